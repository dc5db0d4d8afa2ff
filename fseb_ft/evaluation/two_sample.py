"""Two-sample tests of a batch of predictions against a reference split: is the batch drawn from
the same distribution? Pure functions of arrays, for ``fseb-ft monitor``.

- :func:`mmd_test`: the kernel two-sample test (Gretton et al., JMLR 2012) on feature vectors:
  the unbiased MMD² with a Gaussian kernel whose bandwidth is the median pairwise distance of the
  pooled sample, and a permutation p-value.
- :func:`class_proportion_test`: Pearson's χ² statistic of the 2 × K table of predicted classes
  (reference, batch), with a permutation p-value (the "black-box shift detection" test of
  Lipton et al. 2018 and Rabanser et al. 2019).
- :func:`rate_test`: whether a batch's rate of a binary event (abstentions, OOD flags) differs
  from the reference's: Fisher's exact test of the 2 × 2 table.
- :func:`bonferroni`: one alarm over several tests, its false-alarm rate ≤ the level.

**Why scipy's permutation test, and why the kernel once.** ``scipy.stats.permutation_test``
draws the permutations and computes the p-value as ``(1 + #{permuted ≥ observed}) / (1 +
permutations)`` (exact enumeration when there are fewer partitions than permutations), which is
a valid p-value: under exchangeability its false-alarm rate is at most the level for any number
of permutations. It is given the *indices* of the pooled sample, and the statistic reads the
Gaussian kernel matrix computed once: each permutation is then two matrix products, where
permuting the features would recompute the O(N² D) kernel per permutation. The bandwidth, a
function of the pooled sample, is the same for every permutation, so the test stays exact. No
well-kept library does this in the toolkit's dependencies: alibi-detect's ``MMDDrift`` is the
same test behind TensorFlow or a pinned stack, torchdrift is unmaintained.

**Why Fisher's exact test, not a binomial test against the reference's rate.** The reference's
rate is itself estimated, from n_ref images: a binomial test that takes it as known has the
batch count's variance low by the factor ``1 + n/n_ref`` (1.5 for 500 images against 1000), so
its false-alarm rate exceeds its level. Fisher's test compares the two counts, conditional on
their total: under exchangeable images it is valid (conservative, as a discrete test).
Two-sided, because fewer abstentions or OOD flags than validation predicts is also a batch
unlike validation: a model confidently wrong on shifted images abstains less, not more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "TestOutcome",
    "bonferroni",
    "class_proportion_test",
    "gaussian_kernel",
    "median_bandwidth",
    "mmd2_unbiased",
    "mmd_test",
    "rate_test",
]

_BATCH = 100  # permutations scipy hands the statistic at once: an (N, 100) indicator matrix


@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """A test's statistic and p-value."""

    statistic: float
    """The test statistic of the observed split (MMD², χ², or the batch's rate)."""
    p_value: float
    """Its p-value under the null hypothesis that batch and reference are exchangeable."""


def median_bandwidth(pooled: np.ndarray) -> float:
    """The median heuristic: the median Euclidean distance between distinct points of
    ``pooled`` (N, D); 1.0 when they all coincide (any bandwidth gives MMD² = 0 then)."""
    d2 = _squared_distances(np.asarray(pooled, dtype=np.float64))
    off = d2[~np.eye(len(d2), dtype=bool)]
    sigma = float(np.sqrt(np.median(off))) if off.size else 0.0
    return sigma if sigma > 0 else 1.0


def gaussian_kernel(pooled: np.ndarray, bandwidth: float) -> np.ndarray:
    """``exp(-‖a - b‖² / (2 σ²))`` between every two rows of ``pooled`` (N, D): (N, N) float64."""
    d2 = _squared_distances(np.asarray(pooled, dtype=np.float64))
    return np.exp(-d2 / (2.0 * bandwidth**2))


