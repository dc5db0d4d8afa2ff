"""Every metric of many resamples of the evaluated images at once (the bootstrap's statistics).

A resample is how often it draws each image: its counts, a column of an (N, B) array for B
resamples (:func:`draw_counts`). Every metric here is a function of those counts, none depends
on the images' order, and each is computed for all B resamples at once from per-image
quantities, sums per tie group of a score (the curves' thresholds) and confusion matrices. Each
equals the registered metric on the resampled images, the task metrics' scikit-learn functions
included (tests/evaluation/test_bootstrap.py checks); a metric with no batched form here (one a
contributor registers) is computed by its registered function on each resample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.metrics import (
    METRIC_REGISTRY,
    Metric,
    MetricInputs,
    metric_inputs,
    top_label_bins,  # the ECE's bins, shared so a resample bins exactly as ece() does
)

__all__ = ["Statistic", "detection_statistic", "draw_counts", "metric_statistics"]

Statistic = Callable[[np.ndarray], np.ndarray]
"""How often each image is drawn in each resample (N, B) → (B,) values of one metric."""


def draw_counts(i: np.ndarray) -> np.ndarray:
    """(N, B): how often each image is drawn in each resample of indices ``i`` (B, N). Every
    metric is a function of these counts: none depends on the images' order. Resamples are
    columns, so the sums over tie groups below run down contiguous rows."""
    b, n = i.shape
    flat = (i * b + np.arange(b)[:, None]).ravel()  # image-major: image · B + resample
    return np.bincount(flat, minlength=n * b).reshape(n, b).astype(np.float64)


def metric_statistics(log_probs: Tensor, labels: Tensor, names: Sequence[str]) -> list[Statistic]:
    """One batched statistic per registered metric of ``names`` (of ``log_probs`` (N, K) and
    ``labels`` (N,)); the registered function on each resample for a metric without a batched
    form."""
    x = metric_inputs(log_probs, labels)
    correct = x.correct.double().numpy()  # (N,)
    onehot = torch.nn.functional.one_hot(x.labels, x.num_classes)  # (N, K)
    found: dict[str, Statistic] = {
        "accuracy": _mean_of(correct),
        "nll": _mean_of(-x.log_probs.double().gather(1, x.labels[:, None])[:, 0].numpy()),
        "brier": _mean_of(((x.probs - onehot) ** 2).sum(-1).numpy()),
        "ece": _ece_of(x.probs, x.labels, 15),
        "ece_10bin": _ece_of(x.probs, x.labels, 10),
    }
    for suffix, score in (("", "max_prob"), ("_entropy", "neg_entropy")):
        aurc = _aurc_of(x.confidence[score].numpy(), 1.0 - correct)
        found[f"aurc{suffix}"] = aurc
        found[f"sel_pred_auc{suffix}"] = _one_minus(aurc)
    if x.num_classes == 2:
        found["auroc_positive"] = _binary_auroc_of(x.log_probs[:, 1].double().numpy(), labels)

    def statistic(name: str) -> Statistic:
        if name in found:
            return found[name]
        task = _TASK_STATISTICS.get(name)
        return task(x) if task else _looped(METRIC_REGISTRY[name], log_probs, labels)

    return [statistic(name) for name in names]


def _mean_of(values: np.ndarray) -> Statistic:
    return lambda counts: values @ counts / len(values)


def _group_sums(group: np.ndarray, groups: int, weight: np.ndarray | None = None) -> Statistic:
    """counts (N, B) → (groups, B): the sum of ``weight`` (1 when ``None``) over each
    resample's images in each group, through a sparse (groups, N) membership matrix."""
    from scipy import sparse  # imported with scipy.stats, when a bootstrap runs

    n = len(group)
    values = np.ones(n) if weight is None else weight
    member = sparse.csr_matrix((values, (group, np.arange(n))), shape=(groups, n))
    return lambda counts: np.asarray(member @ counts)


