"""OOD scores and their detection metrics: pure tensor maths (docs/method.md, "Metrics").

A score is per sample, larger meaning more likely out of distribution: predictive entropy (the
paper's), the negative maximum softmax probability, the negative maximum logit and the energy.
:func:`ood_metrics` reports AUROC, AUPR and FPR95 of each chosen score, in- and
out-of-distribution scored together (:func:`fseb_ft.evaluation.metrics.ood_detection`). Conventions
and
argument checks are those of :mod:`fseb_ft.evaluation.metrics`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fseb_ft.evaluation.metrics import (
    _check_float_matrix,
    _describe,
    _f64,
    confidence_scores,
    ood_detection,
    predictive_entropy,
)
from fseb_ft.recipe.options import OOD_SCORES

__all__ = ["energy_score", "max_logit_score", "ood_metrics", "ood_score"]

_LOGIT_SCORES = ("max_logit", "energy")


def max_logit_score(logits: Tensor) -> Tensor:
    """Maximum-logit OOD score ``-max_k f_k`` (Hendrycks et al., 2022): larger = more OOD.

    Args:
        logits: ``(N, K)`` logits of one model.

    Returns:
        ``(N,)`` float64 scores.
    """
    logits = _check_float_matrix(logits, "logits")
    return -_f64(logits).max(dim=-1).values  # (N,)


def energy_score(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Energy OOD score ``E(x) = -T · logsumexp_k(f_k / T)`` (Liu et al., 2020): larger = more
    OOD.

    Args:
        logits: ``(N, K)`` logits of one model.
        temperature: ``T > 0``; 1 is the usual choice.

    Returns:
        ``(N,)`` float64 scores.
    """
    logits = _check_float_matrix(logits, "logits")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
    return -temperature * torch.logsumexp(_f64(logits) / temperature, dim=-1)  # (N,)


def ood_score(name: str, probs: Tensor, logits: Tensor | None = None) -> Tensor:
    """Per-sample OOD score ``name`` of :data:`OOD_SCORES`, larger = more likely OOD.

    ``entropy``: :func:`predictive_entropy`; ``msp``: ``-max_k p_k`` (negative maximum softmax
    probability); ``max_logit``: :func:`max_logit_score`; ``energy``: :func:`energy_score`
    with ``T = 1``. The last two read ``logits`` (softmax drops the logsumexp they depend on).

    Args:
        name: one of :data:`OOD_SCORES`.
        probs: ``(N, K)`` class probabilities.
        logits: ``(N, K)`` logits; required for ``max_logit`` and ``energy``.

    Returns:
        ``(N,)`` float64 scores.
    """
    if name not in OOD_SCORES:
        raise ValueError(f"`name` must be one of {list(OOD_SCORES)}, got {name!r}")
    if name == "entropy":
        return predictive_entropy(probs)
    if name == "msp":
        return -confidence_scores(probs)["max_prob"]
    if logits is None:
        raise ValueError(f"the {name!r} score needs `logits`, got None")
    return max_logit_score(logits) if name == "max_logit" else energy_score(logits)


def ood_metrics(
    probs_in: Tensor,
    probs_out: Tensor,
    scores: tuple[str, ...] = ("entropy",),
    logits_in: Tensor | None = None,
    logits_out: Tensor | None = None,
) -> dict[str, Tensor]:
    """OOD detection (:func:`ood_detection`) by each score of ``scores``.

    Keys are ``{score}_auroc``, ``{score}_aupr`` and ``{score}_fpr95`` for each score (see
    :func:`ood_score`); ``entropy`` is the paper's choice. A logit score (``max_logit``,
    ``energy``) is left out when the logits are not given (an ensemble has averaged
    probabilities but no logits): absent, never computed from something else.

    Args:
        probs_in: ``(N_in, K)`` class probabilities on in-distribution data.
        probs_out: ``(N_out, K)`` class probabilities on OOD data (same K).
        scores: names from :data:`OOD_SCORES`.
        logits_in: ``(N_in, K)`` logits behind ``probs_in``, or ``None``.
        logits_out: ``(N_out, K)`` logits behind ``probs_out``, or ``None``.

    Returns:
        Three 0-dim float64 tensors per score reported.
    """
    probs_in = _check_float_matrix(probs_in, "probs_in")
    probs_out = _check_float_matrix(probs_out, "probs_out")
    if probs_in.shape[1] != probs_out.shape[1]:
        raise ValueError(
            f"`probs_out` must have the same number of classes K={probs_in.shape[1]} as "
            f"`probs_in`, got {_describe(probs_out)}"
        )
    has_logits = logits_in is not None and logits_out is not None
    out: dict[str, Tensor] = {}
    for name in scores:
        if name in _LOGIT_SCORES and not has_logits:
            continue
        found = ood_detection(
            ood_score(name, probs_in, logits_in), ood_score(name, probs_out, logits_out)
        )
        out.update({f"{name}_{key}": value for key, value in found.items()})
    return out
