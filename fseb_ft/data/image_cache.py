"""The resized-image cache (``data.cache``): every image decoded once, shrunk, kept on disk.

Large originals (2048×1536 fundus photos) cost more to decode every epoch than a GPU takes to
train on them. :func:`cache_images` decodes every image of a dataset held encoded (image files,
``datasets`` image columns) once, shrinks it with PIL so its shorter side is ``data.cache.size``
(aspect ratio kept; an image already that small is kept as it is) and stores the uint8 pixels of
the whole dataset as one flat blob with an index of shapes and offsets, since the images need not
share a shape. Later runs, sweep trials and evaluations read them through a memory map
(:class:`CachedImages`); the training and evaluation transforms then run on the smaller image.

**Key.** An entry is named by a hash of the dataset's ``identity`` (the source's content
fingerprint: an image folder's file names, sizes and times, a ``datasets`` fingerprint, a label
file's bytes), its length and channels, the size, the resampling filter, PIL's
decompression-bomb limit (``data.max_image_pixels``) and :data:`VERSION`: a changed file makes a
new entry, an unchanged dataset finds its old one. A subset (the held-out
validation split, ``fraction``, ``limit``, ``classes``) is cached as the whole dataset it is
taken from, so runs with other seeds or subsets reuse the same entry.

**Unreadable images.** The build is also the check before training
(:mod:`fseb_ft.data.screening`): an image that cannot be decoded is recorded in the index with
the decoder's words, and every later use reports it again without decoding anything; what is
done about it (``data.bad_images``) is the screen's business.

**Atomic.** The pixels (``<name>.bin``) and then the index (``<name>.npz``) are each written to a
temporary file and renamed into place; the index marks a complete entry. A build that is killed
leaves no entry, and its temporary file is removed by the next build of the same entry.

Of fseb_ft this imports :mod:`fseb_ft.data.images`, :mod:`fseb_ft.data.pixels` and the recipe
(whose :func:`~fseb_ft.recipe.datasets.check_cache_size` is the one rule of the cache's size,
re-exported here for the commands that check it before a build).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
import zipfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

import numpy as np
import PIL.Image

from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.data.pixels import decode_image, fit_channels, unreadable_cause
from fseb_ft.logs import progress_bar
from fseb_ft.recipe import ImageCacheConfig
from fseb_ft.recipe.datasets import check_cache_size

__all__ = [
    "PARALLEL_FROM",
    "VERSION",
    "CacheReport",
    "CachedImages",
    "CachedSets",
    "cache_dir",
    "cache_images",
    "check_cache_size",
    "resize_shorter",
    "user_cache_dir",
]

logger = logging.getLogger(__name__)

VERSION = 2
"""Part of every entry's key: raise it when the cached pixels of the same images change (2: images
turned upright by their EXIF orientation)."""
PARALLEL_FROM = 64
"""Datasets of at least this many images are decoded by a pool of processes; smaller ones in
this process (a pool costs more to start than they take)."""

_RESAMPLING = {
    "bilinear": PIL.Image.Resampling.BILINEAR,
    "bicubic": PIL.Image.Resampling.BICUBIC,
    "lanczos": PIL.Image.Resampling.LANCZOS,
    "box": PIL.Image.Resampling.BOX,
    "hamming": PIL.Image.Resampling.HAMMING,
}


def user_cache_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/fseb_ft/<name>``, else ``~/.cache/fseb_ft/<name>``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "fseb_ft" / name


def cache_dir(config: ImageCacheConfig) -> Path:
    """The folder of ``config``'s entries: ``data.cache.dir``, else :func:`user_cache_dir`."""
    return Path(config.dir).expanduser() if config.dir else user_cache_dir("images")


def resize_shorter(image: np.ndarray, size: int, resize: str) -> np.ndarray:
    """``image`` (uint8 (H, W, 1|3)) shrunk with PIL's ``resize`` filter so its shorter side
    is ``size``, aspect ratio kept (the longer side rounded); as it is when already that small."""
    height, width = image.shape[:2]
    if min(height, width) <= size:
        return image
    if height <= width:
        shape = (size, max(1, round(width * size / height)))
    else:
        shape = (max(1, round(height * size / width)), size)
    gray = image.shape[2] == 1
    pil = PIL.Image.fromarray(image[:, :, 0] if gray else image)  # L | RGB
    out = np.asarray(pil.resize(shape[::-1], resample=_RESAMPLING[resize]))  # (h, w[, 3])
    return out[:, :, None] if gray else out


