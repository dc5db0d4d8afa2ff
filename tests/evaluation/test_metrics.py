"""Tests for fseb_ft.evaluation.metrics against hand-worked cases and independent references.

References are scikit-learn / scipy where they compute the same definition, otherwise naive
float64 loops written directly from the definitions in design.md section 3 (never the
implementation under test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from fseb_ft.evaluation import metrics as M
from fseb_ft.evaluation import ood as O
from fseb_ft.evaluation import temperature as T

# --------------------------------------------------------------------------------------------
# Independent references
# --------------------------------------------------------------------------------------------


def ref_fpr95(score_in: np.ndarray, score_out: np.ndarray) -> float:
    y = np.r_[np.zeros(len(score_in)), np.ones(len(score_out))]
    s = np.r_[score_in, score_out]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return float(fpr[np.argmax(tpr >= 0.95)])


def ref_ood(score_in: np.ndarray, score_out: np.ndarray) -> dict[str, float]:
    y = np.r_[np.zeros(len(score_in)), np.ones(len(score_out))]
    s = np.r_[score_in, score_out]
    return {
        "auroc": float(roc_auc_score(y, s)),
        "aupr": float(average_precision_score(y, s)),
        "fpr95": ref_fpr95(score_in, score_out),
    }


def ref_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    """Loop over bins; bin b holds conf in (lo_b, hi_b], edges b/n rounded to probs' dtype."""
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    uppers = [probs.dtype.type((b + 1) / n_bins) for b in range(n_bins)]
    bins = np.empty(len(conf), dtype=np.int64)
    for i, c in enumerate(conf):
        bins[i] = next((b for b, hi in enumerate(uppers) if c <= hi), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        members = bins == b
        if members.any():
            acc_b = correct[members].mean()
            conf_b = conf[members].astype(np.float64).mean()
            total += members.sum() / len(conf) * abs(acc_b - conf_b)
    return total


def ref_aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """O(N²): each sample weighted by the risk at the threshold equal to its own confidence."""
    conf = np.asarray(conf, dtype=np.float64)
    err = 1.0 - np.asarray(correct, dtype=np.float64)
    risks = [err[conf >= c].mean() for c in conf]
    return float(np.mean(risks))


def rows_with_confidence(conf: list[float], k: int, argmax: list[int]) -> np.ndarray:
    """Probability rows whose maximum is exactly ``conf[i]`` at column ``argmax[i]``."""
    rows = np.zeros((len(conf), k))
    for i, (c, j) in enumerate(zip(conf, argmax, strict=True)):
        rest = (1.0 - c) / (k - 1)
        assert rest < c
        rows[i, :] = rest
        rows[i, j] = c
    return rows


# --------------------------------------------------------------------------------------------
# OOD detection
# --------------------------------------------------------------------------------------------


def _random_scores(seed: int, ties: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_in, n_out = rng.integers(20, 400, size=2)
    s_in = rng.normal(0.0, 1.0, size=n_in)
    s_out = rng.normal(0.7, 1.2, size=n_out)
    if ties == "rounded":
        s_in, s_out = np.round(s_in, 1), np.round(s_out, 1)
    elif ties == "coarse":
        s_in, s_out = np.round(s_in), np.round(s_out)
    return s_in, s_out


@pytest.mark.parametrize("ties", ["none", "rounded", "coarse"])
@pytest.mark.parametrize("seed", range(8))
def test_ood_detection_matches_sklearn(seed: int, ties: str) -> None:
    s_in, s_out = _random_scores(seed, ties)
    got = M.ood_detection(torch.tensor(s_in), torch.tensor(s_out))
    want = ref_ood(s_in, s_out)
    for key in ("auroc", "aupr", "fpr95"):
        assert got[key].dtype == torch.float64 and got[key].ndim == 0
        assert got[key].item() == pytest.approx(want[key], abs=1e-12), key


@pytest.mark.parametrize("seed", range(4))
def test_ood_detection_float32_inputs_match_sklearn(seed: int) -> None:
    s_in, s_out = _random_scores(seed, "rounded")
    s_in32, s_out32 = s_in.astype(np.float32), s_out.astype(np.float32)
    got = M.ood_detection(torch.from_numpy(s_in32), torch.from_numpy(s_out32))
    want = ref_ood(s_in32.astype(np.float64), s_out32.astype(np.float64))
    for key in want:
        assert got[key].item() == pytest.approx(want[key], abs=1e-12), key


def test_ood_detection_without_ties_fpr95_matches_default_roc_curve() -> None:
    # Without ties sklearn's drop_intermediate cannot remove the first point with TPR >= 0.95.
    s_in, s_out = _random_scores(123, "none")
    y = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]
    fpr, tpr, _ = roc_curve(y, np.r_[s_in, s_out])
    got = M.ood_detection(torch.tensor(s_in), torch.tensor(s_out))
    assert got["fpr95"].item() == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)


