"""Tuned PS-MAP against tuned FS-EB, each with and without temperature scaling (issue 11).

    python -m benchmarks.tuned recipes/fmnist.yaml --trials 8 --seeds 1 2 \
        --out runs/fmnist-sweep train.epochs=3

1. ``fseb-ft sweep RECIPE --trials N --compare eval.temperature_scaling=true [overrides]``: the
   same trial budget for PS-MAP (over lr and prior_var) and for FS-EB (also reg_scale and
   prior_cov_diag), each winner picked on validation NLL and evaluated once on the test split
   (seed 0, the recipe's).
2. Each winner's ``best_recipe.yaml`` again with ``train.seed`` = each of ``--seeds``.
3. A Markdown table over the seeds (mean ± standard error; "Δ" rows are per-seed differences
   from PS-MAP, paired by seed) and the sweep's cost: the training seconds of all its trials
   over those of the winner's run.

Steps already done (a finished sweep, a seed's ``results.json``) are not run again, so
``--tables-only`` prints the table from what is on disk. The table is printed with the stamp of
the code that made its runs (:mod:`benchmarks.provenance`); ``--section NAME`` also writes both
into that marked section of ``--results``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import paper_rows
from benchmarks.provenance import made_by, run_codes, stamp, write_section
from benchmarks.seeds import cell
from fseb_ft.runs.rundir import RUN_INFO_FILE, TRAINER_STATE, latest_checkpoint

REPO = Path(__file__).resolve().parents[1]
ARMS = ("psmap", "fseb")
LABELS = {"psmap": "PS-MAP", "fseb": "FS-EB"}
# (column title, key in a results block, OOD set or None, scale); "{ood}" is the OOD set's title.
COLUMNS = (
    ("Acc. (%)", "accuracy", None, 100.0),
    ("NLL", "nll", None, 1.0),
    ("ECE (%)", "ece", None, 100.0),
    ("{ood} AUROC (%)", "entropy_auroc", "ood", 100.0),
)


def _fseb_ft(*args: str, check: bool = True) -> None:
    subprocess.run([sys.executable, "-m", "fseb_ft.cli", *args], check=check)


def run_all(recipe: str, trials: int, seeds: Sequence[int], out: Path, overrides: list[str]):
    """Steps 1 and 2: the compared sweeps, then the winners at the other seeds."""
    if not all((out / arm / "best_recipe.yaml").is_file() for arm in ARMS):
        _fseb_ft("sweep", recipe, "--trials", str(trials), "--compare",
                 "eval.temperature_scaling=true", *overrides, f"output.dir={out}")  # fmt: skip
    for arm in ARMS:
        for seed in seeds:
            target = out / "seeds" / f"{arm}-seed{seed}"
            if not (target / "results.json").is_file():
                # A run that diverges is a result (listed by table()), not a reason to stop.
                _fseb_ft(str(out / arm / "best_recipe.yaml"), f"train.seed={seed}",
                         f"output.dir={target}", check=False)  # fmt: skip


def _results(out: Path, arm: str, seeds: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Seed → results of the arm's winner; a seed whose run stopped (diverged) is left out."""
    board = json.loads((out / arm / "leaderboard.json").read_text())
    found = {0: board["best"]["results"]}
    for seed in seeds:
        path = out / "seeds" / f"{arm}-seed{seed}" / "results.json"
        if path.is_file():
            found[seed] = json.loads(path.read_text())
    return found


def _value(results: dict[str, Any], key: str, ood: str | None, scaled: bool) -> float:
    block = results["temperature_scaled"] if scaled else results
    if ood is None:
        return block["test"][key]
    (scores,) = block["ood"].values()
    return scores[key]


def _cell(values: Sequence[float], scale: float, signed: bool = False) -> str:
    """Mean ± standard error (none for one seed); a difference (``signed``) carries its sign,
    + or −."""
    digits = 2 if scale != 1.0 else 4
    return cell([v * scale for v in values], digits, signed).replace("-", "−")


