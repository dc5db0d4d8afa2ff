"""Loading the datasets a recipe names: every source becomes
:class:`~fseb_ft.data.images.LabeledImages`.

One module per source, each registering its loader by name (:func:`~.registry.source`): a
Hugging Face Hub id (:mod:`.hub`), an image folder (:mod:`.imagefolder`), a ``save_to_disk``
folder (:mod:`.disk`), ``.npz`` arrays (:mod:`.arrays`), IDX gzip files, MNIST-style
(:mod:`.idx`), scikit-learn's digits (:mod:`.sklearn_digits`) and a label file of image file
names (:mod:`.csv`). Importing a source module registers it: a new source is its module, its
name in the one import line of source modules below, and its name in
:data:`fseb_ft.recipe.options.SOURCES`, which a test holds equal to the registry. A source's
own functions are imported from its module (``from fseb_ft.data.sources.imagefolder import
load_imagefolder``); this package re-exports none of them.

:func:`load_spec` maps one recipe :class:`~fseb_ft.recipe.DatasetSpec` onto its source and
:func:`build_splits` a whole ``data`` section; this is the only data package that reads the
recipe.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from fseb_ft.data.holdout import hold_out
from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.data.pixels import set_max_image_pixels
from fseb_ft.data.sources import arrays, csv, disk, hub, idx, imagefolder, sklearn_digits  # noqa: F401
from fseb_ft.data.sources.registry import find_source, source
from fseb_ft.data.splits import Splits, select_classes, stratified_split
from fseb_ft.errors import FsebError
from fseb_ft.recipe import DataConfig, DatasetSpec
from fseb_ft.recipe.datasets import IN_MEMORY

__all__ = ["build_splits", "hold_outs", "load_spec", "load_split", "source"]


def load_spec(spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """Load the dataset a recipe's :class:`~fseb_ft.recipe.DatasetSpec` describes.

    The source registered as ``spec.source`` loads it; then ``classes`` filters and relabels,
    ``fraction`` keeps a seeded stratified share of each class and ``limit`` a seeded random
    subset (quick runs).
    """
    found = find_source(spec.source)
    data = found.load(spec, channels, seed)
    if spec.classes is not None and not found.selects_classes:
        data = select_classes(data, spec.classes)
    if spec.fraction is not None and spec.fraction < 1.0:
        # The complement of a stratified hold-out of 1 − fraction: the same share of each class.
        keep, _ = stratified_split(data.labels, 1.0 - spec.fraction, seed)
        data = IndexedImages(data, keep)
    if spec.limit is not None and spec.limit < len(data):
        keep = np.random.default_rng(seed).choice(len(data), spec.limit, replace=False)
        data = IndexedImages(data, np.sort(keep))
    return data


def load_split(key: str, spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """:func:`load_spec`, with an error prefixed by the recipe key: ``data.test: ...``.

    Raises:
        FsebError: the spec stands for data the Python API was given in memory.
    """
    if spec.path.startswith(IN_MEMORY):
        raise FsebError(
            f"{key} is {spec.path!r}: the run was trained through the Python API "
            "(fseb_ft.finetune) on data held in memory, which cannot be read again. Save it "
            "(datasets' save_to_disk, or an image folder) and point this key of the run's "
            "recipe.yaml at it (source: disk or imagefolder)"
        )
    try:
        return load_spec(spec, channels, seed)
    except (ValueError, TypeError, OSError) as err:
        try:
            prefixed = type(err)(f"{key}: {err}")
        except TypeError:  # an exception type that needs other arguments
            prefixed = ValueError(f"{key}: {err}")
        raise prefixed from err


def hold_outs(
    full: LabeledImages, cfg: DataConfig, seed: int
) -> tuple[LabeledImages, LabeledImages | None, LabeledImages | None]:
    """(train, validation hold-out, test hold-out) of the training images ``full``.

    The test hold-out is ``data.test_fraction`` of them (``None`` when it is null), the
    validation one ``data.val_fraction`` (``None`` with ``data.val``), taken from the rest;
    seeded with ``cfg.draw_seed(seed)`` (``data.seed``, else ``train.seed``), stratified, and of
    whole groups when ``full`` has groups (:func:`fseb_ft.data.holdout.hold_out`). Without
    either, train is ``full`` itself.
    """
    seed = cfg.draw_seed(seed)
    val_fraction = cfg.val_fraction if cfg.val is None else None
    if val_fraction is None and cfg.test_fraction is None:
        return full, None, None
    parts = hold_out(full.labels, full.groups, val_fraction, cfg.test_fraction, seed)
    val = None if parts.val is None else IndexedImages(full, parts.val)
    test = None if parts.test is None else IndexedImages(full, parts.test)
    return IndexedImages(full, parts.train), val, test


def build_splits(cfg: DataConfig, seed: int) -> Splits:
    """Load train/val/test/OOD; hold out validation and test parts of train where the recipe
    asks (:func:`hold_outs`); every draw seeded with ``cfg.draw_seed(seed)`` (``data.seed``,
    else ``seed``, ``train.seed``). ``data.max_image_pixels`` becomes PIL's limit here, for this
    process and its workers: every command that reads a recipe's data passes here first."""
    set_max_image_pixels(cfg.max_image_pixels)
    seed = cfg.draw_seed(seed)
    full = load_split("data.train", cfg.train, cfg.channels, seed)
    train, val, test = hold_outs(full, cfg, seed)
    if cfg.val is not None:
        val = load_split("data.val", cfg.val, cfg.channels, seed)
    if cfg.test is not None:
        test = load_split("data.test", cfg.test, cfg.channels, seed)
    ood = {
        name: load_split(f"data.ood.{name}", spec, cfg.channels, seed)
        for name, spec in cfg.ood.items()
    }
    # Validation is data.val or a hold-out of data.val_fraction: the recipe's rules give one.
    return Splits(train=train, val=cast(LabeledImages, val), test=test, ood=ood)