def test_ood_detection_hand_case() -> None:
    # in  (negatives): 0.1, 0.3, 0.5      out (positives): 0.5, 0.7
    # AUROC: pairs (out, in): 0.7 beats all 3; 0.5 beats 0.1 and 0.3, ties 0.5 (½)
    #        -> (3 + 2.5) / 6 = 11/12.
    # AP: thresholds 0.7 (TP 1, FP 0, P = 1,   R = 1/2), 0.5 (TP 2, FP 1, P = 2/3, R = 1)
    #        -> 1/2 · 1 + 1/2 · 2/3 = 5/6.
    # FPR95: first threshold with TPR >= 0.95 is 0.5, where FPR = 1/3.
    s_in = torch.tensor([0.1, 0.3, 0.5], dtype=torch.float64)
    s_out = torch.tensor([0.5, 0.7], dtype=torch.float64)
    got = M.ood_detection(s_in, s_out)
    assert got["auroc"].item() == pytest.approx(11 / 12, abs=1e-15)
    assert got["aupr"].item() == pytest.approx(5 / 6, abs=1e-15)
    assert got["fpr95"].item() == pytest.approx(1 / 3, abs=1e-15)
    want = ref_ood(s_in.numpy(), s_out.numpy())
    for key in want:
        assert got[key].item() == pytest.approx(want[key], abs=1e-12)


def test_fpr95_is_the_smallest_fpr_reaching_tpr95_with_collinear_ties() -> None:
    # 20 positives, 10 negatives. Thresholds (desc): 10 -> 18 pos (TPR .90, FPR 0);
    # 5 -> +1 pos +1 neg (TPR .95 exactly = 19/20, FPR .1); 4 -> +1 pos +1 neg (TPR 1, FPR .2);
    # 0 -> +8 neg. The point at 5 is collinear with its neighbours, so roc_curve's default
    # drop_intermediate=True removes it and would report 0.2; the definition asks for 0.1.
    s_out = np.r_[np.full(18, 10.0), 5.0, 4.0]
    s_in = np.r_[5.0, 4.0, np.zeros(8)]
    got = M.ood_detection(torch.tensor(s_in), torch.tensor(s_out))
    assert got["fpr95"].item() == pytest.approx(0.1, abs=1e-15)
    assert got["fpr95"].item() == pytest.approx(ref_fpr95(s_in, s_out), abs=1e-15)


def test_ood_detection_extremes() -> None:
    # Perfect separation: AUROC = AP = 1, FPR95 = 0; reversed: AUROC 0; all tied: AUROC ½,
    # AP = prevalence, FPR95 = 1.
    a, b = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0, 4.0])
    perfect = M.ood_detection(a, b)
    assert (perfect["auroc"].item(), perfect["aupr"].item(), perfect["fpr95"].item()) == (1, 1, 0)
    assert M.ood_detection(b, a)["auroc"].item() == 0.0
    tied = M.ood_detection(torch.zeros(3), torch.zeros(2))
    assert tied["auroc"].item() == pytest.approx(0.5)
    assert tied["aupr"].item() == pytest.approx(2 / 5)
    assert tied["fpr95"].item() == 1.0


def test_ood_metrics_uses_entropy_and_negative_max_prob() -> None:
    rng = np.random.default_rng(7)
    logits_in = rng.normal(size=(150, 6)) * 3
    logits_out = rng.normal(size=(120, 6))
    p_in = torch.softmax(torch.tensor(logits_in), -1)
    p_out = torch.softmax(torch.tensor(logits_out), -1)
    # Round to create ties in the max-prob score as well.
    p_in = torch.round(p_in, decimals=2)
    p_in = p_in / p_in.sum(-1, keepdim=True)
    assert set(O.ood_metrics(p_in, p_out)) == {"entropy_auroc", "entropy_aupr", "entropy_fpr95"}
    got = O.ood_metrics(p_in, p_out, scores=("entropy", "msp"))
    assert set(got) == {f"{s}_{m}" for s in ("entropy", "msp") for m in ("auroc", "aupr", "fpr95")}
    ent = ref_ood(scipy_entropy(p_in.numpy(), axis=1), scipy_entropy(p_out.numpy(), axis=1))
    msp = ref_ood(-p_in.numpy().max(1), -p_out.numpy().max(1))
    for key in ent:
        assert got[f"entropy_{key}"].item() == pytest.approx(ent[key], abs=1e-12)
        assert got[f"msp_{key}"].item() == pytest.approx(msp[key], abs=1e-12)


# Two samples, K = 3, worked by hand:
#   row 0: logits (2, 0, 0):    max 2, logsumexp = log(e² + 2) = 2.2395447662...,
#          p = (e², 1, 1) / (e² + 2) = (0.7869860, 0.1065070, 0.1065070)
#   row 1: logits (1, 1, 1):    max 1, logsumexp = 1 + log 3, p uniform, entropy log 3
_HAND_LOGITS = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
_E2 = math.exp(2.0)
_HAND_SCORES = {
    "entropy": [
        -(_E2 * math.log(_E2 / (_E2 + 2)) + 2 * math.log(1 / (_E2 + 2))) / (_E2 + 2),
        math.log(3.0),
    ],
    "msp": [-_E2 / (_E2 + 2), -1 / 3],
    "max_logit": [-2.0, -1.0],
    "energy": [-math.log(_E2 + 2), -(1 + math.log(3.0))],
}


@pytest.mark.parametrize("name", list(_HAND_SCORES))
def test_ood_scores_match_hand_worked_values(name: str) -> None:
    probs = torch.softmax(_HAND_LOGITS.double(), -1)
    got = O.ood_score(name, probs, _HAND_LOGITS)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(_HAND_SCORES[name], abs=1e-7)


