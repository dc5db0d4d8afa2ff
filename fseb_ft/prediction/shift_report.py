"""Is a batch of images still like the validation split the model was calibrated on? The
monitor's checks, as pure functions of the two splits' penultimate features and logits.

Four checks raise the alarm, each a test whose p-value is valid under the null hypothesis that
the batch's images and validation's are exchangeable (drawn from one distribution):

- ``features``: the kernel two-sample test (MMD², :func:`~fseb_ft.evaluation.two_sample.mmd_test`)
  of the penultimate features: any change in what the images look like to the network;
- ``abstention``: the share of images abstained on (top-class log-odds below the rule's
  threshold), Fisher's exact test against validation's share;
- ``ood``: the share flagged by the OOD score (above the score's value that flags
  :attr:`MonitorSettings.ood_flag_rate` of validation), the same test;
- ``classes``: the predicted classes' proportions, χ² with a permutation p-value (label shift
  shows here first).

The alarm is any of them below ``level / 4`` (Bonferroni): its false-alarm rate is at most
``level`` whatever their dependence. Two estimates only report, with no test behind them: the
batch's accuracy by ATC and its class proportions by BBSE
(:mod:`fseb_ft.evaluation.label_shift`), with each image's re-weighted probabilities.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.label_shift import LabelShift, atc_estimate, atc_threshold, bbse, reweight
from fseb_ft.evaluation.ood import ood_score
from fseb_ft.evaluation.selective import top_class_log_odds
from fseb_ft.evaluation.two_sample import (
    bonferroni,
    class_proportion_test,
    mmd_test,
    rate_test,
)

__all__ = ["MonitorSettings", "Outputs", "ShiftCheck", "ShiftReport", "shift_report"]

DEFAULT_LEVEL = 0.01
"""The false-alarm rate a monitor allows by default: a check run hourly on healthy batches
alarms about once in four days (at 0.05, about once a day)."""


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What the network gives for a set of images."""

    features: Tensor
    """Penultimate features (N, D)."""
    logits: Tensor
    """Logits (N, K)."""
    labels: Tensor | None = None
    """Class indices (N,) (validation's; a batch has none)."""


