"""Image values of any kind → uint8 (H, W, C) arrays with the channels a dataset yields.

PIL images, encoded ``{"bytes", "path"}`` records, numpy arrays and torch tensors all reach
:class:`~fseb_ft.data.images.LabeledImages` as one uint8 layout. 16-bit, 32-bit and floating-point
pixels become 8 bits in one place, :func:`as_uint8`, for training, evaluation and ``fseb-ft
predict`` alike. A caller that needs less than the full resolution (a training transform that
shrinks every image) names the least size it needs, and a JPEG is decoded at a reduced scale
(:data:`MinSize`). An encoded image is turned upright as its EXIF orientation says
(:func:`upright`), as viewers and ``datasets`` show it. Imports no other fseb_ft module.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import PIL.Image
import PIL.ImageOps
import torch
from PIL import ExifTags

__all__ = [
    "EMPTY_FILE",
    "WIDE_MODES",
    "MinSize",
    "any_image_to_array",
    "as_uint8",
    "decode_image",
    "fit_channels",
    "pil_to_array",
    "set_max_image_pixels",
    "unreadable_cause",
    "upright",
]

EMPTY_FILE = "empty file (0 bytes)"
"""Why an image of zero bytes cannot be read (PIL names only its ``BytesIO`` buffer)."""

# PIL modes that hold one intensity channel; everything else is converted to RGB.
_GRAY_MODES = {"1", "L", "LA"}
WIDE_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
"""PIL modes of more than 8 bits per pixel, read as they are stored and brought to 8 bits by
:func:`as_uint8` (PIL's ``convert("L")`` clips them at 255: a 16-bit image turns white)."""

MinSize = Callable[[tuple[int, int]], tuple[int, int]]
"""The least (width, height) a caller needs of an image of (width, height), both upright (its EXIF
orientation applied, as the caller sees it; :func:`decode_image` turns them to the stored
image's for the decoder). A JPEG is then decoded at the smallest of libjpeg's scales 1/2, 1/4,
1/8 that is at least that size (PIL's ``Image.draft``: the inverse DCT of fewer coefficients, a
downscale in the frequency domain that skips most of the inverse DCT and colour conversion of a
full decode); other formats in full."""

_LIMIT_ENV = "FSEB_FT_MAX_IMAGE_PIXELS"
"""Carries ``data.max_image_pixels`` to worker processes started afresh (spawn, forkserver: the
default on macOS), which import this module and so apply it; forked ones inherit PIL's setting."""

_TRANSPOSING = frozenset({5, 6, 7, 8})
"""EXIF orientations whose undoing swaps width and height (a quarter turn, a transposition)."""

# ITU-R BT.601 luma weights, the same PIL uses for convert("L").
_LUMA = np.array([0.299, 0.587, 0.114])


def fit_channels(image: np.ndarray, channels: int, where: str) -> np.ndarray:
    """Return ``image`` as uint8 (H, W, channels): expand gray, drop alpha, or take luma."""
    image = as_uint8(image, where)
    if image.ndim == 2:
        image = image[:, :, None]  # (H, W, 1)
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"{where} has shape {image.shape}; expected (H, W) or (H, W, 1|3|4)")
    if image.shape[2] == 4:
        image = image[:, :, :3]  # (H, W, 3): alpha carries no class information
    if channels == image.shape[2]:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=2)  # (H, W, 3)
    return np.round(image @ _LUMA).astype(np.uint8)[:, :, None]  # (H, W, 1)


