"""Bootstrap intervals of a run's metrics over its evaluation images (``eval.bootstrap``).

:func:`scipy.stats.bootstrap` draws the resamples and takes the percentile interval; what it
resamples is the images' indices (``np.arange(N)``), so one statistic call computes every metric
of a resample at once, and the same seed gives the same resamples to every metric and to every
run scored on the same images: a paired difference (:func:`paired_difference_intervals`) uses
the same resamples for both runs. The model is held fixed: an interval says how much a metric
moves with the draw of the test images, not from one training seed to another.

The metrics of a resample are :mod:`fseb_ft.evaluation.resampled`'s, computed for a batch of
resamples at once from how often each image is drawn. BCa is not offered: its jackknife costs
``N`` more evaluations.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.ood import available, ood_score
from fseb_ft.evaluation.resampled import (
    Statistic,
    detection_statistic,
    draw_counts,
    metric_statistics,
)
from fseb_ft.recipe import Recipe

if TYPE_CHECKING:  # predictions need Accelerate; intervals only read their tensors
    from fseb_ft.evaluation.predictions import Predictions

__all__ = [
    "Bootstrap",
    "difference_intervals",
    "metric_intervals",
    "ood_intervals",
    "ood_score_values",
    "paired_difference_intervals",
    "prediction_intervals",
    "same_images",
]

_BATCH = 100
"""Resamples per statistic call: bounds the (batch, N) index and (batch, groups) count arrays."""


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are drawn: ``resamples`` (0: none), ``confidence`` and the ``seed`` of the
    resample indices (a run's ``train.seed``)."""

    resamples: int = 1000
    confidence: float = 0.95
    seed: int = 0

    @classmethod
    def of(cls, recipe: Recipe) -> Bootstrap:
        """A run's: ``eval.bootstrap`` resamples at ``eval.bootstrap_confidence``, seeded by
        ``train.seed``."""
        return cls(recipe.eval.bootstrap, recipe.eval.bootstrap_confidence, recipe.train.seed)

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> Bootstrap:
        """The bootstrap a results record's ``intervals`` (:meth:`record`) were drawn with."""
        return cls(record["resamples"], record["confidence"], record["seed"])

    def record(self) -> dict[str, object]:
        """What ``results.json`` says of how its intervals were drawn."""
        return {
            "method": "percentile",
            "strata": "label",
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }

    def intervals(
        self, statistic: Callable[..., np.ndarray], samples: Sequence[np.ndarray]
    ) -> list[list[float | None]]:
        """The percentile interval of each row of ``statistic`` (the resampled indices of each
        sample of ``samples``, (B, n_j) each → (M, B)), resampling each sample independently.
        A sample of fewer than two images cannot be resampled: every interval is then
        ``None``."""
        from scipy import stats  # 0.6 s to import: not on every command's start

        if any(len(sample) < 2 for sample in samples):
            rows = statistic(*(np.asarray(sample)[None] for sample in samples)).shape[0]
            return [[None, None] for _ in range(rows)]
        with warnings.catch_warnings():
            # A resample distribution of one value (two identical runs' difference) is [v, v].
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            found = stats.bootstrap(
                tuple(samples),
                lambda *idx, axis=-1: statistic(*idx),
                n_resamples=self.resamples,
                confidence_level=self.confidence,
                method="percentile",
                vectorized=True,
                batch=_BATCH,
                rng=np.random.default_rng(self.seed),
            ).confidence_interval
        low, high = np.atleast_1d(found.low), np.atleast_1d(found.high)
        return [[_finite(lo), _finite(hi)] for lo, hi in zip(low, high, strict=True)]


def prediction_intervals(
    predictions: Predictions,
    names: Sequence[str],
    ood_scores: Sequence[str],
    bootstrap: Bootstrap,
) -> dict[str, Any]:
    """``results.json``'s ``intervals`` of ``predictions``: how they were drawn
    (:meth:`Bootstrap.record`), ``test`` (:func:`metric_intervals` of the metrics ``names``)
    and ``ood`` (set → :func:`ood_intervals` of the scores of ``ood_scores`` it reports)."""
    record = bootstrap.record() | {"test": metric_intervals(*predictions.test, names, bootstrap)}
    record["ood"] = {
        name: ood_intervals(*_ood_scores(predictions, name, ood_scores), bootstrap)
        for name in predictions.ood
    }
    return record


def difference_intervals(
    a: Predictions,
    b: Predictions,
    names: Sequence[str],
    ood_scores: Sequence[str],
    bootstrap: Bootstrap,
) -> dict[str, Any]:
    """:func:`prediction_intervals` of ``a``'s metrics minus ``b``'s, on the same resamples of
    the same images (:func:`same_images` must hold)."""
    test = paired_difference_intervals(a.test, b.test, names, bootstrap)
    record: dict[str, Any] = bootstrap.record() | {"test": test, "ood": {}}
    for name in a.ood:
        found_a = _ood_scores(a, name, ood_scores)
        found_b = _ood_scores(b, name, ood_scores)
        both = [s for s in found_a[0] if s in found_b[0]]  # an ensemble lacks logit scores
        pick = [{s: scores[s] for s in both} for scores in (*found_a, *found_b)]
        record["ood"][name] = ood_intervals(pick[0], pick[1], bootstrap, (pick[2], pick[3]))
    return record


def same_images(a: Predictions, b: Predictions) -> bool:
    """Whether ``a`` and ``b`` were scored on the same split with the same labels in the same
    order and on OOD sets of the same names and sizes: what a paired difference needs."""
    return (
        a.split == b.split
        and torch.equal(a.test[1], b.test[1])
        and {k: len(v) for k, v in a.ood.items()} == {k: len(v) for k, v in b.ood.items()}
    )