def test_energy_temperature_and_logit_scores_ignore_a_logit_shift_only_where_they_should() -> None:
    z = torch.randn(5, 4, dtype=torch.float64)
    t = 2.5
    assert torch.allclose(O.energy_score(z, t), -t * torch.logsumexp(z / t, -1))
    # Softmax drops a per-row shift, so the probability scores cannot see it; the logit ones do.
    shifted = z + 3.0
    assert torch.allclose(O.energy_score(shifted), O.energy_score(z) - 3.0)
    assert torch.allclose(O.max_logit_score(shifted), O.max_logit_score(z) - 3.0)


@pytest.mark.parametrize("name", ["entropy", "msp", "max_logit", "energy"])
def test_ood_metrics_per_score_match_sklearn(name: str) -> None:
    rng = np.random.default_rng(3)
    z_in = torch.tensor(rng.normal(size=(80, 5)) * 3 + rng.normal(size=(80, 1)) * 2)
    z_out = torch.tensor(rng.normal(size=(60, 5)) + rng.normal(size=(60, 1)))
    p_in, p_out = torch.softmax(z_in, -1), torch.softmax(z_out, -1)
    got = O.ood_metrics(p_in, p_out, scores=(name,), logits_in=z_in, logits_out=z_out)
    s_in, s_out = _HAND_REFS[name](z_in.numpy()), _HAND_REFS[name](z_out.numpy())
    want = ref_ood(s_in, s_out)
    assert set(got) == {f"{name}_{m}" for m in want}
    for key, value in want.items():
        assert got[f"{name}_{key}"].item() == pytest.approx(value, abs=1e-12), key


def _np_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _np_logsumexp(z: np.ndarray) -> np.ndarray:
    m = z.max(1)
    return m + np.log(np.exp(z - m[:, None]).sum(1))


_HAND_REFS = {
    "entropy": lambda z: scipy_entropy(_np_softmax(z), axis=1),
    "msp": lambda z: -_np_softmax(z).max(1),
    "max_logit": lambda z: -z.max(1),
    "energy": lambda z: -_np_logsumexp(z),
}


def test_logit_scores_are_absent_without_logits() -> None:
    p = torch.softmax(torch.randn(6, 3), -1)
    got = O.ood_metrics(p, p, scores=("entropy", "max_logit", "energy"))
    assert set(got) == {"entropy_auroc", "entropy_aupr", "entropy_fpr95"}
    with pytest.raises(ValueError, match="needs `logits`"):
        O.ood_score("energy", p)
    with pytest.raises(ValueError, match="must be one of"):
        O.ood_score("odin", p)


# --------------------------------------------------------------------------------------------
# Temperature scaling
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t0", [0.5, 2.0])
def test_fit_temperature_recovers_a_known_temperature(t0: float) -> None:
    # Labels drawn from softmax(z) make T = 1 the calibrated temperature of z, so the fit on
    # z · T0 must find T0 (up to the sampling noise of 20,000 labels).
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, 5, generator=g, dtype=torch.float64) * 2.0
    labels = torch.multinomial(torch.softmax(z, -1), 1, generator=g).squeeze(1)
    t = T.fit_temperature((z * t0).float(), labels)
    assert t.dtype == torch.float64 and t.ndim == 0
    assert t.item() == pytest.approx(t0, rel=0.03)

    # It is the minimiser: the NLL is no lower a little either side.
    def nll_at(temp: float) -> float:
        return M.nll(torch.log_softmax(z * t0 / temp, -1), labels).item()

    assert nll_at(t.item()) <= min(nll_at(t.item() * 0.99), nll_at(t.item() * 1.01))
    assert T.fit_temperature((z * t0).float(), labels).item() == t.item()  # deterministic


def test_fit_temperature_rejects_non_finite_logits() -> None:
    z = torch.tensor([[0.0, float("inf")], [1.0, 0.0]])
    with pytest.raises(ValueError, match="`logits` must be finite"):
        T.fit_temperature(z, torch.tensor([0, 1]))


# --------------------------------------------------------------------------------------------
# ECE
# --------------------------------------------------------------------------------------------