@dataclasses.dataclass(frozen=True)
class MonitorSettings:
    """How a batch is checked; validated at once."""

    log_odds_threshold: float = -math.inf
    """The abstention rule's threshold on top-class log-odds (``-inf``: nothing abstains)."""
    temperature: float | None = None
    """The temperature the confidences are scaled with (``None``: the raw logits)."""
    ood_score: str | None = None
    """The OOD score of the logits (entropy, msp, max_logit, energy) whose flags are counted;
    ``None``: entropy (the command gives the run's first)."""
    ood_flag_rate: float = 0.05
    """The share of validation images the OOD flag's threshold flags, in (0, 1)."""
    level: float = DEFAULT_LEVEL
    """The alarm's false-alarm rate, in (0, 1); each of the four tests is held to a quarter."""
    permutations: int = 1000
    """Random permutations of each permutation test, ≥ 1: the smallest p-value is 1 / (1 +
    permutations), so it must reach ``level / 4`` for those tests to be able to alarm."""
    seed: int = 0
    """Seed of the permutations and of the feature test's draws."""
    max_mmd_size: int = 1000
    """Images of each split the feature test reads at most (a seeded draw): its kernel matrix
    holds (2 · max_mmd_size)² floats."""

    def __post_init__(self) -> None:
        for name in ("level", "ood_flag_rate"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        if self.permutations < 1:
            raise ValueError(f"permutations must be at least 1, got {self.permutations}")
        if self.seed < 0:
            raise ValueError(f"seed must be ≥ 0, got {self.seed}")
        if 1 / (1 + self.permutations) >= self.level / 4:
            raise ValueError(
                f"permutations {self.permutations} cannot give a p-value below level / 4 = "
                f"{self.level / 4:g} (the smallest is 1 / (1 + permutations)): give at least "
                f"{math.ceil(4 / self.level)}"
            )
        if self.max_mmd_size < 2:
            raise ValueError(f"max_mmd_size must be at least 2, got {self.max_mmd_size}")


@dataclasses.dataclass(frozen=True)
class ShiftCheck:
    """One line of the report."""

    name: str
    """Its key in the JSON file."""
    title: str
    """What the table calls it."""
    statistic: float | None
    """The test statistic (``None``: an estimate, not a test)."""
    p_value: float | None
    """Its p-value (``None``: not a test)."""
    expected: float | None
    """What validation predicts for the batch (a rate, an accuracy)."""
    observed: float | None
    """What the batch shows."""
    alarms: bool
    """Whether it takes part in the alarm (a test) or only reports."""
    alarm: bool = False
    """Whether it raised the alarm: its p-value below ``level / 4``."""


@dataclasses.dataclass(frozen=True)
class ShiftReport:
    """The checks of one batch against validation."""

    checks: list[ShiftCheck]
    """The four tests, then the estimates."""
    level: float
    """The alarm's false-alarm rate."""
    each_level: float
    """The level each test is held to (Bonferroni)."""
    label_shift: LabelShift
    """BBSE's class proportions of the batch."""
    reweighted: np.ndarray
    """The batch's probabilities re-weighted by BBSE's weights (n, K)."""
    probabilities: np.ndarray
    """The batch's temperature-scaled probabilities (n, K)."""
    confidence: tuple[np.ndarray, np.ndarray]
    """Top-class probabilities of validation (N_v,) and of the batch (n,), for the plot."""
    bandwidth: float
    """The feature test's Gaussian kernel bandwidth (median heuristic)."""

    @property
    def alarm(self) -> bool:
        """Whether any test raised the alarm."""
        return any(check.alarm for check in self.checks)

    def to_json(self, class_names: list[str]) -> dict[str, Any]:
        """The report as the JSON file holds it (without the per-image rows)."""
        shift = self.label_shift
        return {
            "alarm": self.alarm,
            "level": self.level,
            "each_level": self.each_level,
            "checks": {c.name: _check_json(c) for c in self.checks},
            "feature_bandwidth": self.bandwidth,
            "label_shift": {
                "classes": class_names,
                "validation_proportions": shift.reference.tolist(),
                "estimated_proportions": shift.proportions.tolist(),
                "weights": shift.weights.tolist(),
                "identifiable": shift.identifiable,
                "condition_number": shift.condition if np.isfinite(shift.condition) else None,
            },
        }


def _check_json(check: ShiftCheck) -> dict[str, Any]:
    record = dataclasses.asdict(check)
    del record["name"]
    return record


def shift_report(validation: Outputs, batch: Outputs, settings: MonitorSettings) -> ShiftReport:
    """Every check of ``batch`` against ``validation`` (which has labels)."""
    if validation.labels is None:
        raise ValueError("the validation outputs need their labels")
    val, new = _Scores.of(validation, settings), _Scores.of(batch, settings)
    features, bandwidth = mmd_test(
        validation.features.double().numpy(), batch.features.double().numpy(),
        settings.permutations, settings.seed, settings.max_mmd_size,
    )  # fmt: skip
    k = validation.logits.shape[1]
    classes = class_proportion_test(val.predicted, new.predicted, k, settings.permutations,
                                    settings.seed)  # fmt: skip
    tests = [
        ShiftCheck("features", "features (MMD²)", features.statistic, features.p_value,
                   None, None, True),
        _rate_check("abstention", "abstention rate", val.abstain, new.abstain),
        _rate_check("ood", f"OOD flags ({settings.ood_score or 'entropy'})", val.flagged(val),
                    new.flagged(val)),
        ShiftCheck("classes", "predicted classes (χ²)", classes.statistic, classes.p_value,
                   None, None, True),
    ]  # fmt: skip
    each, alarms = bonferroni([float(t.p_value or 0.0) for t in tests], settings.level)
    tests = [dataclasses.replace(t, alarm=a) for t, a in zip(tests, alarms, strict=True)]
    correct = val.predicted == validation.labels.numpy()
    t = atc_threshold(val.confidence, correct)
    estimated = atc_estimate(t, new.confidence)
    accuracy = ShiftCheck("accuracy", "accuracy (ATC estimate)", None, None,
                          float(correct.mean()), estimated, False)  # fmt: skip
    shift = bbse(val.predicted, validation.labels.numpy(), new.predicted, k)
    return ShiftReport(
        checks=[*tests, accuracy], level=settings.level, each_level=each, label_shift=shift,
        reweighted=reweight(new.probs, shift.weights), probabilities=new.probs,
        confidence=(val.probs.max(axis=1), new.probs.max(axis=1)), bandwidth=bandwidth,
    )  # fmt: skip


def _rate_check(name: str, title: str, val: np.ndarray, new: np.ndarray) -> ShiftCheck:
    """Fisher's test of the share of ``new`` (n,) bool against that of ``val`` (N_v,) bool."""
    p = rate_test(int(new.sum()), len(new), int(val.sum()), len(val))
    return ShiftCheck(name, title, float(new.mean()), p, float(val.mean()), float(new.mean()), True)


@dataclasses.dataclass(frozen=True)
class _Scores:
    """What the checks read of one split's logits."""

    probs: np.ndarray
    """Temperature-scaled probabilities (N, K)."""
    predicted: np.ndarray
    """Predicted classes (N,)."""
    confidence: np.ndarray
    """Top-class log-odds (N,): the abstention rule's and ATC's confidence."""
    abstain: np.ndarray
    """Abstained on (N,) bool."""
    ood: np.ndarray
    """The OOD score (N,), larger: more likely OOD."""
    flag_rate: float
    """The share of a reference split the flag's threshold flags."""

    @classmethod
    def of(cls, outputs: Outputs, settings: MonitorSettings) -> _Scores:
        logits = outputs.logits.double()
        scale = settings.temperature or 1.0
        probs = torch.softmax(logits / scale, dim=-1)
        confidence = top_class_log_odds(logits, scale).numpy()
        return cls(
            probs=probs.numpy(), predicted=logits.argmax(dim=-1).numpy(), confidence=confidence,
            abstain=confidence < settings.log_odds_threshold,
            ood=ood_score(settings.ood_score or "entropy", probs, logits).numpy(),
            flag_rate=settings.ood_flag_rate,
        )  # fmt: skip

    def flagged(self, reference: _Scores) -> np.ndarray:
        """Flagged (N,) bool: the OOD score above its value that flags the share
        :attr:`flag_rate` of ``reference`` (ties: fewer)."""
        cut = np.quantile(reference.ood, 1.0 - self.flag_rate, method="higher")
        return self.ood > cut
