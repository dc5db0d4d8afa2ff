"""Bootstrap intervals of a run's metrics over its evaluation images (``eval.bootstrap``).

:func:`scipy.stats.bootstrap` draws the resamples and takes the percentile interval; what it
resamples is the images' indices (``np.arange(N)``), so one statistic call computes every metric
of a resample at once, and the same seed gives the same resamples to every metric and to every
run scored on the same images: a paired difference (:func:`paired_difference_intervals`) uses
the same resamples for both runs. The model is held fixed: an interval says how much a metric
moves with the draw of the test images, not from one training seed to another.

Each metric of a resample is computed batched over resamples from per-image quantities and
counts per tie group (equal to the registered metric on the resampled images; a test checks);
a metric with no batched form here (the task metrics) is computed by its registered function
on each resample. BCa is not offered: its jackknife costs ``N`` more evaluations.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy import sparse, stats
from torch import Tensor

from fseb_ft.evaluation.metrics import (
    METRIC_REGISTRY,
    Metric,
    _top_label_bins,  # the ECE's bins, shared so a resample bins exactly as ece() does
    metric_inputs,
)
from fseb_ft.evaluation.ood import available, ood_score
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

_Stat = Callable[[np.ndarray], np.ndarray]
"""How often each image is drawn in each resample (N, B) → (B,) values of one metric."""


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
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }

    def intervals(
        self, statistic: Callable[..., np.ndarray], sizes: Sequence[int]
    ) -> list[list[float | None]]:
        """The percentile interval of each row of ``statistic`` (resample indices of each of
        ``sizes`` samples (B, n_j) → (M, B)), resampling each sample independently."""
        with warnings.catch_warnings():
            # A resample distribution of one value (two identical runs' difference) is [v, v].
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            found = stats.bootstrap(
                tuple(np.arange(n) for n in sizes),
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
    record = bootstrap.record() | {"test": test, "ood": {}}
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
    images of ``(log_probs (N, K), labels (N,))`` resampled; ``None`` where a resample cannot
    define it (an AUROC of one class)."""
    stat = _stacked(_metric_statistics(log_probs, labels, names))
    found = bootstrap.intervals(lambda i: stat(_counts(i)), [len(labels)])
    return dict(zip(names, found, strict=True))


def paired_difference_intervals(
    a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], names: Sequence[str], bootstrap: Bootstrap
) -> dict[str, list[float | None]]:
    """``{name: [low, high]}`` of ``metric(a) − metric(b)``, both computed on the same
    resamples of the same images (``a`` and ``b``: log-probabilities and the same labels)."""
    if not torch.equal(a[1], b[1]):
        raise ValueError("a paired difference needs the same images in the same order")
    stat_a = _stacked(_metric_statistics(*a, names))
    stat_b = _stacked(_metric_statistics(*b, names))

    def difference(i: np.ndarray) -> np.ndarray:
        counts = _counts(i)
        return stat_a(counts) - stat_b(counts)

    found = bootstrap.intervals(difference, [len(a[1])])
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
    the intervals are of the difference, on the same resamples."""
    stats_ = [_detection_statistic(scores_in[s], scores_out[s]) for s in scores_in]
    if minus is not None:
        others = [_detection_statistic(minus[0][s], minus[1][s]) for s in scores_in]
        stats_ = [_minus(f, g) for f, g in zip(stats_, others, strict=True)]

    def statistic(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        counts_in, counts_out = _counts(i), _counts(j)
        return np.concatenate([f(counts_in, counts_out) for f in stats_])

    n_in, n_out = len(next(iter(scores_in.values()))), len(next(iter(scores_out.values())))
    found = bootstrap.intervals(statistic, [n_in, n_out])
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


def _counts(i: np.ndarray) -> np.ndarray:
    """(N, B): how often each image is drawn in each resample of indices ``i`` (B, N). Every
    metric is a function of these counts: none depends on the images' order. Resamples are
    columns, so the sums over tie groups below run down contiguous rows."""
    b, n = i.shape
    flat = (i * b + np.arange(b)[:, None]).ravel()  # image-major: image · B + resample
    return np.bincount(flat, minlength=n * b).reshape(n, b).astype(np.float64)


def _metric_statistics(log_probs: Tensor, labels: Tensor, names: Sequence[str]) -> list[_Stat]:
    """One batched statistic per metric of ``names``; the registered function per resample
    for a metric without a batched form."""
    x = metric_inputs(log_probs, labels)
    correct = x.correct.double().numpy()  # (N,)
    onehot = torch.nn.functional.one_hot(x.labels, x.num_classes)  # (N, K)
    found: dict[str, _Stat] = {
        "accuracy": _mean_of(correct),
        "nll": _mean_of(-x.log_probs.double().gather(1, x.labels[:, None])[:, 0].numpy()),
        "brier": _mean_of(((x.probs - onehot) ** 2).sum(-1).numpy()),
        "ece": _ece_of(x.probs, x.labels, 15),
        "ece_10bin": _ece_of(x.probs, x.labels, 10),
    }
    for suffix, score in (("", "max_prob"), ("_entropy", "neg_entropy")):
        aurc = _aurc_of(x.confidence[score].numpy(), 1.0 - correct)
        found[f"aurc{suffix}"] = aurc
        found[f"sel_pred_auc{suffix}"] = lambda c, aurc=aurc: 1.0 - aurc(c)
    if x.num_classes == 2:
        found["auroc_positive"] = _binary_auroc_of(x.log_probs[:, 1].double().numpy(), labels)
    return [found.get(name) or _looped(METRIC_REGISTRY[name], log_probs, labels) for name in names]


def _stacked(statistics: Sequence[_Stat]) -> _Stat:
    return lambda counts: np.stack([f(counts) for f in statistics])  # (M, B)


def _minus(f: Callable[..., np.ndarray], g: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda *counts: f(*counts) - g(*counts)


def _mean_of(values: np.ndarray) -> _Stat:
    return lambda counts: values @ counts / len(values)


def _group_sums(group: np.ndarray, groups: int, weight: np.ndarray | None = None) -> _Stat:
    """counts (N, B) → (groups, B): the sum of ``weight`` (1 when ``None``) over each
    resample's images in each group, through a sparse (groups, N) membership matrix."""
    n = len(group)
    values = np.ones(n) if weight is None else weight
    member = sparse.csr_matrix((values, (group, np.arange(n))), shape=(groups, n))
    return lambda counts: np.asarray(member @ counts)


