"""benchmarks/quickstart_seeds.py: its table from run records, and --tables-only's section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import quickstart_seeds


def _record(accuracy: float, nll: float, auroc: float) -> dict:
    return {
        "test": {"accuracy": accuracy, "nll": nll, "ece": 0.01, "brier": 0.02},
        "ood": {"digits_5_9": {"entropy_auroc": auroc, "entropy_fpr95": 0.5}},
    }


RECORDS = {
    0: {"psmap": _record(0.98, 0.040, 0.80), "fseb": _record(1.00, 0.020, 0.95)},
    1: {"psmap": _record(0.99, 0.030, 0.90), "fseb": _record(0.99, 0.020, 0.96)},
    2: {"psmap": _record(1.00, 0.020, 0.85), "fseb": _record(0.99, 0.023, 0.97)},
}


def test_the_table_gives_mean_se_and_range_and_pairs_the_delta_by_seed() -> None:
    per_seed = {s: quickstart_seeds.seed_values(r) for s, r in RECORDS.items()}
    lines = quickstart_seeds.table(per_seed).splitlines()
    assert lines[0] == (
        "| Method | Acc. (%) | NLL | ECE (%) | Brier | OOD AUROC (%) | OOD FPR95 (%) |"
    )
    # PS-MAP's accuracy: 98, 99, 100; mean 99, sample sd 1, SE 1/sqrt(3) = 0.577.
    psmap = lines[2].split(" | ")
    assert psmap[1] == "99.00 ± 0.58 [98.00–100.00]"
    assert psmap[5] == "85.0 ± 2.9 [80.0–90.0]"
    # FS-EB − PS-MAP per seed, NLL: -0.020, -0.010, +0.003; mean -0.009, SE 0.0067.
    delta = lines[4].split(" | ")
    assert delta[0] == "| **Δ FS-EB − PS-MAP**"
    assert delta[2] == "−0.009 ± 0.007"
    assert delta[5] == "+11.0 ± 2.6"  # AUROC +15, +6, +12: sample sd sqrt(21), SE 2.65
    assert delta[3] == "+0.00 ± 0.00"


def test_tables_only_writes_the_stamped_section_from_saved_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed, runs in RECORDS.items():
        for slug, record in runs.items():
            folder = tmp_path / "runs" / f"seed{seed}" / slug
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps(record))
    page = tmp_path / "results.md"
    page.write_text("# Results\n\n<!-- quickstart:begin -->\nold\n<!-- quickstart:end -->\n")
    argv = ["--tables-only", "--out", str(tmp_path / "runs"), "--results", str(page)]
    quickstart_seeds.main(argv)
    text = page.read_text()
    assert "old" not in text and "| **Δ FS-EB − PS-MAP** |" in text
    assert "`OMP_NUM_THREADS=1 python -m benchmarks.quickstart_seeds --seeds 0 1 2`" in text
    assert "<!-- made-by: " in text  # runs without a code record: a stamp that says so
    assert "| FS-EB | 99.33 ± 0.33 [99.00–100.00] |" in capsys.readouterr().out


def test_tables_only_names_a_seed_that_never_ran(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"seed0/psmap/results\.json not found"):
        quickstart_seeds.main(["--tables-only", "--seeds", "0", "--out", str(tmp_path)])
