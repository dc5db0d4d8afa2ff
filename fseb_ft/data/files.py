"""Image folders without ``datasets``: ``root/<split>/<class>/**`` listed by ``os.scandir``.

``datasets.load_dataset("imagefolder")`` resolves its file patterns through fsspec, which costs
~40 s for 60,000 files on every run; listing the folder ourselves costs a few hundredths of a
second per 10,000 files (docs/performance.md, "Start-up on image folders"). The layout and the
accepted extensions are those of ``datasets``' imagefolder, with three differences: any
subfolder is a split under its own name (``val/`` is split ``val``; ``validation`` still finds
``val/``), a class is a top-level folder of the split (images in its subfolders belong to it, as
in torchvision's ``ImageFolder``), and the files left out (no image extension, or outside any
class folder) are named in one warning.

Of fseb_ft this imports only :mod:`fseb_ft.data.images` and :mod:`fseb_ft.data.pixels`.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

from fseb_ft.data.images import LabeledImages, check_channels
from fseb_ft.data.pixels import MinSize, decode_image, fit_channels

__all__ = [
    "IMAGE_EXTENSIONS",
    "SPLIT_FOLDERS",
    "FileImages",
    "FolderListing",
    "file_changes",
    "find_images",
    "list_split",
    "read_image",
]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(ImageFolder.EXTENSIONS)
"""Lower-case extensions (with the dot) of the files taken as images: ``datasets``' list."""

SPLIT_FOLDERS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""The folder names ``datasets`` takes for its three standard splits; a split asked for by one of
these names is found under any of its group's names when no folder has its own name."""

SHOWN = 10
"""How many left-out files the warning names (then the count)."""


@dataclass(frozen=True)
class FolderListing:
    """The images of one split folder, in ``datasets``' order (sorted relative paths)."""

    folder: Path
    """The split folder (``root/<split>``, or ``root`` itself for a flat folder)."""
    files: list[str]
    """Image paths relative to ``folder``, POSIX style, sorted."""
    labels: np.ndarray
    """Class index of each file, int64 (N,)."""
    class_names: list[str]
    """Sorted class folder names, empty ones included."""
    left_out: list[str]
    """Files not taken: without an image extension, or not inside a class folder."""
    fingerprint: str
    """16 hex digits of a sha256 over class names and every file's path, size and mtime: it
    changes when a file is added, removed, renamed or rewritten, and only then."""
    stats: dict[str, tuple[int, int]]
    """Each image file's ``(size, mtime_ns)``, by its path relative to ``folder``: what the
    fingerprint hashes, kept to name the files a changed fingerprint comes from."""


def file_changes(
    old: Mapping[str, Sequence[int]], new: Mapping[str, Sequence[int]], shown: int = 3
) -> str:
    """How the files ``new`` (relative path → size, mtime) differ from ``old``: the count of files
    added, rewritten and removed, each with its first ``shown`` paths; empty when none."""
    kinds = (
        ("added", sorted(set(new) - set(old))),
        ("rewritten", sorted(f for f in set(old) & set(new) if list(old[f]) != list(new[f]))),
        ("removed", sorted(set(old) - set(new))),
    )
    return ", ".join(
        f"{len(files)} {kind} ({', '.join(files[:shown])}{', …' if len(files) > shown else ''})"
        for kind, files in kinds
        if files
    )


def split_folder(root: Path, split: str) -> Path:
    """The folder holding ``split``: ``root/<split>``, one of its aliases, or a flat ``root``.

    A flat ``root/<class>/*`` (no subfolder named like a standard split) is split ``train``.
    """
    if (root / split).is_dir():
        return root / split
    group = next((names for names in SPLIT_FOLDERS.values() if split in names), ())
    for name in group:
        if (root / name).is_dir():
            return root / name
    subfolders = sorted(e.name for e in os.scandir(root) if e.is_dir() and _visible(e.name))
    known = {name for names in SPLIT_FOLDERS.values() for name in names}
    if split in SPLIT_FOLDERS["train"] and not known & set(subfolders):
        return root
    raise FileNotFoundError(
        f"image folder {root} has no subfolder for split {split!r}; its subfolders are "
        f"{subfolders} (expected {root}/<split>/<class>/*, or a flat {root}/<class>/* as 'train')"
    )