def _ece_of(probs: Tensor, labels: Tensor, n_bins: int) -> _Stat:
    conf, correct, bins = _top_label_bins(probs, labels, n_bins)
    gaps = _group_sums(bins.numpy(), n_bins, (correct - conf).numpy())
    return lambda counts: np.abs(gaps(counts)).sum(0) / len(bins)


def _descending_groups(scores: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's tie group, 0 for the largest: the thresholds of the curves."""
    values, group = np.unique(-scores, return_inverse=True)
    return group.reshape(-1), len(values)


def _aurc_of(confidence: np.ndarray, errors: np.ndarray) -> _Stat:
    """AURC as :func:`~fseb_ft.evaluation.selective.selective_prediction` defines it."""
    group, groups = _descending_groups(confidence)
    admitted, wrong = _group_sums(group, groups), _group_sums(group, groups, errors)

    def aurc(counts: np.ndarray) -> np.ndarray:
        n_g = admitted(counts)  # (G, B) images in each tie group
        cum_e, cum_n = wrong(counts).cumsum(0), n_g.cumsum(0)
        risk = np.divide(cum_e, cum_n, out=np.zeros_like(cum_e), where=n_g > 0)
        return (risk * n_g).sum(0) / len(group)

    return aurc


def _binary_auroc_of(scores: np.ndarray, labels: Tensor) -> _Stat:
    """The AUROC of label 1 by ``scores``; NaN for a resample of one class."""
    group, groups = _descending_groups(scores)
    pos = labels.double().numpy()
    negatives, positives = _group_sums(group, groups, 1.0 - pos), _group_sums(group, groups, pos)
    return lambda counts: _detection(negatives(counts), positives(counts))[0]


def _detection_statistic(score_in: Tensor, score_out: Tensor) -> Callable[..., np.ndarray]:
    """(in counts (N_in, B), out counts (N_out, B)) → (3, B) AUROC, AUPR, FPR95."""
    s_in, s_out = score_in.double().numpy(), score_out.double().numpy()
    group, groups = _descending_groups(np.concatenate([s_in, s_out]))
    negatives = _group_sums(group[: len(s_in)], groups)
    positives = _group_sums(group[len(s_in) :], groups)
    return lambda c_in, c_out: np.stack(_detection(negatives(c_in), positives(c_out)))


def _detection(neg: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, ...]:
    """AUROC, AUPR and FPR95 (B,) of :func:`~fseb_ft.evaluation.detection.ood_detection` from
    the negatives and positives (G, B) in each tie group, in decreasing score."""
    n_neg, n_pos = neg.sum(0), pos.sum(0)  # (B,)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of one class: NaN
        tps, fps = pos.cumsum(0), neg.cumsum(0)
        auroc = (pos * (n_neg - fps + 0.5 * neg)).sum(0) / (n_pos * n_neg)
        precision = np.divide(tps, tps + fps, out=np.zeros_like(tps), where=pos > 0)
        aupr = (pos * precision).sum(0) / n_pos
        first = (tps / n_pos >= 0.95).argmax(0)  # (B,)
        fpr95 = np.take_along_axis(fps, first[None], 0)[0] / n_neg
    return auroc, aupr, fpr95


def _looped(metric: Metric, log_probs: Tensor, labels: Tensor) -> _Stat:
    """A registered metric computed by its own function on each resample's images."""
    every = np.arange(len(labels))

    def each(counts: np.ndarray) -> np.ndarray:
        found = []
        for row in counts.T.astype(np.int64):
            drawn = torch.from_numpy(np.repeat(every, row))
            found.append(float(metric.compute(metric_inputs(log_probs[drawn], labels[drawn]))))
        return np.array(found)

    return each


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