class CachedImages(LabeledImages):
    """A dataset's images as the cache holds them: read from the entry's memory-mapped pixels.

    Labels, class names, groups and metadata are the base dataset's; the identity is the
    base's with ``|cached:<size>px:<resize>`` appended. Images are held decoded (nothing left for
    the check before training). An unreadable image of the base raises when read: the screen
    has left it out or stopped before.
    """

    def __init__(self, base: LabeledImages, entry: _Entry, suffix: str) -> None:
        """Serve ``base``'s images from ``entry``."""
        self.base_identity = base.identity
        self.identity = f"{base.identity}{suffix}"
        self.labels = base.labels  # (N,)
        self.class_names = list(base.class_names)
        self.channels = base.channels
        self.groups = base.groups
        self.metadata = base.metadata
        self.entry = entry
        self._pixels: np.ndarray | None = None  # opened on first read, in each process

    def _read(self, index: int) -> np.ndarray:
        """A copy of the cached image (h, w, channels) uint8."""
        start, end = self.entry.offsets[index], self.entry.offsets[index + 1]
        if index in self.entry.bad:
            name, reason = self.entry.bad[index]
            raise ValueError(
                f"cannot read image {index} of {self.base_identity} ({name}): {reason}"
            )
        if self._pixels is None:
            self._pixels = self.entry.open_pixels()
        return np.array(self._pixels[start:end]).reshape(self.entry.shapes[index])

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the memory map (a DataLoader worker opens its own)."""
        return {**self.__dict__, "_pixels": None}


@dataclass(frozen=True)
class _Entry:
    """One dataset's cached pixels: where they are, each image's shape and offset, the bad."""

    pixels: Path
    shapes: np.ndarray
    """(N, 3) int64: each image's (h, w, channels); (0, 0, channels) for an unreadable one."""
    offsets: np.ndarray
    """(N + 1,) int64: image i is bytes ``offsets[i]:offsets[i + 1]`` of the pixels."""
    bad: dict[int, tuple[str, str]]
    """Index → (name, reason) of each image that could not be decoded."""
    reused: bool
    seconds: float
    keys: list[str] = field(default_factory=list)
    """The recipe keys served from it (for the report)."""

    def open_pixels(self) -> np.ndarray:
        """The pixels, flat (Σ h·w·c,) uint8, memory-mapped read-only."""
        if int(self.offsets[-1]) == 0:  # an empty file cannot be mapped
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self.pixels, dtype=np.uint8, mode="r")


class CacheReport(NamedTuple):
    """What one cache entry took: for ``fseb-ft cache``'s table."""

    keys: list[str]
    """The recipe keys it serves (``data.train``, ``data.val``, …)."""
    images: int
    bytes: int
    seconds: float
    """Seconds to build it, or to find and open it when reused."""
    reused: bool
    path: Path


class CachedSets(NamedTuple):
    """:func:`cache_images`' result."""

    sets: dict[str, LabeledImages]
    """Each dataset by its recipe key, cached (or as it was when held decoded already)."""
    bad: dict[str, list[tuple[int, str, str]]]
    """Each key's unreadable images: (index in that dataset, name, reason)."""
    reports: list[CacheReport]


def cache_images(
    named: Mapping[str, LabeledImages],
    config: ImageCacheConfig,
    progress: bool = True,
    workers: int | None = None,
) -> CachedSets:
    """Serve every dataset of ``named`` (recipe key → dataset) from the cache, building what
    is missing (in ``workers`` processes; ``None``: one per CPU core this process may use).

    A dataset held decoded already (arrays, IDX files, in-memory torch datasets) is returned as
    it is: decoding costs it nothing, and its identity need not fingerprint its pixels.
    """
    entries: dict[str, _Entry] = {}
    sets: dict[str, LabeledImages] = {}
    bad: dict[str, list[tuple[int, str, str]]] = {}
    suffix = f"|cached:{config.size}px:{config.resize}"
    for key, data in named.items():
        root = _root(data)
        if len(root) == 0 or root.encoded(0) is None:
            sets[key] = data
            continue
        name = _entry_name(root, config)
        if name not in entries:
            entries[name] = _entry(root, config, cache_dir(config) / name, key, progress, workers)
        entry = entries[name]
        entry.keys.append(key)
        sets[key] = _rebased(data, root, CachedImages(root, entry, suffix))
        bad[key] = _bad_of(data, root, entry)
    reports = [
        CacheReport(e.keys, len(e.shapes), int(e.offsets[-1]), e.seconds, e.reused, e.pixels)
        for e in entries.values()
    ]
    return CachedSets(sets, {key: found for key, found in bad.items() if found}, reports)


