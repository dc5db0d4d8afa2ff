"""Certified abstention: a confidence threshold whose risk among accepted images is at most ``r``
with probability at least ``C`` over the validation draw (exactly or approximately: see below
for which); pure maths on tensors.

The risk of a threshold ``λ`` is the conditional error rate ``R(λ) = P(wrong | c ≥ λ)`` of a new
image, the *selective risk*. :func:`certified_threshold` picks ``λ`` by Learn-then-Test
(Angelopoulos, Bates, Candès, Jordan and Lei, 2021) with fixed-sequence testing: the candidate
thresholds are tested from the most conservative downwards, each null hypothesis ``R(λ) > r``
rejected when the exact one-sided Clopper–Pearson upper bound on ``R(λ)`` at level ``C``, from
the ``e`` errors among the ``n`` validation images ``λ`` accepts, is at most ``r``; the first
failure stops the sequence and the last rejected ``λ`` is chosen. When none is, or ``r = 0``,
no threshold is certified: ``λ̂ = +inf``, abstain on everything.

What Learn-then-Test proves: for candidates fixed before the validation draw, in a fixed order,
the errors among the ``n`` images a candidate accepts are ``Bin(n, R(λ))`` given ``n``, so each
test has level ``1 - C`` and fixed-sequence testing keeps the probability of choosing any ``λ``
with ``R(λ) > r`` at most ``1 - C``:

    P_validation( R(λ̂) ≤ r ) ≥ C,

when the validation images and the new ones are exchangeable (drawn alike), and nothing the
confidences depend on was fitted on the validation images (a run picks its best epoch and fits
its temperature there, so on a run it is approximate for that reason too).

What is done here differs in two ways, both chosen from the validation confidences, never from
their labels: the candidates are the distinct validation confidences themselves, and the
sequence starts at the first that accepts enough images for zero errors to meet the bound,
``1 - (1 - C)^(1/n) ≤ r`` (more conservative ones can certify nothing and would stop every
sequence at once; the selective-classification example of Angelopoulos & Bates, "A Gentle
Introduction to Conformal Prediction", 2021, likewise drops the points of its fixed grid that
accept fewer than 30 images). So the proof above does not apply verbatim. What holds instead:
given the confidences of i.i.d. validation images, the candidates and the start are fixed and
each image's error is an independent draw with probability ``P(wrong | c_i)``. Where that
probability is the same for every image (a flat risk), the error counts are binomial again and
the guarantee holds exactly; otherwise they are sums of unequal draws, which the binomial
argument does not cover, and the guarantee is approximate. A fixed grid with a point in every
gap between adjacent confidences would run the same tests in the same order (a grid point in
a gap accepts the same validation images as the confidence above it) and choose a threshold
no higher than ``λ̂`` (the lowest grid point of the gap below it), so where the risk falls as
the threshold rises, ``λ̂`` is never riskier than that grid's choice.
tests/evaluation/test_certified.py checks the realised rate of choosing a ``λ̂`` with
``R(λ̂) > r`` over simulated validation draws, for a flat risk and a falling one.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_vector, to_float64
from fseb_ft.evaluation.selective import abstention_outcome, selective_prediction

__all__ = ["BOUND_METHOD", "certified_threshold", "clopper_pearson_upper"]

BOUND_METHOD = "Clopper–Pearson, Learn-then-Test"
"""How :func:`certified_threshold` bounds the risk, as the summary, files and card name it."""


def clopper_pearson_upper(errors: Tensor, n: Tensor, level: float) -> Tensor:
    """The exact one-sided Clopper–Pearson upper bound on a binomial error rate.

    ``P(Bin(n, u) ≤ e) = 1 - level`` at the bound ``u``: the ``level`` quantile of
    ``Beta(e + 1, n - e)`` (scipy's), and 1 when ``e = n``. Equal to the upper end of
    ``scipy.stats.binomtest(e, n, alternative="less").proportion_ci(level, method="exact")``.

    Args:
        errors: ``(G,)`` error counts ``e``.
        n: ``(G,)`` trial counts ``n >= 1``, ``n >= e``.
        level: the confidence ``C``, in (0, 1).

    Returns:
        ``(G,)`` float64 upper bounds.
    """
    from scipy import stats  # 0.6 s to import: not on every command's start

    e = to_float64(torch.as_tensor(errors)).cpu().numpy()  # (G,)
    trials = to_float64(torch.as_tensor(n)).cpu().numpy()  # (G,)
    with np.errstate(invalid="ignore", divide="ignore"):  # e = n: Beta(n + 1, 0), bound 1
        upper = stats.beta.ppf(level, e + 1, trials - e)
    return torch.from_numpy(np.where(e >= trials, 1.0, upper))


def certified_threshold(
    confidence: Tensor, correct: Tensor, *, max_risk: float, level: float
) -> dict[str, Tensor]:
    """The lowest threshold certified by Learn-then-Test for risk ``<= max_risk`` with
    probability ``>= level`` (module docstring: what is guaranteed, and under what).

    Args:
        confidence: ``(N,)`` validation confidences, higher meaning more confident (no NaN).
        correct: ``(N,)`` bool (or 0/1) tensor, whether each prediction is correct.
        max_risk: the largest tolerated error rate among accepted images ``r``, in [0, 1).
        level: the probability ``C`` over the validation draw, in [0.5, 1).

    Returns:
        ``threshold`` (``+inf`` when none is certified), :func:`abstention_outcome`'s
        ``accepted``, ``coverage`` and ``risk`` there, and ``risk_bound``, the Clopper–Pearson
        bound at it (NaN when none is certified): 0-dim float64 tensors.
    """
    if not 0 <= max_risk < 1:
        raise ValueError(f"`max_risk` must lie in [0, 1), got {max_risk!r}")
    if not 0.5 <= level < 1:
        raise ValueError(f"`level` must lie in [0.5, 1), got {level!r}")
    conf64 = to_float64(check_float_vector(confidence, "confidence"))  # (N,)
    curve = selective_prediction(conf64, correct)  # per distinct confidence, coverage ascending
    groups = torch.unique(conf64, sorted=True).flip(0)  # (G,) t_1 > … > t_G
    admitted = torch.round(curve["coverage"] * conf64.shape[0])  # (G,) n_g
    errors = torch.round(curve["risk"] * admitted)  # (G,) e_g
    bound = clopper_pearson_upper(errors, admitted, level).to(conf64.device)  # (G,)
    # Zero errors among n_g meet the bound from some n_g on: the sequence starts there.
    zero = clopper_pearson_upper(torch.zeros_like(admitted), admitted, level)  # (G,)
    could_pass = zero.to(conf64.device) <= max_risk
    start = int(torch.argmax(could_pass.to(torch.int8)))  # the first that could pass
    passed = (bound <= max_risk)[start:]  # (G - start,)
    run = len(passed) if bool(passed.all()) else int(torch.argmin(passed.to(torch.int8)))
    if not bool(could_pass.any()) or run == 0:
        threshold, risk_bound = conf64.new_tensor(math.inf), conf64.new_tensor(math.nan)
    else:
        threshold, risk_bound = groups[start + run - 1], bound[start + run - 1]
    found = abstention_outcome(conf64, correct, threshold)
    return {"threshold": threshold, **found, "risk_bound": risk_bound}
