"""Source ``hub``: one split of a Hugging Face Hub dataset, through ``datasets.load_dataset``."""

from __future__ import annotations

from pathlib import Path

import datasets

from fseb_ft.data.images import HFImages, nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.recipe import DatasetSpec

__all__ = ["load_hub"]


def load_hub(
    repo_id: str,
    split: str,
    revision: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    cache_dir: str | Path | None = None,
    config: str | None = None,
    channels: int = 3,
) -> HFImages:
    """Load one split of a Hugging Face Hub dataset (pin ``revision`` for reproducible runs)."""
    dataset = datasets.load_dataset(
        repo_id,
        config,
        revision=revision,
        split=split,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    name = repo_id if config is None else f"{repo_id}/{config}"
    identity = f"hub:{name}@{revision or 'default'}:{split}#{dataset._fingerprint}"
    return nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


@source("hub")
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> HFImages:
    """The spec's split of Hub dataset ``spec.path`` (its ``config`` and ``revision``)."""
    return load_hub(
        spec.path, spec.split, spec.revision, spec.image_column, spec.label_column,
        config=spec.config, channels=channels,
    )  # fmt: skip
