"""Source ``imagefolder``: ``path/<split>/<class>/*`` image files, listed by
:mod:`fseb_ft.data.files`."""

from __future__ import annotations

from pathlib import Path

from fseb_ft.data.files import FileImages
from fseb_ft.data.images import nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.recipe import DatasetSpec

__all__ = ["load_imagefolder"]


def load_imagefolder(path: str | Path, split: str = "train", channels: int = 3) -> FileImages:
    """Load ``path/<split>/<class>/*`` (or a flat ``path/<class>/*`` as split "train").

    Labels follow the sorted names of this split's class folders, empty folders included; any
    subfolder name is a split (``val/`` is split ``val``, and split ``validation`` finds it too).
    The folder is listed directly (:mod:`fseb_ft.data.files`), not through ``datasets``.
    """
    return nonempty(FileImages.from_folder(path, split, channels))


@source(
    "imagefolder",
    hint="Point data.train.path at the folder whose sub-folders are the classes "
    "(PATH/<split>/<class>/*.jpg or PATH/<class>/*.jpg).",
)
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> FileImages:
    """The spec's split of the image folder ``spec.path``."""
    return load_imagefolder(Path(spec.path), spec.split, channels=channels)
