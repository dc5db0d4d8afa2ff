"""OOD scores and their detection metrics: pure tensor maths (docs/method.md, "Metrics").

A score is per sample, larger meaning more likely out of distribution: predictive entropy (the
paper's), the negative maximum softmax probability, the negative maximum logit and the energy.
Each is one function registered by :func:`register_ood_score` under its name in
:data:`~fseb_ft.recipe.options.OOD_SCORES`, with the title tables and model cards give it and
whether it reads logits; :data:`OOD_SCORE_REGISTRY` lists them in that order. The feature
scores (Mahalanobis, relative Mahalanobis, KNN, ViM) follow, registered with
``needs_features``: the evaluation pass computes them from the penultimate features
(:mod:`fseb_ft.evaluation.feature_ood`) and hands their values in as ``features``.
:func:`ood_metrics` reports AUROC, AUPR and FPR95 of each chosen score, in- and
out-of-distribution scored together (:func:`fseb_ft.evaluation.detection.ood_detection`).
Conventions and argument checks are those of the metrics (:mod:`fseb_ft.evaluation.checks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import (
    check_float_matrix,
    check_float_vector,
    describe,
    to_float64,
)
from fseb_ft.evaluation.detection import ood_detection
from fseb_ft.evaluation.feature_ood import FEATURE_SCORES
from fseb_ft.evaluation.metrics import confidence_scores, predictive_entropy

__all__ = [
    "OOD_SCORE_REGISTRY",
    "OodScore",
    "available",
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
            larger = more likely OOD; with ``needs_features``, the ``(N,)`` values computed
            from the features → themselves, checked.
        needs_features: whether it is a feature score, absent where its values are (an
            ensemble, ``predict``).
    """

    name: str
    title: str
    needs_logits: bool
    compute: _ScoreFn
    needs_features: bool = False


OOD_SCORE_REGISTRY: dict[str, OodScore] = {}
"""Name → :class:`OodScore`, in registration order (that of
:data:`~fseb_ft.recipe.options.OOD_SCORES`, which a test pins)."""


def register_ood_score(
    name: str, *, title: str, needs_logits: bool = False, needs_features: bool = False
) -> Callable[[_ScoreFn], _ScoreFn]:
    """Register the decorated function as the OOD score ``name``.

    Args:
        name: the score's name; also add it to :data:`~fseb_ft.recipe.options.OOD_SCORES`.
        title: how tables and the model card name it; required and non-empty, so a score
            without one fails when its module is imported, not after training.
        needs_logits: whether the function takes logits instead of probabilities.
        needs_features: whether it is a feature score, whose values are given.

    Returns:
        A decorator that registers the function and returns it unchanged.
    """
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"OOD score {name!r} needs a non-empty `title`, got {title!r}")
    if name in OOD_SCORE_REGISTRY:
        raise ValueError(f"OOD score {name!r} is already registered")

    def register(compute: _ScoreFn) -> _ScoreFn:
        OOD_SCORE_REGISTRY[name] = OodScore(name, title, needs_logits, compute, needs_features)
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


_FEATURE_TITLES = {
    "mahalanobis": "Mahalanobis distance (penultimate features)",
    "relative_mahalanobis": "relative Mahalanobis distance (penultimate features)",
    "knn": "k-th nearest-neighbour distance (penultimate features)",
    "vim": "ViM (virtual logit of the penultimate features)",
}
for _name in FEATURE_SCORES:
    register_ood_score(_name, title=_FEATURE_TITLES[_name], needs_features=True)(
        lambda values: to_float64(check_float_vector(values, "feature score values"))
    )


def ood_score(
    name: str,
    probs: Tensor,
    logits: Tensor | None = None,
    features: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """Per-sample OOD score ``name`` of :data:`OOD_SCORE_REGISTRY`, larger = more likely OOD.

    ``entropy``: :func:`entropy_score`; ``msp``: :func:`msp_score`; ``max_logit``:
    :func:`max_logit_score`; ``energy``: :func:`energy_score` with ``T = 1``. A score that
    needs logits (softmax drops the logsumexp they depend on) reads ``logits``, a feature score
    its values in ``features``, the others ``probs``.

    Args:
        name: a registered score.
        probs: ``(N, K)`` class probabilities.
        logits: ``(N, K)`` logits; required for the scores that need them.
        features: feature score name → its ``(N,)`` values
            (:func:`~fseb_ft.evaluation.feature_ood.feature_ood_score`); required for those.

    Returns:
        ``(N,)`` float64 scores.
    """
    score = _registered(name)
    if score.needs_features:
        if features is None or name not in features:
            raise ValueError(f"the {name!r} score needs its values in `features`, got none")
        return score.compute(features[name])
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
    features_in: Mapping[str, Tensor] | None = None,
    features_out: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """OOD detection (:func:`ood_detection`) by each score of ``scores``.

    Keys are ``{score}_auroc``, ``{score}_aupr`` and ``{score}_fpr95`` for each score (see
    :func:`ood_score`); ``entropy`` is the paper's choice. A score that needs logits
    (``max_logit``, ``energy``) is left out when the logits are not given (an ensemble has
    averaged probabilities but no logits): absent, never computed from something else; so is a
    feature score whose values are not given.

    Args:
        probs_in: ``(N_in, K)`` class probabilities on in-distribution data.
        probs_out: ``(N_out, K)`` class probabilities on OOD data (same K).
        scores: registered score names.
        logits_in: ``(N_in, K)`` logits behind ``probs_in``, or ``None``.
        logits_out: ``(N_out, K)`` logits behind ``probs_out``, or ``None``.
        features_in: feature score name → ``(N_in,)`` values, or ``None``.
        features_out: feature score name → ``(N_out,)`` values, or ``None``.

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
    out: dict[str, Tensor] = {}
    for name in scores:
        if not available(name, (logits_in, logits_out), (features_in, features_out)):
            continue
        found = ood_detection(
            ood_score(name, probs_in, logits_in, features_in),
            ood_score(name, probs_out, logits_out, features_out),
        )
        out.update({f"{name}_{key}": value for key, value in found.items()})
    return out


def available(
    name: str,
    logits: Sequence[Tensor | None],
    features: Sequence[Mapping[str, Tensor] | None],
) -> bool:
    """Whether score ``name`` can be computed on every set given: a logit score needs each set's
    logits, a feature score its values in each set's ``features``."""
    score = _registered(name)
    if score.needs_features:
        return all(found is not None and name in found for found in features)
    return not score.needs_logits or all(z is not None for z in logits)
