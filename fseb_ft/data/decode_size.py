"""How small a training transform lets an image be decoded.

A pipeline whose first step shrinks every image (a resize, or a random resized crop whose smallest
crop is still larger than its output) loses nothing when a JPEG is decoded at a reduced scale that
the step still only shrinks (PIL's ``draft``, DCT-domain downscaling): decoding gets several times
cheaper on photos much larger than the input. Evaluation decodes in full, so its pixels are timm's
eval transform of the stored image, as the model card documents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import albumentations as A

from fseb_ft.data.pixels import MinSize

__all__ = ["ShrinkOnly", "min_decode_size"]


@dataclass(frozen=True)
class ShrinkOnly:
    """The least size to decode an image at for a first step that then still only shrinks it.

    Called with an image's (width, height) as the step sees it (upright: its EXIF orientation
    applied), it returns the least (width, height) to decode
    (:data:`~fseb_ft.data.pixels.MinSize`). A resize to ``size`` needs the image at least that
    size; a random resized crop needs its smallest crop at least that size (:func:`_smallest_crop`),
    so that every crop it draws is shrunk, never enlarged, to ``size``. The crop is drawn relative
    to the image the step sees (its area share and aspect ratio, its position uniform), so a
    smaller decode moves crops only by the rounding to whole pixels: the augmentation's
    distribution is the same, and each crop loses no detail the output could hold.
    """

    size: tuple[int, int]
    """(height, width) the step outputs."""
    scale: float | None = None
    """A random resized crop's smallest share of the image's area; None for a resize of the
    whole image."""
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """A random resized crop's range of aspect ratios (width / height)."""

    def __call__(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """The least (width, height) of an image of ``image_size`` (width, height), upright."""
        width, height = image_size
        crop_h: float
        crop_w: float
        crop_h, crop_w = height, width
        if self.scale is not None:
            crop_h, crop_w = _smallest_crop(height, width, self.scale, self.ratio)
        factor = min(1.0, max(self.size[0] / crop_h, self.size[1] / crop_w))
        return math.ceil(width * factor), math.ceil(height * factor)


def _smallest_crop(
    height: int, width: int, scale: float, ratio: tuple[float, float]
) -> tuple[float, float]:
    """Lower bounds of the (height, width) of any crop albumentations' RandomResizedCrop draws.

    A drawn crop has area ``s·H·W`` (s ≥ ``scale``) and aspect ratio r in ``ratio``: its height is
    at least √(scale·H·W / r_max), its width √(scale·H·W · r_min). After 10 draws that do not fit
    it falls back to the largest centre crop of a ratio in range: height at least min(H, W / r_min),
    width min(W, H · r_max).
    """
    area = scale * height * width
    crop_h = min(math.sqrt(area / ratio[1]), height, width / ratio[0])
    crop_w = min(math.sqrt(area * ratio[0]), width, height * ratio[1])
    return crop_h, crop_w


def min_decode_size(transform: Any) -> MinSize | None:
    """How small ``transform`` lets an image be decoded (a :class:`ShrinkOnly`), or None.

    Only an albumentations pipeline that always starts with a resize or a random resized crop
    (the training and perturbation transforms) allows a smaller decode. Anything else, the eval
    transform included, decodes in full: evaluation's pixels are what timm's eval transform makes
    of the stored image, as the model card documents.
    """
    if not isinstance(transform, A.Compose) or transform.p != 1 or not transform.transforms:
        return None
    first = transform.transforms[0]
    if first.p != 1:
        return None
    if isinstance(first, A.RandomResizedCrop):
        ratio = (float(first.ratio[0]), float(first.ratio[1]))
        return ShrinkOnly((first.size[0], first.size[1]), float(first.scale[0]), ratio)
    if isinstance(first, A.Resize):
        return ShrinkOnly((first.height, first.width))
    return None
