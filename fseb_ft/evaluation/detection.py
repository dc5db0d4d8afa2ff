"""Threshold-free detection metrics of a score: AUROC, AUPR and FPR95 (docs/method.md,
"Metrics").

:func:`ood_detection` ranks in- against out-of-distribution samples by an OOD score
(:mod:`fseb_ft.evaluation.ood`); :func:`binary_auroc` ranks a binary task's classes by the
positive class's score. Conventions and argument checks are those of
the metrics (:mod:`fseb_ft.evaluation.checks`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_vector, check_labels, to_float64

__all__ = ["binary_auroc", "ood_detection"]


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
    score_in = check_float_vector(score_in, "score_in")
    score_out = check_float_vector(score_out, "score_out")
    s_in = to_float64(score_in)  # (N_in,)
    s_out = to_float64(score_out).to(s_in.device)  # (N_out,)
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
    scores = check_float_vector(scores, "scores")
    labels = check_labels(labels, scores.shape[0], 2).to(scores.device)  # (N,)
    n_pos = int(labels.sum())
    if n_pos in (0, labels.shape[0]):
        raise ValueError(
            f"`labels` must contain both classes 0 and 1 for an AUROC, got only class "
            f"{int(labels[0])} in {labels.shape[0]} samples"
        )
    return ood_detection(scores[labels == 0], scores[labels == 1])["auroc"]
