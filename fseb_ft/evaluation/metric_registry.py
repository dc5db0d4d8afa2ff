"""The in-distribution metrics by name: ``@metric("accuracy", title=..., scale=...,
higher_is_better=True)`` registers a function of :class:`MetricInputs` as one metric.

:func:`fseb_ft.evaluation.metrics.classification_metrics` computes every registered metric that
applies to the task, in registration order; that order is the order of the results' keys, so a
new metric goes after the existing ones. A *task* metric (``task=True``: quadratic weighted
kappa, balanced accuracy, …, :mod:`fseb_ft.evaluation.task_metrics`) joins a bundle only when it
is asked for (``eval.metrics``, ``train.select_metric``), after the others (:func:`bundle`). The
bundle's metrics are registered in :mod:`fseb_ft.evaluation.metrics`, which re-exports this
module's names and imports the task metrics: import them from there, so that the registry is
filled. Tables take a metric's title and scale from here, checkpoint selection and sweeps its
direction (:func:`higher_is_better`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from torch import Tensor

from fseb_ft.recipe import VAL_OOD_METRIC_SUFFIX

__all__ = ["METRIC_REGISTRY", "Metric", "MetricInputs", "bundle", "higher_is_better", "metric"]


@dataclass(frozen=True)
class MetricInputs:
    """What every metric of one set of predictions reads, computed once for all of them.

    Attributes:
        log_probs: ``(N, K)`` natural-log class probabilities, as given (checked).
        labels: ``(N,)`` integer labels in ``[0, K)``, on the device of ``probs``.
        probs: ``(N, K)`` float64 class probabilities, ``exp(log_probs)``.
        correct: ``(N,)`` bool, whether the arg-max class is the label.
        confidence: the confidence scores by name (``max_prob``, ``neg_entropy``;
            :func:`~fseb_ft.evaluation.metrics.confidence_scores`), each ``(N,)`` float64.
        selective: for each confidence score, its selective-prediction curve and areas
            (:func:`~fseb_ft.evaluation.selective.selective_prediction`).
    """

    log_probs: Tensor
    labels: Tensor
    probs: Tensor
    correct: Tensor
    confidence: Mapping[str, Tensor]
    selective: Mapping[str, Mapping[str, Tensor]]

    @property
    def num_classes(self) -> int:
        """``K``, the number of classes."""
        return self.probs.shape[1]


_Compute = Callable[[MetricInputs], Tensor]


@dataclass(frozen=True)
class Metric:
    """A registered in-distribution metric.

    Attributes:
        name: its key in the results (``results["test"][name]``) and in ``train.select_metric``.
        title: its column title in the results tables.
        scale: the factor tables show it multiplied by (100 for a percentage).
        higher_is_better: whether a larger value is better (checkpoint selection, sweeps).
        compute: :class:`MetricInputs` → 0-dim float64 tensor (``(K,)`` when ``per_class``).
        applies: ``K`` → whether the metric is defined for ``K`` classes; ``None`` for every
            ``K``. Tables show the column of a metric with ``applies`` only when some result has
            it.
        task: computed only when asked for by name (``eval.metrics``, or selected), not in
            every bundle; tables show its column when some result has it.
        per_class: one value per class (a list in ``results.json``): a table of its own rather
            than a column, and never a selection metric.
    """

    name: str
    title: str
    scale: float
    higher_is_better: bool
    compute: _Compute
    applies: Callable[[int], bool] | None = None
    task: bool = False
    per_class: bool = False

    def applies_to(self, num_classes: int) -> bool:
        """Whether the metric is reported for a task of ``num_classes`` classes."""
        return self.applies is None or self.applies(num_classes)


METRIC_REGISTRY: dict[str, Metric] = {}
"""Name → :class:`Metric`, in registration order: the order of the results' keys."""


def metric(
    name: str,
    *,
    title: str,
    higher_is_better: bool,
    scale: float = 1.0,
    applies: Callable[[int], bool] | None = None,
    task: bool = False,
    per_class: bool = False,
) -> Callable[[_Compute], _Compute]:
    """Register the decorated function as the metric ``name`` (the fields of :class:`Metric`).

    A metric without a title, with a scale that is not positive, or registered twice fails when
    its module is imported, not after training.

    Returns:
        A decorator that registers the function and returns it unchanged.
    """
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"metric {name!r} needs a non-empty `title`, got {title!r}")
    if not scale > 0:
        raise ValueError(f"metric {name!r} needs a positive `scale`, got {scale!r}")
    if name in METRIC_REGISTRY:
        raise ValueError(f"metric {name!r} is already registered")

    def register(compute: _Compute) -> _Compute:
        METRIC_REGISTRY[name] = Metric(
            name, title, scale, higher_is_better, compute, applies, task, per_class
        )
        return compute

    return register


def bundle(num_classes: int, task_metrics: Iterable[str] = ()) -> list[Metric]:
    """The metrics a bundle computes for a ``num_classes``-class task: every metric that is not
    a task metric, then the task metrics named in ``task_metrics``, each in registration order
    and where it applies (repeats count once).

    Raises:
        ValueError: a name of ``task_metrics`` is not a registered task metric.
    """
    asked = set(task_metrics)
    known = {name for name, m in METRIC_REGISTRY.items() if m.task}
    if asked - known:
        raise ValueError(
            f"unknown task metrics {sorted(asked - known)}: registered are {sorted(known)}"
        )
    ordinary = [m for m in METRIC_REGISTRY.values() if not m.task]
    chosen = ordinary + [m for m in METRIC_REGISTRY.values() if m.name in asked]
    return [m for m in chosen if m.applies_to(num_classes)]


def higher_is_better(name: str) -> bool:
    """Whether a larger value of the validation metric ``name`` is better: the registered
    metric's direction, and higher for a ``data.val_ood`` set's ``ood_<name>_auroc``.

    Raises:
        ValueError: ``name`` is neither registered nor a validation OOD metric.
    """
    if name in METRIC_REGISTRY:
        return METRIC_REGISTRY[name].higher_is_better
    if name.endswith(VAL_OOD_METRIC_SUFFIX):
        return True
    raise ValueError(
        f"unknown metric {name!r}: registered are {list(METRIC_REGISTRY)}, and "
        f"ood_<name>{VAL_OOD_METRIC_SUFFIX} for the data.val_ood sets"
    )
