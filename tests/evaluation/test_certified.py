"""Certified abstention (fseb_ft.evaluation.certified, ``--max-risk R --confidence C``): the
Clopper–Pearson bound is scipy's, Learn-then-Test's fixed sequence stops at its first failure, the
certified threshold is never less conservative than the empirical one, the guarantee holds on
simulated exchangeable data, and the rule's record, summary and argument checks."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import stats

from fseb_ft.evaluation.abstention import AbstentionRule, certified_rule, out_of_range
from fseb_ft.evaluation.certified import BOUND_METHOD, certified_threshold, clopper_pearson_upper
from fseb_ft.evaluation.selective import abstention_threshold
from fseb_ft.predict import main
from fseb_ft.prediction import predict_images, summary

# Twenty validation images, confidences 20 > 19 > … > 1; ranks 7, 10, 11, 17, 19, 20 are wrong.
CONFIDENCE = torch.arange(20, 0, -1, dtype=torch.float64)
WRONG = {7, 10, 11, 17, 19, 20}
CORRECT = torch.tensor([rank not in WRONG for rank in range(1, 21)])


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
def test_the_bound_is_scipys_exact_one_sided_clopper_pearson(level: float) -> None:
    cases = [(0, 1), (0, 20), (1, 20), (7, 20), (19, 20), (20, 20), (3, 500)]
    errors, n = (torch.tensor(column) for column in zip(*cases, strict=True))
    found = clopper_pearson_upper(errors, n, level)
    for (e, trials), bound in zip(cases, found.tolist(), strict=True):
        test = stats.binomtest(e, trials, alternative="less")
        assert bound == pytest.approx(test.proportion_ci(level, method="exact").high, rel=1e-9)
    # Zero errors: P(Bin(n, u) = 0) = (1 - u)^n = 1 - level, by hand.
    assert found[1] == pytest.approx(1 - (1 - level) ** (1 / 20), rel=1e-9)


def test_the_hand_worked_case_stops_at_the_first_failure() -> None:
    # r = 0.4, C = 0.9. Zero errors meet the bound from n = 5 on (1 - 0.1^(1/5) = 0.369; n = 4:
    # 0.438), so the sequence starts at τ = 16 (top 5, no error), passes τ = 15 (top 6, 0.319),
    # and fails at τ = 14 (top 7, one error: 0.453 > 0.4). τ = 12 (top 9, one error: 0.368)
    # would pass again, but fixed-sequence testing stopped: τ = 15.
    found = certified_threshold(CONFIDENCE, CORRECT, max_risk=0.4, level=0.9)
    assert float(found["threshold"]) == 15.0
    assert (int(found["accepted"]), float(found["risk"])) == (6, 0.0)
    assert float(found["risk_bound"]) == pytest.approx(1 - 0.1 ** (1 / 6), rel=1e-9)
    seven = stats.binomtest(1, 7, alternative="less").proportion_ci(0.9, method="exact").high
    nine = stats.binomtest(1, 9, alternative="less").proportion_ci(0.9, method="exact").high
    assert seven > 0.4 >= nine  # the failure that stops it, and the pass it never reaches
    # The empirical rule accepts all 20 (risk 6 / 20 = 0.3 ≤ 0.4).
    assert float(abstention_threshold(CONFIDENCE, CORRECT, max_risk=0.4)["threshold"]) == 1.0


@pytest.mark.parametrize(("max_risk", "level"), [(0.0, 0.9), (0.1, 0.9), (0.4, 0.999)])
def test_nothing_certified_abstains_on_everything(max_risk: float, level: float) -> None:
    # r = 0: no bound is 0; r = 0.1: 22 error-free images needed; C = 0.999: the top 5 fail.
    found = certified_threshold(CONFIDENCE, CORRECT, max_risk=max_risk, level=level)
    assert float(found["threshold"]) == math.inf and int(found["accepted"]) == 0
    assert math.isnan(float(found["risk_bound"]))


def test_the_certified_threshold_is_never_below_the_empirical_one() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        n = int(torch.randint(20, 300, (1,), generator=generator))
        confidence = torch.randint(0, 40, (n,), generator=generator).double()  # with ties
        correct = torch.rand(n, generator=generator) < 0.5 + confidence / 80  # (N,)
        for max_risk in (0.05, 0.2, 0.4):
            for level in (0.5, 0.9):
                cert = certified_threshold(confidence, correct, max_risk=max_risk, level=level)
                emp = abstention_threshold(confidence, correct, max_risk=max_risk)
                assert float(cert["threshold"]) >= float(emp["threshold"])


def test_the_guarantee_holds_over_simulated_validation_draws() -> None:
    # Exchangeable data: confidence c ~ U(0, 1), P(wrong | c) = 0.6 (1 - c), so the true risk
    # among accepted at τ is R(τ) = 0.3 (1 - τ), exactly. r = 0.1, C = 0.9: at most 10 % of the
    # validation draws may choose a τ with R(τ) > r, within a binomial tolerance of 3 SE.
    generator = torch.Generator().manual_seed(26)
    draws, n, max_risk, level = 150, 300, 0.1, 0.9
    certified_misses = empirical_misses = certified_any = 0
    for _ in range(draws):
        confidence = torch.rand(n, generator=generator, dtype=torch.float64)
        correct = torch.rand(n, generator=generator, dtype=torch.float64) >= 0.6 * (1 - confidence)
        tau = float(
            certified_threshold(confidence, correct, max_risk=max_risk, level=level)["threshold"]
        )
        certified_misses += tau < 1 and 0.3 * (1 - tau) > max_risk
        certified_any += tau < 1
        tau = float(abstention_threshold(confidence, correct, max_risk=max_risk)["threshold"])
        empirical_misses += 0.3 * (1 - tau) > max_risk
    tolerance = 3 * math.sqrt(level * (1 - level) / draws)
    assert certified_misses / draws <= 1 - level + tolerance
    assert empirical_misses / draws > 0.3  # the empirical rule is no such guarantee
    assert certified_any > draws / 2  # and the certified one is not only abstaining


def test_under_a_flat_risk_the_guarantee_is_exact_as_the_module_says() -> None:
    # P(wrong | c) = 0.104 for every image, just above r = 0.1: every threshold is too risky, and
    # the sequence certifies one exactly when its first test passes. Given the confidences that
    # test sees Bin(n0, 0.104) errors among the n0 = 22 most confident images (0.9^22 <= 0.1 <
    # 0.9^21) and passes at 0 errors only (P(Bin(22, 0.1) <= 1) > 0.1): with probability
    # 0.896^22 = 0.0894 <= 1 - C, which the simulated draws meet within 3 SE.
    generator = torch.Generator().manual_seed(5)
    draws, n, max_risk, level, risk = 300, 300, 0.1, 0.9, 0.104
    assert stats.binom.cdf(0, 22, max_risk) <= 1 - level < stats.binom.cdf(1, 22, max_risk)
    certified = 0
    for _ in range(draws):
        confidence = torch.rand(n, generator=generator, dtype=torch.float64)
        correct = torch.rand(n, generator=generator, dtype=torch.float64) >= risk
        cert = certified_threshold(confidence, correct, max_risk=max_risk, level=level)
        first_test_passes = bool(correct[confidence.argsort(descending=True)[:22]].all())
        assert bool(torch.isfinite(cert["threshold"])) == first_test_passes
        certified += first_test_passes
    exact = (1 - risk) ** 22
    assert exact <= 1 - level
    assert abs(certified / draws - exact) <= 3 * math.sqrt(exact * (1 - exact) / draws)


def test_a_certified_rule_records_its_guarantee_and_old_records_still_load() -> None:
    rule = certified_rule(0.4, 0.9, 0.5, CONFIDENCE, CORRECT)
    record = json.loads(json.dumps(rule.to_json()))
    assert record["criterion"] == "max_risk" and record["target"] == 0.4
    assert record["certified"] == {
        "confidence": 0.9,
        "method": BOUND_METHOD,
        "risk_bound": pytest.approx(1 - 0.1 ** (1 / 6)),
        "empirical_coverage": 1.0,
    }
    assert record["validation"]["coverage"] == 0.3
    assert AbstentionRule.from_json(record) == rule
    old = {key: value for key, value in record.items() if key != "certified"}
    assert AbstentionRule.from_json(old).certified is None


def test_the_summary_states_the_guarantee_and_its_cost_or_that_nothing_is_certified() -> None:
    meta = {"model": "run r", "temperature": 0.5, "images": 4, "abstained": 1, "unreadable": [],
            "left_out": []}  # fmt: skip
    meta["abstention"] = certified_rule(0.4, 0.9, 0.5, CONFIDENCE, CORRECT).to_json()
    lines = summary(meta, None).splitlines()
    assert lines[1].endswith("chosen on the validation split for risk ≤ 0.4 with probability ≥ 0.9")
    assert lines[3] == (
        "guarantee: risk ≤ 40 % among accepted with probability ≥ 90 % (Clopper–Pearson, "
        "Learn-then-Test; bound at the threshold 31.87 %); validation coverage 30.0 % "
        "(empirical rule: 100.0 %)"
    )
    meta["abstention"] = certified_rule(0.1, 0.9, 0.5, CONFIDENCE, CORRECT).to_json()
    assert summary(meta, None).splitlines()[3] == (
        "guarantee: no threshold is certified for risk ≤ 10 % among accepted with probability "
        "≥ 90 % on the validation split, so the model abstains on everything (Clopper–Pearson, "
        "Learn-then-Test); validation coverage 0.0 % (empirical rule: 30.0 %)"
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--confidence", "0.95"], "--confidence C certifies --max-risk R: give --max-risk too"),
        (["--coverage", "0.9", "--confidence", "0.95"], "give --max-risk too"),
        (["--max-risk", "0.1", "--confidence", "0.3"], "must lie in [0.5, 1), got 0.3"),
        (["--max-risk", "0.1", "--confidence", "1"], "must lie in [0.5, 1), got 1"),
    ],
)
def test_confidence_argument_errors_are_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["RUN", "images/", *argv])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m fseb_ft.predict: error: ") and error in last


def test_the_api_refuses_a_confidence_without_max_risk_before_loading() -> None:
    with pytest.raises(ValueError, match="give max_risk too"):
        predict_images("no-such-run", ["x.png"], confidence=0.95)
    with pytest.raises(ValueError, match=r"confidence must lie in \[0.5, 1\)"):
        predict_images("no-such-run", ["x.png"], max_risk=0.1, confidence=0.2)
    assert out_of_range("confidence", 0.5) is None and out_of_range("confidence", 0.99) is None