def test_ece_hand_case_10_bins_edges_and_confidence_one() -> None:
    # K = 5, n_bins = 10; bins (b/10, (b+1)/10].
    #   conf 1.00 correct -> bin 9 (0.9, 1.0]   (the reference JAX code drops it)
    #   conf 0.90 wrong   -> bin 8 (0.8, 0.9]   (edge: lower bin)
    #   conf 0.85 correct -> bin 8
    #   conf 0.30 correct -> bin 2 (0.2, 0.3]   (edge)
    #   conf 0.25 wrong   -> bin 2
    #   conf 0.50 wrong   -> bin 4 (0.4, 0.5]   (edge)
    #   conf 0.45 correct -> bin 4
    # ECE = (1/N) Σ_b |Σ_{i∈b} (acc_i - conf_i)|:
    #   bin 9: |1 - 1| = 0
    #   bin 8: |(0 - .9) + (1 - .85)| = .75
    #   bin 2: |(1 - .3) + (0 - .25)| = .45
    #   bin 4: |(0 - .5) + (1 - .45)| = .05
    #   ECE = (0 + .75 + .45 + .05) / 7 = 1.25 / 7
    # (edge values pushed up would give (.1 + .15 + .95 + 1.05)/7 instead; dropping 1.0 changes N.)
    conf = [1.0, 0.9, 0.85, 0.3, 0.25, 0.5, 0.45]
    argmax = [0, 1, 2, 3, 0, 1, 2]
    correct = [True, False, True, True, False, False, True]
    labels = [j if ok else (j + 1) % 5 for j, ok in zip(argmax, correct, strict=True)]
    probs = torch.tensor(rows_with_confidence(conf, 5, argmax))
    labels_t = torch.tensor(labels)
    got = M.ece(probs, labels_t, n_bins=10)
    assert got.dtype == torch.float64 and got.ndim == 0
    assert got.item() == pytest.approx(1.25 / 7, abs=1e-12)
    # 15 bins: all seven fall in different bins (1.0->14, .9->13, .85->12, .5->7, .45->6,
    # .3->4, .25->3), so ECE = Σ|acc - conf| / 7 = (0 + .9 + .15 + .7 + .25 + .5 + .55) / 7.
    assert M.ece(probs, labels_t).item() == pytest.approx(3.05 / 7, abs=1e-12)


