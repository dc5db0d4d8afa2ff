"""Common corruptions (Hendrycks & Dietterich, ICLR 2019) at severities 1–5, CIFAR-10-C style.

Covariate shift is measured by evaluating the test split again after corrupting every image
(docs/method.md, "Metrics": every metric per corruption and severity). The corruptions follow the
reference script that made CIFAR-10-C (``make_cifar_c.py`` in ``hendrycks/robustness``): the same
formulas and the same per-severity parameters, re-implemented with numpy, OpenCV (albumentations'
imaging backend), SciPy and Pillow. albumentations' own transforms draw their parameters from ranges
and use other kernels (its ``MotionBlur`` is a uniform line, ``RandomFog`` and ``RandomSnow`` paint
other patterns), so they would not reproduce CIFAR-10-C's severities.

The per-image formulas are :mod:`fseb_ft.data.corruption_ops`. The corruptions, their parameters per
severity and every place where this implementation differs from the reference are listed in
docs/corruptions.md; ``all`` (:data:`BENCHMARK`) is the
benchmark's fifteen less ``frost``.

**Randomness.** Image ``i`` of a set is corrupted with the generator
:func:`image_rng` ``(seed, corruption, i)``, so a (corruption, severity, seed) triple always
gives the same pixels, in any order and any process. The severity is not part of the seed: every
severity of a corruption uses the same random draws (common random numbers), so the change
between severities is the corruption getting stronger, not a new noise pattern.

**Cache.** :class:`CorruptedImages` corrupts a whole :class:`~fseb_ft.data.images.LabeledImages`
once and stores the uint8 pixels under ``cache_dir`` (default :func:`default_cache_dir`:
``$XDG_CACHE_HOME/fseb_ft/corruptions`` or ``~/.cache/fseb_ft/corruptions``) as
``<corruption>/s<severity>-seed<seed>-<hash>.npy`` (all pixels, flat) with an ``.npz`` index (image
shapes and the key), keyed by the base set's ``identity``, a hash of a few of its images, the
corruption, severity, seed and :data:`VERSION`. A later evaluation memory-maps them instead
of recomputing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from fseb_ft.data.corruption_ops import BENCHMARK, CORRUPTIONS, EXTRA
from fseb_ft.data.image_cache import user_cache_dir
from fseb_ft.data.images import LabeledImages, content_hash
from fseb_ft.logs import progress_bar
from fseb_ft.recipe.options import ALL_CORRUPTIONS
from fseb_ft.recipe.reporting import resolve_corruptions

__all__ = [
    "ALL",
    "BENCHMARK",
    "CORRUPTIONS",
    "EXTRA",
    "SEVERITIES",
    "VERSION",
    "CorruptedImages",
    "corrupt",
    "corrupt_images",
    "default_cache_dir",
    "image_rng",
]

logger = logging.getLogger(__name__)

SEVERITIES = (1, 2, 3, 4, 5)
"""The five severity levels."""
ALL = ALL_CORRUPTIONS
VERSION = 1
"""Part of every cache key: raise it when a corruption's pixels change."""


def _check_severity(severity: int) -> int:
    integral = isinstance(severity, int | np.integer) and not isinstance(severity, bool)
    if not integral or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {list(SEVERITIES)}, got {severity!r}")
    return int(severity)


