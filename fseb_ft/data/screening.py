"""The check before training: every encoded image of every split and context dataset is read.

A truncated JPEG used to end a run with a traceback at the step that first drew it, possibly
hours in. :func:`screen` reads each image still held encoded (files of an image folder, bytes
of a ``datasets`` ``Image`` column; arrays and IDX files are decoded already) far enough to find
the usual damage, then stops with one :class:`BadImagesError` naming the bad files, or
(``data.bad_images: skip``) drops them.

How deep (docs/performance.md, "Checking images before training"): ``Image.open`` and ``size``
read only the header, and PIL's ``verify()`` does nothing for JPEG, so neither finds a
truncated JPEG. A JPEG is therefore decoded at 1/8 scale (``draft``), which still reads every
byte of its compressed stream; other formats are decoded in full.

An image of more than 8 bits per pixel (16-bit, 32-bit integer, floating point) is also given to
:func:`fseb_ft.data.pixels.as_uint8`, so pixels it refuses (a float TIFF outside [0, 1]) are found
here too, not at a training step.

With ``data.cache``, the resized-image cache's build (:mod:`fseb_ft.data.image_cache`) is this
check: each image is decoded once, for both.

Of fseb_ft this imports only :mod:`fseb_ft.errors`, the recipe, :mod:`fseb_ft.data.images`,
:mod:`fseb_ft.data.image_cache`, :mod:`fseb_ft.data.splits` and :mod:`fseb_ft.data.pixels`.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import PIL.Image

from fseb_ft.data.image_cache import cache_images
from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.data.pixels import EMPTY_FILE, WIDE_MODES, as_uint8, unreadable_cause
from fseb_ft.data.splits import Splits
from fseb_ft.errors import FsebError
from fseb_ft.logs import progress_bar
from fseb_ft.recipe import ImageCacheConfig

__all__ = [
    "SHOWN",
    "BadImage",
    "BadImagesError",
    "apply_policy",
    "check_image",
    "find_bad_images",
    "screen",
    "screen_splits",
]

logger = logging.getLogger(__name__)

SHOWN = 20
"""How many bad files a message names (then the count)."""
PROGRESS_FROM = 2_000
"""Datasets with at least this many images show a progress bar while checked."""

# (identity, length, PIL's pixel limit) → (index, name, reason) of its bad images: a sweep's
# trials, run in one process, check each dataset once. An image folder's identity changes with
# its files.
_CHECKED: dict[tuple[str, int, int | None], list[tuple[int, str, str]]] = {}


@dataclass(frozen=True)
class BadImage:
    """One image that cannot be read."""

    key: str
    """The recipe key of its dataset (``data.train``, ``context.datasets[0]``, …)."""
    index: int
    """Its index in that dataset."""
    name: str
    """Its file (or ``identity[index]`` for bytes without a path)."""
    reason: str
    """What PIL said."""


class BadImagesError(FsebError, ValueError):
    """Images that cannot be read were found before they were used (``data.bad_images: stop``):
    before training, or before ``fseb-ft evaluate`` re-reads a run's evaluation splits."""

    def __init__(self, bad: list[BadImage]) -> None:
        """Name the first :data:`SHOWN` bad images and give the count."""
        shown = "; ".join(f"{b.key}: {b.name} ({b.reason})" for b in bad[:SHOWN])
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        super().__init__(
            f"{len(bad)} image(s) cannot be read: {shown}{more}. "
            "Replace or remove them, or set data.bad_images=skip to leave them out."
        )
        self.bad = bad


def check_image(source: str | bytes) -> str | None:
    """Why the image at ``source`` (a path or the encoded bytes) cannot be read; None if it can.

    Opens it, reads its size and decodes it: a JPEG at 1/8 scale (``draft``), which reads all
    its data and so finds truncation at a fraction of a full decode's cost; others in full. Pixels
    of more than 8 bits must be ones :func:`~fseb_ft.data.pixels.as_uint8` takes.
    """
    try:
        # One read, then PIL parses memory: cheaper than its many small reads of the file.
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        if not data:
            return EMPTY_FILE
        with PIL.Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width < 1 or height < 1:
                return f"size {width}x{height}"
            if image.format == "JPEG":
                image.draft(image.mode, (1, 1))
            image.load()
            if image.mode in WIDE_MODES:
                as_uint8(np.asarray(image), "it")
    except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as err:
        encoded: bytes | None
        path: str | None
        encoded, path = (source, None) if isinstance(source, bytes) else (None, source)
        cause = unreadable_cause(err, encoded, path)
        return str(cause) or type(cause).__name__
    return None


