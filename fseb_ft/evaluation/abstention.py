"""The abstention rule of a selective classifier: the threshold ``τ`` on its confidence, how
``τ`` was chosen, and what it achieves on the validation split.

A model abstains on an image when its confidence, the maximum class probability of
``softmax(logits / T)``, is below ``τ``; equivalently, when its top-class log-odds
(:func:`~fseb_ft.evaluation.selective.top_class_log_odds`, which never round to 1) are below
``log(τ / (1 - τ))``. ``τ`` holds for the temperature ``T`` it was chosen with only.
:class:`AbstentionRule` is the record ``fseb-ft predict`` reports in its meta file and stores
with a run (``abstention.json``, the model folder's ``fseb.json``); the functions here build one
from the validation split's confidences (:mod:`fseb_ft.evaluation.selective` does the maths).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.certified import BOUND_METHOD, certified_threshold
from fseb_ft.evaluation.selective import abstention_outcome, abstention_threshold

__all__ = [
    "RANGES",
    "AbstentionRule",
    "Certificate",
    "Criterion",
    "ValidationOutcome",
    "certified_rule",
    "given_rule",
    "no_rule",
    "out_of_range",
    "rule_for_target",
]

Criterion = Literal["none", "coverage", "max_risk", "threshold"]
"""How ``τ`` was set: not at all (nothing abstains), for a target coverage or largest risk on the
validation split, or given."""
RANGES = {
    "coverage": "(0, 1]",
    "max_risk": "[0, 1)",
    "threshold": "[0, 1]",
    "confidence": "[0.5, 1)",
}
"""The values each way of setting ``τ`` takes, and the confidence of a certified ``max_risk``, in
interval notation (as docs/cli.md states them)."""


@dataclasses.dataclass(frozen=True)
class ValidationOutcome:
    """What a threshold does on the labelled validation split."""

    n: int
    """Validation images."""
    accepted: int
    """Images whose confidence reaches ``τ``."""
    coverage: float
    """``accepted / n``."""
    risk: float | None
    """The error rate among the accepted images; ``None`` when none is accepted."""


@dataclasses.dataclass(frozen=True)
class Certificate:
    """What a ``max_risk`` rule chosen with a confidence guarantees
    (:mod:`fseb_ft.evaluation.certified`): with probability at least :attr:`confidence` over the
    draw of the validation split, the error rate among the accepted images of new images
    exchangeable with it is at most the rule's target."""

    confidence: float
    """The probability ``C`` of the guarantee."""
    method: str
    """How the risk is bounded (:data:`~fseb_ft.evaluation.certified.BOUND_METHOD`)."""
    risk_bound: float | None
    """The Clopper–Pearson upper bound on the risk at ``τ``; ``None``: no threshold is
    certified, so the model abstains on everything."""
    empirical_coverage: float
    """The validation coverage of the empirical rule for the same target (the uncertified
    ``--max-risk``): what the guarantee costs is the difference."""


@dataclasses.dataclass(frozen=True)
class AbstentionRule:
    """Abstain when the top-class log-odds are below :attr:`log_odds_threshold`.

    :meth:`to_json` gives the record as the meta file, ``abstention.json`` and ``fseb.json``
    hold it; :meth:`from_json` reads it back, also from records that lack the log-odds.
    """

    temperature: float | None
    """The temperature ``T`` the confidences are scaled with (``None``: the raw logits)."""
    criterion: Criterion
    """How ``τ`` was set."""
    threshold: float
    """``τ`` as a probability."""
    log_odds_threshold: float
    """``τ`` as top-class log-odds, ``log(τ / (1 - τ))`` (``±inf`` at ``τ`` = 0 or 1)."""
    target: float | None = None
    """The coverage, the largest risk or the ``τ`` asked for, as given (``None``: criterion
    ``none``)."""
    validation: ValidationOutcome | None = None
    """What ``τ`` does on the run's validation split; ``None`` without one at hand."""
    chosen_on: Literal["validation", "kept"] | None = None
    """``validation``: chosen on it now; ``kept``: the rule stored with the model; ``None``:
    given (or nothing abstains). A stored rule has none."""
    certified: Certificate | None = None
    """The guarantee of a ``max_risk`` rule chosen with a confidence; ``None``: the empirical
    rule (or another criterion)."""

    def to_json(self) -> dict[str, Any]:
        """The record, its keys in the order the files have always had them."""
        out: dict[str, Any] = {"temperature": self.temperature, "criterion": self.criterion}
        if self.criterion != "none":
            out["target"] = self.target
        out |= {"threshold": self.threshold, "log_odds_threshold": self.log_odds_threshold}
        if self.chosen_on == "validation":
            out["chosen_on"] = self.chosen_on
        validation = self.validation
        out["validation"] = None if validation is None else dataclasses.asdict(validation)
        if self.certified is not None:  # absent otherwise: the files keep their former keys
            out["certified"] = dataclasses.asdict(self.certified)
        if self.chosen_on == "kept":  # the stored record, then how this call came by it
            out["chosen_on"] = self.chosen_on
        return out

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> AbstentionRule:
        """Read a record as :meth:`to_json` writes it (the log-odds derived from ``τ`` when a
        record from before they were stored lacks them)."""
        validation = record.get("validation")
        log_odds = record.get("log_odds_threshold")
        certified = record.get("certified")
        return cls(
            temperature=record.get("temperature"),
            criterion=record["criterion"],
            threshold=float(record["threshold"]),
            log_odds_threshold=_log_odds(record["threshold"]) if log_odds is None else log_odds,
            target=record.get("target"),
            validation=None if validation is None else ValidationOutcome(**validation),
            chosen_on=record.get("chosen_on"),
            certified=None if certified is None else Certificate(**certified),
        )

    def measured(self, confidence: Tensor, correct: Tensor) -> AbstentionRule:
        """This rule with what it does on validation confidences (top-class log-odds,
        ``(N_v,)``) and their correctness ``(N_v,)``."""
        threshold = torch.tensor(self.log_odds_threshold, dtype=torch.float64)
        found = abstention_outcome(confidence, correct, threshold)
        return dataclasses.replace(self, validation=_outcome(found, len(confidence)))


