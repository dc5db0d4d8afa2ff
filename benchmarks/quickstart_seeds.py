"""The offline quickstart (``make demo``) over seeds: how far one demo run can land from another.

    OMP_NUM_THREADS=1 python -m benchmarks.quickstart_seeds [--seeds 0 1 2] [--out runs/qs-seeds]
        [--results docs/results.md] [--tables-only]

For every seed, ``recipes/quickstart.yaml --compare train.seed=S`` (PS-MAP and FS-EB on
scikit-learn's digits 0–4, digits 5–9 as the OOD set; the same seed gives both methods the same
data and initialisation) into ``OUT/seedS``; a seed whose two runs finished is not trained
again. The table gives each method's mean ± standard error over the seeds and the range, then
FS-EB − PS-MAP paired by seed, and goes between ``<!-- quickstart:begin/end -->`` of
``--results``, stamped with the code that made the runs. About 3 minutes a seed on one
thread of the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.provenance import write_section
from benchmarks.seeds import cell, value_at

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "quickstart.yaml"
MARKERS = ("<!-- quickstart:begin -->", "<!-- quickstart:end -->")
METHODS = {"psmap": "PS-MAP", "fseb": "FS-EB"}
OOD = "digits_5_9"
# (column title, where in results.json, scale, decimals)
COLUMNS = (
    ("Acc. (%)", ("test", "accuracy"), 100.0, 2),
    ("NLL", ("test", "nll"), 1.0, 3),
    ("ECE (%)", ("test", "ece"), 100.0, 2),
    ("Brier", ("test", "brier"), 1.0, 3),
    ("OOD AUROC (%)", ("ood", OOD, "entropy_auroc"), 100.0, 1),
    ("OOD FPR95 (%)", ("ood", OOD, "entropy_fpr95"), 100.0, 1),
)

Values = dict[str, dict[str, float]]
"""Per method slug, each column's value (scaled) of one seed."""


def seed_values(results: Mapping[str, Mapping[str, Any]]) -> Values:
    """Each method's column values from its ``results.json`` record (by method slug)."""
    return {
        slug: {title: scale * value_at(record, path) for title, path, scale, _ in COLUMNS}
        for slug, record in results.items()
    }


def table(per_seed: Mapping[int, Values]) -> str:
    """Mean ± SE [min–max] per method, then the paired Δ FS-EB − PS-MAP ± SE."""
    seeds = sorted(per_seed)
    head = "| Method | " + " | ".join(c[0] for c in COLUMNS) + " |\n"
    lines = [head, "|---" * (len(COLUMNS) + 1) + "|\n"]
    for slug, label in METHODS.items():
        cells = []
        for title, _, _, digits in COLUMNS:
            values = [per_seed[s][slug][title] for s in seeds]
            spread = f" [{min(values):.{digits}f}–{max(values):.{digits}f}]"
            cells.append(cell(values, digits) + (spread if len(values) > 1 else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |\n")
    deltas = [
        cell([per_seed[s]["fseb"][t] - per_seed[s]["psmap"][t] for s in seeds], d, signed=True)
        for t, _, _, d in COLUMNS
    ]
    lines.append("| **Δ FS-EB − PS-MAP** | " + " | ".join(deltas).replace("-", "−") + " |\n")
    return "".join(lines)


def run_seed(seed: int, out: Path) -> dict[str, dict[str, Any]]:
    """The two runs of ``seed`` (trained unless both finished; a killed one resumes), their
    ``results.json``."""
    from fseb_ft.finetune import compare

    if not all(path.is_file() for path in _results_files(seed, out).values()):
        compare(RECIPE, [f"train.seed={seed}", f"output.dir={out / f'seed{seed}'}"])
    return read_seed(seed, out)


def read_seed(seed: int, out: Path) -> dict[str, dict[str, Any]]:
    """The finished runs' ``results.json`` of ``seed``.

    Raises:
        SystemExit: a run has none (``--tables-only`` before the runs).
    """
    files = _results_files(seed, out)
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise SystemExit(f"{missing[0]} not found: run the benchmark without --tables-only first")
    return {slug: json.loads(path.read_text()) for slug, path in files.items()}


def _results_files(seed: int, out: Path) -> dict[str, Path]:
    """Each method's ``results.json`` of ``seed`` under ``out``, by method slug."""
    return {slug: out / f"seed{seed}" / slug / "results.json" for slug in METHODS}


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quickstart_seeds",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "qs-seeds")
    parser.add_argument("--results", type=Path, help="write the table into this page")
    parser.add_argument("--tables-only", action="store_true",
                        help="train nothing: the table from the runs' results.json")  # fmt: skip
    args = parser.parse_args(argv)
    read = read_seed if args.tables_only else run_seed
    per_seed = {seed: seed_values(read(seed, args.out)) for seed in args.seeds}
    command = "OMP_NUM_THREADS=1 python -m benchmarks.quickstart_seeds --seeds " + " ".join(
        map(str, args.seeds)
    )
    text = (
        f"`{command}`; mean ± standard error over the seeds and [range]; Δ paired by seed; "
        f"OOD: digits 5–9 by predictive entropy:\n\n{table(per_seed)}"
    )
    print(text)
    if args.results is not None:
        write_section(args.results, text, MARKERS, runs=[args.out / f"seed{s}" for s in args.seeds])
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