def find_bad_images(data: LabeledImages, key: str, progress: bool = True) -> list[BadImage]:
    """Every image of ``data`` that :func:`check_image` refuses (none for decoded datasets)."""
    if len(data) == 0 or data.encoded(0) is None:
        return []
    seen = (data.identity, len(data), PIL.Image.MAX_IMAGE_PIXELS)  # the limit decides too
    if seen not in _CHECKED:
        bar = progress and len(data) >= PROGRESS_FROM
        found = []
        for index in progress_bar(range(len(data)), desc=f"checking {key}", show=bar, leave=False):
            # Every image of a dataset whose first is encoded is (checked above).
            name, source = cast(tuple[str, str | bytes], data.encoded(index))
            reason = check_image(source)
            if reason is not None:
                found.append((index, name, reason))
        _CHECKED[seen] = found
    return [BadImage(key, *bad) for bad in _CHECKED[seen]]


def screen(
    named: Mapping[str, LabeledImages],
    policy: str,
    progress: bool = True,
    cache: ImageCacheConfig | None = None,
) -> tuple[dict[str, LabeledImages], dict[str, list[str]]]:
    """Check every dataset of ``named`` (recipe key → dataset) and apply ``policy``.

    With ``cache`` (``data.cache``) the datasets are served from the resized-image cache, and
    its build is the check (:func:`~fseb_ft.data.image_cache.cache_images`: each image decoded
    once); a reused entry reports the bad images it recorded. ``stop`` raises
    :class:`BadImagesError` when any image is bad; ``skip`` returns each dataset without its bad
    images (a subset) and logs their count. Returns the datasets and the files dropped, by key
    (empty when none was bad).
    """
    if cache is None:
        bad = {key: find_bad_images(data, key, progress) for key, data in named.items()}
        return apply_policy(named, bad, policy)
    cached = cache_images(named, cache, progress)
    found = {key: [BadImage(key, *b) for b in cached.bad.get(key, [])] for key in named}
    return apply_policy(cached.sets, found, policy)


def apply_policy(
    named: Mapping[str, LabeledImages], bad: Mapping[str, list[BadImage]], policy: str
) -> tuple[dict[str, LabeledImages], dict[str, list[str]]]:
    """``data.bad_images`` applied to the datasets ``named`` whose bad images are ``bad``: see
    :func:`screen`."""
    found = [b for found in bad.values() for b in found]
    if not found:
        return dict(named), {}
    if policy == "stop":
        raise BadImagesError(found)
    kept: dict[str, LabeledImages] = {}
    for key, data in named.items():
        drop = [b.index for b in bad.get(key, [])]
        keep = np.setdiff1d(np.arange(len(data)), drop)  # (N - dropped,)
        kept[key] = IndexedImages(data, keep) if drop else data
    shown = ", ".join(b.name for b in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    logger.warning(
        "data.bad_images=skip: left out %d image(s) that cannot be read: %s%s",
        len(found),
        shown,
        more,
    )
    return kept, {key: [b.name for b in found] for key, found in bad.items() if found}


def screen_splits(
    splits: Splits,
    context: Sequence[LabeledImages],
    policy: str,
    progress: bool = True,
    train: bool = True,
    cache: ImageCacheConfig | None = None,
) -> tuple[Splits, list[LabeledImages], dict[str, list[str]]]:
    """:func:`screen` a run's splits and its context datasets (``context.datasets``), served
    from the resized-image ``cache`` when given.

    ``train=False`` leaves ``data.train`` unchecked: re-evaluating a run reads only the other
    splits, and the training set is usually the largest.
    """
    named = {"data.train": splits.train} if train else {}
    named["data.val"] = splits.val
    if splits.test is not None:
        named["data.test"] = splits.test
    named |= {f"data.ood.{name}": data for name, data in splits.ood.items()}
    named |= {f"context.datasets[{i}]": data for i, data in enumerate(context)}
    kept, dropped = screen(named, policy, progress, cache)
    screened = Splits(
        train=kept.get("data.train", splits.train),
        val=kept["data.val"],
        test=kept.get("data.test"),
        ood={name: kept[f"data.ood.{name}"] for name in splits.ood},
    )
    return screened, [kept[f"context.datasets[{i}]"] for i in range(len(context))], dropped
