"""benchmarks/tuned.py: the table and the sweep cost from the files a compared sweep leaves."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import tuned


def _results(acc: float, nll: float) -> dict:
    block = {"test": {"accuracy": acc, "nll": nll, "ece": 0.01}, "ood": {"mnist": {}}}
    block["ood"]["mnist"]["entropy_auroc"] = 0.8
    return {**block, "temperature_scaled": {**block, "temperature": 1.5}}


def test_table_pairs_seeds_and_cost_is_trials_over_the_winner(tmp_path: Path) -> None:
    for arm, accs in (("psmap", (0.90, 0.92, 0.94)), ("fseb", (0.91, 0.94, 0.95))):
        trials = []
        for i, seconds in enumerate((30.0, 10.0)):
            trial = tmp_path / arm / "trials" / f"t{i}"
            trial.mkdir(parents=True)
            (trial / "run.json").write_text(json.dumps({"training": {"seconds": seconds}}))
            trials.append({"dir": str(trial)})
        best = {"dir": trials[0]["dir"], "results": _results(accs[0], 0.3)}
        board = {"best": best, "trials": trials}
        (tmp_path / arm / "leaderboard.json").write_text(json.dumps(board))
        for seed, acc in zip((1, 2), accs[1:], strict=True):
            folder = tmp_path / "seeds" / f"{arm}-seed{seed}"
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps(_results(acc, 0.3)))
    text = tuned.table(tmp_path, [1, 2])
    assert "| PS-MAP | 0, 1, 2 | 92.00 ± 1.15 |" in text
    assert text.startswith("| Method | seeds | Acc. (%) | NLL | ECE (%) | MNIST AUROC (%) |")
    assert "| Δ FS-EB | 0, 1, 2 | +1.33 ± 0.33 | +0.0000 ± 0.0000 |" in text  # differences 1, 2, 1
    assert "| FS-EB + TS | 0, 1, 2 |" in text and "| Δ FS-EB + TS |" in text
    (tmp_path / "seeds" / "psmap-seed2" / "results.json").unlink()  # that run diverged
    text = tuned.table(tmp_path, [1, 2])
    assert "| PS-MAP | 0, 1 | 91.00 ± 1.00 |" in text
    assert "| Δ FS-EB | 0, 1 | +1.50 ± 0.50 |" in text  # paired on seeds 0 and 1 only
    assert "PS-MAP: seed(s) 2 stopped (diverged)." in text
    with_paper = tuned.table(tmp_path, [1, 2], paper="fmnist-tuned")
    assert with_paper.startswith(text.split("\n\n")[0])  # ours unchanged, paper rows after
    assert (
        "| paper: PS-MAP (ResNet-18, from scratch; Tables 1, 3) | 5 | 93.8 ± 0.0 | 0.26 ± 0.00 "
        "| 3.6 ± 0.0 | 94.9 ± 0.4 |"  # the paper's OOD set is the column's: MNIST
    ) in with_paper
    assert with_paper.rstrip().endswith("PS-MAP: seed(s) 2 stopped (diverged).")
    assert tuned.sweep_cost(tmp_path)["FS-EB"] == {
        "trials": 2, "seconds": 40.0, "one_run": 30.0, "ratio": 40.0 / 30.0
    }  # fmt: skip


def test_a_difference_carries_its_sign_and_a_level_does_not() -> None:
    assert tuned._cell([-0.01, -0.03], 1.0, signed=True) == "−0.0200 ± 0.0100"
    assert tuned._cell([0.5, 0.7], 100.0, signed=True) == "+60.00 ± 10.00"
    assert tuned._cell([0.5, 0.7], 100.0) == "60.00 ± 10.00"