def test_ece_hand_case_15_bins_edges() -> None:
    # n_bins = 15, bins (b/15, (b+1)/15].
    #   conf 1.00 wrong   -> bin 14 (14/15, 1]
    #   conf 0.95 correct -> bin 14            : |(0 - 1) + (1 - .95)| = .95
    #   conf 0.40 correct -> bin 5 (1/3, 6/15]  (0.4 = 6/15 is an edge)
    #   conf 0.35 wrong   -> bin 5             : |(1 - .4) + (0 - .35)| = .25
    #   conf 0.60 wrong   -> bin 8 (8/15, 9/15] (0.6 = 9/15 is an edge)
    #   conf 0.55 correct -> bin 8             : |(0 - .6) + (1 - .55)| = .15
    #   ECE = (.95 + .25 + .15) / 6 = .225
    conf = [1.0, 0.95, 0.4, 0.35, 0.6, 0.55]
    argmax = [0, 1, 2, 3, 0, 1]
    correct = [False, True, True, False, False, True]
    labels = [j if ok else (j + 1) % 4 for j, ok in zip(argmax, correct, strict=True)]
    probs = torch.tensor(rows_with_confidence(conf, 4, argmax))
    assert M.ece(probs, torch.tensor(labels), n_bins=15).item() == pytest.approx(0.225, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_ece_low_precision_edge_lands_in_lower_bin(dtype: torch.dtype) -> None:
    # float32(0.2) = 0.2000000029... > 0.2 (double); it must still be in (0.1, 0.2] with 10 bins,
    # together with the 0.15 sample:  |(1 - .2) + (0 - .15)| / 2 = .325
    # (in the wrong bin it would be (.8 + .15) / 2 = .475).
    probs = torch.tensor(
        [
            [0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.0],  # conf 0.2 at index 0, label 0: correct
            [0.15, 0.15, 0.15, 0.15, 0.14, 0.13, 0.13],  # conf 0.15 at index 0, label 1: wrong
        ],
        dtype=dtype,
    )
    labels = torch.tensor([0, 1])
    c = probs.max(-1).values.double()
    want = abs((1 - c[0]) + (0 - c[1])).item() / 2
    assert want == pytest.approx(0.325, abs=2e-3)
    assert M.ece(probs, labels, n_bins=10).item() == pytest.approx(want, abs=1e-12)


def test_ece_perfectly_calibrated_is_zero() -> None:
    # conf .8 with 8/10 correct, conf .5 (tie -> class 0) with 2/4 correct, conf 1 all correct.
    probs = torch.tensor([[0.8, 0.2]] * 10 + [[0.5, 0.5]] * 4 + [[1.0, 0.0]] * 3)
    labels = torch.tensor([0] * 8 + [1] * 2 + [0, 1, 0, 1] + [0] * 3)
    for n_bins in (10, 15):
        assert M.ece(probs, labels, n_bins=n_bins).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", range(4))
def test_ece_random_with_many_edge_confidences_matches_loop_reference(
    seed: int, dtype: type
) -> None:
    rng = np.random.default_rng(seed)
    n, k = 300, 4
    # Multiples of 1/30 hit every 10-bin edge and every other 15-bin edge.
    conf = (rng.integers(9, 31, size=n) / 30).tolist()
    argmax = rng.integers(0, k, size=n).tolist()
    probs = rows_with_confidence(conf, k, argmax).astype(dtype)
    probs[: n // 3] = rng.dirichlet(np.ones(k) * 0.5, size=n // 3)  # some generic rows too
    labels = rng.integers(0, k, size=n)
    # Make accuracy correlate with confidence so bins differ.
    labels = np.where(rng.random(n) < probs.max(1), probs.argmax(1), labels)
    for n_bins in (10, 15):
        got = M.ece(torch.from_numpy(probs), torch.from_numpy(labels), n_bins=n_bins)
        assert got.item() == pytest.approx(ref_ece(probs, labels, n_bins), abs=1e-12)


# --------------------------------------------------------------------------------------------
# Selective prediction
# --------------------------------------------------------------------------------------------


def test_selective_prediction_hand_case_with_ties() -> None:
    # conf    .9 .9 | .7 .7 .7 | .2       correct 1 0 | 1 1 0 | 0
    # groups: n = 2, 5, 6; cumulative errors e = 1, 2, 3
    # coverage = 2/6, 5/6, 1; risk = 1/2, 2/5, 1/2; accuracy = 1/2, 3/5, 1/2
    # AURC = 2/6·.5 + 3/6·.4 + 1/6·.5 = (1 + 1.2 + .5)/6 = .45; sel_pred_auc = .55
    conf = torch.tensor([0.9, 0.9, 0.7, 0.7, 0.7, 0.2])
    correct = torch.tensor([1, 0, 1, 1, 0, 0]).bool()
    got = M.selective_prediction(conf, correct)
    torch.testing.assert_close(
        got["coverage"], torch.tensor([2 / 6, 5 / 6, 1.0], dtype=torch.float64)
    )
    torch.testing.assert_close(got["risk"], torch.tensor([0.5, 0.4, 0.5], dtype=torch.float64))
    torch.testing.assert_close(got["accuracy"], torch.tensor([0.5, 0.6, 0.5], dtype=torch.float64))
    assert got["aurc"].item() == pytest.approx(0.45, abs=1e-15)
    assert got["sel_pred_auc"].item() == pytest.approx(0.55, abs=1e-15)
    assert got["aurc"].ndim == 0 and got["aurc"].dtype == torch.float64


def test_selective_prediction_perfect_ranking() -> None:
    # 3 correct above 2 wrong: accuracies at coverage 1/5..5/5 = 1, 1, 1, 3/4, 3/5
    # sel_pred_auc = (1 + 1 + 1 + .75 + .6) / 5 = .87, AURC = .13
    conf = torch.tensor([0.6, 0.9, 0.5, 0.7, 0.8], dtype=torch.float64)
    correct = torch.tensor([False, True, False, True, True])
    got = M.selective_prediction(conf, correct)
    assert got["sel_pred_auc"].item() == pytest.approx(0.87, abs=1e-15)
    assert got["aurc"].item() == pytest.approx(0.13, abs=1e-15)
    assert (got["sel_pred_auc"] + got["aurc"]).item() == pytest.approx(1.0, abs=1e-15)
    torch.testing.assert_close(
        got["accuracy"], torch.tensor([1, 1, 1, 0.75, 0.6], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(5))
def test_aurc_tied_invariant_to_order_and_matches_bruteforce(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 200
    conf = rng.integers(0, 6, size=n) / 5  # heavy ties
    correct = rng.random(n) < 0.3 + 0.6 * conf
    base = M.selective_prediction(torch.tensor(conf), torch.tensor(correct))
    assert base["aurc"].item() == pytest.approx(ref_aurc(conf, correct), abs=1e-12)
    assert (base["sel_pred_auc"] + base["aurc"]).item() == pytest.approx(1.0, abs=1e-12)
    assert len(base["coverage"]) == len(np.unique(conf))
    # Within-tie extremes: correct first vs errors first inside every tie group (an ungrouped
    # implementation would give different areas for these two).
    for errors_first in (False, True):
        key = np.lexsort((correct if errors_first else ~correct, -conf))
        got = M.selective_prediction(torch.tensor(conf[key]), torch.tensor(correct[key]))
        for name in base:
            torch.testing.assert_close(got[name], base[name], rtol=0, atol=1e-15)
    perm = rng.permutation(n)
    got = M.selective_prediction(torch.tensor(conf[perm]), torch.tensor(correct[perm]))
    for name in base:
        torch.testing.assert_close(got[name], base[name], rtol=0, atol=1e-15)


def test_aurc_without_ties_is_mean_of_prefix_risks() -> None:
    rng = np.random.default_rng(11)
    n = 257
    conf = rng.random(n).astype(np.float32)
    correct = rng.random(n) < conf
    order = np.argsort(-conf, kind="stable")
    errs = np.cumsum(~correct[order])
    want = float(np.mean(errs / np.arange(1, n + 1)))
    got = M.selective_prediction(torch.from_numpy(conf), torch.from_numpy(correct.astype(np.int64)))
    assert got["aurc"].item() == pytest.approx(want, abs=1e-12)
    assert got["sel_pred_auc"].item() == pytest.approx(1 - want, abs=1e-12)
    np.testing.assert_allclose(got["coverage"].numpy(), np.arange(1, n + 1) / n, atol=1e-15)


# --------------------------------------------------------------------------------------------
# Accuracy, NLL, Brier
# --------------------------------------------------------------------------------------------


def test_accuracy_ties_go_to_lowest_index_and_random_matches_numpy() -> None:
    # Lowest-index tie-break predicts 0, 0, 1 -> all correct; highest-index would give 1/3.
    probs = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.2, 0.8]])
    assert M.accuracy(probs, torch.tensor([0, 0, 1])).item() == 1.0
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=100)
    y = rng.integers(0, 5, size=100)
    got = M.accuracy(torch.tensor(p), torch.tensor(y))
    assert got.dtype == torch.float64 and got.item() == pytest.approx(np.mean(p.argmax(1) == y))


