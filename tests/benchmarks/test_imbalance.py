"""benchmarks/imbalance.py: the label files it draws, its paired table, and a --quick run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import imbalance
from fseb_ft.runs import report


def _arms(bal_acc: float, nll: float) -> dict[str, dict[str, float]]:
    metrics = {"roc_auc": 0.8, "sensitivity_at_95_specificity": 0.3, "ece": 0.05}
    arms = {}
    for slug in ("psmap", "fseb"):
        for arm in ("none", "none/ts", "balanced", "balanced/ts", "balanced/pc"):
            shift = 0.1 if arm.startswith("balanced") else 0.0
            arms[f"{slug}/{arm}"] = metrics | {"balanced_accuracy": bal_acc + shift, "nll": nll}
    return arms


def test_the_table_pairs_arms_seed_by_seed() -> None:
    per_seed = {0: _arms(0.60, 0.20), 1: _arms(0.70, 0.30), 2: _arms(0.65, 0.40)}
    per_seed[1]["fseb/balanced"]["nll"] = 0.36  # FS-EB − PS-MAP, weighted: 0, +0.06, 0
    lines = imbalance.table(per_seed).splitlines()
    assert lines[0].startswith("| | Bal. acc. (%) | AUROC (%) |")
    assert (
        lines[2]
        == "| PS-MAP | 65.00 ± 2.89 | 80.00 ± 0.00 | 30.00 ± 0.00 | 0.300 ± 0.058 | 5.00 ± 0.00 |"
    )
    titles = [line.split(" | ")[0] for line in lines[2:]]
    assert titles[:4] == ["| PS-MAP", "| FS-EB", "| PS-MAP + TS", "| FS-EB + TS"]
    assert "| FS-EB, weighted + prior corr." in titles
    weighted = next(line for line in lines if line.startswith("| Δ FS-EB − PS-MAP, weighted"))
    assert weighted.split(" | ")[4] == "+0.020 ± 0.020"  # paired on the seed: mean 0.02
    gain = next(line for line in lines if line.startswith("| Δ weighted − unweighted, PS-MAP"))
    assert gain.split(" | ")[1] == "+10.00 ± 0.00"  # the seeds' levels differ, the Δ does not
    deltas = imbalance.headline(per_seed)
    assert deltas["fseb_vs_psmap_weighted_nll"] == pytest.approx([0.02, 0.02])
    assert deltas["weighted_vs_unweighted_balanced_accuracy_psmap"] == pytest.approx([0.1, 0.0])


def test_quick_run_draws_csv_tasks_and_ends_with_the_headline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runs' figures are not under test, and drawing them is most of a tiny run's time.
    monkeypatch.setattr(report, "_draw", lambda jobs, strict: [])
    deltas = imbalance.main(["--quick", "--seeds", "0", "--out", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == json.dumps(deltas)  # one seed: the standard errors are NaN
    with (tmp_path / "task" / "seed0" / "train.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted({row["label"] for row in rows}) == ["frog", "other"]
    assert sum(row["label"] == "frog" for row in rows) == 8
    assert all((tmp_path / "quick-images" / row["image"]).is_file() for row in rows)
    record = json.loads((tmp_path / "imbalance.json").read_text())
    arms = record["per_seed"]["0"]
    assert {"psmap/none", "fseb/balanced/ts", "fseb/balanced/pc"} <= set(arms)
    run_json = json.loads(
        (tmp_path / "runs" / "seed0" / "balanced" / "fseb" / "run.json").read_text()
    )
    assert len(run_json["class_weights"]) == 2  # the weighted runs are weighted
    assert arms["psmap/balanced/pc"]["roc_auc"] == pytest.approx(
        arms["psmap/balanced"]["roc_auc"], abs=1e-9
    )  # a constant logit shift leaves the ranking alone
