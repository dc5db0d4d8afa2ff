"""Evaluation metrics for classifiers: pure tensor maths (definitions: docs/method.md, "Metrics").

Conventions shared by every function:

- ``probs``: ``(N, K)`` floating tensor of class probabilities (rows sum to one).
- ``log_probs``: ``(N, K)`` floating tensor of natural-log class probabilities.
- ``logits``: ``(N, K)`` floating tensor of a single model's unnormalised outputs.
- ``labels``: ``(N,)`` integer tensor (int64 preferred) with values in ``[0, K)``.

Scalars come back as 0-dim float64 tensors, per-sample quantities as float64 ``(N,)`` tensors,
on the device of the inputs. Sums are accumulated in float64 so that results on large test sets
do not depend on the input precision. Invalid inputs raise :class:`ValueError` naming the
argument, what was expected and what was received.

Nothing here touches files, logging or Accelerate; callers gather tensors across processes first.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
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
    "nll",
    "ood_detection",
    "predictive_entropy",
    "selective_prediction",
]


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"object of type {type(x).__name__}"


def _check_tensor(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {_describe(x)}")
    return x


def _check_float_matrix(x: object, name: str) -> Tensor:
    """Check ``x`` is a non-empty ``(N, K)`` floating tensor."""
    x = _check_tensor(x, name)
    if x.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D (N, K) floating tensor, got {_describe(x)}")
    if not x.is_floating_point():
        raise ValueError(
            f"`{name}` must have a floating-point dtype (float16/bfloat16/float32/float64), "
            f"got {_describe(x)}"
        )
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"`{name}` must be non-empty with N >= 1 and K >= 1, got {_describe(x)}")
    return x


def _check_float_vector(x: object, name: str) -> Tensor:
    """Check ``x`` is a non-empty ``(N,)`` floating tensor without NaN."""
    x = _check_tensor(x, name)
    if x.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D (N,) floating tensor, got {_describe(x)}")
    if not x.is_floating_point():
        raise ValueError(
            f"`{name}` must have a floating-point dtype (float16/bfloat16/float32/float64), "
            f"got {_describe(x)}"
        )
    if x.shape[0] == 0:
        raise ValueError(f"`{name}` must be non-empty (N >= 1), got {_describe(x)}")
    # NaN compares unequal to itself, so it would silently corrupt sorting and tie grouping.
    if bool(torch.isnan(x).any()):
        raise ValueError(f"`{name}` must not contain NaN, got {_describe(x)} with NaN entries")
    return x


def _check_labels(labels: object, n: int, k: int, name: str = "labels") -> Tensor:
    """Check ``labels`` is an ``(n,)`` integer tensor with values in ``[0, k)``; return int64."""
    labels = _check_tensor(labels, name)
    if labels.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D (N,) int64 tensor, got {_describe(labels)}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(
            f"`{name}` must have an integer dtype (int64 expected), got {_describe(labels)}"
        )
    if labels.shape[0] != n:
        raise ValueError(
            f"`{name}` must have length N={n} to match the predictions, got {_describe(labels)}"
        )
    if n > 0:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= k:
            raise ValueError(
                f"`{name}` values must lie in [0, K) = [0, {k}), got values in [{lo}, {hi}]"
            )
    return labels.long()


def _f64(x: Tensor) -> Tensor:
    # MPS has no float64 at all; everything else keeps the caller's device.
    if x.device.type == "mps":
        x = x.cpu()
    return x.to(torch.float64)


# --------------------------------------------------------------------------------------------
# Per-sample quantities
# --------------------------------------------------------------------------------------------


def predictive_entropy(probs: Tensor) -> Tensor:
    """Predictive entropy ``H(p) = -Σ_k p_k log p_k`` in nats, with ``0 · log 0 = 0``.

    Args:
        probs: ``(N, K)`` class probabilities.

    Returns:
        ``(N,)`` float64 entropies; exactly 0 for one-hot rows, ``log K`` for uniform rows.
    """
    probs = _check_float_matrix(probs, "probs")
    p = _f64(probs)  # (N, K)
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
    probs = _check_float_matrix(probs, "probs")
    return {
        # float32 -> float64 is exact, so ties in the input stay ties here.
        "max_prob": _f64(probs.max(dim=-1).values),  # (N,)
        "neg_entropy": -predictive_entropy(probs),  # (N,)
    }


# --------------------------------------------------------------------------------------------
# In-distribution scalar metrics
# --------------------------------------------------------------------------------------------


def accuracy(probs: Tensor, labels: Tensor) -> Tensor:
    """Top-1 accuracy: mean of ``1[argmax_k p_k = y]``.

    Ties in the arg-max go to the lowest class index (``torch.argmax`` semantics).

    Args:
        probs: ``(N, K)`` class probabilities (or any monotone transform, e.g. logits).
        labels: ``(N,)`` integer labels in ``[0, K)``.

    Returns:
        0-dim float64 tensor in ``[0, 1]``.
    """
    probs = _check_float_matrix(probs, "probs")
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    pred = probs.argmax(dim=-1)  # (N,)
    return _f64(pred == labels.to(pred.device)).mean()


def chance_accuracy(labels: Tensor) -> Tensor:
    """Accuracy of always predicting the most frequent label: the rate of the majority class.

    A classifier whose accuracy is not above this has learned nothing measurable.

    Args:
        labels: ``(N,)`` integer labels, N ≥ 1.

    Returns:
        0-dim float64 tensor in ``(0, 1]``.
    """
    labels = _check_tensor(labels, "labels")
    n = labels.shape[0] if labels.ndim else 0  # a wrong ndim is reported by _check_labels
    labels = _check_labels(labels, n, torch.iinfo(torch.int64).max)
    if labels.numel() == 0:
        raise ValueError("`labels` must not be empty: chance accuracy of no samples is undefined")
    counts = torch.bincount(labels)  # (max label + 1,)
    return _f64(counts.max()) / labels.numel()


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
    labels = _check_tensor(labels, "labels")
    n = labels.shape[0] if labels.ndim else 0  # a wrong ndim is reported by _check_labels
    labels = _check_labels(labels, n, torch.iinfo(torch.int64).max)
    if labels.numel() == 0:
        raise ValueError("`labels` must not be empty: chance NLL of no samples is undefined")
    counts = _f64(torch.bincount(labels))  # (max label + 1,)
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
    log_probs = _check_float_matrix(log_probs, "log_probs")
    labels = _check_labels(labels, log_probs.shape[0], log_probs.shape[1])
    picked = log_probs.gather(1, labels.to(log_probs.device)[:, None]).squeeze(1)  # (N,)
    return -_f64(picked).mean()


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
    probs = _check_float_matrix(probs, "probs")
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    p = _f64(probs)  # (N, K)
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
    conf64, correct, bin_idx = _top_label_bins(probs, labels, n_bins)  # (N,) each
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
    conf64, correct, bin_idx = _top_label_bins(probs, labels, n_bins)  # (N,) each
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


def _top_label_bins(probs: Tensor, labels: Tensor, n_bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Top-label confidence (float64), correctness (0/1 float64) and ECE bin index, each (N,)."""
    probs = _check_float_matrix(probs, "probs")
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"`n_bins` must be a positive int, got {n_bins!r}")
    conf, pred = probs.max(dim=-1)  # (N,), (N,)
    correct = _f64(pred == labels.to(pred.device))  # (N,)
    conf64 = _f64(conf)  # (N,) exact widening
    # Edges are rounded to the confidence dtype first: otherwise float32(0.2) > 0.2 (double)
    # would push a confidence that *is* 0.2 at float32 precision into the next bin up.
    edges = (torch.arange(n_bins + 1, dtype=torch.float64) / n_bins).to(conf.dtype)  # (n+1,)
    edges = _f64(edges).to(conf64.device)  # (n+1,)
    # bucketize(right=False) gives i with edges[i-1] < c <= edges[i]: bins closed on the right.
    # Clamping sends c == 0 to the first bin and c == 1 (or a rounding hair above) to the last.
    bin_idx = (torch.bucketize(conf64, edges, right=False) - 1).clamp_(0, n_bins - 1)  # (N,)
    return conf64, correct.to(conf64.device), bin_idx


