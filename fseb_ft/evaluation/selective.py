"""Selective prediction: the accuracy–coverage curve and abstention thresholds; pure tensor maths.

A selective classifier predicts when its confidence, the maximum class probability ``p_max``
(after temperature scaling when the model has it), reaches a threshold ``τ`` and abstains
otherwise (Geifman & El-Yaniv, 2017; docs/method.md, "Metrics"). :func:`selective_prediction`
gives the accuracy and risk at every threshold and the areas under those curves.
:func:`top_class_log_odds` gives the confidence on a scale that never rounds to 1: confident
predictions, whose ``p_max`` would tie at exactly 1.0 where no threshold splits them, stay
distinct. :func:`abstention_threshold` picks the threshold on labelled validation predictions,
for a target coverage or for a largest tolerated risk (error rate among the accepted
predictions); :func:`abstention_outcome` reports the coverage and risk a given threshold
achieves. The accepted set is always ``{i : c_i >= τ}``, so tied confidences are accepted or
refused together, exactly as :func:`selective_prediction` groups them. Conventions and argument
checks are those of :mod:`fseb_ft.evaluation.metrics`.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import (
    check_correct,
    check_float_matrix,
    check_float_vector,
    to_float64,
)

__all__ = [
    "abstention_outcome",
    "abstention_threshold",
    "selective_prediction",
    "top_class_log_odds",
]

# Coverage targets are decimal fractions (0.9) whose product with N is not exact in binary
# (0.29 · 100 = 28.999999999999996); this slack keeps ⌈α N⌉ at the intended count.
_COUNT_SLACK = 1e-9


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
    confidence = check_float_vector(confidence, "confidence")
    n = confidence.shape[0]
    correct = check_correct(correct, n)
    conf64 = to_float64(confidence)  # (N,)
    order = torch.argsort(conf64, descending=True)  # (N,)
    conf_sorted = conf64[order]  # (N,)
    errors = to_float64(~correct.to(conf64.device))[order]  # (N,)
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


def top_class_log_odds(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """The log-odds of the predicted class, ``log(p_max / (1 - p_max))`` with
    ``p = softmax(logits / T)``: a confidence that orders samples as ``p_max`` does.

    Computed as ``z_max - logsumexp_{k != argmax} z_k`` with ``z = logits / T``, it stays finite
    and distinct where ``p_max`` rounds to exactly 1 (a logit gap above ~37, or a small ``T``),
    so thresholds on it can still split confident samples. ``p_max = sigmoid(log-odds)``.

    Args:
        logits: ``(N, K)`` finite logits of one model.
        temperature: ``T > 0``.

    Returns:
        ``(N,)`` float64 log-odds (``+inf`` when ``K = 1``).
    """
    logits = check_float_matrix(logits, "logits")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
    z = to_float64(logits) / temperature  # (N, K)
    top = z.max(dim=-1)  # (N,) values and indices
    others = z.scatter(1, top.indices[:, None], -math.inf)  # (N, K) the predicted class masked
    return top.values - torch.logsumexp(others, dim=-1)  # (N,)


def abstention_threshold(
    confidence: Tensor,
    correct: Tensor,
    *,
    coverage: float | None = None,
    max_risk: float | None = None,
) -> dict[str, Tensor]:
    """The confidence threshold ``τ`` for a target ``coverage`` or a largest ``max_risk``.

    The candidate thresholds are the distinct confidences ``t_1 > t_2 > … > t_G``; ``t_g``
    accepts the ``n_g`` samples with ``c >= t_g`` and makes ``e_g`` errors among them, so its
    coverage is ``n_g / N`` and its (selective) risk ``e_g / n_g``.

    - ``coverage = α``: the largest ``t_g`` with ``n_g >= α N``, i.e. the ``⌈α N⌉`` most confident
      samples (more only when confidences tie at the cut), so the coverage reached is within
      one sample of ``α`` whenever the cut falls between distinct confidences.
    - ``max_risk = r``: the smallest ``t_g`` (largest coverage) with ``e_g / n_g <= r``: the
      empirical risk on these samples, not a high-probability bound. When even the most
      confident group errs too often, ``τ = +inf``: abstain on everything.

    Exactly one of ``coverage`` and ``max_risk`` must be given.

    Args:
        confidence: ``(N,)`` floating confidences, higher meaning more confident (no NaN).
        correct: ``(N,)`` bool (or 0/1) tensor, whether each prediction is correct.
        coverage: target fraction of accepted samples, in ``(0, 1]``.
        max_risk: largest tolerated error rate among accepted samples, in ``[0, 1)``.

    Returns:
        ``threshold`` (``τ``), with :func:`abstention_outcome`'s ``accepted``, ``coverage`` and
        ``risk`` at ``τ``: 0-dim float64 tensors.
    """
    if (coverage is None) == (max_risk is None):
        raise ValueError(
            f"give exactly one of `coverage` and `max_risk`, got {coverage=} and {max_risk=}"
        )
    if coverage is not None and not 0 < coverage <= 1:
        raise ValueError(f"`coverage` must lie in (0, 1], got {coverage!r}")
    if max_risk is not None and not 0 <= max_risk < 1:
        raise ValueError(f"`max_risk` must lie in [0, 1), got {max_risk!r}")
    conf64 = to_float64(check_float_vector(confidence, "confidence"))  # (N,)
    n = conf64.shape[0]
    curve = selective_prediction(conf64, correct)  # per distinct confidence, coverage ascending
    groups = torch.unique(conf64, sorted=True).flip(0)  # (G,) t_1 > … > t_G
    admitted = torch.round(curve["coverage"] * n)  # (G,) n_g
    if coverage is not None:
        wanted = math.ceil(coverage * n - _COUNT_SLACK * n)  # ⌈α N⌉ samples
        g = int(torch.nonzero(admitted >= wanted)[0, 0])  # the first group reaching it
        threshold = groups[g]
    else:
        risk = cast(float, max_risk)  # the one given when coverage is not (checked above)
        fine = torch.nonzero(curve["risk"] <= risk + _COUNT_SLACK)  # (F, 1)
        threshold = groups[int(fine[-1, 0])] if len(fine) else conf64.new_tensor(math.inf)
    return {"threshold": threshold, **abstention_outcome(conf64, correct, threshold)}


def abstention_outcome(confidence: Tensor, correct: Tensor, threshold: Tensor) -> dict[str, Tensor]:
    """What the threshold ``τ`` does on labelled predictions: accept ``{i : c_i >= τ}``.

    Args:
        confidence: ``(N,)`` floating confidences (no NaN).
        correct: ``(N,)`` bool (or 0/1) tensor, whether each prediction is correct.
        threshold: 0-dim ``τ`` (``+inf`` abstains on everything, ``-inf`` on nothing).

    Returns:
        ``accepted`` (the count), ``coverage`` (``accepted / N``) and ``risk`` (errors among the
        accepted over ``accepted``; NaN when nothing is accepted): 0-dim float64 tensors.
    """
    conf64 = to_float64(check_float_vector(confidence, "confidence"))  # (N,)
    correct = check_correct(correct, conf64.shape[0]).to(conf64.device)  # (N,)
    accept = conf64 >= to_float64(torch.as_tensor(threshold)).to(conf64.device)  # (N,)
    accepted = accept.sum().to(torch.float64)
    errors = (accept & ~correct).sum().to(torch.float64)
    risk = errors / accepted if accepted > 0 else conf64.new_tensor(math.nan)
    return {"accepted": accepted, "coverage": accepted / conf64.shape[0], "risk": risk}