def _ece_of(probs: Tensor, labels: Tensor, n_bins: int) -> Statistic:
    conf, correct, bins = top_label_bins(probs, labels, n_bins)
    gaps = _group_sums(bins.numpy(), n_bins, (correct - conf).numpy())
    return lambda counts: np.abs(gaps(counts)).sum(0) / len(bins)


def _descending_groups(scores: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's tie group, 0 for the largest: the thresholds of the curves."""
    values, group = np.unique(-scores, return_inverse=True)
    return group.reshape(-1), len(values)


def _one_minus(statistic: Statistic) -> Statistic:
    """``1 − statistic``, per resample (the selective-prediction AUC of an AURC)."""
    return lambda counts: 1.0 - statistic(counts)


def _aurc_of(confidence: np.ndarray, errors: np.ndarray) -> Statistic:
    """AURC as :func:`~fseb_ft.evaluation.selective.selective_prediction` defines it."""
    group, groups = _descending_groups(confidence)
    admitted, wrong = _group_sums(group, groups), _group_sums(group, groups, errors)

    def aurc(counts: np.ndarray) -> np.ndarray:
        n_g = admitted(counts)  # (G, B) images in each tie group
        cum_e, cum_n = wrong(counts).cumsum(0), n_g.cumsum(0)
        risk = np.divide(cum_e, cum_n, out=np.zeros_like(cum_e), where=n_g > 0)
        return (risk * n_g).sum(0) / len(group)

    return aurc


def _ranking_of(scores: np.ndarray, positive: np.ndarray) -> Callable[[np.ndarray], tuple]:
    """counts (N, B) → the negatives and the positives (G, B) in each tie group of ``scores``
    (N,), in decreasing score; ``positive`` (N,) is 1 for a positive image, else 0."""
    group, groups = _descending_groups(scores)
    negatives = _group_sums(group, groups, 1.0 - positive)
    positives = _group_sums(group, groups, positive)
    return lambda counts: (negatives(counts), positives(counts))


def _binary_auroc_of(scores: np.ndarray, labels: Tensor) -> Statistic:
    """The AUROC of label 1 by ``scores``; NaN for a resample of one class."""
    ranking = _ranking_of(scores, labels.double().numpy())
    return lambda counts: _detection(*ranking(counts))[0]


def detection_statistic(score_in: Tensor, score_out: Tensor) -> Callable[..., np.ndarray]:
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


def _confusion_of(x: MetricInputs, summary: Callable[[np.ndarray], np.ndarray]) -> Statistic:
    """``summary`` of each resample's confusion matrix (K, K, B): rows the labels, columns the
    arg-max classes (the task metrics' predicted class, ties to the lowest index)."""
    k = x.num_classes
    cells = (x.labels * k + x.probs.argmax(-1)).numpy()  # (N,) each image's cell, row-major
    sums = _group_sums(cells, k * k)
    return lambda counts: summary(sums(counts).reshape(k, k, -1))


def _qwk(confusion: np.ndarray) -> np.ndarray:
    """``cohen_kappa_score(weights="quadratic")`` of confusions (K, K, B): ``1 − Σ w O / Σ w E``
    with ``w_ij = (i − j)²`` and ``E`` the outer product of the label and prediction counts over
    N; NaN where ``Σ w E = 0`` (labels and predictions share fewer than two classes)."""
    grades = np.arange(confusion.shape[0], dtype=np.float64)
    weight = (grades[:, None] - grades[None, :]) ** 2  # (K, K)
    labelled, predicted = confusion.sum(1), confusion.sum(0)  # (K, B) each
    observed = np.einsum("ij,ijb->b", weight, confusion)  # (B,)
    expected = np.einsum("ij,ib,jb->b", weight, labelled, predicted) / confusion.sum((0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.0 - observed / expected


def _balanced_accuracy(confusion: np.ndarray) -> np.ndarray:
    """``balanced_accuracy_score`` of confusions (K, K, B): the mean recall over the classes
    with labels."""
    hits, labelled = np.diagonal(confusion).T, confusion.sum(1)  # (K, B) each
    recall = np.divide(hits, labelled, out=np.zeros_like(labelled), where=labelled > 0)
    return recall.sum(0) / (labelled > 0).sum(0)


def _macro_f1(confusion: np.ndarray) -> np.ndarray:
    """``f1_score(average="macro", zero_division=0)`` of confusions (K, K, B): the mean
    ``2 TP / (2 TP + FP + FN)`` over the classes among the labels or the predictions."""
    hits = np.diagonal(confusion).T  # (K, B)
    seen = confusion.sum(1) + confusion.sum(0)  # (K, B) labels + predictions = 2 TP + FP + FN
    f1 = np.divide(2 * hits, seen, out=np.zeros_like(seen), where=seen > 0)
    return f1.sum(0) / (seen > 0).sum(0)


def _one_vs_rest_of(x: MetricInputs, which: int) -> Statistic:
    """Task metric ``roc_auc`` (``which`` 0) or ``average_precision`` (1): of label 1's
    log-probability for K = 2, else the macro mean over the classes of each one's against the
    rest by its probability; NaN for a resample that lacks a class."""
    labels = x.labels.numpy()
    if x.num_classes == 2:
        rankings = [_ranking_of(x.log_probs[:, 1].double().numpy(), labels.astype(np.float64))]
    else:
        rankings = [
            _ranking_of(x.probs[:, c].numpy(), (labels == c).astype(np.float64))
            for c in range(x.num_classes)
        ]
    classes = _group_sums(labels, x.num_classes)

    def each(counts: np.ndarray) -> np.ndarray:
        values = np.mean([_detection(*ranking(counts))[which] for ranking in rankings], 0)
        return np.where((classes(counts) > 0).all(0), values, np.nan)  # (B,)

    return each


def _sensitivity_of(x: MetricInputs, percent: int) -> Statistic:
    """:func:`~fseb_ft.evaluation.task_metrics.sensitivity_at_specificity` of label 1's
    log-probability: the thresholds are the tie groups (and +∞, calling none positive)."""
    ranking = _ranking_of(x.log_probs[:, 1].double().numpy(), x.labels.double().numpy())

    def each(counts: np.ndarray) -> np.ndarray:
        neg, pos = ranking(counts)  # (G, B) each
        n_neg, n_pos = neg.sum(0), pos.sum(0)  # (B,)
        specific = 100 * (n_neg - neg.cumsum(0)) >= percent * n_neg  # (G, B)
        called = np.where(specific, pos.cumsum(0), 0.0).max(0)  # (B,) true positives
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where((n_pos > 0) & (n_neg > 0), called / n_pos, np.nan)

    return each


_TASK_STATISTICS: dict[str, Callable[[MetricInputs], Statistic]] = {
    "qwk": lambda x: _confusion_of(x, _qwk),
    "balanced_accuracy": lambda x: _confusion_of(x, _balanced_accuracy),
    "macro_f1": lambda x: _confusion_of(x, _macro_f1),
    "roc_auc": lambda x: _one_vs_rest_of(x, 0),
    "average_precision": lambda x: _one_vs_rest_of(x, 1),
    "sensitivity_at_90_specificity": lambda x: _sensitivity_of(x, 90),
    "sensitivity_at_95_specificity": lambda x: _sensitivity_of(x, 95),
}
"""The batched task metrics (fseb_ft.evaluation.task_metrics) by name, built when asked for."""


def _looped(metric: Metric, log_probs: Tensor, labels: Tensor) -> Statistic:
    """A registered metric computed by its own function on each resample's images."""
    every = np.arange(len(labels))

    def each(counts: np.ndarray) -> np.ndarray:
        found = []
        for row in counts.T.astype(np.int64):
            drawn = torch.from_numpy(np.repeat(every, row))
            found.append(float(metric.compute(metric_inputs(log_probs[drawn], labels[drawn]))))
        return np.array(found)

    return each
