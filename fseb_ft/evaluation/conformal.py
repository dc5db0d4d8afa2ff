"""Split-conformal prediction sets for a classifier's probabilities; pure tensor maths.

A prediction set ``C(x) = {y : s(x, y) ≤ q̂}`` holds every class whose non-conformity score is
at most the quantile ``q̂`` of the scores of the true labels on a labelled calibration split
(the run's validation split). With ``n`` calibration images and target coverage ``1 − α``,
``q̂`` is the ``⌈(n + 1)(1 − α)⌉``-th smallest calibration score (quantile level
``⌈(n + 1)(1 − α)⌉ / n``; ``+∞``, every class, when that rank exceeds ``n``). Guarantee
(Vovk et al., 2005; Angelopoulos & Bates, 2021): when the calibration images and a new image
are exchangeable (drawn alike, e.g. i.i.d. from one distribution), ``P(y ∈ C(x)) ≥ 1 − α``,
marginally over the calibration draw and the new image; with continuous scores it is also at
most ``1 − α + 1 / (n + 1)``. It assumes the probabilities were fitted without the calibration
images: a run's validation split also chose its best epoch (and its temperature, with
temperature scaling), so on a run the guarantee is approximate. It says nothing of one image,
nor of images unlike the calibration split (another hospital, a corruption, an unseen class).
Class-conditional (Mondrian) calibration takes one quantile per class from that class's
calibration images, so the guarantee holds for each class: ``P(y ∈ C(x) | y = k) ≥ 1 − α``
(rare classes then get their own, larger sets, and a class with fewer than ``1/α − 1``
calibration images is in every set).

The scores (``p`` the probabilities, ``o(x, y)`` the 1-based rank of ``y`` by decreasing
probability, ``m(x, y)`` the mass of the classes ranked before ``y``):

- ``lac`` (Sadinle et al., 2019): ``1 − p_y``; the smallest sets on average.
- ``aps`` (Romano et al., 2020): ``m(x, y) + u · p_y``.
- ``raps`` (Angelopoulos et al., 2021): ``m(x, y) + u · p_y + λ · max(0, o(x, y) − k_reg)``,
  which penalises long tails of small probabilities.

``u`` randomises APS and RAPS: one independent uniform draw in ``[0, 1)`` per image
(:func:`uniform_draws`, seeded), for the calibration images when calibrating and a fresh one for
each new image when predicting (never the calibration's), gives coverage close to ``1 − α``
itself: a new image's randomised score is then exchangeable with the calibration scores.
Without it ``u = 0``: deterministic sets that always hold the top class, and coverage still
``≥ 1 − α`` (more conservative). LAC ignores ``u``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_matrix, check_labels, to_float64
from fseb_ft.recipe import EvalConfig
from fseb_ft.recipe.options import CONFORMAL_METHODS

__all__ = [
    "CONFORMAL_METHODS",
    "COVERAGE_KEY",
    "SET_SIZE_KEY",
    "ConformalCalibration",
    "ConformalTarget",
    "calibrate",
    "conformal_coverage",
    "conformity_scores",
    "prediction_sets",
    "quantile_rank",
    "uniform_draws",
]

COVERAGE_KEY = "conformal_coverage"
"""The results' key of the conformal sets' empirical coverage on the reported split."""
SET_SIZE_KEY = "conformal_set_size"
"""The results' key of their mean size."""

# Coverage targets are decimal fractions (0.9) whose product with n + 1 is not exact in binary
# (0.9 · 100 = 90.00000000000001): this slack keeps ⌈(n + 1)(1 − α)⌉ at the intended rank.
_RANK_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class ConformalCalibration:
    """What :func:`calibrate` found: the score, its parameters and the quantile(s) ``q̂``."""

    method: str
    """``lac``, ``aps`` or ``raps``."""
    coverage: float
    """The target coverage ``1 − α``."""
    n: int
    """Calibration images."""
    quantiles: Tensor
    """``q̂``: ``(1,)`` marginal, or ``(K,)`` one per class (class-conditional); ``+∞`` where
    there are too few calibration images for the target."""
    class_conditional: bool
    """One quantile per class (Mondrian) rather than one for all."""
    randomized: bool
    """APS / RAPS scores randomised by ``u`` (:func:`uniform_draws`)."""
    lam: float = 0.01
    """RAPS's penalty ``λ`` per rank beyond ``k_reg``."""
    k_reg: int = 1
    """RAPS's ranks without penalty."""


@dataclasses.dataclass(frozen=True)
class ConformalTarget:
    """The conformal sets a run's results report (``eval.conformal``, ``eval.conformal_method``,
    ``eval.conformal_class_conditional``): deterministic, as ``fseb-ft predict``'s."""

    coverage: float
    """The target coverage ``1 − α``."""
    method: str = "lac"
    """``lac``, ``aps`` or ``raps``."""
    class_conditional: bool = False
    """One quantile per class."""

    @classmethod
    def of(cls, cfg: EvalConfig) -> ConformalTarget | None:
        """The ``eval`` section's; ``None`` when ``eval.conformal`` is."""
        if cfg.conformal is None:
            return None
        return cls(cfg.conformal, cfg.conformal_method, cfg.conformal_class_conditional)