def list_split(root: str | Path, split: str) -> FolderListing:
    """List ``root``'s split ``split``: class folders, image files, labels and fingerprint."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist or is not a directory")
    folder = split_folder(root, split)
    class_names, found, left_out = [], [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            if not _visible(entry.name):
                continue
            if entry.is_dir():
                class_names.append(entry.name)
            elif entry.is_file():
                left_out.append(entry.name)
    class_names.sort()
    digest = hashlib.sha256("\0".join(class_names).encode())
    for label, name in enumerate(class_names):
        for relative, stat in _walk(folder / name, name):
            if os.path.splitext(relative)[1].lower() in IMAGE_EXTENSIONS:
                found.append((relative, label, stat.st_size, stat.st_mtime_ns))
            else:
                left_out.append(relative)
    found.sort()  # datasets' order: sorted paths (fsspec's find), not class by class
    for relative, _, size, mtime in found:
        digest.update(f"\0{relative}\0{size}\0{mtime}".encode())
    return FolderListing(
        folder=folder,
        files=[f[0] for f in found],
        labels=np.array([f[1] for f in found], dtype=np.int64),  # (N,)
        class_names=class_names,
        left_out=sorted(left_out),
        fingerprint=digest.hexdigest()[:16],
        stats={relative: (size, mtime) for relative, _, size, mtime in found},
    )


def _walk(folder: Path, prefix: str) -> list[tuple[str, os.stat_result]]:
    """Every visible file below ``folder``: (``prefix/relative/path``, its stat), any depth; a
    symbolic link to nothing too (its own stat), so it is reported as an unreadable image."""
    out = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if not _visible(entry.name):
                continue
            relative = f"{prefix}/{entry.name}"
            if entry.is_dir():
                out += _walk(Path(entry.path), relative)
            elif entry.is_file():
                out.append((relative, entry.stat()))
            elif entry.is_symlink():  # to nothing: listed, so the image check names it
                out.append((relative, entry.stat(follow_symlinks=False)))
    return out


def _visible(name: str) -> bool:
    """Whether ``datasets`` would look at a file or folder: not hidden, not ``__special__``."""
    return not name.startswith((".", "__"))


class FileImages(LabeledImages):
    """Image files on disk with integer labels, decoded with PIL when an item is read.

    Decoding is the one :class:`~fseb_ft.data.images.HFImages` uses (grayscale, 16-bit, palette,
    RGBA and CMYK images are converted, not rejected), so the pixels equal those of the ``datasets``
    imagefolder path.
    """

    def __init__(
        self,
        folder: str | Path,
        files: Sequence[str],
        labels: np.ndarray,
        class_names: Sequence[str],
        identity: str,
        channels: int = 3,
    ) -> None:
        """Hold ``files`` (relative to ``folder``) and their ``labels`` (N,)."""
        self.folder = Path(folder)
        self.files = list(files)
        self.labels = np.asarray(labels, dtype=np.int64)  # (N,)
        if self.labels.shape != (len(self.files),):
            raise ValueError(f"{len(self.files)} files but labels of shape {self.labels.shape}")
        self.class_names = [str(name) for name in class_names]
        self.identity = identity
        self.channels = check_channels(channels)

    @classmethod
    def from_folder(cls, root: str | Path, split: str = "train", channels: int = 3) -> FileImages:
        """Load ``root/<split>/<class>/*`` (or a flat ``root/<class>/*`` as split "train").

        Labels follow the sorted names of this split's class folders, empty folders included.
        Files left out are named in one warning (the first :data:`SHOWN`, then the count).
        """
        listing = list_split(root, split)
        if listing.left_out:
            shown = ", ".join(listing.left_out[:SHOWN])
            more = len(listing.left_out) - SHOWN
            logger.warning(
                "%s: left out %d file(s) without an image extension or outside a class folder: "
                "%s%s",
                listing.folder,
                len(listing.left_out),
                shown,
                f" and {more} more" if more > 0 else "",
            )
        identity = f"imagefolder:{Path(root)}:{split}#{listing.fingerprint}"
        return cls(
            listing.folder, listing.files, listing.labels, listing.class_names, identity, channels
        )

    def path(self, index: int) -> Path:
        """The file of sample ``index``."""
        return self.folder / self.files[index]

    def encoded(self, index: int) -> tuple[str, str]:
        """(file, file) of sample ``index``: the image check opens the file and names it."""
        path = str(self.path(index))
        return path, path

    def _read(self, index: int) -> np.ndarray:
        """Decode one file, naming the sample and file when that fails."""
        return self._read_at_least(index, None)

    def _read_at_least(self, index: int, min_size: MinSize | None) -> np.ndarray:
        """Decode one file, a JPEG reduced as ``min_size`` allows."""
        where = f"image {index} of {self.identity}"
        return decode_image({"path": str(self.path(index)), "bytes": None}, where, min_size)


_GLOB_CHARS = frozenset("*?[")


def find_images(inputs: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """The image files ``inputs`` name, in order, each once; and the other files passed over.

    An input is a file (taken whatever its extension: it was asked for by name), a folder
    (every file with an :data:`IMAGE_EXTENSIONS` extension below it, recursively, in sorted
    order, hidden files and folders left out) or a glob pattern (``**`` recursive; its matches
    taken as files or folders are).

    Returns:
        (image files, files in the folders and globs left out for their extension).

    Raises:
        FileNotFoundError: an input neither exists nor matches anything, or no image is found.
    """
    found: dict[Path, None] = {}
    skipped: dict[Path, None] = {}
    for given in inputs:
        text = str(given)
        path = Path(text).expanduser()
        if path.exists():
            matches = [path]
        elif _GLOB_CHARS & set(text):
            matches = [Path(m) for m in sorted(glob.glob(str(path), recursive=True))]
            if not matches:
                raise FileNotFoundError(f"no file matches {text!r}")
        else:
            raise FileNotFoundError(f"{text} does not exist")
        for match in matches:
            if match.is_file() and (match == path or _is_image(match)):
                found[match] = None
            elif match.is_file():
                skipped[match] = None
            elif match.is_dir():
                for file in _files_below(match):
                    (found if _is_image(file) else skipped)[file] = None
    if not found:
        listed = ", ".join(str(i) for i in inputs)
        raise FileNotFoundError(
            f"no images found in {listed} (image extensions: .png, .jpg, .jpeg, .webp, … "
            f"{len(IMAGE_EXTENSIONS)} in all; {len(skipped)} other file(s) left out)"
        )
    return list(found), [f for f in skipped if f not in found]


def read_image(path: Path, channels: int) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W, channels): grayscale, RGBA, palette and 16-bit
    images converted, as in training.

    Raises:
        ValueError: the file cannot be decoded (truncated, not an image); the message names it.
    """
    where = f"image {path}"
    return fit_channels(decode_image({"path": str(path), "bytes": None}, where), channels, where)


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def _files_below(folder: Path) -> list[Path]:
    """Every file below ``folder``, sorted, without hidden files or folders."""
    files = (p for p in folder.rglob("*") if p.is_file())
    return sorted(
        p for p in files if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
