"""A run's checks of its loaded data against its recipe, made before anything is written: two
training classes, ``eval.group_by``'s column, the class count of ``model.num_classes`` and of the
two-class metrics a recipe selects or reports, the length of a ``train.class_weights`` list, and
laplace-torch for ``eval.laplace``."""

from __future__ import annotations

import logging

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.sources.registry import find_source
from fseb_ft.data.splits import Splits, require_two_classes
from fseb_ft.evaluation.groups import reported_groups
from fseb_ft.evaluation.laplace import laplace_torch
from fseb_ft.evaluation.metrics import METRIC_REGISTRY
from fseb_ft.method.likelihood import check_class_weights
from fseb_ft.recipe import ConfigError, DatasetSpec, Recipe
from fseb_ft.recipe.datasets import IN_MEMORY
from fseb_ft.recipe.options import BINARY_TASK_METRICS

__all__ = [
    "check_data",
    "check_select_metric",
    "class_count",
    "ordinal_warnings",
    "reported_task_metrics",
    "require_training_classes",
]

logger = logging.getLogger(__name__)


def check_data(recipe: Recipe, splits: Splits) -> None:
    """What the loaded data must satisfy before anything is written: two training classes,
    ``eval.group_by``'s column, the class count of a two-class ``train.select_metric`` and of a
    ``train.class_weights`` list (before the screen and the cache's build); and with
    ``eval.laplace``, laplace-torch installed (not found only after training)."""
    require_training_classes(recipe.data.train, splits.train)
    reported_groups(splits, recipe.eval.group_by)
    num_classes = recipe.model.num_classes or splits.train.num_classes
    check_select_metric(recipe, num_classes)
    check_class_weights(recipe.train.class_weights, num_classes)
    if recipe.eval.laplace:
        laplace_torch()


def require_training_classes(spec: DatasetSpec, train: LabeledImages) -> None:
    """Stop a run whose training images are of fewer than two classes, naming where they are
    from: an image folder pointed one level too high (its only class ``train_images``)."""
    if spec.path.startswith(IN_MEMORY):
        require_two_classes(train, f"train= ({train.identity})", "Pass images of every class.")
        return
    where = ", ".join(
        [f"{spec.source} {spec.path}".strip(), f"split {spec.split}"]
        + ([f"classes {list(spec.classes)}"] if spec.classes is not None else [])
    )
    require_two_classes(train, f"data.train ({where})", find_source(spec.source).hint)


def class_count(recipe: Recipe, splits: Splits) -> tuple[int, list[str]]:
    """The head's class count K, after checking the splits' labels; and the data warnings."""
    found = splits.train.num_classes
    k = recipe.model.num_classes or found
    if k < found:
        raise ValueError(
            f"model.num_classes={k} but the training labels go up to {found - 1}; "
            f"set model.num_classes to at least {found} or null"
        )
    return k, splits.check_labels(k) + ordinal_warnings(recipe, splits.train)


def ordinal_warnings(recipe: Recipe, train: LabeledImages) -> list[str]:
    """With ``qwk`` in ``eval.metrics`` (whose penalty grows with the distance between label
    indices): a warning when the classes' order is likely not the grades' own. Names a label
    file or folders gave unordered are sorted alphabetically (``mild`` before ``none``); integer
    labels of a label file that start at 1 leave class 0 without images, never trained. Either
    way ``classes`` gives the order; a recipe that gives it is not warned."""
    spec = recipe.data.train
    if "qwk" not in recipe.eval.metrics or spec.classes is not None:
        return []
    names = list(train.class_names)
    integers = all(name.lstrip("-").isdigit() for name in names)
    if spec.source in ("csv", "imagefolder") and not integers:
        return [
            f"eval.metrics has qwk, which counts how far apart label indices are, but the "
            f"class names were sorted alphabetically: {names}; if that is not their order, "
            "give it: data.train.classes: [lowest, ..., highest]"
        ]
    if spec.source == "csv" and integers and len(names) > 1 and not (train.labels == 0).any():
        grades = ", ".join(names[1:])
        return [
            f"eval.metrics has qwk, but the integer labels start at 1: class 0 has no images "
            f"and is never trained; give data.train.classes: [{grades}] to make them classes "
            f"0..{len(names) - 2}"
        ]
    return []


def check_select_metric(recipe: Recipe, num_classes: int) -> None:
    """Stop, before anything is written, a run that selects on a two-class metric with another
    class count (a recipe that states its count stops at load already)."""
    select = recipe.train.select_metric
    if select in BINARY_TASK_METRICS and num_classes != 2:
        raise ConfigError(
            f"train.select_metric={select!r}: defined for two classes only (label 1 the "
            f"positive one), but this run has {num_classes}; select on another metric"
        )


def reported_task_metrics(recipe: Recipe, num_classes: int, main: bool) -> tuple[str, ...]:
    """The metrics of ``eval.metrics`` defined for ``num_classes`` classes; the others are left
    out, with a log line (on the main process, ``main``)."""
    kept = tuple(n for n in recipe.eval.metrics if METRIC_REGISTRY[n].applies_to(num_classes))
    left_out = [n for n in recipe.eval.metrics if n not in kept]
    if left_out and main:
        logger.warning(
            "eval.metrics: leaving out %s, defined for two classes only; this run has %d",
            ", ".join(left_out),
            num_classes,
        )
    return kept
