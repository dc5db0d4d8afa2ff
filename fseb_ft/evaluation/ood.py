"""OOD scores and their detection metrics: pure tensor maths (docs/method.md, "Metrics").

A score is per sample, larger meaning more likely out of distribution: predictive entropy (the
paper's), the negative maximum softmax probability, the negative maximum logit and the energy.
Each is one function registered by :func:`register_ood_score` under its name in
:data:`~fseb_ft.recipe.options.OOD_SCORES`, with the title tables and model cards give it and
whether it reads logits; :data:`OOD_SCORE_REGISTRY` lists them in that order.
:func:`ood_metrics` reports AUROC, AUPR and FPR95 of each chosen score, in- and
out-of-distribution scored together (:func:`fseb_ft.evaluation.detection.ood_detection`).
Conventions and argument checks are those of the metrics (:mod:`fseb_ft.evaluation.checks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_matrix, describe, to_float64
from fseb_ft.evaluation.detection import ood_detection
from fseb_ft.evaluation.metrics import confidence_scores, predictive_entropy

__all__ = [
    "OOD_SCORE_REGISTRY",
    "OodScore",
    "energy_score",
    "entropy_score",
    "max_logit_score",
    "msp_score",
    "ood_metrics",
    "ood_score",
    "register_ood_score",
]

_ScoreFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class OodScore:
    """A registered OOD score.

    Attributes:
        name: its name in ``eval.ood_scores`` and in the results' keys (``{name}_auroc``, …).
        title: how tables and the model card name it.
        needs_logits: whether it reads logits (absent for an ensemble, which has none) rather
            than probabilities.
        compute: ``(N, K)`` logits if ``needs_logits`` else probabilities → ``(N,)`` scores,
            larger = more likely OOD.
    """

    name: str
    title: str
    needs_logits: bool
    compute: _ScoreFn


OOD_SCORE_REGISTRY: dict[str, OodScore] = {}
"""Name → :class:`OodScore`, in registration order (that of
:data:`~fseb_ft.recipe.options.OOD_SCORES`, which a test pins)."""


def register_ood_score(
    name: str, *, title: str, needs_logits: bool = False
) -> Callable[[_ScoreFn], _ScoreFn]:
    """Register the decorated function as the OOD score ``name``.

    Args:
        name: the score's name; also add it to :data:`~fseb_ft.recipe.options.OOD_SCORES`.
        title: how tables and the model card name it; required and non-empty, so a score
            without one fails when its module is imported, not after training.
        needs_logits: whether the function takes logits instead of probabilities.

    Returns:
        A decorator that registers the function and returns it unchanged.
    """
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"OOD score {name!r} needs a non-empty `title`, got {title!r}")
    if name in OOD_SCORE_REGISTRY:
        raise ValueError(f"OOD score {name!r} is already registered")

    def register(compute: _ScoreFn) -> _ScoreFn:
        OOD_SCORE_REGISTRY[name] = OodScore(name, title, needs_logits, compute)
        return compute

    return register


def _registered(name: str) -> OodScore:
    """The registered score ``name``; a :class:`ValueError` names the registered ones."""
    if name not in OOD_SCORE_REGISTRY:
        raise ValueError(f"`name` must be one of {list(OOD_SCORE_REGISTRY)}, got {name!r}")
    return OOD_SCORE_REGISTRY[name]


@register_ood_score("entropy", title="predictive entropy")
def entropy_score(probs: Tensor) -> Tensor:
    """Predictive entropy :func:`~fseb_ft.evaluation.metrics.predictive_entropy`, the paper's OOD
    score.

    Args:
        probs: ``(N, K)`` class probabilities.

    Returns:
        ``(N,)`` float64 scores.
    """
    return predictive_entropy(probs)


@register_ood_score("msp", title="negative maximum softmax probability (−MSP)")
def msp_score(probs: Tensor) -> Tensor:
    """Negative maximum softmax probability ``-max_k p_k`` (Hendrycks & Gimpel, 2017).

    Args:
        probs: ``(N, K)`` class probabilities.

    Returns:
        ``(N,)`` float64 scores.
    """
    return -confidence_scores(probs)["max_prob"]


@register_ood_score("max_logit", title="negative maximum logit", needs_logits=True)
def max_logit_score(logits: Tensor) -> Tensor:
    """Maximum-logit OOD score ``-max_k f_k`` (Hendrycks et al., 2022): larger = more OOD.

    Args:
        logits: ``(N, K)`` logits of one model.

    Returns:
        ``(N,)`` float64 scores.
    """
    logits = check_float_matrix(logits, "logits")
    return -to_float64(logits).max(dim=-1).values  # (N,)


@register_ood_score("energy", title="energy (−logsumexp of the logits)", needs_logits=True)
def energy_score(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Energy OOD score ``E(x) = -T · logsumexp_k(f_k / T)`` (Liu et al., 2020): larger = more
    OOD.

    Args:
        logits: ``(N, K)`` logits of one model.
        temperature: ``T > 0``; 1 is the usual choice (and the registered score's).

    Returns:
        ``(N,)`` float64 scores.
    """
    logits = check_float_matrix(logits, "logits")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
    return -temperature * torch.logsumexp(to_float64(logits) / temperature, dim=-1)  # (N,)