# --------------------------------------------------------------------------------------------
# Selective prediction
# --------------------------------------------------------------------------------------------


def _check_correct(correct: object, n: int) -> Tensor:
    correct = _check_tensor(correct, "correct")
    if correct.ndim != 1:
        raise ValueError(
            f"`correct` must be a 1-D (N,) bool or 0/1 tensor, got {_describe(correct)}"
        )
    if correct.shape[0] != n:
        raise ValueError(
            f"`correct` must have length N={n} to match `confidence`, got {_describe(correct)}"
        )
    is_binary = correct.dtype == torch.bool or (
        not correct.is_complex() and bool(((correct == 0) | (correct == 1)).all())
    )
    if not is_binary:
        raise ValueError(
            f"`correct` must be a bool tensor or contain only 0 and 1, got {_describe(correct)}"
        )
    return correct.bool()


def selective_prediction(confidence: Tensor, correct: Tensor) -> dict[str, Tensor]:
    """Accuracy–coverage and risk–coverage curves and their areas (Geifman & El-Yaniv, 2017,
    "Selective Classification for Deep Neural Networks").

    Samples are sorted by confidence, descending, and tied confidences are grouped: each distinct
    confidence value ``t_g`` (``g = 1..G``, decreasing) is one threshold that admits every
    sample with confidence ``>= t_g``. With ``n_g`` samples and ``e_g`` errors admitted,

        coverage_g = n_g / N,   risk_g = e_g / n_g,   accuracy_g = 1 - risk_g,
        AURC = Σ_g (n_g - n_{g-1}) / N · risk_g          (n_0 = 0),
        sel_pred_auc = Σ_g (n_g - n_{g-1}) / N · accuracy_g = 1 - AURC.

    Each sample is thus weighted by the risk at the threshold that first admits it; without ties
    AURC is the usual ``(1/N) Σ_k errors_k / k``. The result does not depend on the order of
    tied samples.

    Args:
        confidence: ``(N,)`` floating confidences, higher meaning more confident (no NaN).
        correct: ``(N,)`` bool (or 0/1) tensor, whether each prediction is correct.

    Returns:
        ``coverage``, ``accuracy``, ``risk``: ``(G,)`` float64 curves in increasing coverage;
        ``sel_pred_auc`` and ``aurc``: 0-dim float64 areas.
    """
    confidence = _check_float_vector(confidence, "confidence")
    n = confidence.shape[0]
    correct = _check_correct(correct, n)
    conf64 = _f64(confidence)  # (N,)
    order = torch.argsort(conf64, descending=True)  # (N,)
    conf_sorted = conf64[order]  # (N,)
    errors = _f64(~correct.to(conf64.device))[order]  # (N,)
    cum_err = errors.cumsum(0)  # (N,)
    cum_n = torch.arange(1, n + 1, dtype=torch.float64, device=conf64.device)  # (N,)
    # The last sample of each run of equal confidences closes a threshold group.
    is_group_end = torch.ones(n, dtype=torch.bool, device=conf64.device)  # (N,)
    is_group_end[:-1] = conf_sorted[1:] != conf_sorted[:-1]
    n_g = cum_n[is_group_end]  # (G,)
    e_g = cum_err[is_group_end]  # (G,)
    coverage = n_g / n  # (G,)
    risk = e_g / n_g  # (G,)
    acc = (n_g - e_g) / n_g  # (G,)
    weight = torch.diff(n_g, prepend=n_g.new_zeros(1)) / n  # (G,) newly admitted fraction
    return {
        "coverage": coverage,
        "accuracy": acc,
        "risk": risk,
        "sel_pred_auc": (weight * acc).sum(),
        "aurc": (weight * risk).sum(),
    }