def as_uint8(image: np.ndarray, where: str) -> np.ndarray:
    """Pixels of any numeric type as uint8, by the bit depth of their type, never of the image.

    - ``uint8`` as it is; ``bool`` (1 bit, PIL mode ``1``) as 0 / 255.
    - Wider unsigned integers (``uint16``, which PIL's 16-bit modes ``I;16*`` give, ``uint32``,
      ``uint64``) by the bit depth of their container: ``value >> (bits - 8)``, so 16-bit
      0..65535 becomes 0..255 in order, as torchvision's ``to_dtype(..., scale=True)`` does.
      Not by each image's range, which would give the same stored value another pixel in every
      image and brighten a dark one. So 12-bit data in a 16-bit container (values up to 4095)
      comes out 0..15, nearly black: shift it up 4 bits (``<< 4``) before (docs/troubleshooting.md).
    - Floating point (PIL mode ``F``): finite values in [0, 1], as ``ToTensor`` gives, times 255
      and rounded; others are refused.
    - Signed integers (``int8`` … ``int64``, PIL mode ``I``): what numpy, torch and PIL give
      integers of any depth (a list of ints, an int64 tensor, a 16-bit PGM, a 32-bit TIFF), so
      their type tells no bit depth: values 0..255 are taken as they are, others refused.

    Raises:
        ValueError: floating-point pixels outside [0, 1] or not finite, signed integers
            outside 0..255, or a non-numeric type; the message names ``where`` and the range.
    """
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.bool_:
        return image.astype(np.uint8) * np.uint8(255)
    if np.issubdtype(image.dtype, np.unsignedinteger):
        # numpy, not torchvision's to_dtype: torch < 2.3 (which fseb_ft allows) has no uint16.
        return (image >> (8 * image.dtype.itemsize - 8)).astype(np.uint8)
    if image.dtype.kind not in "if":  # signed integers, floating point
        raise ValueError(f"{where} has pixels of type {image.dtype}; expected numbers")
    low, high = (image.min(), image.max()) if image.size else (0, 0)  # NaN if any is NaN
    if np.issubdtype(image.dtype, np.floating):
        if np.isfinite([low, high]).all() and low >= 0 and high <= 1:
            return np.round(image * 255.0).astype(np.uint8)
        raise ValueError(
            f"{where} has floating-point pixels ({image.dtype}) in [{low}, {high}]; expected "
            "values in [0, 1] (as ToTensor gives), or uint8 0..255 — pass images before "
            "normalisation, fseb_ft normalises with the model's data config"
        )
    if low >= 0 and high <= 255:
        return image.astype(np.uint8)
    raise ValueError(
        f"{where} has signed integer pixels ({image.dtype}) in [{low}, {high}], which tell no "
        "bit depth; expected 0..255 — give 16-bit images as uint16 (scaled >> 8), or uint8"
    )


def decode_image(value: Any, where: str, min_size: MinSize | None = None) -> np.ndarray:
    """Turn a PIL image, ``{"bytes", "path"}`` dict, array or nested list into an array.

    Every image is turned upright as its EXIF orientation says (:func:`upright`), a PIL image
    that still carries the tag too. An encoded JPEG is decoded at a reduced scale when
    ``min_size`` allows it (:data:`MinSize`, of the upright image); without ``min_size``, every
    image at its stored size.
    """
    if isinstance(value, PIL.Image.Image):
        return pil_to_array(upright(value))
    if isinstance(value, dict):
        path, data = value.get("path"), value.get("bytes")
        if data is None and path is None:
            raise ValueError(f"{where} has neither bytes nor a path")
        try:
            # Without bytes, the path is set (checked above).
            source = io.BytesIO(data) if data is not None else cast(str, path)
            with PIL.Image.open(source) as image:
                if min_size is not None and image.format == "JPEG":
                    image.draft(None, _stored_min_size(image, min_size))  # mode unchanged
                image.load()  # PIL opens lazily; decode now so a truncated file fails here
                return pil_to_array(upright(image))
        except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as err:
            # The cause is the decoder's own words, which `fseb-ft predict` shows per image.
            cause = unreadable_cause(err, data, path)
            raise ValueError(f"cannot read {where} (file {path}): {cause}") from cause
    if isinstance(value, list) or hasattr(value, "__array__"):
        return np.asarray(value)  # numpy/torch-formatted datasets and nested lists
    raise TypeError(f"{where} is a {type(value).__name__}; expected a PIL image, dict or array")


def set_max_image_pixels(limit: int | None) -> None:
    """PIL's decompression-bomb limit (``data.max_image_pixels``) for this process and the
    workers it starts: PIL warns on an image of more pixels and refuses one of more than twice
    as many; ``None``: no limit."""
    PIL.Image.MAX_IMAGE_PIXELS = limit
    os.environ[_LIMIT_ENV] = str(limit)