def no_rule(temperature: float | None) -> AbstentionRule:
    """The rule of a model with no threshold kept or given: ``τ`` = 0, nothing abstains."""
    return AbstentionRule(temperature, "none", 0.0, _log_odds(0.0))


def given_rule(threshold: float, temperature: float | None) -> AbstentionRule:
    """The rule for a ``τ`` given as a probability in [0, 1] (its validation outcome unknown)."""
    return AbstentionRule(
        temperature, "threshold", float(threshold), _log_odds(threshold), target=threshold
    )


def rule_for_target(
    criterion: Literal["coverage", "max_risk"],
    target: float,
    temperature: float | None,
    confidence: Tensor,
    correct: Tensor,
) -> AbstentionRule:
    """The rule whose ``τ`` reaches the ``target`` coverage, or the largest ``max_risk``, on
    validation confidences (top-class log-odds at ``temperature``, ``(N_v,)``) and their
    correctness ``(N_v,)``."""
    found = abstention_threshold(confidence, correct, **{criterion: target})
    return AbstentionRule(
        temperature,
        criterion,
        float(torch.sigmoid(found["threshold"])),  # as a probability
        float(found["threshold"]),
        target=target,
        validation=_outcome(found, len(confidence)),
        chosen_on="validation",
    )


def certified_rule(
    max_risk: float,
    level: float,
    temperature: float | None,
    confidence: Tensor,
    correct: Tensor,
) -> AbstentionRule:
    """The ``max_risk`` rule certified with probability ``level`` on validation confidences
    (top-class log-odds at ``temperature``, ``(N_v,)``) and their correctness ``(N_v,)``:
    :func:`~fseb_ft.evaluation.certified.certified_threshold`, with the coverage the empirical
    rule for ``max_risk`` would have."""
    found = certified_threshold(confidence, correct, max_risk=max_risk, level=level)
    empirical = abstention_threshold(confidence, correct, max_risk=max_risk)
    bound = float(found["risk_bound"])
    return AbstentionRule(
        temperature,
        "max_risk",
        float(torch.sigmoid(found["threshold"])),  # as a probability
        float(found["threshold"]),
        target=max_risk,
        validation=_outcome(found, len(confidence)),
        chosen_on="validation",
        certified=Certificate(
            confidence=level,
            method=BOUND_METHOD,
            risk_bound=None if math.isnan(bound) else bound,
            empirical_coverage=float(empirical["coverage"]),
        ),
    )


def out_of_range(name: str, value: float) -> str | None:
    """Why ``value`` is no valid ``name`` (a key of :data:`RANGES`); None when it is one."""
    interval = RANGES[name]
    low, high = (float(end) for end in interval[1:-1].split(","))
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[-1] == ")" else value <= high
    return None if above and below else f"must lie in {interval}, got {value:g}"


def _log_odds(threshold: float) -> float:
    """``τ`` as the top-class log-odds ``log(τ / (1 - τ))`` it equals."""
    with np.errstate(divide="ignore"):
        return float(np.log(threshold) - np.log1p(-threshold))  # ±inf at τ = 0 or 1


def _outcome(found: Mapping[str, Tensor], n: int) -> ValidationOutcome:
    risk = float(found["risk"])
    return ValidationOutcome(
        n=n,
        accepted=int(found["accepted"]),
        coverage=float(found["coverage"]),
        risk=None if math.isnan(risk) else risk,
    )
