"""The monitor's report from two splits' outputs: what each check counts, on a hand-made case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fseb_ft.evaluation.two_sample import rate_test
from fseb_ft.prediction.shift_report import MonitorSettings, Outputs, shift_report


def outputs(gaps: list[float], labels: list[int] | None = None) -> Outputs:
    """Two-class logits (gap, 0) (a negative gap predicts class 1), features (gap, gap²)."""
    g = torch.tensor(gaps, dtype=torch.float64)
    logits = torch.stack([g, torch.zeros_like(g)], dim=1)
    features = torch.stack([g, g**2], dim=1)
    return Outputs(features, logits, None if labels is None else torch.tensor(labels))


def test_each_check_counts_what_it_says() -> None:
    # Validation: top-class log-odds |gap|; two of eight below 1 (abstain), five right.
    val = outputs([3, 2, 0.5, -0.6, -2.2, -3.3, 4, -4.4], [0, 0, 1, 0, 1, 1, 1, 1])
    batch = outputs([0.2, -0.3, 0.9, 2.5, -1.5, 0.1])  # four of six below 1
    settings = MonitorSettings(log_odds_threshold=1.0, permutations=999, seed=0, level=0.05)
    report = shift_report(val, batch, settings)
    checks = {c.name: c for c in report.checks}
    assert report.each_level == pytest.approx(0.05 / 4)
    abstention = checks["abstention"]
    assert (abstention.expected, abstention.observed) == (2 / 8, 4 / 6)
    assert abstention.p_value == pytest.approx(rate_test(4, 6, 2, 8))
    assert abstention.alarm == (rate_test(4, 6, 2, 8) < 0.05 / 4)
    # Entropy flags: above validation's 95 % quantile ("higher"): the largest entropy, |gap| 0.5.
    assert checks["ood"].expected == 0 and checks["ood"].observed == pytest.approx(3 / 6)
    accuracy = checks["accuracy"]
    assert accuracy.expected == 5 / 8 and not accuracy.alarms
    # ATC: 5 of 8 above the 6th largest log-odds, 2: one of the batch's six.
    assert accuracy.observed == pytest.approx(1 / 6)
    assert [c.alarms for c in report.checks] == [True, True, True, True, False]
    assert report.alarm == any(c.alarm for c in report.checks)
    np.testing.assert_allclose(report.reweighted.sum(axis=1), 1.0)
    assert report.confidence[1][0] == pytest.approx(1 / (1 + math.exp(-0.2)))


def test_a_level_the_permutations_cannot_reach_is_refused() -> None:
    with pytest.raises(ValueError, match="permutations 100 cannot give a p-value below"):
        MonitorSettings(permutations=100, level=0.01)
    with pytest.raises(ValueError, match="level must be in"):
        MonitorSettings(level=1.5)
