"""What a model takes: the input size and normalisation (:class:`InputSpec`), and how evaluation
resizes an image to that size (:data:`EVAL_RESIZE`).

Light on purpose (no timm, no albumentations): the data transforms, the models and the run folder
all read these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EVAL_RESIZE", "InputSpec"]

EVAL_RESIZE: dict[str, Any] = {"interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash"}
"""How evaluation brings an image to the input size, in timm's data-config keys: squash the whole
image to (H, W) with PIL's antialiased bilinear resize, no centre-crop margin. Exported models
carry these keys in ``config.json``, so their documented transform is
:func:`fseb_ft.data.transforms.eval_transform`."""


@dataclass(frozen=True)
class InputSpec:
    """How images must be prepared for the model."""

    size: tuple[int, int]
    """(height, width) fed to the model."""
    mean: tuple[float, ...]
    """Per-channel normalisation mean in [0, 1] units."""
    std: tuple[float, ...]
    """Per-channel normalisation std in [0, 1] units."""