def image_rng(seed: int, corruption: str, index: int) -> np.random.Generator:
    """The generator that corrupts image ``index`` of a set: a function of its arguments only.

    The severity is deliberately not an input (common random numbers across severities).
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be ≥ 0, got seed={seed}, index={index}")
    tag = zlib.crc32(corruption.encode("utf-8"))
    return np.random.default_rng([int(seed), tag, int(index)])


def corrupt(
    image: np.ndarray,
    corruption: str,
    severity: int,
    rng: np.random.Generator | int = 0,
) -> np.ndarray:
    """Corrupt one uint8 image (H, W), (H, W, 1) or (H, W, 3); same shape and dtype back.

    Args:
        image: uint8 pixels, any size.
        corruption: a name of :data:`CORRUPTIONS`.
        severity: 1 (mild) to 5 (strong).
        rng: a generator, or an integer seed for one (use :func:`image_rng` for image ``i``
            of a set).
    """
    fn = CORRUPTIONS.get(corruption)
    if fn is None:
        resolve_corruptions([corruption])  # raises with the list of names
    level = _check_severity(severity) - 1
    pixels = np.asarray(image)
    if pixels.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {pixels.dtype}")
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3)):
        raise ValueError(
            f"image must have shape (H, W), (H, W, 1) or (H, W, 3); got {pixels.shape}"
        )
    if min(pixels.shape[:2]) < 1:
        raise ValueError(f"image is empty: shape {pixels.shape}")
    x = pixels.reshape(*pixels.shape[:2], -1).astype(np.float64) / 255.0  # (H, W, C)
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    scale = max(1.0, min(x.shape[:2]) / 32.0)  # the reference's parameters are for 32×32
    # (H, W, C); fn is set: an unknown name raised above, which mypy cannot follow.
    out = fn(x, level, generator, scale)  # type: ignore[misc]  # fn is not None (above)
    return np.rint(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8).reshape(pixels.shape)


def corrupt_images(
    images: Sequence[np.ndarray] | np.ndarray,
    corruption: str,
    severity: int,
    seed: int = 0,
    indices: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Corrupt a set of images; image ``k`` uses :func:`image_rng` ``(seed, corruption, i)``.

    ``i`` is ``indices[k]`` when given (the images' positions in a larger set), else ``k``.
    """
    positions = range(len(images)) if indices is None else indices
    if len(positions) != len(images):
        raise ValueError(f"{len(images)} images but {len(positions)} indices")
    return [
        corrupt(image, corruption, severity, image_rng(seed, corruption, int(i)))
        for image, i in zip(images, positions, strict=True)
    ]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fseb_ft/corruptions``, else ``~/.cache/fseb_ft/corruptions``."""
    return user_cache_dir("corruptions")


class CorruptedImages(LabeledImages):
    """A :class:`~fseb_ft.data.images.LabeledImages` with every image corrupted, labels unchanged.

    The corrupted uint8 images are computed once, at construction (a tqdm bar when
    ``progress``), cached on disk and served from a read-only memory map; image ``i`` is
    ``corrupt(base[i], corruption, severity, image_rng(seed, corruption, i))``. Wrap it in the
    model's evaluation transform like any other split: the corruption happens on the raw
    pixels, before resizing and normalisation.

    Args:
        base: the clean images (e.g. the test split).
        corruption: a name of :data:`CORRUPTIONS`.
        severity: 1 to 5.
        seed: seed of the per-image generators.
        cache_dir: where the cache lives (default :func:`default_cache_dir`); ``False``
            disables it (the images are then kept in memory).
        progress: show a progress bar while corrupting.
    """

    def __init__(
        self,
        base: LabeledImages,
        corruption: str,
        severity: int,
        seed: int = 0,
        cache_dir: str | Path | bool | None = None,
        progress: bool = True,
    ) -> None:
        """Corrupt ``base`` (or load it from the cache); see the class docstring."""
        (self.corruption,) = resolve_corruptions([corruption])
        self.severity = _check_severity(severity)
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be an integer ≥ 0, got {seed!r}")
        self.seed = int(seed)
        self.base = base
        self.labels = base.labels
        self.class_names = list(base.class_names)
        self.channels = base.channels
        self.identity = f"{base.identity}|corrupt:{self.corruption}:{self.severity}:{self.seed}"
        self.cache_path = None if cache_dir is False else self._cache_file(cache_dir)
        images = self._load() if self.cache_path is not None else None
        self.from_cache = images is not None
        if images is None:
            images = self._compute(progress)
            if self.cache_path is not None and self._save(images):
                # Serve from the memory map: the computed copies leave RAM.
                images = self._load() or images
        self._images = images

    def _read(self, index: int) -> np.ndarray:
        """The corrupted image (H, W, channels) uint8."""
        return self._images[index]

    def _cache_key(self) -> str:
        n = len(self.base)
        probe = sorted({round(k * (n - 1) / 3) for k in range(4)}) if n else []
        sample = content_hash(*(self.base[i][0] for i in probe)) if probe else "empty"
        return (
            f"v{VERSION}|{self.base.identity}|n={n}|probe={sample}|{self.corruption}|"
            f"severity={self.severity}|seed={self.seed}"
        )

    def _cache_file(self, cache_dir: str | Path | bool | None) -> Path:
        # Called without False (no cache): None or True is the default folder, else a path.
        given = cast(str | Path, cache_dir)
        root = default_cache_dir() if cache_dir in (None, True) else Path(given).expanduser()
        self._key = self._cache_key()
        digest = hashlib.sha256(self._key.encode("utf-8")).hexdigest()[:20]
        return root / self.corruption / f"s{self.severity}-seed{self.seed}-{digest}.npz"

    def _compute(self, progress: bool) -> list[np.ndarray]:
        images = []
        desc = f"corrupt {self.corruption} s{self.severity}"
        for i in progress_bar(range(len(self.base)), desc=desc, show=progress, leave=False):
            rng = image_rng(self.seed, self.corruption, i)
            images.append(corrupt(self.base[i][0], self.corruption, self.severity, rng))
        return images

    def _load(self) -> list[np.ndarray] | None:
        """The cached images (views of a read-only memory map), or None if absent or stale."""
        index = cast(Path, self.cache_path)  # called only with a cache (its callers check)
        pixels_file = index.with_suffix(".npy")
        if not (index.is_file() and pixels_file.is_file()):
            return None
        try:
            with np.load(index, allow_pickle=False) as npz:
                key, shapes = str(npz["key"]), npz["shapes"]
            pixels = np.load(pixels_file, mmap_mode="r", allow_pickle=False)  # (Σ H·W·C,)
        except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile) as err:
            logger.warning("ignoring unreadable corruption cache %s: %r", index, err)
            return None
        ends = np.cumsum(np.prod(shapes, axis=1))  # (N,)
        if key != self._key or len(shapes) != len(self.base):
            logger.warning("ignoring corruption cache %s: it holds other images", index)
            return None
        if pixels.ndim != 1 or (ends[-1] if len(ends) else 0) != len(pixels):
            logger.warning("ignoring corruption cache %s: pixel file of the wrong size", index)
            return None
        starts = np.concatenate([[0], ends[:-1]])
        return [
            pixels[a:b].reshape(shape)
            for a, b, shape in zip(starts, ends, shapes.tolist(), strict=True)
        ]

    def _save(self, images: list[np.ndarray]) -> bool:
        """Write the pixels (``.npy``, flat) then the index (``.npz``: key, shapes); atomic each.

        The index is written last, so a reader that finds it finds the pixels complete.
        Returns whether both were written (a failure is logged, not raised).
        """
        index = cast(Path, self.cache_path)  # called only with a cache (its callers check)
        shapes = np.array([im.shape for im in images], dtype=np.int64).reshape(-1, 3)  # (N, 3)
        pixels = np.concatenate([im.ravel() for im in images]) if images else np.zeros(0, np.uint8)
        written = []
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
            for path, write in (
                (index.with_suffix(".npy"), lambda f: np.save(f, pixels, allow_pickle=False)),
                (index, lambda f: np.savez(f, key=np.array(self._key), shapes=shapes)),
            ):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                written.append(tmp)
                with open(tmp, "wb") as f:
                    write(f)
                os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
        except OSError as err:
            for tmp in written:
                tmp.unlink(missing_ok=True)
            logger.warning("could not write the corruption cache %s: %r", index, err)
            return False
        return True
