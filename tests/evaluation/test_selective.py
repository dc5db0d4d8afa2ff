"""Abstention thresholds (fseb_ft.evaluation.selective): hand-worked cases, ties, and naive
references."""

from __future__ import annotations

import math

import pytest
import torch

from fseb_ft.evaluation.selective import (
    abstention_outcome,
    abstention_threshold,
    top_class_log_odds,
)

# Distinct confidences t_g: samples admitted n_g, errors e_g, risk e_g / n_g
#   0.9: 1, 0, 0    0.8 (tied pair): 3, 1, 1/3    0.7: 4, 1, 1/4    0.6: 5, 2, 2/5    0.5: 6, 3, 1/2
CONF = torch.tensor([0.9, 0.8, 0.8, 0.7, 0.6, 0.5])
CORRECT = torch.tensor([True, True, False, True, False, False])


@pytest.mark.parametrize(
    ("coverage", "threshold", "accepted", "risk"),
    [
        (0.5, 0.8, 3, 1 / 3),  # ⌈3⌉ = 3: the pair at 0.8 closes exactly there
        (0.6, 0.7, 4, 1 / 4),  # ⌈3.6⌉ = 4
        (0.1, 0.9, 1, 0.0),  # ⌈0.6⌉ = 1
        (0.3, 0.8, 3, 1 / 3),  # ⌈1.8⌉ = 2 cuts the tied pair: both are accepted
        (1.0, 0.5, 6, 1 / 2),
    ],
)
def test_coverage_threshold_by_hand(
    coverage: float, threshold: float, accepted: int, risk: float
) -> None:
    found = abstention_threshold(CONF, CORRECT, coverage=coverage)
    assert float(found["threshold"]) == pytest.approx(threshold)
    assert int(found["accepted"]) == accepted
    assert float(found["coverage"]) == pytest.approx(accepted / 6)
    assert float(found["risk"]) == pytest.approx(risk)


@pytest.mark.parametrize(
    ("max_risk", "threshold", "accepted"),
    [
        (0.0, 0.9, 1),
        (0.25, 0.7, 4),  # 0.8's risk 1/3 is too high, yet 0.7 with more coverage is fine
        (0.3, 0.7, 4),
        (0.4, 0.6, 5),
        (0.5, 0.5, 6),
    ],
)
def test_max_risk_threshold_by_hand(max_risk: float, threshold: float, accepted: int) -> None:
    found = abstention_threshold(CONF, CORRECT, max_risk=max_risk)
    assert float(found["threshold"]) == pytest.approx(threshold)
    assert int(found["accepted"]) == accepted
    assert float(found["risk"]) <= max_risk


def test_no_threshold_meets_the_risk_then_abstain_on_everything() -> None:
    found = abstention_threshold(
        torch.tensor([0.9, 0.5]), torch.tensor([False, True]), max_risk=0.1
    )
    assert found["threshold"] == math.inf
    assert int(found["accepted"]) == 0 and float(found["coverage"]) == 0
    assert math.isnan(float(found["risk"]))


def test_outcome_of_a_given_threshold() -> None:
    got = abstention_outcome(CONF, CORRECT, torch.tensor(0.8))
    assert (int(got["accepted"]), float(got["risk"])) == (3, pytest.approx(1 / 3))
    everything = abstention_outcome(CONF, CORRECT, torch.tensor(-math.inf))
    assert int(everything["accepted"]) == 6 and float(everything["coverage"]) == 1.0


def test_coverage_is_within_one_sample_of_the_target_and_matches_a_naive_count() -> None:
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 100, 997):
        conf = torch.rand(n, generator=gen, dtype=torch.float64)  # distinct almost surely
        correct = torch.rand(n, generator=gen) < conf.float()
        for coverage in (0.01, 0.29, 0.5, 0.9, 0.95, 0.999, 1.0):
            found = abstention_threshold(conf.float(), correct, coverage=coverage)
            accepted = int(found["accepted"])
            assert 0 <= accepted - coverage * n < 1, (n, coverage, accepted)
            # Naive float64 reference: the ⌈αN⌉-th largest confidence (αN rounded as a decimal).
            k = math.ceil(round(coverage * n, 9))
            ranked = sorted(conf.float().double().tolist(), reverse=True)
            assert float(found["threshold"]) == ranked[k - 1]


def test_max_risk_matches_a_naive_search() -> None:
    gen = torch.Generator().manual_seed(1)
    conf = torch.rand(300, generator=gen, dtype=torch.float64)
    conf = torch.round(conf * 40) / 40  # (300,) many ties
    correct = torch.rand(300, generator=gen, dtype=torch.float64) < conf
    for max_risk in (0.0, 0.05, 0.1, 0.2, 0.4):
        best = math.inf
        for t in sorted(set(conf.tolist())):  # the lowest threshold with risk <= max_risk
            keep = conf >= t
            if float((keep & ~correct).sum()) / float(keep.sum()) <= max_risk:
                best = t
                break
        found = abstention_threshold(conf, correct, max_risk=max_risk)
        assert float(found["threshold"]) == best, max_risk


def test_top_class_log_odds_by_hand_and_where_probabilities_round_to_one() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 1.0]])
    # p_max = e² / (e² + 2): log-odds 2 - log 2; then 3 - log(1 + e).
    expected = torch.tensor([2 - math.log(2), 3 - math.log(1 + math.e)], dtype=torch.float64)
    assert torch.allclose(top_class_log_odds(logits), expected, rtol=0, atol=1e-12)
    half = torch.tensor([4 - math.log(2), 6 - math.log(1 + math.exp(2))], dtype=torch.float64)
    assert torch.allclose(top_class_log_odds(logits, 0.5), half, rtol=0, atol=1e-12)  # z = 2 f
    confident = torch.tensor([[0.0, -50.0], [0.0, -60.0]])  # p_max rounds to 1.0 for both
    assert torch.softmax(confident.double(), -1).max(-1).values.tolist() == [1.0, 1.0]
    assert top_class_log_odds(confident).tolist() == [50.0, 60.0]  # still ordered
    assert top_class_log_odds(torch.zeros(3, 1)).tolist() == [math.inf] * 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one"),
        ({"coverage": 0.5, "max_risk": 0.1}, "exactly one"),
        ({"coverage": 0.0}, "coverage"),
        ({"coverage": 1.5}, "coverage"),
        ({"max_risk": 1.0}, "max_risk"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        abstention_threshold(CONF, CORRECT, **kwargs)
