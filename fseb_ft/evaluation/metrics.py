"""Evaluation metrics for classifiers: pure tensor maths (definitions: docs/method.md, "Metrics").

Conventions shared by every function:

- ``probs``: ``(N, K)`` floating tensor of class probabilities (rows sum to one).
- ``log_probs``: ``(N, K)`` floating tensor of natural-log class probabilities.
- ``logits``: ``(N, K)`` floating tensor of a single model's unnormalised outputs.
- ``labels``: ``(N,)`` integer tensor (int64 preferred) with values in ``[0, K)``.

Scalars come back as 0-dim float64 tensors, per-sample quantities as float64 ``(N,)`` tensors,
on the device of the inputs. Sums are accumulated in float64 so that results on large test sets
do not depend on the input precision. Invalid inputs raise :class:`ValueError` naming the
argument, what was expected and what was received (:mod:`fseb_ft.evaluation.checks`).

This module holds the classification, calibration and ensemble metrics and the standard bundle of
them, and is the one import path of every metric: the selective-prediction curve
(:mod:`fseb_ft.evaluation.selective`), the detection metrics (:mod:`fseb_ft.evaluation.detection`),
the metric registry (:mod:`fseb_ft.evaluation.metric_registry`) and the task metrics
(:mod:`fseb_ft.evaluation.task_metrics`) are part of its API. The bundle
(:func:`classification_metrics`) is the registry: each of its metrics is one function of the shared
:class:`MetricInputs`, registered below with ``@metric(name, title=..., scale=...,
higher_is_better=...)`` (and ``applies=`` when it is defined for some class counts only).

Nothing here touches files, logging or Accelerate; callers gather tensors across processes first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import (
    check_float_matrix,
    check_labels,
    check_tensor,
    describe,
    to_float64,
)
from fseb_ft.evaluation.detection import binary_auroc, ood_detection
from fseb_ft.evaluation.metric_registry import (
    METRIC_REGISTRY,
    Metric,
    MetricInputs,
    bundle,
    higher_is_better,
    metric,
)
from fseb_ft.evaluation.selective import selective_prediction
from fseb_ft.evaluation.task_metrics import sensitivity_at_specificity  # registers them all

__all__ = [
    "METRIC_REGISTRY",
    "Metric",
    "MetricInputs",
    "accuracy",
    "binary_auroc",
    "brier",
    "calibration_bins",
    "chance_accuracy",
    "chance_nll",
    "classification_metrics",
    "confidence_scores",
    "ece",
    "ensemble_log_probs",
    "higher_is_better",
    "metric",
    "metric_inputs",
    "nll",
    "ood_detection",
    "predictive_entropy",
    "selective_prediction",
    "sensitivity_at_specificity",
    "top_label_bins",
]


def predictive_entropy(probs: Tensor) -> Tensor:
    """Predictive entropy ``H(p) = -Σ_k p_k log p_k`` in nats, with ``0 · log 0 = 0``.

    Args:
        probs: ``(N, K)`` class probabilities.

    Returns:
        ``(N,)`` float64 entropies; exactly 0 for one-hot rows, ``log K`` for uniform rows.
    """
    probs = check_float_matrix(probs, "probs")
    p = to_float64(probs)  # (N, K)
    # xlogy defines 0·log 0 = 0, so one-hot rows give exactly 0 rather than NaN.
    return -torch.special.xlogy(p, p).sum(dim=-1)  # (N,)


def confidence_scores(probs: Tensor) -> dict[str, Tensor]:
    """Per-sample confidence scores (higher means more confident).

    Args:
        probs: ``(N, K)`` class probabilities.

    Returns:
        ``{"max_prob": max_k p_k, "neg_entropy": -H(p)}``, each ``(N,)`` float64, with
        ``H`` as in :func:`predictive_entropy`.
    """
    probs = check_float_matrix(probs, "probs")
    return {
        # float32 -> float64 is exact, so ties in the input stay ties here.
        "max_prob": to_float64(probs.max(dim=-1).values),  # (N,)
        "neg_entropy": -predictive_entropy(probs),  # (N,)
    }


def accuracy(probs: Tensor, labels: Tensor) -> Tensor:
    """Top-1 accuracy: mean of ``1[argmax_k p_k = y]``.

    Ties in the arg-max go to the lowest class index (``torch.argmax`` semantics).

    Args:
        probs: ``(N, K)`` class probabilities (or any monotone transform, e.g. logits).
        labels: ``(N,)`` integer labels in ``[0, K)``.

    Returns:
        0-dim float64 tensor in ``[0, 1]``.
    """
    probs = check_float_matrix(probs, "probs")
    labels = check_labels(labels, probs.shape[0], probs.shape[1])
    pred = probs.argmax(dim=-1)  # (N,)
    return to_float64(pred == labels.to(pred.device)).mean()


def chance_accuracy(labels: Tensor) -> Tensor:
    """Accuracy of always predicting the most frequent label: the rate of the majority class.

    A classifier whose accuracy is not above this has learned nothing measurable.

    Args:
        labels: ``(N,)`` integer labels, N ≥ 1.

    Returns:
        0-dim float64 tensor in ``(0, 1]``.
    """
    labels = check_tensor(labels, "labels")
    n = labels.shape[0] if labels.ndim else 0  # a wrong ndim is reported by check_labels
    labels = check_labels(labels, n, torch.iinfo(torch.int64).max)
    if labels.numel() == 0:
        raise ValueError("`labels` must not be empty: chance accuracy of no samples is undefined")
    counts = torch.bincount(labels)  # (max label + 1,)
    return to_float64(counts.max()) / labels.numel()


def chance_nll(labels: Tensor) -> Tensor:
    """NLL of always predicting the labels' class frequencies: the entropy ``-Σ_k p_k log p_k``.

    The best NLL a model that ignores its input can reach on these labels (the frequencies are
    those of ``labels`` themselves). A model whose NLL is below it has learned something about
    the images, even where its accuracy does not beat :func:`chance_accuracy`.

    Args:
        labels: ``(N,)`` integer labels, N ≥ 1.

    Returns:
        0-dim float64 tensor, ≥ 0 (0 when every label is the same).
    """
    labels = check_tensor(labels, "labels")
    n = labels.shape[0] if labels.ndim else 0  # a wrong ndim is reported by check_labels
    labels = check_labels(labels, n, torch.iinfo(torch.int64).max)
    if labels.numel() == 0:
        raise ValueError("`labels` must not be empty: chance NLL of no samples is undefined")
    counts = to_float64(torch.bincount(labels))  # (max label + 1,)
    p = counts[counts > 0] / labels.numel()  # (C,) the frequencies of the classes present
    return -(p * p.log()).sum()


def nll(log_probs: Tensor, labels: Tensor) -> Tensor:
    """Negative log-likelihood: ``-(1/N) Σ_i log p(y_i | x_i)``.

    Computed from log-probabilities so that confident wrong predictions stay finite: pass
    ``torch.log_softmax(logits.float(), -1)`` for one model, :func:`ensemble_log_probs` for an
    ensemble.

    Args:
        log_probs: ``(N, K)`` natural-log class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.

    Returns:
        0-dim float64 tensor (``inf`` only if some true class has log-probability ``-inf``).
    """
    log_probs = check_float_matrix(log_probs, "log_probs")
    labels = check_labels(labels, log_probs.shape[0], log_probs.shape[1])
    picked = log_probs.gather(1, labels.to(log_probs.device)[:, None]).squeeze(1)  # (N,)
    return -to_float64(picked).mean()


def brier(probs: Tensor, labels: Tensor) -> Tensor:
    """Multi-class Brier score: ``(1/N) Σ_i Σ_k (p_ik - 1[k = y_i])²``.

    Ranges over ``[0, 2]``: 0 for a correct one-hot prediction, 2 for a wrong one-hot one,
    ``1 - 1/K`` for the uniform distribution.

    Args:
        probs: ``(N, K)`` class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.

    Returns:
        0-dim float64 tensor.
    """
    probs = check_float_matrix(probs, "probs")
    labels = check_labels(labels, probs.shape[0], probs.shape[1])
    p = to_float64(probs)  # (N, K)
    onehot = torch.nn.functional.one_hot(labels.to(p.device), p.shape[1]).to(p.dtype)  # (N, K)
    return ((p - onehot) ** 2).sum(dim=-1).mean()


def ece(probs: Tensor, labels: Tensor, n_bins: int = 15) -> Tensor:
    """Top-label expected calibration error (Guo et al., 2017, "On Calibration of Modern
    Neural Networks").

    With confidence ``c_i = max_k p_ik`` and correctness ``a_i = 1[argmax_k p_ik = y_i]``,
    samples fall into ``n_bins`` equal-width bins closed on the right,
    ``B_b = {i : b/n < c_i <= (b+1)/n}``, ``b = 0..n-1``; confidence exactly 1.0 falls in the
    last bin (the reference JAX code drops it; this does not). Then

        ECE = Σ_b |B_b|/N · |acc(B_b) - conf(B_b)| = (1/N) Σ_b |Σ_{i∈B_b} (a_i - c_i)|.

    Bin edges ``b/n`` are rounded to the dtype of the confidences before comparison, so a
    float32 confidence equal to ``float32(b/n)`` lands in the lower bin, exactly as a float64
    one equal to ``b/n`` does.

    Args:
        probs: ``(N, K)`` class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.
        n_bins: number of equal-width bins (15 by default; 10 to compare with the paper).

    Returns:
        0-dim float64 tensor in ``[0, 1]``.
    """
    conf64, correct, bin_idx = top_label_bins(probs, labels, n_bins)  # (N,) each
    gap = torch.zeros(n_bins, dtype=torch.float64, device=conf64.device)  # (n_bins,)
    gap.scatter_add_(0, bin_idx, correct - conf64)  # (n_bins,) Σ_{i∈B_b} (a_i - c_i)
    return gap.abs().sum() / conf64.shape[0]


def calibration_bins(probs: Tensor, labels: Tensor, n_bins: int = 15) -> dict[str, Tensor]:
    """Per-bin statistics of the top-label reliability diagram, with the bins of :func:`ece`.

    Bin ``b`` covers confidences in ``(b/n, (b+1)/n]`` (confidence 0 in the first bin, 1.0 in
    the last), exactly as in :func:`ece`, so that
    ``ECE = Σ_b count_b / N · |accuracy_b - confidence_b|`` over the non-empty bins.

    Args:
        probs: ``(N, K)`` class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.
        n_bins: number of equal-width bins.

    Returns:
        ``edges`` ``(n_bins + 1,)`` (``b/n``); ``count`` ``(n_bins,)`` samples per bin;
        ``confidence`` and ``accuracy`` ``(n_bins,)``, the mean top-label confidence and the
        fraction correct in each bin, NaN for empty bins. All float64.
    """
    conf64, correct, bin_idx = top_label_bins(probs, labels, n_bins)  # (N,) each
    zeros = torch.zeros(n_bins, dtype=torch.float64, device=conf64.device)  # (n_bins,)
    count = zeros.scatter_add(0, bin_idx, torch.ones_like(conf64))  # (n_bins,)
    sum_conf = zeros.scatter_add(0, bin_idx, conf64)  # (n_bins,)
    sum_correct = zeros.scatter_add(0, bin_idx, correct)  # (n_bins,)
    # 0/0 = NaN marks the empty bins.
    return {
        "edges": torch.arange(n_bins + 1, dtype=torch.float64, device=conf64.device) / n_bins,
        "count": count,
        "confidence": sum_conf / count,
        "accuracy": sum_correct / count,
    }


def top_label_bins(probs: Tensor, labels: Tensor, n_bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Top-label confidence (float64), correctness (0/1 float64) and ECE bin index, each (N,)."""
    probs = check_float_matrix(probs, "probs")
    labels = check_labels(labels, probs.shape[0], probs.shape[1])
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"`n_bins` must be a positive int, got {n_bins!r}")
    conf, pred = probs.max(dim=-1)  # (N,), (N,)
    correct = to_float64(pred == labels.to(pred.device))  # (N,)
    conf64 = to_float64(conf)  # (N,) exact widening
    # Edges are rounded to the confidence dtype first: otherwise float32(0.2) > 0.2 (double)
    # would push a confidence that *is* 0.2 at float32 precision into the next bin up.
    edges = (torch.arange(n_bins + 1, dtype=torch.float64) / n_bins).to(conf.dtype)  # (n+1,)
    edges = to_float64(edges).to(conf64.device)  # (n+1,)
    # bucketize(right=False) gives i with edges[i-1] < c <= edges[i]: bins closed on the right.
    # Clamping sends c == 0 to the first bin and c == 1 (or a rounding hair above) to the last.
    bin_idx = (torch.bucketize(conf64, edges, right=False) - 1).clamp_(0, n_bins - 1)  # (N,)
    return conf64, correct.to(conf64.device), bin_idx


