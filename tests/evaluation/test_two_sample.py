"""The monitor's two-sample tests: MMD² against a direct double loop, χ² and Fisher against hand
counts, and their p-values' validity: under the null the false-alarm rate stays at the level."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fseb_ft.evaluation.two_sample import (
    bonferroni,
    class_proportion_test,
    median_bandwidth,
    mmd2_unbiased,
    mmd_test,
    rate_test,
)

DRAWS = 200
LEVEL = 0.05
# The false-alarm rate of a valid test over DRAWS draws is at most Binomial(DRAWS, LEVEL) / DRAWS:
# this bound fails a valid test once in a thousand.
MARGIN = stats.binom.ppf(0.999, DRAWS, LEVEL) / DRAWS


def direct_mmd2(x: np.ndarray, y: np.ndarray, sigma: float) -> float:
    """Gretton et al.'s unbiased MMD², term by term in float64."""

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return math.exp(
            -sum((float(u) - float(v)) ** 2 for u, v in zip(a, b, strict=True)) / (2 * sigma**2)
        )

    m, n = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
    return xx + yy - 2 * xy


def test_mmd2_equals_the_double_loop_and_the_bandwidth_is_the_median_distance() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.integers(-3, 4, (6, 3)), rng.integers(-1, 6, (5, 3))
    pooled = np.concatenate([x, y]).astype(np.float64)
    distances = [
        np.linalg.norm(pooled[i] - pooled[j]) for i in range(11) for j in range(11) if i != j
    ]
    sigma = median_bandwidth(pooled)
    assert sigma == pytest.approx(float(np.median(distances)), rel=1e-12)
    assert mmd2_unbiased(x, y, sigma) == pytest.approx(direct_mmd2(x, y, sigma), rel=1e-10)
    assert mmd2_unbiased(x, y, 0.7) == pytest.approx(direct_mmd2(x, y, 0.7), rel=1e-10)


def test_the_permutation_p_value_counts_the_observed_split() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(12, 2)), rng.normal(size=(12, 2)) + 3.0
    outcome, sigma = mmd_test(x, y, permutations=99, seed=0)
    assert outcome.statistic == pytest.approx(mmd2_unbiased(x, y, sigma), rel=1e-12)
    # Clearly apart: no permutation reaches it, so p = (1 + 0) / (1 + 99).
    assert outcome.p_value == pytest.approx(1 / 100)
    again, _ = mmd_test(x, y, permutations=99, seed=0)
    assert again == outcome  # seeded


def test_mmd_test_caps_each_sample_at_a_seeded_draw() -> None:
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(50, 2)), rng.normal(size=(8, 2))
    capped, sigma = mmd_test(x, y, permutations=19, seed=3, max_size=10)
    draw = np.random.default_rng(3).choice(50, size=10, replace=False)
    assert capped.statistic == pytest.approx(mmd2_unbiased(x[np.sort(draw)], y, sigma))


def false_alarm_rate(test: object, shift: float = 0.0) -> float:
    """The share of DRAWS seeded draws where ``test(reference, batch, seed)`` has p < LEVEL."""
    alarms = 0
    for seed in range(DRAWS):
        rng = np.random.default_rng(1000 + seed)
        alarms += test(rng, shift, seed) < LEVEL  # type: ignore[operator]  # a callable
    return alarms / DRAWS


def mmd_p(rng: np.random.Generator, shift: float, seed: int) -> float:
    x, y = rng.normal(size=(15, 3)), rng.normal(size=(10, 3)) + shift
    return mmd_test(x, y, permutations=49, seed=seed)[0].p_value


def classes_p(rng: np.random.Generator, shift: float, seed: int) -> float:
    reference = rng.choice(4, size=40, p=[0.4, 0.3, 0.2, 0.1])
    batch = rng.choice(4, size=20, p=[0.4 - shift, 0.3, 0.2, 0.1 + shift])
    return class_proportion_test(reference, batch, 4, permutations=49, seed=seed).p_value


@pytest.mark.parametrize("p_value", [mmd_p, classes_p], ids=["mmd", "classes"])
def test_under_the_null_the_false_alarm_rate_is_at_most_the_level(p_value: object) -> None:
    assert false_alarm_rate(p_value) <= MARGIN
    assert false_alarm_rate(p_value, shift=0.3 if p_value is classes_p else 1.5) > 0.5


def test_class_proportion_statistic_is_pearsons_chi2_of_the_table() -> None:
    reference = np.array([0] * 5 + [1] * 3 + [2] * 2)
    batch = np.array([0] * 1 + [1] * 2 + [2] * 5)
    table = [[5, 3, 2], [1, 2, 5]]
    expected = stats.chi2_contingency(table, correction=False).statistic
    found = class_proportion_test(reference, batch, 4, permutations=199, seed=0)  # class 3: none
    assert found.statistic == pytest.approx(expected, rel=1e-12)
    assert 1 / 200 <= found.p_value <= 1


def test_rate_test_is_fishers_two_sided_test_by_hand() -> None:
    # Batch 4 of 6, reference 1 of 6: the hypergeometric of the top-left cell, 5 events in 12.
    pmf = [math.comb(5, a) * math.comb(7, 6 - a) / math.comb(12, 6) for a in range(6)]
    observed = pmf[4]
    by_hand = sum(p for p in pmf if p <= observed * (1 + 1e-7))
    assert rate_test(4, 6, 1, 6) == pytest.approx(by_hand, rel=1e-12)


def test_bonferroni_holds_each_test_to_the_level_over_their_number() -> None:
    assert bonferroni([0.004, 0.02, 0.5, 0.0026], 0.01) == (0.0025, [False, False, False, False])
    assert bonferroni([0.002, 0.9], 0.01)[1] == [True, False]