def table(out: Path, seeds: Sequence[int], paper: str | None = None) -> str:
    """Step 3: the Markdown table of the winners over seed 0 and ``seeds``.

    A seed whose run stopped is listed as such and left out; Δ rows pair the seeds both have.
    ``paper`` names a pairing of ``benchmarks.paper_rows`` whose paper rows follow ours.
    """
    runs = {arm: _results(out, arm, seeds) for arm in ARMS}
    (ood,) = runs["psmap"][0]["ood"]
    header = [
        "Method",
        "seeds",
        *(c[0].format(ood=paper_rows.OOD_TITLES.get(ood, ood)) for c in COLUMNS),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    common = sorted(set(runs["psmap"]) & set(runs["fseb"]))
    for scaled in (False, True):
        suffix = " + TS" if scaled else ""
        for arm in ARMS:
            got = runs[arm]
            cells = [_cell([_value(r, k, o, scaled) for r in got.values()], scale)
                     for _, k, o, scale in COLUMNS]  # fmt: skip
            lines.append("| " + " | ".join([LABELS[arm] + suffix, _seeds(got), *cells]) + " |")
        delta = [
            _cell([_value(runs["fseb"][s], k, o, scaled) - _value(runs["psmap"][s], k, o, scaled)
                   for s in common], scale, signed=True)
            for _, k, o, scale in COLUMNS
        ]  # fmt: skip
        paired = ", ".join(map(str, common))
        lines.append("| " + " | ".join([f"Δ FS-EB{suffix}", paired, *delta]) + " |")
    missing = {LABELS[a]: sorted({0, *seeds} - set(runs[a])) for a in ARMS}
    notes = [f"{label}: seed(s) {', '.join(map(str, s))} stopped (diverged)"
             for label, s in missing.items() if s]  # fmt: skip
    text = "\n".join(lines) + "\n" + "".join(f"\n{note}." for note in notes) + "\n"
    return paper_rows.extend(text, paper) if paper else text


def _seeds(found: dict[int, Any]) -> str:
    return ", ".join(map(str, sorted(found)))


def sweep_cost(out: Path) -> dict[str, dict[str, float]]:
    """Per arm: the trials' training seconds, the winner's, and their ratio."""
    cost = {}
    for arm in ARMS:
        board = json.loads((out / arm / "leaderboard.json").read_text())
        seconds = [_trial_seconds(Path(t["dir"])) for t in board["trials"]]
        one = _trial_seconds(Path(board["best"]["dir"]))
        cost[LABELS[arm]] = {"trials": len(seconds), "seconds": sum(seconds), "one_run": one,
                             "ratio": sum(seconds) / one}  # fmt: skip
    return cost


def _trial_seconds(run_dir: Path) -> float:
    """Training seconds of a trial; a pruned one has them in its last checkpoint only."""
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    if "training" in info:
        return info["training"]["seconds"]
    checkpoint = latest_checkpoint(run_dir)
    return json.loads((checkpoint / TRAINER_STATE).read_text())["seconds"] if checkpoint else 0.0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tuned",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="section.key=value for every run")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tables-only", action="store_true")
    parser.add_argument(
        "--paper",
        choices=sorted(paper_rows.PAIRINGS),
        default=None,
        help="add the paper's rows for this pairing (fmnist-tuned for recipes/fmnist.yaml)",
    )
    parser.add_argument(
        "--section",
        default=None,
        help="also write the table into this marked section of --results (e.g. fmnist-tuned)",
    )
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "results.md")
    args = parser.parse_intermixed_args(argv)
    if not args.tables_only:
        run_all(args.recipe, args.trials, args.seeds, args.out, args.overrides)
    body = table(args.out, args.seeds, args.paper)
    print(body + "\n" + stamp(made_by(run_codes([args.out]))))
    print(json.dumps(sweep_cost(args.out)))
    if args.section:
        markers = (f"<!-- {args.section}:begin -->", f"<!-- {args.section}:end -->")
        write_section(args.results, body, markers, runs=[args.out])


if __name__ == "__main__":
    main()
