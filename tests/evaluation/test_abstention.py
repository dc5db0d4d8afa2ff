"""The abstention rule as a typed record (fseb_ft.evaluation.abstention): its JSON keeps the key
order and values the meta file, ``abstention.json`` and ``fseb.json`` have always had, it reads
back to the same rule, and ``fseb-ft predict``'s summary reads it back."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from fseb_ft.evaluation.abstention import (
    AbstentionRule,
    ValidationOutcome,
    given_rule,
    no_rule,
    out_of_range,
    rule_for_target,
)
from fseb_ft.prediction import summary

# Top-class log-odds of six validation images and whether each prediction was right.
CONFIDENCE = torch.tensor([2.0, 1.0, 1.0, 0.5, -0.5, -1.0], dtype=torch.float64)
CORRECT = torch.tensor([True, True, False, True, False, False])
VALIDATION_KEYS = ["n", "accepted", "coverage", "risk"]


def _through_a_file(record: dict) -> dict:
    return json.loads(json.dumps(record, indent=2))


def test_a_rule_chosen_for_coverage_has_the_meta_files_keys_and_reads_back() -> None:
    rule = rule_for_target("coverage", 0.5, 0.25, CONFIDENCE, CORRECT)
    record = rule.to_json()
    assert list(record) == ["temperature", "criterion", "target", "threshold",
                            "log_odds_threshold", "chosen_on", "validation"]  # fmt: skip
    assert list(record["validation"]) == VALIDATION_KEYS
    assert record["chosen_on"] == "validation" and record["target"] == 0.5
    assert record["threshold"] == pytest.approx(1 / (1 + math.exp(-1.0)))  # τ = sigmoid(1)
    assert record["validation"] == {"n": 6, "accepted": 3, "coverage": 0.5, "risk": 1 / 3}
    assert AbstentionRule.from_json(_through_a_file(record)) == rule


def test_the_kept_record_drops_how_it_was_chosen_and_adds_kept_last() -> None:
    chosen = rule_for_target("max_risk", 0.3, None, CONFIDENCE, CORRECT)
    stored = dataclasses.replace(chosen, chosen_on=None).to_json()  # abstention.json
    assert "chosen_on" not in stored
    assert list(stored) == ["temperature", "criterion", "target", "threshold",
                            "log_odds_threshold", "validation"]  # fmt: skip
    kept = dataclasses.replace(AbstentionRule.from_json(stored), chosen_on="kept")
    assert list(kept.to_json()) == [*stored, "chosen_on"] and kept.to_json()["chosen_on"] == "kept"
    assert dataclasses.replace(kept, chosen_on=None) == dataclasses.replace(chosen, chosen_on=None)


@pytest.mark.parametrize(("tau", "log_odds"), [(0.0, -math.inf), (0.5, 0.0), (1.0, math.inf)])
def test_a_given_threshold_keeps_its_target_as_given_and_infinite_log_odds(
    tau: float, log_odds: float
) -> None:
    rule = given_rule(tau, 1.5)
    record = rule.to_json()
    assert list(record) == ["temperature", "criterion", "target", "threshold",
                            "log_odds_threshold", "validation"]  # fmt: skip
    assert record["log_odds_threshold"] == log_odds and record["validation"] is None
    assert AbstentionRule.from_json(_through_a_file(record)) == rule
    assert given_rule(1, None).to_json()["target"] == 1  # `1` in JSON, as the caller gave it
    outcome = rule.measured(CONFIDENCE, CORRECT).validation
    assert outcome is not None and outcome.n == 6
    assert outcome.accepted == sum(c >= log_odds for c in CONFIDENCE.tolist())
    assert outcome.coverage == outcome.accepted / 6
    assert (outcome.risk is None) == (outcome.accepted == 0)  # no error rate of nothing


def test_nothing_abstains_without_a_rule() -> None:
    record = no_rule(None).to_json()
    assert record == {
        "temperature": None,
        "criterion": "none",
        "threshold": 0.0,
        "log_odds_threshold": -math.inf,
        "validation": None,
    }
    assert list(record) == ["temperature", "criterion", "threshold", "log_odds_threshold",
                            "validation"]  # fmt: skip


def test_a_record_from_before_the_log_odds_gets_them_from_tau() -> None:
    old = {"temperature": 0.5, "criterion": "coverage", "target": 0.9, "threshold": 0.75,
           "validation": {"n": 10, "accepted": 9, "coverage": 0.9, "risk": 0.0}}  # fmt: skip
    rule = AbstentionRule.from_json(old)
    assert rule.log_odds_threshold == pytest.approx(math.log(3.0))
    assert rule.validation == ValidationOutcome(n=10, accepted=9, coverage=0.9, risk=0.0)


def test_the_summary_reads_the_rule_back_from_the_meta_record() -> None:
    rule = rule_for_target("coverage", 0.5, 0.25, CONFIDENCE, CORRECT)
    meta = {"model": "run r", "temperature": 0.25, "abstention": rule.to_json(), "images": 4,
            "abstained": 1, "unreadable": [], "left_out": []}  # fmt: skip
    lines = summary(meta, None).splitlines()
    assert lines[1] == (
        f"threshold: abstain when max probability < {rule.threshold:.6g} (top-class log-odds < "
        "1), chosen on the validation split for coverage 0.5"
    )
    assert lines[2] == (
        "validation: coverage 0.5000 (3/6 images), risk 0.3333 (error rate among accepted)"
    )
    meta["abstention"] = dataclasses.replace(rule, chosen_on="kept").to_json()
    assert "kept with the model (chosen on the validation split for coverage 0.5)" in summary(
        meta, None
    )


@pytest.mark.parametrize(
    ("name", "value", "valid"),
    [("coverage", 0.0, False), ("coverage", 1.0, True), ("max_risk", 0.0, True),
     ("max_risk", 1.0, False), ("threshold", 0.0, True), ("threshold", 1.0, True),
     ("threshold", 1.5, False)],
)  # fmt: skip
def test_each_option_takes_its_interval(name: str, value: float, valid: bool) -> None:
    assert (out_of_range(name, value) is None) == valid
