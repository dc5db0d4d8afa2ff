"""Python API: fine-tune on datasets you already hold in memory.

    import fseb_ft
    results = fseb_ft.finetune(
        "recipes/cifar10.yaml",
        train=hf_train,              # a datasets.Dataset or torch Dataset of (image, label)
        test=hf_test,
        ood={"cifar100": hf_cifar100_test},
        train__epochs=5,             # recipe overrides (see below)
        output__dir="runs/cifar10-api",
    )

``fseb_ft.finetune(...)`` and ``fseb_ft.api.finetune(...)`` are the same call. The recipe's
model, context, objective, optimiser, loop, evaluation and output settings apply; its
``data.train/val/test/ood`` sources are replaced by the datasets passed here (the rest of
``data``: batch size, augmentation, channels, ``val_fraction``, normalisation, still applies).

Overrides are keyword arguments, in any of three spellings (values are Python objects, not
YAML text):

- a section mapping, merged into the recipe: ``fseb={"reg_scale": 0}``;
- ``section__key=value`` (double underscore for each dot): ``fseb__reg_scale=0``,
  ``output__dir="runs/mine"``;
- dotted keys through a dict: ``**{"fseb.reg_scale": 0, "train.epochs": 1}``.

``train=`` is the training dataset, so the ``train`` *section* takes the second or third
spelling (``train__epochs=5``), never ``train={...}``.

The run directory (``output.dir``) gets everything a CLI run writes. Its ``recipe.yaml`` names
the data ``in-memory:<split>`` and ``run.json`` records the datasets' provenance; re-evaluating
such a run with ``python -m fseb_ft.evaluate`` needs the data saved to disk and the recipe's
``data`` pointing at it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fseb_ft.config import (
    ConfigError,
    Recipe,
    parent_section,
    plain_tree,
    read_recipe_file,
    recipe_from_dict,
)

__all__ = ["finetune", "resolve_recipe"]

_SECTIONS = tuple(f.name for f in dataclasses.fields(Recipe))
# Stands in for a dataset held in memory in the resolved recipe (run.json has its provenance).
_IN_MEMORY = "in-memory:{}"


def finetune(
    recipe: str | Path | Recipe | Mapping[str, Any] | None = None,
    train: Any = None,
    val: Any = None,
    test: Any = None,
    ood: Mapping[str, Any] | None = None,
    *,
    class_names: Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Fine-tune with FS-EB (or PS-MAP, ``fseb__reg_scale=0``) on in-memory datasets.

    Args:
        recipe: a YAML recipe path, a :class:`~fseb_ft.config.Recipe`, a mapping of sections as
            in a YAML file, or ``None`` for all defaults (ImageNet-pretrained ResNet-18).
        train: the training data: a ``datasets.Dataset`` (image and label columns found from
            their ``Image`` / ``ClassLabel`` features, else ``image``/``img`` and
            ``label``/``labels``), any map-style torch ``Dataset`` of ``(image, label)`` pairs
            (image: PIL, numpy (H, W[, C]) uint8, or a (C, H, W) tensor in [0, 1] or uint8), or a
            :class:`fseb_ft.images.LabeledImages`.
        val: validation data for model selection; ``None`` holds out a stratified, seeded
            ``data.val_fraction`` of ``train``.
        test: the in-distribution test data the results are reported on (required).
        ood: named semantic-shift sets scored against ``test`` (labels are not used).
        class_names: class names, index = label; default: the ``ClassLabel`` names, the
            dataset's ``classes`` attribute, else ``"0" .. "K-1"``.
        image_column: image column (HF) or item key (torch datasets yielding mappings).
        label_column: label column (HF) or item key.
        **overrides: recipe overrides, see the module docstring.

    Returns:
        The results dict of :func:`fseb_ft.finetune.run` (``test``, ``ood``, ``training``),
        also written to ``output.dir/results.json``.
    """
    from fseb_ft.images import Splits, as_labeled_images

    if train is None:
        raise TypeError("finetune() needs train=: the training dataset")
    if test is None:
        raise TypeError(
            "finetune() needs test=: the results are reported on the test split (the "
            "validation data only selects the checkpoint and is never reported)"
        )
    resolved = resolve_recipe(recipe, overrides, has_val=val is not None, ood_names=ood or {})
    wrap = {
        "class_names": class_names,
        "channels": resolved.data.channels,
        "image_column": image_column,
        "label_column": label_column,
    }
    splits = Splits(
        train=as_labeled_images(train, **wrap),
        val=None,  # set below
        test=as_labeled_images(test, **wrap),
        ood={name: as_labeled_images(data, **wrap) for name, data in (ood or {}).items()},
    )
    if val is None:
        splits.train, splits.val = _hold_out(splits.train, resolved)
    else:
        splits.val = as_labeled_images(val, **wrap)
    from fseb_ft.finetune import run

    return run(resolved, splits=splits)


def resolve_recipe(
    recipe: str | Path | Recipe | Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None = None,
    has_val: bool = False,
    ood_names: Sequence[str] | Mapping[str, Any] = (),
) -> Recipe:
    """The validated recipe ``finetune`` runs: ``recipe`` plus ``overrides``, data in memory.

    ``data.train``, ``data.test`` (and ``data.val`` when ``has_val``, ``data.ood`` for
    ``ood_names``) become ``in-memory:<name>`` placeholders: the datasets passed to
    :func:`finetune` replace them.
    """
    raw = _raw_recipe(recipe)
    for key, value in (overrides or {}).items():
        _apply(raw, key, value)
    data = raw.setdefault("data", {})
    if not isinstance(data, dict):
        raise ConfigError(f"data must be a mapping of keys, got {data!r}")
    data["train"] = _placeholder("train")
    data["val"] = _placeholder("val") if has_val else None
    data["test"] = _placeholder("test")
    data["ood"] = {str(name): _placeholder(f"ood/{name}") for name in ood_names}
    return recipe_from_dict(raw)


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
    parts = key.replace("__", ".").split(".")
    if parts[0] not in _SECTIONS or not all(parts):
        raise ConfigError(
            f"unknown override {key!r}: use a recipe section {list(_SECTIONS)} as "
            "section={...}, section__key=value or **{'section.key': value}"
        )
    node = parent_section(raw, parts)
    last = parts[-1]
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        _merge(node[last], value)
    else:
        node[last] = plain_tree(copy.deepcopy(value))


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = plain_tree(copy.deepcopy(value))


def _placeholder(name: str) -> dict[str, str]:
    return {"source": "arrays", "path": _IN_MEMORY.format(name), "split": name}


def _hold_out(full: Any, recipe: Recipe) -> tuple[Any, Any]:
    """(train, val): a stratified, seeded ``data.val_fraction`` of ``full`` held out."""
    from fseb_ft.images import IndexedImages, stratified_split

    train_idx, val_idx = stratified_split(full.labels, recipe.data.val_fraction, recipe.train.seed)
    return IndexedImages(full, train_idx), IndexedImages(full, val_idx)
