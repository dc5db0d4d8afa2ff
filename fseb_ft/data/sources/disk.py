"""Source ``disk``: a folder written by ``datasets``' ``save_to_disk``."""

from __future__ import annotations

from pathlib import Path

import datasets

from fseb_ft.data.images import HFImages, nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.recipe import DatasetSpec

__all__ = ["load_disk"]


def load_disk(
    path: str | Path,
    split: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    channels: int = 3,
) -> HFImages:
    """Load a ``save_to_disk`` folder: a ``Dataset``, or one ``split`` of a ``DatasetDict``.

    ``split`` may be omitted for a ``DatasetDict`` with a single split.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset folder {path} does not exist")
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in loaded:
            raise ValueError(f"split {split!r} not found in {path}; splits are {splits}")
        dataset = loaded[split]
    else:
        dataset = loaded
        if split is not None and dataset.split is not None and str(dataset.split) != split:
            raise ValueError(f"{path} holds split {str(dataset.split)!r}, not {split!r}")
    identity = f"disk:{path}:{split or dataset.split}#{dataset._fingerprint}"
    return nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


@source("disk")
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> HFImages:
    """The spec's split of the ``save_to_disk`` folder ``spec.path``."""
    return load_disk(Path(spec.path), spec.split, spec.image_column, spec.label_column, channels)