@pytest.mark.parametrize("k", [2, 7, 1000])
def test_nll_brier_uniform(k: int) -> None:
    n = 5
    probs = torch.full((n, k), 1.0 / k)
    labels = torch.arange(n) % k
    assert M.nll(torch.log(probs), labels).item() == pytest.approx(math.log(k), rel=1e-6)
    assert M.brier(probs, labels).item() == pytest.approx(1 - 1 / k, rel=1e-6)


def test_nll_brier_one_hot() -> None:
    probs = torch.eye(4, dtype=torch.float64)
    right, wrong = torch.arange(4), (torch.arange(4) + 1) % 4
    assert M.nll(torch.log(probs), right).item() == 0.0
    assert M.brier(probs, right).item() == 0.0
    assert M.brier(probs, wrong).item() == 2.0
    assert M.nll(torch.log(probs), wrong).item() == math.inf


def test_nll_huge_logits_stays_finite() -> None:
    logits = torch.tensor([[1e4, -1e4, 0.0], [3e4, 2e4, -5e4]], dtype=torch.float32)
    labels = torch.tensor([1, 1])
    got = M.nll(torch.log_softmax(logits.float(), -1), labels)
    # Row 1: log p_1 = -1e4 - logsumexp = -2e4; row 2: log p_1 = 2e4 - 3e4 = -1e4 (the other
    # terms are below exp(-1e4), invisible in double).
    assert math.isfinite(got.item())
    assert got.item() == pytest.approx((2e4 + 1e4) / 2, rel=1e-6)


def test_nll_random_matches_cross_entropy_in_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=gen) * 5
    labels = torch.randint(0, 10, (64,), generator=gen)
    want = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    got = M.nll(torch.log_softmax(logits.float(), -1), labels)
    assert got.dtype == torch.float64 and got.item() == pytest.approx(want, rel=1e-6)


def test_brier_random_matches_loop() -> None:
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(6), size=50)
    y = rng.integers(0, 6, size=50)
    want = np.mean([sum((p[i, j] - (j == y[i])) ** 2 for j in range(6)) for i in range(50)])
    assert M.brier(torch.tensor(p), torch.tensor(y)).item() == pytest.approx(want, abs=1e-14)


# --------------------------------------------------------------------------------------------
# Entropy, confidence scores, ensembles
# --------------------------------------------------------------------------------------------


def test_predictive_entropy_uniform_one_hot_and_random() -> None:
    k = 10
    uniform = torch.full((3, k), 1.0 / k, dtype=torch.float64)
    torch.testing.assert_close(
        M.predictive_entropy(uniform), torch.full((3,), math.log(k)).double()
    )
    one_hot = torch.eye(k, dtype=torch.float32)
    h = M.predictive_entropy(one_hot)
    assert h.shape == (k,) and not torch.isnan(h).any() and (h == 0).all()
    p = np.random.default_rng(0).dirichlet(np.ones(k) * 0.3, size=40)
    p[0, :3] = 0.0
    p[0] /= p[0].sum()
    np.testing.assert_allclose(
        M.predictive_entropy(torch.tensor(p)).numpy(), scipy_entropy(p, axis=1), atol=1e-13
    )


def test_confidence_scores() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]], dtype=torch.float32)
    got = M.confidence_scores(probs)
    assert set(got) == {"max_prob", "neg_entropy"}
    torch.testing.assert_close(got["max_prob"], torch.tensor([0.7, 1.0]).double())
    want = -scipy_entropy(probs.double().numpy(), axis=1)
    np.testing.assert_allclose(got["neg_entropy"].numpy(), want, atol=1e-7)
    assert got["neg_entropy"][1].item() == 0.0


def test_ensemble_log_probs_matches_naive_float64() -> None:
    gen = torch.Generator().manual_seed(1)
    member = torch.log_softmax(torch.randn(5, 20, 10, generator=gen, dtype=torch.float64) * 3, -1)
    want = np.log(np.mean(np.exp(member.numpy()), axis=0))
    got = M.ensemble_log_probs(member)
    assert got.shape == (20, 10)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    got32 = M.ensemble_log_probs(member.float())
    np.testing.assert_allclose(got32.numpy(), want, rtol=0, atol=1e-5)
    # One member: identity.
    torch.testing.assert_close(M.ensemble_log_probs(member[:1]), member[0])


def test_ensemble_log_probs_is_stable_far_in_the_tail() -> None:
    # log p = -1000 and -1010 for two members: naive exp underflows to 0 -> -inf.
    member = torch.tensor([[[0.0, -1000.0]], [[0.0, -1010.0]]], dtype=torch.float32)
    got = M.ensemble_log_probs(member)
    want = -1000.0 + math.log((1 + math.exp(-10)) / 2)
    assert torch.isfinite(got).all()
    assert got[0, 1].item() == pytest.approx(want, rel=1e-6)
    assert got[0, 0].item() == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------------------------
# The bundle
# --------------------------------------------------------------------------------------------