# --------------------------------------------------------------------------------------------
# OOD detection
# --------------------------------------------------------------------------------------------


def ood_detection(score_in: Tensor, score_out: Tensor) -> dict[str, Tensor]:
    """Threshold-free OOD detection metrics, OOD being the positive class.

    Scores follow the convention HIGHER = MORE LIKELY OOD. In- and out-of-distribution samples
    are scored together; every distinct score value is one threshold (predict OOD when
    ``score >= t``), as in scikit-learn's ``roc_curve`` / ``precision_recall_curve``.

    - ``auroc``: Mann–Whitney ``P(s_out > s_in) + ½ P(s_out = s_in)``; equals
      ``sklearn.metrics.roc_auc_score``.
    - ``aupr``: average precision ``Σ_g (R_g - R_{g-1}) · P_g`` over the distinct thresholds
      (``R_0 = 0``); equals ``sklearn.metrics.average_precision_score``.
    - ``fpr95``: the smallest false-positive rate among thresholds whose true-positive rate is
      ``>= 0.95``, i.e. the FPR of ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` at
      the first index with TPR ``>= 0.95``.

    Args:
        score_in: ``(N_in,)`` floating scores of in-distribution samples (negatives).
        score_out: ``(N_out,)`` floating scores of OOD samples (positives).

    Returns:
        ``{"auroc", "aupr", "fpr95"}``, each a 0-dim float64 tensor.
    """
    score_in = _check_float_vector(score_in, "score_in")
    score_out = _check_float_vector(score_out, "score_out")
    s_in = _f64(score_in)  # (N_in,)
    s_out = _f64(score_out).to(s_in.device)  # (N_out,)
    n_neg, n_pos = s_in.shape[0], s_out.shape[0]
    scores = torch.cat([s_in, s_out])  # (N,)
    is_pos = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)])  # (N,)
    order = torch.argsort(scores, descending=True)  # (N,)
    s_sorted = scores[order]  # (N,)
    is_group_end = torch.ones_like(s_sorted, dtype=torch.bool)  # (N,)
    is_group_end[:-1] = s_sorted[1:] != s_sorted[:-1]
    # Counts are small integers held exactly in float64; only the final ratios round.
    tps = is_pos[order].cumsum(0)[is_group_end]  # (G,) positives with score >= t_g
    n_admitted = torch.arange(1, scores.shape[0] + 1, dtype=torch.float64, device=s_in.device)
    fps = n_admitted[is_group_end] - tps  # (G,) negatives with score >= t_g
    d_tps = torch.diff(tps, prepend=tps.new_zeros(1))  # (G,) positives in tie group g
    d_fps = torch.diff(fps, prepend=fps.new_zeros(1))  # (G,) negatives in tie group g

    # Each positive beats the negatives strictly below its tie group and ties with those in it.
    neg_below = n_neg - fps  # (G,)
    u_stat = (d_tps * (neg_below + 0.5 * d_fps)).sum()
    auroc = u_stat / (n_pos * n_neg)

    precision = tps / (tps + fps)  # (G,) never 0/0: every group admits >= 1 sample
    aupr = (d_tps / n_pos * precision).sum()

    # Same float64 ratio-then-compare as sklearn, so an exact 0.95 (e.g. 19/20) counts.
    tpr = tps / n_pos  # (G,)
    fpr = fps / n_neg  # (G,)
    first = int(torch.nonzero(tpr >= 0.95)[0, 0])  # exists: the last group has tpr == 1
    return {"auroc": auroc, "aupr": aupr, "fpr95": fpr[first]}