def ensemble_log_probs(member_log_probs: Tensor) -> Tensor:
    """Log of the ensemble's mean predictive distribution.

    ``log( (1/E) Σ_e p_e ) = logsumexp_e(log p_e) - log E``, which never exponentiates a large
    negative log-probability on its own and so stays finite where ``log(mean(exp(.)))`` would
    underflow to ``-inf``.

    Args:
        member_log_probs: ``(E, N, K)`` natural-log class probabilities of ``E`` members.

    Returns:
        ``(N, K)`` log-probabilities, in the input dtype (half precisions promoted to float32).
    """
    x = check_tensor(member_log_probs, "member_log_probs")
    if x.ndim != 3:
        raise ValueError(
            f"`member_log_probs` must be a 3-D (E, N, K) floating tensor, got {describe(x)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"`member_log_probs` must have a floating-point dtype, got {describe(x)}")
    if x.numel() == 0:
        raise ValueError(f"`member_log_probs` must be non-empty (E, N, K >= 1), got {describe(x)}")
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # (E, N, K)
    return torch.logsumexp(x, dim=0) - math.log(x.shape[0])  # (N, K)


def metric_inputs(log_probs: Tensor, labels: Tensor) -> MetricInputs:
    """Check ``log_probs`` and ``labels`` and compute what every registered metric reads.

    Args:
        log_probs: ``(N, K)`` natural-log class probabilities (see :func:`nll`).
        labels: ``(N,)`` integer labels in ``[0, K)``.
    """
    log_probs = check_float_matrix(log_probs, "log_probs")
    labels = check_labels(labels, log_probs.shape[0], log_probs.shape[1])
    probs = to_float64(log_probs).exp()  # (N, K)
    labels = labels.to(probs.device)  # (N,)
    correct = probs.argmax(dim=-1) == labels  # (N,)
    scores = confidence_scores(probs)
    return MetricInputs(
        log_probs=log_probs,
        labels=labels,
        probs=probs,
        correct=correct,
        confidence=scores,
        selective={name: selective_prediction(s, correct) for name, s in scores.items()},
    )


@metric("accuracy", title="Acc. (%)", scale=100.0, higher_is_better=True)
def _accuracy(x: MetricInputs) -> Tensor:
    """:func:`accuracy`."""
    return accuracy(x.probs, x.labels)


@metric("nll", title="NLL", higher_is_better=False)
def _nll(x: MetricInputs) -> Tensor:
    """:func:`nll`, from the log-probabilities as given."""
    return nll(x.log_probs, x.labels)


@metric("brier", title="Brier", higher_is_better=False)
def _brier(x: MetricInputs) -> Tensor:
    """:func:`brier`."""
    return brier(x.probs, x.labels)


@metric("ece", title="ECE (%)", scale=100.0, higher_is_better=False)
def _ece(x: MetricInputs) -> Tensor:
    """:func:`ece` with 15 bins."""
    return ece(x.probs, x.labels, n_bins=15)


@metric("ece_10bin", title="ECE-10 (%)", scale=100.0, higher_is_better=False)
def _ece_10bin(x: MetricInputs) -> Tensor:
    """:func:`ece` with the paper's 10 bins."""
    return ece(x.probs, x.labels, n_bins=10)


@metric("sel_pred_auc", title="Sel. Pred. (%)", scale=100.0, higher_is_better=True)
def _sel_pred_auc(x: MetricInputs) -> Tensor:
    """Area under the accuracy–coverage curve, confidence = max probability."""
    return x.selective["max_prob"]["sel_pred_auc"]


@metric("aurc", title="AURC (%)", scale=100.0, higher_is_better=False)
def _aurc(x: MetricInputs) -> Tensor:
    """Area under the risk–coverage curve, confidence = max probability."""
    return x.selective["max_prob"]["aurc"]


@metric("sel_pred_auc_entropy", title="Sel. Pred. entropy (%)", scale=100.0, higher_is_better=True)
def _sel_pred_auc_entropy(x: MetricInputs) -> Tensor:
    """Area under the accuracy–coverage curve, confidence = negative predictive entropy."""
    return x.selective["neg_entropy"]["sel_pred_auc"]


@metric("aurc_entropy", title="AURC entropy (%)", scale=100.0, higher_is_better=False)
def _aurc_entropy(x: MetricInputs) -> Tensor:
    """Area under the risk–coverage curve, confidence = negative predictive entropy."""
    return x.selective["neg_entropy"]["aurc"]


@metric(
    "auroc_positive",
    title="AUROC pos. (%)",
    scale=100.0,
    higher_is_better=True,
    applies=lambda k: k == 2,
)
def _auroc_positive(x: MetricInputs) -> Tensor:
    """:func:`binary_auroc` of the positive class (label 1), the usual headline metric of
    imbalanced binary tasks such as melanoma detection; NaN when the labels hold one class."""
    n_pos = int(x.labels.sum())
    if not 0 < n_pos < x.labels.shape[0]:
        return torch.tensor(math.nan, dtype=torch.float64, device=x.probs.device)
    # log p_1 ranks exactly as p_1 but keeps underflowed probabilities apart.
    return binary_auroc(to_float64(x.log_probs[:, 1]), x.labels)


def classification_metrics(
    log_probs: Tensor, labels: Tensor, task_metrics: Iterable[str] = ()
) -> dict[str, Tensor]:
    """The in-distribution bundle (:func:`bundle`): each metric registered above that applies to
    the task (``auroc_positive`` for K = 2 only), then each task metric named in
    ``task_metrics`` that applies, in registration order: name → 0-dim float64 tensor (``(K,)``
    for a per-class metric).

    Args:
        log_probs: ``(N, K)`` natural-log class probabilities (see :func:`nll`).
        labels: ``(N,)`` integer labels in ``[0, K)``.
        task_metrics: task metrics to add (``eval.metrics``); an unknown name raises.
    """
    inputs = metric_inputs(log_probs, labels)
    return {m.name: m.compute(inputs) for m in bundle(inputs.num_classes, task_metrics)}