def mmd2_unbiased(x: np.ndarray, y: np.ndarray, bandwidth: float) -> float:
    """The unbiased MMD² of samples ``x`` (m, D) and ``y`` (n, D), m, n ≥ 2, with the Gaussian
    kernel of ``bandwidth``: the means of k over distinct pairs within each sample, less twice
    the mean over pairs across them (Gretton et al. 2012, eq. 3)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    kernel = gaussian_kernel(np.concatenate([x, y]), bandwidth)
    np.fill_diagonal(kernel, 0.0)
    inside = np.zeros((len(x) + len(y), 1))
    inside[: len(x)] = 1.0
    return float(_mmd2(kernel, kernel.sum(axis=0), inside, len(x))[0])


def mmd_test(
    x: np.ndarray, y: np.ndarray, permutations: int, seed: int, max_size: int | None = None
) -> tuple[TestOutcome, float]:
    """The permutation test of MMD² between ``x`` (m, D) and ``y`` (n, D), and its bandwidth.

    ``max_size`` caps each sample at a seeded draw of that many rows (the kernel matrix is
    (m + n)² floats): the test is then of the draws, valid as before, its power that of the
    smaller samples. The statistic is :func:`mmd2_unbiased`, larger when the samples differ
    (a one-sided test).
    """
    from scipy import stats  # 0.6 s of every command's start at the top level

    rng = np.random.default_rng(seed)
    x, y = (
        _at_most(np.asarray(x, np.float64), max_size, rng),
        _at_most(np.asarray(y, np.float64), max_size, rng),
    )
    pooled = np.concatenate([x, y])  # (N, D)
    bandwidth = median_bandwidth(pooled)
    kernel = gaussian_kernel(pooled, bandwidth)
    np.fill_diagonal(kernel, 0.0)
    sums, m = kernel.sum(axis=0), len(x)

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> Any:
        rows = np.atleast_2d(a).astype(np.intp)  # (B, m) the indices drawn as the first sample
        inside = np.zeros((len(pooled), len(rows)))
        inside[rows.T, np.arange(len(rows))] = 1.0  # (N, B)
        out = _mmd2(kernel, sums, inside, m)
        return out if np.ndim(a) > 1 else out[0]

    found = stats.permutation_test(
        (np.arange(m), np.arange(m, len(pooled))), statistic, permutation_type="independent",
        vectorized=True, n_resamples=permutations, alternative="greater", batch=_BATCH, rng=rng,
    )  # fmt: skip
    return TestOutcome(float(found.statistic), float(found.pvalue)), bandwidth


def _mmd2(kernel: np.ndarray, sums: np.ndarray, inside: np.ndarray, m: int) -> np.ndarray:
    """MMD² of each split ``inside`` (N, B) (1: the first sample's m points) with the
    zero-diagonal ``kernel`` (N, N) and its column ``sums`` (N,): (B,)."""
    n = len(kernel) - m
    within_x = np.einsum("ib,ib->b", inside, kernel @ inside)  # Σ_{i≠j ∈ x} k
    across_and_x = sums @ inside  # Σ_{i ∈ x, j} k = within_x + across
    across = across_and_x - within_x
    within_y = sums.sum() - 2.0 * across_and_x + within_x  # Σ_{i≠j ∈ y} k
    return within_x / (m * (m - 1)) + within_y / (n * (n - 1)) - 2.0 * across / (m * n)


def _squared_distances(z: np.ndarray) -> np.ndarray:
    """‖z_i - z_j‖² (N, N), clipped at 0 against rounding, exactly 0 on the diagonal."""
    norms = np.einsum("ij,ij->i", z, z)
    d2 = np.maximum(norms[:, None] + norms[None, :] - 2.0 * (z @ z.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    return d2


def _at_most(rows: np.ndarray, size: int | None, rng: np.random.Generator) -> np.ndarray:
    """``rows``, or a draw of ``size`` of them without replacement, in their order."""
    if size is None or len(rows) <= size:
        return rows
    return rows[np.sort(rng.choice(len(rows), size=size, replace=False))]


def class_proportion_test(
    reference: np.ndarray, batch: np.ndarray, num_classes: int, permutations: int, seed: int
) -> TestOutcome:
    """Pearson's χ² of the 2 × K table of class indices ``reference`` (n_ref,) and ``batch``
    (n,), its p-value by permutation (valid at any expected count, where the χ² distribution
    needs about five per cell)."""
    from scipy import stats

    k = int(num_classes)

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> Any:
        table = np.stack([_counts(a, k), _counts(b, k)], axis=-2)  # (..., 2, K)
        expected = (
            table.sum(-1, keepdims=True)
            * table.sum(-2, keepdims=True)
            / table.sum((-2, -1), keepdims=True)
        )
        terms = np.where(expected > 0, (table - expected) ** 2 / np.where(expected > 0,
                         expected, 1.0), 0.0)  # fmt: skip
        return terms.sum((-2, -1))

    found = stats.permutation_test(
        (np.asarray(reference), np.asarray(batch)), statistic, permutation_type="independent",
        vectorized=True, n_resamples=permutations, alternative="greater", batch=_BATCH,
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return TestOutcome(float(found.statistic), float(found.pvalue))


def _counts(classes: np.ndarray, k: int) -> np.ndarray:
    """How many of ``classes`` (..., n) are each class: (..., K) float64."""
    return (np.asarray(classes)[..., None] == np.arange(k)).sum(axis=-2).astype(np.float64)


def rate_test(batch_hits: int, batch_size: int, reference_hits: int, reference_size: int) -> float:
    """The two-sided p-value of Fisher's exact test that a batch with ``batch_hits`` events of
    ``batch_size`` and a reference with ``reference_hits`` of ``reference_size`` share one rate."""
    from scipy import stats

    table = [
        [batch_hits, batch_size - batch_hits],
        [reference_hits, reference_size - reference_hits],
    ]
    return float(stats.fisher_exact(table, alternative="two-sided").pvalue)


def bonferroni(p_values: Sequence[float], level: float) -> tuple[float, list[bool]]:
    """The level each of the tests is held to, ``level / len(p_values)``, and which of them
    fall below it: the chance that any alarms falsely is at most ``level`` whatever the tests'
    dependence (their union bound)."""
    each = level / max(len(p_values), 1)
    return each, [p < each for p in p_values]