def test_classification_metrics_bundle() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(300, 5, generator=gen) * 2
    labels = torch.randint(0, 5, (300,), generator=gen)
    labels = torch.where(torch.rand(300, generator=gen) < 0.5, logits.argmax(-1), labels)
    log_probs = torch.log_softmax(logits, -1)
    got = M.classification_metrics(log_probs, labels)
    assert set(got) == {
        "accuracy",
        "nll",
        "brier",
        "ece",
        "ece_10bin",
        "sel_pred_auc",
        "aurc",
        "sel_pred_auc_entropy",
        "aurc_entropy",
    }
    for value in got.values():
        assert value.ndim == 0 and value.dtype == torch.float64
    p = log_probs.double().exp().numpy()
    y = labels.numpy()
    correct = p.argmax(1) == y
    assert got["accuracy"].item() == pytest.approx(correct.mean(), abs=1e-12)
    want_nll = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    assert got["nll"].item() == pytest.approx(want_nll, rel=1e-6)
    onehot = np.eye(5)[y]
    assert got["brier"].item() == pytest.approx(((p - onehot) ** 2).sum(1).mean(), abs=1e-12)
    assert got["ece"].item() == pytest.approx(ref_ece(p, y, 15), abs=1e-12)
    assert got["ece_10bin"].item() == pytest.approx(ref_ece(p, y, 10), abs=1e-12)
    assert got["aurc"].item() == pytest.approx(ref_aurc(p.max(1), correct), abs=1e-12)
    neg_h = -scipy_entropy(p, axis=1)
    assert got["aurc_entropy"].item() == pytest.approx(ref_aurc(neg_h, correct), abs=1e-12)
    assert (got["sel_pred_auc"] + got["aurc"]).item() == pytest.approx(1.0, abs=1e-12)
    assert (got["sel_pred_auc_entropy"] + got["aurc_entropy"]).item() == pytest.approx(1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inputs_give_same_results() -> None:
    gen = torch.Generator().manual_seed(2)
    log_probs = torch.log_softmax(torch.randn(100, 7, generator=gen), -1)
    labels = torch.randint(0, 7, (100,), generator=gen)
    cpu = M.classification_metrics(log_probs, labels)
    gpu = M.classification_metrics(log_probs.cuda(), labels.cuda())
    for key, value in cpu.items():
        assert gpu[key].device.type == "cuda"
        assert gpu[key].item() == pytest.approx(value.item(), abs=1e-12), key
    p = log_probs.exp()
    ood_cpu = O.ood_metrics(p[:50], p[50:])
    ood_gpu = O.ood_metrics(p[:50].cuda(), p[50:].cuda())
    for key, value in ood_cpu.items():
        assert ood_gpu[key].item() == pytest.approx(value.item(), abs=1e-12), key


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

_P = torch.full((4, 3), 1 / 3)
_Y = torch.tensor([0, 1, 2, 0])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: M.accuracy(_P[0], _Y), r"`probs` must be a 2-D \(N, K\)"),
        (lambda: M.accuracy(_P.reshape(1, 4, 3), _Y), r"`probs`.*got tensor of shape \(1, 4, 3\)"),
        (lambda: M.accuracy(_P, _Y[:3]), r"`labels` must have length N=4.*shape \(3,\)"),
        (
            lambda: M.brier(_P, torch.tensor([0, 1, 3, 0])),
            r"`labels` values must lie in \[0, K\) = \[0, 3\)",
        ),
        (lambda: M.brier(_P, torch.tensor([0, -1, 2, 0])), r"`labels` values.*\[-1, 2\]"),
        (lambda: M.ece(_P, _Y.float()), r"`labels` must have an integer dtype.*float32"),
        (lambda: M.ece(_P, _Y[None]), r"`labels` must be a 1-D"),
        (lambda: M.ece(torch.ones(4, 3, dtype=torch.int64), _Y), r"`probs`.*floating.*int64"),
        (lambda: M.ece(_P, _Y, n_bins=0), r"`n_bins` must be a positive int"),
        (lambda: M.accuracy(torch.empty(0, 3), _Y[:0]), r"`probs` must be non-empty"),
        (lambda: M.nll(_P[:, :, None], _Y), r"`log_probs` must be a 2-D"),
        (lambda: M.nll(_P.numpy(), _Y), r"`log_probs` must be a torch.Tensor"),
        (lambda: M.predictive_entropy(torch.ones(2, 2, dtype=torch.int32)), r"`probs`.*int32"),
        (lambda: M.confidence_scores(_P[0]), r"`probs` must be a 2-D"),
        (lambda: M.selective_prediction(_P, _Y.bool()), r"`confidence` must be a 1-D"),
        (lambda: M.selective_prediction(_P[:, 0], _Y[:2] > 0), r"`correct` must have length N=4"),
        (lambda: M.selective_prediction(_P[:, 0], _Y), r"`correct` must be a bool.*only 0 and 1"),
        (
            lambda: M.selective_prediction(torch.tensor([0.5, math.nan]), torch.tensor([1, 0])),
            r"`confidence` must not contain NaN",
        ),
        (lambda: M.ood_detection(_P[:, 0], torch.empty(0)), r"`score_out` must be non-empty"),
        (lambda: M.ood_detection(_Y, _P[:, 0]), r"`score_in`.*floating.*int64"),
        (lambda: O.ood_metrics(_P, torch.full((2, 4), 0.25)), r"`probs_out`.*K=3"),
        (lambda: O.ood_metrics(_P[0], _P), r"`probs_in` must be a 2-D"),
        (lambda: M.ensemble_log_probs(_P), r"`member_log_probs` must be a 3-D \(E, N, K\)"),
        (lambda: M.ensemble_log_probs(_Y.reshape(1, 1, 4)), r"`member_log_probs`.*floating"),
        (lambda: M.classification_metrics(_P, _Y[:2]), r"`labels` must have length N=4"),
    ],
)
def test_validation_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_all_exports() -> None:
    assert set(M.__all__) == {
        "accuracy",
        "nll",
        "brier",
        "ece",
        "selective_prediction",
        "confidence_scores",
        "predictive_entropy",
        "ood_detection",
        "ensemble_log_probs",
        "classification_metrics",
        "calibration_bins",
        "binary_auroc",
        "chance_accuracy",
        "chance_nll",
        "METRIC_REGISTRY",
        "Metric",
        "MetricInputs",
        "higher_is_better",
        "metric",
        "metric_inputs",
        "sensitivity_at_specificity",
        "top_label_bins",
    }
    assert set(O.__all__) == {
        "available",
        "ood_metrics",
        "ood_score",
        "max_logit_score",
        "energy_score",
        "entropy_score",
        "msp_score",
        "OOD_SCORE_REGISTRY",
        "OodScore",
        "register_ood_score",
    }
    assert T.__all__ == [
        "TEMPERATURE_RANGE",
        "fit_temperature",
        "temperature_identified",
        "temperature_warnings",
    ]
    for module in (M, O, T):
        for name in module.__all__:
            assert callable(getattr(module, name)) or name.isupper()


