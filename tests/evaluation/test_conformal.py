"""Conformal prediction sets (fseb_ft.evaluation.conformal): hand-worked scores and sets, the
coverage guarantee on exchangeable synthetic data, and MAPIE's sets as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import StratifiedShuffleSplit

from fseb_ft.evaluation.conformal import (
    ConformalTarget,
    calibrate,
    conformal_coverage,
    conformity_scores,
    prediction_sets,
    quantile_rank,
    uniform_draws,
)

pytestmark = pytest.mark.no_figures

ALPHA = 0.1


def test_lac_by_hand() -> None:
    # True-label probabilities 7/8, 3/4, 5/8, 3/8: scores 1/8, 1/4, 3/8, 5/8 (exact in binary).
    # n = 4, coverage 1/2: q̂ is the ⌈5 · 0.5⌉ = 3rd smallest score, 3/8.
    probs = torch.tensor([[7 / 8, 1 / 8], [1 / 4, 3 / 4], [5 / 8, 3 / 8], [5 / 8, 3 / 8]])
    cal = calibrate(probs, torch.tensor([0, 1, 0, 1]), 0.5, "lac")
    assert cal.quantiles.tolist() == [3 / 8] and cal.n == 4
    new = torch.tensor([[5 / 8, 3 / 8], [1 / 2, 1 / 2], [1 / 4, 3 / 4]])
    assert prediction_sets(new, cal).tolist() == [[True, False], [False, False], [False, True]]
    # Coverage 0.9 needs rank ⌈4.5⌉ = 5 of 4 scores: too few images, so every class is in.
    full = calibrate(probs, torch.tensor([0, 1, 0, 1]), 0.9, "lac")
    assert full.quantiles.tolist() == [math.inf] and bool(prediction_sets(new, full).all())


def test_coverage_and_mean_set_size_by_hand() -> None:
    # Calibrated as in test_lac_by_hand: q̂ = 3/8, so a class is in a set when p ≥ 5/8. The sets
    # of the new images are {0}, {}, {1}, {0}: of labels 0, 0, 1, 1 the first and third are
    # covered (2 in 4), and the sets hold 3 classes in all (mean 3/4).
    probs = torch.tensor([[7 / 8, 1 / 8], [1 / 4, 3 / 4], [5 / 8, 3 / 8], [5 / 8, 3 / 8]])
    new = torch.tensor([[5 / 8, 3 / 8], [1 / 2, 1 / 2], [1 / 4, 3 / 4], [3 / 4, 1 / 4]])
    found = conformal_coverage(
        probs, torch.tensor([0, 1, 0, 1]), new, torch.tensor([0, 0, 1, 1]), ConformalTarget(0.5)
    )
    assert found == {"conformal_coverage": 0.5, "conformal_set_size": 0.75}


def test_aps_and_raps_scores_by_hand() -> None:
    # Ranks: class 1 (1/2), class 0 (1/4), class 2 then 3 (1/8 each, tie kept in class order).
    probs = torch.tensor([[1 / 4, 1 / 2, 1 / 8, 1 / 8]])
    assert conformity_scores(probs, "aps").tolist() == [[1 / 2, 0, 3 / 4, 7 / 8]]
    half = torch.tensor([0.5])
    assert conformity_scores(probs, "aps", half).tolist() == [[5 / 8, 1 / 4, 13 / 16, 15 / 16]]
    # RAPS adds λ · max(0, rank − k_reg): λ = 1/4, k_reg = 1 → 0, 1/4, 1/2, 3/4 by rank.
    raps = conformity_scores(probs, "raps", lam=0.25, k_reg=1)
    assert raps.tolist() == [[3 / 4, 0, 5 / 4, 13 / 8]]


def test_the_quantile_rank_is_the_intended_one_despite_binary_fractions() -> None:
    assert (100 * 0.55, quantile_rank(99, 0.55)) == (55.00000000000001, 55)
    assert quantile_rank(9, 0.9) == 9 and quantile_rank(10, 0.9) == 10


def _synthetic(
    n: int, k: int, seed: int, prior: list[float] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exchangeable (probabilities, labels), i.i.d.: random logits, labels drawn from a
    distribution the probabilities only approximate (so every method has work to do); with a
    class ``prior``, the model underrates the rare class 0 too."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, k, generator=g, dtype=torch.float64)  # (n, k)
    log_prior = 0.0 if prior is None else torch.tensor(prior, dtype=torch.float64).log()
    labels = torch.multinomial(torch.softmax(1.5 * logits + log_prior, -1), 1, generator=g)
    if prior is not None:
        logits[:, 0] -= 2.0  # the model's view of class 0: rarer still
    return torch.softmax(logits, -1), labels.squeeze(-1)


@pytest.mark.parametrize(
    ("method", "randomized"), [("lac", False), ("aps", False), ("aps", True), ("raps", True)]
)
def test_marginal_coverage_lies_within_the_binomial_tolerance_of_the_target(
    method: str, randomized: bool
) -> None:
    n, m = 2000, 5000
    probs, labels = _synthetic(n + m, 10, seed=0)
    u_cal = uniform_draws(n, seed=1) if randomized else None
    cal = calibrate(probs[:n], labels[:n], 1 - ALPHA, method, u=u_cal)
    u_new = uniform_draws(m, seed=2) if randomized else None
    sets = prediction_sets(probs[n:], cal, u_new)  # (m, K)
    covered = sets.gather(-1, labels[n:, None]).float().mean().item()
    # Coverage varies with the calibration draw (variance ≈ α(1−α)/n) and the test draw
    # (α(1−α)/m): 3 standard deviations around [1 − α, 1 − α + 1/(n + 1)].
    tol = 3 * math.sqrt(ALPHA * (1 - ALPHA) * (1 / n + 1 / m))
    assert covered >= 1 - ALPHA - tol
    # The upper end needs scores without ties; deterministic APS ties at 0 for the top class,
    # which here is right less often than 1 − α, so it holds for every method on this data.
    assert covered <= 1 - ALPHA + 1 / (n + 1) + tol
    assert 1 < sets.sum(-1).double().mean() < 10  # informative sets, not every class


def test_class_conditional_coverage_holds_for_each_class_and_the_rare_one() -> None:
    n, m, k = 4000, 8000, 4
    prior = [0.05, 0.35, 0.3, 0.3]  # class 0 is rare, and the model underrates it
    probs, labels = _synthetic(n + m, k, seed=3, prior=prior)
    cal = calibrate(probs[:n], labels[:n], 1 - ALPHA, "lac", class_conditional=True)
    assert cal.quantiles.shape == (k,)
    sets = prediction_sets(probs[n:], cal)
    covered = sets.gather(-1, labels[n:, None]).squeeze(-1)
    for c in range(k):
        n_c, m_c = int((labels[:n] == c).sum()), int((labels[n:] == c).sum())
        tol = 3 * math.sqrt(ALPHA * (1 - ALPHA) * (1 / n_c + 1 / m_c))
        rate = covered[labels[n:] == c].float().mean().item()
        assert 1 - ALPHA - tol <= rate <= 1 - ALPHA + 1 / (n_c + 1) + tol, (c, rate)
    # One quantile for all covers the rare class less than each class's own does.
    marginal = prediction_sets(probs[n:], calibrate(probs[:n], labels[:n], 1 - ALPHA, "lac"))
    rare = labels[n:] == 0
    assert marginal[rare, 0].float().mean() < covered[rare].float().mean()


def test_randomised_calibration_needs_draws_at_prediction_and_only_then() -> None:
    probs, labels = _synthetic(50, 3, seed=4)
    cal = calibrate(probs, labels, 0.9, "aps", u=uniform_draws(50, 0))
    with pytest.raises(ValueError, match="randomised: give u exactly when it is"):
        prediction_sets(probs, cal)
    with pytest.raises(ValueError, match="method must be one of"):
        calibrate(probs, labels, 0.9, "thr")


class Stored(ClassifierMixin, BaseEstimator):
    """A prefit scikit-learn classifier whose feature is a row index into stored probabilities:
    how MAPIE scores probabilities it did not compute."""

    def __init__(self, probs: np.ndarray | None = None) -> None:
        self.probs = probs

    def fit(self, X: np.ndarray, y: np.ndarray) -> Stored:
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return True

    @property
    def classes_(self) -> np.ndarray:
        return np.arange(self.probs.shape[1])

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return self.probs[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.predict_proba(X).argmax(1)


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_our_sets_equal_mapies_on_the_same_probabilities(method: str) -> None:
    pytest.importorskip("mapie")
    from mapie.classification import SplitConformalClassifier

    n, m, seed = 200, 300, 7
    probs, labels = _synthetic(n + m, 5, seed=5)
    p, y, index = probs.numpy(), labels.numpy(), np.arange(n + m).reshape(-1, 1)
    mapie = SplitConformalClassifier(
        Stored(p), confidence_level=1 - ALPHA, conformity_score=method, prefit=True,
        random_state=seed,
    ).conformalize(index[:n], y[:n])  # fmt: skip
    last = {"include_last_label": True if method == "lac" else "randomized"}
    theirs = mapie.predict_set(index[n:], conformity_score_params=last)[1][:, :, 0]  # (m, K)
    # MAPIE draws u' with a fresh RandomState(seed) at calibration and at prediction, and its
    # scores use 1 − u' where ours use u. Its RAPS tunes (k_reg, λ) on a stratified tenth of
    # the calibration split and calibrates on the rest: we take its choice and its rest.
    cal_rows, kw = np.arange(n), {}
    if method == "raps":
        score = mapie._mapie_classifier.conformity_score_function_
        split = StratifiedShuffleSplit(n_splits=1, test_size=None, random_state=seed)
        cal_rows = next(split.split(index[:n], y[:n]))[0]
        kw = {"lam": float(score.lambda_star), "k_reg": int(score.k_star[0])}
    u_cal = u_new = None
    if method != "lac":
        u_cal = torch.tensor(1 - np.random.RandomState(seed).uniform(size=len(cal_rows)))
        u_new = torch.tensor(1 - np.random.RandomState(seed).uniform(size=(m, 1))[:, 0])
    cal = calibrate(probs[cal_rows], labels[cal_rows], 1 - ALPHA, method, u=u_cal, **kw)
    ours = prediction_sets(probs[n:], cal, u_new).numpy()
    assert 1 < ours.sum(1).mean() < 5
    np.testing.assert_array_equal(ours, theirs)