def conformal_coverage(
    val_probs: Tensor,
    val_labels: Tensor,
    probs: Tensor,
    labels: Tensor,
    target: ConformalTarget,
) -> dict[str, float]:
    """Calibrate ``target``'s sets on the labelled ``val_probs`` ``(n, K)`` (:func:`calibrate`)
    and score them on ``probs`` ``(N, K)``: :data:`COVERAGE_KEY`, the fraction of images whose
    set holds their label ``labels`` ``(N,)``, and :data:`SET_SIZE_KEY`, the mean set size."""
    calibration = calibrate(
        val_probs, val_labels, target.coverage, target.method, target.class_conditional
    )
    sets = prediction_sets(probs, calibration)  # (N, K) bool
    labels = check_labels(labels, sets.shape[0], sets.shape[1]).to(sets.device)
    covered = sets.gather(-1, labels.reshape(-1, 1)).squeeze(-1)  # (N,)
    return {
        COVERAGE_KEY: covered.double().mean().item(),
        SET_SIZE_KEY: sets.sum(-1).double().mean().item(),
    }


def uniform_draws(n: int, seed: int) -> Tensor:
    """``n`` seeded uniform draws in ``[0, 1)``, float64 ``(n,)``: the ``u`` of randomised sets."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=generator, dtype=torch.float64)


def quantile_rank(n: int, coverage: float) -> int:
    """``⌈(n + 1) · coverage⌉``: the rank (1-based) of ``q̂`` among ``n`` sorted scores."""
    return math.ceil((n + 1) * coverage - _RANK_SLACK)


def conformity_scores(
    probs: Tensor,
    method: str,
    u: Tensor | None = None,
    lam: float = 0.01,
    k_reg: int = 1,
) -> Tensor:
    """The non-conformity score of every class ``(N, K)``, float64, for probabilities ``probs``
    ``(N, K)`` (rows sum to 1); ``u`` ``(N,)`` randomises ``aps`` and ``raps``."""
    probs = to_float64(check_float_matrix(probs, "probs"))
    if method not in CONFORMAL_METHODS:
        raise ValueError(f"method must be one of {list(CONFORMAL_METHODS)}, got {method!r}")
    if method == "lac":
        return 1.0 - probs
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # (N, K) each
    before = sorted_p.cumsum(dim=-1) - sorted_p  # (N, K) mass ranked before each position
    if u is not None:
        before = before + u.to(before).reshape(-1, 1) * sorted_p
    if method == "raps":
        rank = torch.arange(1, probs.shape[1] + 1, dtype=before.dtype, device=before.device)
        before = before + lam * (rank - k_reg).clamp(min=0)  # (K,) broadcast over images
    return torch.empty_like(before).scatter_(-1, order, before)  # back to class order


def calibrate(
    probs: Tensor,
    labels: Tensor,
    coverage: float,
    method: str = "lac",
    class_conditional: bool = False,
    u: Tensor | None = None,
    lam: float = 0.01,
    k_reg: int = 1,
) -> ConformalCalibration:
    """Calibrate on labelled probabilities ``probs`` ``(n, K)`` and ``labels`` ``(n,)`` for the
    target ``coverage`` ``1 − α`` in ``(0, 1]``; ``u`` ``(n,)`` randomises APS / RAPS."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
    if lam < 0 or k_reg < 0:
        raise ValueError(f"RAPS needs lam >= 0 and k_reg >= 0, got {lam} and {k_reg}")
    scores = conformity_scores(probs, method, u, lam, k_reg)  # (n, K)
    labels = check_labels(labels, scores.shape[0], scores.shape[1])
    true = scores.gather(-1, labels.to(scores.device).reshape(-1, 1)).squeeze(-1)  # (n,)
    if class_conditional:
        quantiles = torch.stack(
            [_quantile(true[labels == k], coverage) for k in range(scores.shape[1])]
        )  # (K,)
    else:
        quantiles = _quantile(true, coverage).reshape(1)
    return ConformalCalibration(
        method=method, coverage=coverage, n=len(labels), quantiles=quantiles.cpu(),
        class_conditional=class_conditional, randomized=u is not None, lam=lam, k_reg=k_reg,
    )  # fmt: skip


def prediction_sets(
    probs: Tensor, calibration: ConformalCalibration, u: Tensor | None = None
) -> Tensor:
    """The prediction set of each image of ``probs`` ``(M, K)`` as a bool mask ``(M, K)``:
    ``s(x, y) ≤ q̂`` (``q̂_y`` when class-conditional); ``u`` ``(M,)`` when ``calibration`` is
    randomised (fresh draws, independent of the calibration's: module docstring), else
    ``None``."""
    if (u is not None) != calibration.randomized:
        raise ValueError(
            f"the calibration is {'' if calibration.randomized else 'not '}randomised: give u "
            "exactly when it is, or the scores are not those the quantile holds for"
        )
    scores = conformity_scores(probs, calibration.method, u, calibration.lam, calibration.k_reg)
    quantiles = calibration.quantiles.to(scores)  # (1,) or (K,), broadcast over images
    if calibration.class_conditional and quantiles.shape[0] != scores.shape[1]:
        raise ValueError(
            f"the calibration has {quantiles.shape[0]} classes, probs {scores.shape[1]}"
        )
    return scores <= quantiles


def _quantile(scores: Tensor, coverage: float) -> Tensor:
    """The ``⌈(n + 1) · coverage⌉``-th smallest of ``scores`` ``(n,)``; ``+∞`` past ``n``."""
    rank = quantile_rank(len(scores), coverage)
    if rank > len(scores):
        return torch.tensor(math.inf, dtype=scores.dtype, device=scores.device)
    return scores.sort().values[rank - 1]