def ood_score(name: str, probs: Tensor, logits: Tensor | None = None) -> Tensor:
    """Per-sample OOD score ``name`` of :data:`OOD_SCORE_REGISTRY`, larger = more likely OOD.

    ``entropy``: :func:`entropy_score`; ``msp``: :func:`msp_score`; ``max_logit``:
    :func:`max_logit_score`; ``energy``: :func:`energy_score` with ``T = 1``. A score that
    needs logits (softmax drops the logsumexp they depend on) reads ``logits``, the others
    ``probs``.

    Args:
        name: a registered score.
        probs: ``(N, K)`` class probabilities.
        logits: ``(N, K)`` logits; required for the scores that need them.

    Returns:
        ``(N,)`` float64 scores.
    """
    score = _registered(name)
    if not score.needs_logits:
        return score.compute(probs)
    if logits is None:
        raise ValueError(f"the {name!r} score needs `logits`, got None")
    return score.compute(logits)


def ood_metrics(
    probs_in: Tensor,
    probs_out: Tensor,
    scores: tuple[str, ...] = ("entropy",),
    logits_in: Tensor | None = None,
    logits_out: Tensor | None = None,
) -> dict[str, Tensor]:
    """OOD detection (:func:`ood_detection`) by each score of ``scores``.

    Keys are ``{score}_auroc``, ``{score}_aupr`` and ``{score}_fpr95`` for each score (see
    :func:`ood_score`); ``entropy`` is the paper's choice. A score that needs logits
    (``max_logit``, ``energy``) is left out when the logits are not given (an ensemble has
    averaged probabilities but no logits): absent, never computed from something else.

    Args:
        probs_in: ``(N_in, K)`` class probabilities on in-distribution data.
        probs_out: ``(N_out, K)`` class probabilities on OOD data (same K).
        scores: registered score names.
        logits_in: ``(N_in, K)`` logits behind ``probs_in``, or ``None``.
        logits_out: ``(N_out, K)`` logits behind ``probs_out``, or ``None``.

    Returns:
        Three 0-dim float64 tensors per score reported.
    """
    probs_in = check_float_matrix(probs_in, "probs_in")
    probs_out = check_float_matrix(probs_out, "probs_out")
    if probs_in.shape[1] != probs_out.shape[1]:
        raise ValueError(
            f"`probs_out` must have the same number of classes K={probs_in.shape[1]} as "
            f"`probs_in`, got {describe(probs_out)}"
        )
    has_logits = logits_in is not None and logits_out is not None
    out: dict[str, Tensor] = {}
    for name in scores:
        if _registered(name).needs_logits and not has_logits:
            continue
        found = ood_detection(
            ood_score(name, probs_in, logits_in), ood_score(name, probs_out, logits_out)
        )
        out.update({f"{name}_{key}": value for key, value in found.items()})
    return out