def binary_auroc(scores: Tensor, labels: Tensor) -> Tensor:
    """Area under the ROC curve of ``scores`` for the positive class (label 1) vs label 0.

    The tie-aware Mann–Whitney statistic of :func:`ood_detection` with the negatives
    (``labels == 0``) as ``score_in`` and the positives (``labels == 1``) as ``score_out``;
    equals ``sklearn.metrics.roc_auc_score(labels, scores)``.

    Args:
        scores: ``(N,)`` floating scores, higher meaning more likely positive (no NaN); any
            strictly increasing transform (e.g. ``log p_1`` instead of ``p_1``) gives the same
            value.
        labels: ``(N,)`` integer labels in ``{0, 1}``, both present.

    Returns:
        0-dim float64 tensor in ``[0, 1]``.
    """
    scores = _check_float_vector(scores, "scores")
    labels = _check_labels(labels, scores.shape[0], 2).to(scores.device)  # (N,)
    n_pos = int(labels.sum())
    if n_pos in (0, labels.shape[0]):
        raise ValueError(
            f"`labels` must contain both classes 0 and 1 for an AUROC, got only class "
            f"{int(labels[0])} in {labels.shape[0]} samples"
        )
    return ood_detection(scores[labels == 0], scores[labels == 1])["auroc"]


