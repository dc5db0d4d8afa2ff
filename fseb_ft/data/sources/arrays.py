"""Source ``arrays``: an ``.npz`` file of ``images``, ``labels`` and optional ``class_names``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fseb_ft.data.images import ArrayImages, content_hash, nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.recipe import DatasetSpec

__all__ = ["load_arrays"]


def load_arrays(path: str | Path, channels: int = 3) -> ArrayImages:
    """Load an ``.npz`` with ``images``, ``labels`` and optional ``class_names``.

    ``images`` are uint8, uint16 (16-bit, scaled ``>> 8``) or floats in [0, 1]
    (:func:`fseb_ft.data.pixels.as_uint8`); they are held as uint8.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as npz:
        missing = [key for key in ("images", "labels") if key not in npz.files]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}; it has {npz.files}")
        images = npz["images"]
        labels = npz["labels"]
        class_names = [str(c) for c in npz["class_names"]] if "class_names" in npz.files else None
    identity = f"npz:{path.name}#{content_hash(images, labels)}"
    return nonempty(ArrayImages(images, labels, class_names, identity, channels))


@source("arrays")
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> ArrayImages:
    """The images of the ``.npz`` file ``spec.path`` (it holds one split)."""
    return load_arrays(Path(spec.path), channels)
