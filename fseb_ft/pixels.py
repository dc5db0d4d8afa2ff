"""Image values of any kind → uint8 (H, W, C) arrays with the channels a dataset yields.

PIL images, encoded ``{"bytes", "path"}`` records, numpy arrays and torch tensors all reach
:class:`~fseb_ft.images.LabeledImages` as one uint8 layout. Imports no other fseb_ft module.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import PIL.Image
import torch

__all__ = [
    "EMPTY_FILE",
    "any_image_to_array",
    "as_uint8",
    "decode_image",
    "fit_channels",
    "pil_to_array",
]

EMPTY_FILE = "empty file (0 bytes)"
"""Why an image of zero bytes cannot be read (PIL names only its ``BytesIO`` buffer)."""

# PIL modes that hold one intensity channel; everything else is converted to RGB.
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
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
    """Accept uint8, or integer/bool pixels already within 0..255; refuse anything else."""
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    integral = np.issubdtype(image.dtype, np.integer) or image.dtype == np.bool_
    if integral and (image.size == 0 or (image.min() >= 0 and image.max() <= 255)):
        return image.astype(np.uint8)
    low, high = (image.min(), image.max()) if image.size else (None, None)
    raise ValueError(
        f"{where} has dtype {image.dtype} with range [{low}, {high}]; expected uint8 0..255"
    )


def decode_image(value: Any, where: str) -> np.ndarray:
    """Turn a PIL image, ``{"bytes", "path"}`` dict, array or nested list into an array."""
    if isinstance(value, PIL.Image.Image):
        return pil_to_array(value)
    if isinstance(value, dict):
        path, data = value.get("path"), value.get("bytes")
        if data is None and path is None:
            raise ValueError(f"{where} has neither bytes nor a path")
        try:
            with PIL.Image.open(io.BytesIO(data) if data is not None else path) as image:
                image.load()  # PIL opens lazily; decode now so a truncated file fails here
                return pil_to_array(image)
        except (OSError, ValueError, SyntaxError) as err:
            # The cause is the decoder's own words, which `fseb-ft predict` shows per image.
            cause = ValueError(EMPTY_FILE) if _is_empty(data, path) else err
            raise ValueError(f"cannot read {where} (file {path}): {cause}") from cause
    if isinstance(value, list) or hasattr(value, "__array__"):
        return np.asarray(value)  # numpy/torch-formatted datasets and nested lists
    raise TypeError(f"{where} is a {type(value).__name__}; expected a PIL image, dict or array")


def _is_empty(data: bytes | None, path: str | None) -> bool:
    """Whether the encoded image (``data``, else the file at ``path``) has zero bytes."""
    if data is not None:
        return len(data) == 0
    return path is not None and os.path.isfile(path) and os.path.getsize(path) == 0


def pil_to_array(image: PIL.Image.Image) -> np.ndarray:
    """(H, W) for single-channel modes, (H, W, 3) otherwise (palette, CMYK, RGBA → RGB)."""
    if image.mode in _GRAY_MODES:
        return np.array(image if image.mode == "L" else image.convert("L"))  # (H, W)
    return np.array(image if image.mode == "RGB" else image.convert("RGB"))  # (H, W, 3)


def any_image_to_array(image: Any, where: str) -> np.ndarray:
    """PIL, numpy (HW, HWC, CHW; uint8 or float in [0, 1]) or tensor (CHW, HW) → uint8 array."""
    if isinstance(image, PIL.Image.Image):
        return pil_to_array(image)
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
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (not np.isfinite(array).all() or array.min() < 0 or array.max() > 1):
            raise ValueError(
                f"{where} is floating point with range [{array.min()}, {array.max()}]; expected "
                "values in [0, 1] (as ToTensor gives) or uint8 0..255 — pass images before "
                "normalisation, fseb_ft normalises with the model's data config"
            )
        return np.round(array * 255.0).astype(np.uint8)
    return array