# --------------------------------------------------------------------------------------------
# Ensembles and the standard bundle
# --------------------------------------------------------------------------------------------


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
    x = _check_tensor(member_log_probs, "member_log_probs")
    if x.ndim != 3:
        raise ValueError(
            f"`member_log_probs` must be a 3-D (E, N, K) floating tensor, got {_describe(x)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"`member_log_probs` must have a floating-point dtype, got {_describe(x)}")
    if x.numel() == 0:
        raise ValueError(f"`member_log_probs` must be non-empty (E, N, K >= 1), got {_describe(x)}")
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # (E, N, K)
    return torch.logsumexp(x, dim=0) - math.log(x.shape[0])  # (N, K)


def classification_metrics(log_probs: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """The standard in-distribution bundle, all 0-dim float64 tensors.

    Keys: ``accuracy``, ``nll``, ``brier``, ``ece`` (15 bins), ``ece_10bin``, ``sel_pred_auc``
    and ``aurc`` (confidence = max probability), ``sel_pred_auc_entropy`` and ``aurc_entropy``
    (confidence = negative predictive entropy). Definitions as in the individual functions.

    Binary tasks (K = 2) also get ``auroc_positive``: :func:`binary_auroc` of the positive-class
    (label 1) probability, the usual headline metric of imbalanced tasks such as melanoma
    detection; NaN when ``labels`` hold only one class.

    Args:
        log_probs: ``(N, K)`` natural-log class probabilities (see :func:`nll`).
        labels: ``(N,)`` integer labels in ``[0, K)``.
    """
    log_probs = _check_float_matrix(log_probs, "log_probs")
    labels = _check_labels(labels, log_probs.shape[0], log_probs.shape[1])
    probs = _f64(log_probs).exp()  # (N, K)
    labels = labels.to(probs.device)  # (N,)
    correct = probs.argmax(dim=-1) == labels  # (N,)
    scores = confidence_scores(probs)
    by_max_prob = selective_prediction(scores["max_prob"], correct)
    by_entropy = selective_prediction(scores["neg_entropy"], correct)
    out = {
        "accuracy": accuracy(probs, labels),
        "nll": nll(log_probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, n_bins=15),
        "ece_10bin": ece(probs, labels, n_bins=10),
        "sel_pred_auc": by_max_prob["sel_pred_auc"],
        "aurc": by_max_prob["aurc"],
        "sel_pred_auc_entropy": by_entropy["sel_pred_auc"],
        "aurc_entropy": by_entropy["aurc"],
    }
    if probs.shape[1] == 2:
        n_pos = int(labels.sum())
        out["auroc_positive"] = (
            # log p_1 ranks exactly as p_1 but keeps underflowed probabilities apart.
            binary_auroc(_f64(log_probs[:, 1]), labels)
            if 0 < n_pos < labels.shape[0]
            else torch.tensor(math.nan, dtype=torch.float64, device=probs.device)
        )
    return out