# --------------------------------------------------------------------------------------------
# Binary tasks and reliability-diagram bins
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_auroc_matches_sklearn_with_ties_and_imbalance(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = (rng.random(400) < 0.08).astype(np.int64)  # ~8 % positives, like melanoma
    scores = np.round(rng.random(400) + 0.3 * labels, 2)  # rounded: many ties
    got = M.binary_auroc(torch.from_numpy(scores), torch.from_numpy(labels))
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_classification_metrics_binary_reports_positive_class_auroc_like_sklearn() -> None:
    gen = torch.Generator().manual_seed(11)
    labels = (torch.rand(500, generator=gen) < 0.1).long()
    logits = torch.randn(500, 2, generator=gen) + 1.5 * torch.nn.functional.one_hot(labels, 2)
    log_probs = torch.log_softmax(logits, -1)
    got = M.classification_metrics(log_probs, labels)
    p1 = log_probs.double().exp()[:, 1].numpy()
    assert got["auroc_positive"].item() == pytest.approx(
        roc_auc_score(labels.numpy(), p1), abs=1e-12
    )
    # Only for K = 2; undefined (NaN) when the labels hold a single class.
    assert "auroc_positive" not in M.classification_metrics(
        torch.log_softmax(logits[:, [0, 1, 0]], -1), labels
    )
    one_class = M.classification_metrics(log_probs, torch.zeros(500, dtype=torch.long))
    assert math.isnan(one_class["auroc_positive"].item())


def test_binary_auroc_validates_labels() -> None:
    with pytest.raises(ValueError, match=r"`labels` must contain both classes"):
        M.binary_auroc(torch.rand(5), torch.ones(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`labels` values must lie in \[0, K\) = \[0, 2\)"):
        M.binary_auroc(torch.rand(3), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_calibration_bins_match_loop_and_reproduce_ece(dtype: torch.dtype) -> None:
    # Confidences exactly on edges, at 1.0, and whole empty bins (no confidence below 1/3).
    probs = torch.tensor(
        rows_with_confidence([0.4, 0.4, 0.6, 1.0, 1.0, 0.7, 0.9, 0.5], 3, [0, 1, 2, 0, 1, 2, 0, 1]),
        dtype=dtype,
    )
    labels = torch.tensor([0, 0, 2, 0, 1, 1, 0, 2])
    n_bins = 10
    got = M.calibration_bins(probs, labels, n_bins=n_bins)
    p, y = probs.numpy(), labels.numpy()
    conf, correct = p.max(1), p.argmax(1) == y
    uppers = [p.dtype.type((b + 1) / n_bins) for b in range(n_bins)]
    bins = np.array([next(b for b, hi in enumerate(uppers) if c <= hi) for c in conf])
    counts = np.bincount(bins, minlength=n_bins)
    assert got["count"].tolist() == counts.tolist()
    assert got["edges"].tolist() == pytest.approx([b / n_bins for b in range(n_bins + 1)])
    for b in range(n_bins):
        if counts[b] == 0:
            assert math.isnan(got["accuracy"][b]) and math.isnan(got["confidence"][b])
        else:
            assert got["accuracy"][b].item() == pytest.approx(correct[bins == b].mean())
            assert got["confidence"][b].item() == pytest.approx(
                conf[bins == b].astype(float).mean()
            )
    full = got["count"] > 0
    weighted = (
        got["count"][full] / len(y) * (got["accuracy"] - got["confidence"])[full].abs()
    ).sum()
    assert weighted.item() == pytest.approx(M.ece(probs, labels, n_bins=n_bins).item(), abs=1e-12)
