"""Source ``hub``: one split of a Hugging Face Hub dataset, through ``datasets.load_dataset``."""

from __future__ import annotations

from pathlib import Path

import datasets

from fseb_ft.data.hub_access import hub_or_cache, offline, offline_hint
from fseb_ft.data.images import HFImages, nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.errors import FsebError, first_line
from fseb_ft.recipe import DatasetSpec

__all__ = ["HubDatasetError", "load_hub"]


_LOCAL = (
    "save it once with datasets' save_to_disk (or as an image folder) and give "
    "{source: disk, path: DIR} (or imagefolder)"
)


class HubDatasetError(FsebError, ConnectionError):
    """A Hub dataset that can neither be fetched nor read from the cache."""


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
    """Load one split of a Hugging Face Hub dataset (pin ``revision`` for reproducible runs).

    Without the network (the Hub does not answer, or ``HF_HUB_OFFLINE`` is set) it comes from
    the cache at once, no retries.

    Raises:
        HubDatasetError: it is neither reachable nor cached; the message says how to work
            offline.
    """
    name = repo_id if config is None else f"{repo_id}/{config}"
    with hub_or_cache() as unreachable:
        try:
            dataset = datasets.load_dataset(
                repo_id,
                config,
                revision=revision,
                split=split,
                cache_dir=None if cache_dir is None else str(cache_dir),
            )
        except OSError as err:  # datasets' ConnectionError among them
            if unreachable is None and not offline():
                raise
            why = "HF_HUB_OFFLINE is set" if unreachable is None else "the Hub did not answer"
            raise HubDatasetError(
                f"Hub dataset {name!r}: {why} and it is not in the local cache ({first_line(err)});"
                f" {offline_hint(_LOCAL)}"
            ) from err
    identity = f"hub:{name}@{revision or 'default'}:{split}#{dataset._fingerprint}"
    return nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


@source("hub")
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> HFImages:
    """The spec's split of Hub dataset ``spec.path`` (its ``config`` and ``revision``)."""
    return load_hub(
        spec.path, spec.split, spec.revision, spec.image_column, spec.label_column,
        config=spec.config, channels=channels,
    )  # fmt: skip