def _root(data: LabeledImages) -> LabeledImages:
    """The dataset ``data`` is a subset of (through :class:`IndexedImages`), or itself."""
    while isinstance(data, IndexedImages):
        data = data.base
    return data


def _rebased(data: LabeledImages, root: LabeledImages, cached: CachedImages) -> LabeledImages:
    """``data`` with its root replaced by ``cached``: the same subsets, labels and names."""
    if data is root:
        return cached
    subset = cast(IndexedImages, data)  # every level above the root is a subset of it
    copy = IndexedImages.__new__(IndexedImages)
    copy.__dict__.update(subset.__dict__)
    copy.base = _rebased(subset.base, root, cached)
    copy.identity = f"{data.identity}{cached.identity.removeprefix(root.identity)}"
    return copy


def _root_indices(data: LabeledImages, root: LabeledImages, indices: np.ndarray) -> np.ndarray:
    """The root's indices of ``data``'s samples ``indices``."""
    while data is not root:
        subset = cast(IndexedImages, data)  # every level above the root is a subset of it
        indices = subset.indices[indices]
        data = subset.base
    return indices


def _bad_of(data: LabeledImages, root: LabeledImages, entry: _Entry) -> list[tuple[int, str, str]]:
    """(index in ``data``, name, reason) of ``data``'s unreadable images."""
    if not entry.bad:
        return []
    roots = _root_indices(data, root, np.arange(len(data)))  # (N,)
    hit = np.flatnonzero(np.isin(roots, list(entry.bad)))
    return [(int(i), *entry.bad[int(roots[i])]) for i in hit]


def _entry_name(root: LabeledImages, config: ImageCacheConfig) -> str:
    """The file stem of ``root``'s entry: size, filter and a hash of everything keyed (PIL's
    decompression-bomb limit too: an image refused under one limit may be read under another)."""
    key = (
        f"v{VERSION}|{root.identity}|n={len(root)}|channels={root.channels}|"
        f"size={config.size}|resize={config.resize}|max_pixels={PIL.Image.MAX_IMAGE_PIXELS}"
    )
    return f"{config.size}px-{config.resize}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _entry(
    root: LabeledImages,
    config: ImageCacheConfig,
    stem: Path,
    key: str,
    progress: bool,
    workers: int | None,
) -> _Entry:
    """``root``'s entry at ``stem``: the one on disk, else a new one, built."""
    start = time.perf_counter()
    found = _load(stem, len(root), start)
    if found is not None:
        return found
    stem.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(stem)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    shapes, offsets, bad = _build(root, config, stem, f"caching {key}", progress, workers)
    return _Entry(
        stem.with_suffix(".bin"), shapes, offsets, bad, False, time.perf_counter() - start
    )


def _load(stem: Path, n: int, start: float) -> _Entry | None:
    """The complete entry at ``stem`` for ``n`` images, or None (absent, stale, unreadable)."""
    index, pixels = stem.with_suffix(".npz"), stem.with_suffix(".bin")
    if not (index.is_file() and pixels.is_file()):
        return None
    try:
        with np.load(index, allow_pickle=False) as npz:
            shapes, offsets = npz["shapes"], npz["offsets"]
            reasons = zip(npz["bad_name"].tolist(), npz["bad_reason"].tolist(), strict=True)
            bad = dict(zip(npz["bad_index"].tolist(), reasons, strict=True))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        logger.warning("rebuilding image cache entry %s: its index cannot be read (%r)", index, err)
        return None
    if len(shapes) != n or offsets[-1] != pixels.stat().st_size:
        logger.warning("rebuilding the image cache entry %s: it does not match its images", index)
        return None
    return _Entry(pixels, shapes, offsets, bad, True, time.perf_counter() - start)


