"""The in-memory API's inputs: a recipe (file, :class:`~fseb_ft.recipe.Recipe`, mapping or none)
and Python overrides → the validated recipe whose data are ``in-memory:<split>`` placeholders;
the datasets given in memory → the run's :class:`~fseb_ft.data.splits.Splits`.

:func:`fseb_ft.finetune` runs what these return (``engine.run.run(recipe, splits=...)``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.sources import hold_outs
from fseb_ft.data.splits import Splits
from fseb_ft.data.user_datasets import as_labeled_images
from fseb_ft.recipe import (
    ConfigError,
    Recipe,
    override_path,
    read_recipe_file,
    recipe_from_dict,
)
from fseb_ft.recipe.datasets import IN_MEMORY
from fseb_ft.recipe.schema import plain_tree, set_key

__all__ = ["in_memory_splits", "resolve_recipe"]

_SECTIONS = tuple(f.name for f in dataclasses.fields(Recipe))


def resolve_recipe(
    recipe: str | Path | Recipe | Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None = None,
    has_val: bool = False,
    ood_names: Sequence[str] | Mapping[str, Any] = (),
    has_test: bool = True,
) -> Recipe:
    """The validated recipe ``finetune`` runs: ``recipe`` plus ``overrides``, data in memory.

    ``data.train`` (``data.test`` when ``has_test``, ``data.val`` when ``has_val``, ``data.ood``
    for ``ood_names``) become ``in-memory:<name>`` placeholders: the datasets passed to
    :func:`fseb_ft.finetune.finetune` replace them.
    """
    raw = _raw_recipe(recipe)
    for key, value in (overrides or {}).items():
        _apply(raw, key, value)
    data = raw.setdefault("data", {})
    if not isinstance(data, dict):
        raise ConfigError(f"data must be a mapping of keys, got {data!r}")
    data["train"] = _placeholder("train")
    data["val"] = _placeholder("val") if has_val else None
    data["test"] = _placeholder("test") if has_test else None
    data["ood"] = {str(name): _placeholder(f"ood/{name}") for name in ood_names}
    return recipe_from_dict(raw)


def in_memory_splits(
    recipe: Recipe,
    train: Any,
    val: Any = None,
    test: Any = None,
    ood: Mapping[str, Any] | None = None,
    *,
    class_names: Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> Splits:
    """The datasets given to :func:`fseb_ft.finetune.finetune` as the run's splits, each
    wrapped by :func:`~fseb_ft.data.user_datasets.as_labeled_images` with ``data.channels``;
    without ``val``, a stratified, seeded ``data.val_fraction`` of ``train`` held out, and
    without ``test`` its ``data.test_fraction`` when set
    (:func:`~fseb_ft.data.sources.hold_outs`)."""
    wrap: dict[str, Any] = {
        "class_names": class_names,
        "channels": recipe.data.channels,
        "image_column": image_column,
        "label_column": label_column,
    }
    full = as_labeled_images(train, **wrap)
    train_images, val_images, test_images = hold_outs(full, recipe.data, recipe.train.seed)
    if val is not None:
        val_images = as_labeled_images(val, **wrap)
    if test is not None:
        test_images = as_labeled_images(test, **wrap)
    ood_images = {name: as_labeled_images(data, **wrap) for name, data in (ood or {}).items()}
    # Without val, the recipe's rules give a val_fraction: a hold-out.
    val_split = cast(LabeledImages, val_images)
    return Splits(train=train_images, val=val_split, test=test_images, ood=ood_images)


def _raw_recipe(recipe: str | Path | Recipe | Mapping[str, Any] | None) -> dict[str, Any]:
    """A mutable nested dict of the recipe, as it would be read from YAML."""
    if recipe is None:
        return {}
    if isinstance(recipe, Recipe):
        return plain_tree(dataclasses.asdict(recipe))
    if isinstance(recipe, Mapping):
        return plain_tree(copy.deepcopy(dict(recipe)))
    return read_recipe_file(recipe)


def _apply(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set one override: ``section={...}`` merges, ``a__b=v`` and ``a.b=v`` set a dotted key."""
    parts = override_path(key.replace("__", "."))
    if parts[0] not in _SECTIONS or not all(parts):
        raise ConfigError(
            f"unknown override {key!r}: use a recipe section {list(_SECTIONS)} as "
            "section={...}, section__key=value or **{'section.key': value}"
        )
    set_key(raw, parts, value, merge=True)


def _placeholder(name: str) -> dict[str, str]:
    """The dataset spec that stands for the split ``name`` given in memory."""
    return {"source": "arrays", "path": f"{IN_MEMORY}{name}", "split": name}