def _inherit_max_image_pixels() -> None:
    """Apply the limit a parent process set (:func:`set_max_image_pixels`), if any."""
    value = os.environ.get(_LIMIT_ENV)
    if value is not None:
        PIL.Image.MAX_IMAGE_PIXELS = None if value == "None" else int(value)


_inherit_max_image_pixels()


def upright(image: PIL.Image.Image) -> PIL.Image.Image:
    """``image`` turned and mirrored as its EXIF orientation says, in a copy without the tag
    (``PIL.ImageOps.exif_transpose``): a portrait phone photo stored sideways with orientation
    6 is read upright. An image without one (or already turned: the tag is gone) is returned
    as it is, uncopied."""
    if _orientation(image) == 1:
        return image
    return PIL.ImageOps.exif_transpose(image)


def _orientation(image: PIL.Image.Image) -> int:
    """The EXIF orientation (1: as stored), which ``exif_transpose`` reads too."""
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def _stored_min_size(image: PIL.Image.Image, min_size: MinSize) -> tuple[int, int]:
    """``min_size`` of the upright image, as the (width, height) of the image as stored: the
    transform sees the image turned, so its crops are drawn on the turned size."""
    if _orientation(image) not in _TRANSPOSING:
        return min_size(image.size)
    width, height = min_size(image.size[::-1])
    return height, width


def unreadable_cause(err: BaseException, data: bytes | None, path: str | None) -> BaseException:
    """Why an image (``data``, else the file at ``path``) could not be read, in a user's words:
    :data:`EMPTY_FILE`, a symbolic link to nothing (the OS says only "no such file"), a missing
    file, or ``err``, the decoder's own."""
    if _is_empty(data, path):
        return ValueError(EMPTY_FILE)
    if isinstance(err, PIL.Image.DecompressionBombError):
        return ValueError(f"{err} Raise data.max_image_pixels (PIL refuses twice it) to read it.")
    if data is None and path is not None and not os.path.exists(path):
        if os.path.islink(path):
            return FileNotFoundError(f"broken symbolic link to {os.readlink(path)}")
        return FileNotFoundError("no such file")  # a label file's row whose image is missing
    return err


def _is_empty(data: bytes | None, path: str | None) -> bool:
    """Whether the encoded image (``data``, else the file at ``path``) has zero bytes."""
    if data is not None:
        return len(data) == 0
    return path is not None and os.path.isfile(path) and os.path.getsize(path) == 0


def pil_to_array(image: PIL.Image.Image) -> np.ndarray:
    """(H, W) for single-channel modes, (H, W, 3) otherwise (palette, CMYK, RGBA → RGB).

    Modes of more than 8 bits (:data:`WIDE_MODES`) keep their stored values and type (uint16,
    int32, float32): :func:`as_uint8` scales them.
    """
    if image.mode in WIDE_MODES:
        return np.array(image)  # (H, W)
    if image.mode in _GRAY_MODES:
        return np.array(image if image.mode == "L" else image.convert("L"))  # (H, W)
    return np.array(image if image.mode == "RGB" else image.convert("RGB"))  # (H, W, 3)


def any_image_to_array(image: Any, where: str) -> np.ndarray:
    """PIL (upright: :func:`upright`), numpy (HW, HWC, CHW) or tensor (CHW, HW) → array
    (H, W[, C]) of the same type.

    Its pixels become uint8 in :func:`fit_channels` (:func:`as_uint8`: uint8, uint16, or floats
    in [0, 1] as ``ToTensor`` gives).
    """
    if isinstance(image, PIL.Image.Image):
        return pil_to_array(upright(image))
    chw = isinstance(image, torch.Tensor)
    array = image.detach().cpu().numpy() if chw else np.asarray(image)
    if array.ndim == 3:
        channel_first = array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4)
        if chw or channel_first:
            array = np.moveaxis(array, 0, -1)  # (C, H, W) -> (H, W, C)
    elif array.ndim != 2:
        raise ValueError(
            f"{where} has shape {array.shape}; expected (H, W), (H, W, C) or (C, H, W)"
        )
    return array