def _ood_scores(
    predictions: Predictions, name: str, scores: Sequence[str]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The OOD scores of ``scores`` on the reported split and on the OOD set ``name`` (the
    logit ones only where both have logits, as :func:`~fseb_ft.evaluation.ood.ood_metrics`)."""
    logits_out = predictions.ood_logits.get(name)
    logits_in = predictions.test_logits if logits_out is not None else None
    features_out = predictions.ood_feature_scores.get(name, {})
    features_in = {s: v for s, v in predictions.test_feature_scores.items() if s in features_out}
    probs_in = predictions.test[0].exp()
    return (
        ood_score_values(scores, probs_in, logits_in, features_in),
        ood_score_values(
            scores,
            predictions.ood[name].exp(),
            logits_out if logits_in is not None else None,
            features_out,
        ),
    )


def metric_intervals(
    log_probs: Tensor, labels: Tensor, names: Sequence[str], bootstrap: Bootstrap
) -> dict[str, list[float | None]]:
    """``{name: [low, high]}``: the interval of each registered metric of ``names`` over the
    images of ``(log_probs (N, K), labels (N,))`` resampled within each class
    (:func:`_by_label`), so every resample has the split's class counts and a metric of the
    classes (an AUROC of a rare one) is defined on each."""
    stat = _stacked(metric_statistics(log_probs, labels, names))
    strata, draw = _by_label(labels)
    found = bootstrap.intervals(lambda *idx: stat(draw_counts(draw(idx))), strata)
    return dict(zip(names, found, strict=True))


def paired_difference_intervals(
    a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], names: Sequence[str], bootstrap: Bootstrap
) -> dict[str, list[float | None]]:
    """``{name: [low, high]}`` of ``metric(a) − metric(b)``, both computed on the same
    resamples of the same images (``a`` and ``b``: log-probabilities and the same labels)."""
    if not torch.equal(a[1], b[1]):
        raise ValueError("a paired difference needs the same images in the same order")
    stat_a = _stacked(metric_statistics(*a, names))
    stat_b = _stacked(metric_statistics(*b, names))
    strata, draw = _by_label(a[1])

    def difference(*idx: np.ndarray) -> np.ndarray:
        counts = draw_counts(draw(idx))
        return stat_a(counts) - stat_b(counts)

    found = bootstrap.intervals(difference, strata)
    return dict(zip(names, found, strict=True))


def ood_intervals(
    scores_in: Mapping[str, Tensor],
    scores_out: Mapping[str, Tensor],
    bootstrap: Bootstrap,
    minus: tuple[Mapping[str, Tensor], Mapping[str, Tensor]] | None = None,
) -> dict[str, list[float | None]]:
    """``{f"{score}_{auroc|aupr|fpr95}": [low, high]}`` of each OOD score (name → its ``(N_in,)``
    values on the in-distribution images and ``(N_out,)`` on the OOD ones), resampling both
    sets of images independently. With ``minus``, another run's scores on the same images,
    the intervals are of the difference, on the same resamples. No score: ``{}``."""
    if not scores_in:
        return {}
    stats_ = [detection_statistic(scores_in[s], scores_out[s]) for s in scores_in]
    if minus is not None:
        others = [detection_statistic(minus[0][s], minus[1][s]) for s in scores_in]
        stats_ = [_minus(f, g) for f, g in zip(stats_, others, strict=True)]

    def statistic(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        counts_in, counts_out = draw_counts(i), draw_counts(j)
        return np.concatenate([f(counts_in, counts_out) for f in stats_])

    n_in, n_out = (len(next(iter(scores.values()))) for scores in (scores_in, scores_out))
    found = bootstrap.intervals(statistic, [np.arange(n_in), np.arange(n_out)])
    keys = [f"{s}_{k}" for s in scores_in for k in ("auroc", "aupr", "fpr95")]
    return dict(zip(keys, found, strict=True))


def ood_score_values(
    names: Sequence[str],
    probs: Tensor,
    logits: Tensor | None,
    features: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Each score of ``names`` that can be computed (a logit score needs ``logits``, a feature
    score its values in ``features``)."""
    return {
        name: ood_score(name, probs, logits, features)
        for name in names
        if available(name, (logits,), (features,))
    }


def _by_label(
    labels: Tensor,
) -> tuple[list[np.ndarray], Callable[[Sequence[np.ndarray]], np.ndarray]]:
    """The strata of a resample within classes: the indices of each class of ``labels`` (N,)
    with two images or more, and a function from their resampled indices ((B, n_k) each) to a
    whole resample (B, N), which also holds every image of a class of one (the only resample
    of one image is itself)."""
    found = labels.numpy()
    strata = [np.flatnonzero(found == c) for c in np.unique(found)]
    fixed = np.concatenate([s for s in strata if len(s) < 2] or [np.empty(0, np.int64)])
    strata = [s for s in strata if len(s) >= 2] or [np.empty(0, np.int64)]

    def draw(idx: Sequence[np.ndarray]) -> np.ndarray:
        rows = idx[0].shape[0]
        return np.concatenate([*idx, np.broadcast_to(fixed, (rows, len(fixed)))], axis=1)

    return strata, draw


def _stacked(statistics: Sequence[Statistic]) -> Statistic:
    return lambda counts: np.stack([f(counts) for f in statistics])  # (M, B)


def _minus(f: Callable[..., np.ndarray], g: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda *counts: f(*counts) - g(*counts)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