def _build(
    root: LabeledImages,
    config: ImageCacheConfig,
    stem: Path,
    desc: str,
    progress: bool,
    workers: int,
) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[str, str]]]:
    """Decode, shrink and write every image of ``root``: the pixels, then the index."""
    n = len(root)
    shapes = np.zeros((n, 3), dtype=np.int64)  # (N, 3)
    offsets = np.zeros(n + 1, dtype=np.int64)  # (N + 1,)
    bad: dict[int, tuple[str, str]] = {}
    bar = progress_bar(total=n, desc=desc, show=progress, leave=False)
    with _atomic(stem.with_suffix(".bin")) as out, bar:
        for index, (image, name, reason) in enumerate(_decoded(root, config, workers)):
            if image is None:
                bad[index] = (name, cast(str, reason))  # an image that is None has a reason
                shapes[index] = (0, 0, root.channels)
            else:
                out.write(np.ascontiguousarray(image).data)
                shapes[index] = image.shape
            offsets[index + 1] = offsets[index] + (0 if image is None else image.size)
            bar.update()
    arrays: dict[str, Any] = {
        "shapes": shapes,
        "offsets": offsets,
        "bad_index": np.array(list(bad), dtype=np.int64),
        "bad_name": np.array([name for name, _ in bad.values()], dtype=str),
        "bad_reason": np.array([reason for _, reason in bad.values()], dtype=str),
    }
    with _atomic(stem.with_suffix(".npz")) as tmp:  # last: it marks the entry complete
        np.savez(tmp, **arrays)
    return shapes, offsets, bad


_Decoded = tuple[np.ndarray | None, str, str | None]
"""(shrunk image or None, name, why it cannot be read or None)."""
_JOB: tuple[LabeledImages, ImageCacheConfig] | None = None
"""The dataset and settings a pool worker decodes for (set by the pool's initializer)."""


def _decoded(root: LabeledImages, config: ImageCacheConfig, workers: int) -> Iterator[_Decoded]:
    """Every image of ``root`` decoded and shrunk, in order; in a pool of ``workers`` processes
    for a dataset of :data:`PARALLEL_FROM` images or more."""
    n = len(root)
    if workers <= 1 or n < PARALLEL_FROM:
        for index in range(n):
            yield _decode(root, config, index)
        return
    pool = ProcessPoolExecutor(workers, initializer=_set_job, initargs=(root, config))
    try:
        yield from pool.map(_job, range(n), chunksize=max(1, min(32, n // (8 * workers))))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _set_job(root: LabeledImages, config: ImageCacheConfig) -> None:
    """Pool initializer: what this worker decodes."""
    global _JOB
    _JOB = (root, config)


def _job(index: int) -> _Decoded:
    """A pool worker's :func:`_decode` of image ``index``."""
    job = _JOB
    assert job is not None, "the pool's initializer sets the job"
    return _decode(*job, index)


def _decode(root: LabeledImages, config: ImageCacheConfig, index: int) -> _Decoded:
    """Image ``index`` of ``root`` decoded from its encoded form (once: this is also the check
    before training) and shrunk; or why it cannot be read, in the decoder's words."""
    # Only encoded datasets are cached (decoded ones are served as they are).
    name, source = cast(tuple[str, str | bytes], root.encoded(index))
    where = f"image {index} of {root.identity}"
    try:
        # One read, then PIL parses memory, as the screen does (and so its messages).
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        raw = decode_image({"bytes": data, "path": name}, where)
        image = fit_channels(raw, root.channels, where)  # (H, W, channels)
    except (OSError, ValueError) as err:
        cause = err.__cause__ if isinstance(err, ValueError) and err.__cause__ else err
        cause = unreadable_cause(cause, None, source if isinstance(source, str) else None)
        return None, name, str(cause) or type(cause).__name__
    if min(image.shape[:2]) < 1:
        return None, name, f"size {image.shape[1]}x{image.shape[0]}"
    return resize_shorter(image, config.size, config.resize), name, None


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[IO[bytes]]:
    """A file written in full or not at all: a temporary beside ``path``, synced and renamed
    into place; removed if the writing fails (or is interrupted)."""
    tmp = path.with_name(f".{path.name}.{_owner()}.tmp")
    try:
        with open(tmp, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _owner() -> str:
    """This process in a temporary file's name, ``host-pid``: a later build on this machine
    can tell a dead build's leftovers."""
    return f"{socket.gethostname().replace('.', '_')}-{os.getpid()}"


def _remove_stale_temps(stem: Path) -> None:
    """Remove the temporary files of ``stem``'s entry left by killed builds on this machine."""
    host = _owner().rpartition("-")[0]
    for tmp in stem.parent.glob(f".{stem.name}.*.tmp"):
        owner = tmp.name.removesuffix(".tmp").rsplit(".", 1)[-1]
        their_host, _, pid = owner.rpartition("-")
        if their_host == host and pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (always taken as alive on Windows, where
    ``os.kill`` would end it)."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
