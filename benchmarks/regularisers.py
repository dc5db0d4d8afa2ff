"""Parameter, feature, function or weight space: FS-EB against the ways practitioners stay near
the pretrained model (issue 36, item 5).

    OMP_NUM_THREADS=1 python -m benchmarks.regularisers --seeds 0 1 2 --jobs 2

The setting is the CIFAR-10 transfer protocol of docs/results.md with the paper's distant
context (``benchmarks.paper_cifar10 --protocol context``): the ImageNet-pretrained
EfficientNet-Lite0 of ``../shared`` on 9,000 CIFAR-10 training images at 64 px (1,000 held out
for validation), 3 epochs, batch 64, SGD lr 0.02. OOD sets: MNIST, FashionMNIST and
Tiny-ImageNet, 5,000 each, for every arm (CIFAR-100 is the function-space arms' context, so it
is no OOD set here). The arms (:data:`ARMS`):

- PS-MAP, weight decay towards zero (parameter space);
- L2-SP, weight decay towards the starting weights (parameter space);
- Feature-SP, the penultimate features held near φ0's at the training batch (feature space);
- FS-EB, the prior on the logits at the CIFAR-100 context (function space), with the prior
  that validation NLL chose on this protocol (d = 1);
- FS-VI (head), the same prior as a variational KL, variance on the classifier only;

and WiSE-FT (weight space, post hoc) on PS-MAP and FS-EB. Each arm gets the same budget: its
one strength (:data:`STRENGTH`, the weight of its regulariser) at each multiple in
:data:`GRID` of the reference, trained at the first seed and chosen by the best epoch's
validation NLL, then the winner at the other seeds. Every run draws its images with one
``data.seed`` (0) and is evaluated with temperature scaling ("+ TS"), LAC sets for 90 %
coverage, and the test split's ``--corruption-limit`` images under the 14 corruptions at
severity 5. Steps are skipped when their results are on disk; the tables go between the markers
``<!-- cifar10-regularisers:begin/end -->`` of ``--results``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import paper_cifar10, posthoc
from benchmarks.provenance import write_section
from benchmarks.seeds import cell, row

CONTEXT_METHOD = "FS-EB (cifar100, d=1)"  # the context protocol's validation-chosen prior


@dataclass(frozen=True)
class Arm:
    """One method of the comparison."""

    label: str
    """Its row title."""
    method: tuple[str, ...]
    """Its recipe overrides; ``context`` marks the FS-EB context's (CIFAR-100, d = 1)."""
    strength: str
    """The recipe key the grid scales: the weight of the arm's regulariser."""
    wise: bool = False
    """Whether its runs also evaluate WiSE-FT."""


ARMS = {
    "psmap": Arm("PS-MAP", ("fseb.reg_scale=0",), "fseb.prior_var", wise=True),
    "l2sp": Arm("L2-SP", ("fseb.method=l2sp",), "fseb.prior_var"),
    "feature": Arm("Feature-SP", ("fseb.method=feature",), "fseb.reg_scale"),
    "fseb": Arm("FS-EB", ("context",), "fseb.reg_scale", wise=True),
    "fsvi": Arm(
        "FS-VI (head)",
        ("context", "fseb.method=fsvi", "fseb.fsvi.variance=head"),
        "fseb.reg_scale",
    ),
}
STRENGTH = {"fseb.prior_var": 1.0, "fseb.reg_scale": 1.0}
"""The reference value of each strength key (``recipes/cifar10.yaml``)."""
GRID = (0.1, 1.0, 10.0)
"""Multiples of the regulariser's weight: ``reg_scale`` times m, or ``prior_var`` divided by m
(a weight decay of ``m / (prior_var · N)``), the same three for every arm."""
EVAL = (
    "data.seed=0",
    "eval.temperature_scaling=true",
    "eval.conformal=0.9",
    "eval.corruptions=all",
    "eval.severities=[5]",
    "eval.bootstrap=0",
)
OOD_SETS = posthoc.OOD_SETS
BLOCKS = ((None, ""), ("temperature_scaled", " + TS"), ("wise_ft", " + WiSE"))
# (column title, path in a results block, scale, decimals)
COLUMNS = (
    ("Acc. (%)", ("test", "accuracy"), 100.0, 2),
    ("NLL", ("test", "nll"), 1.0, 4),
    ("ECE (%)", ("test", "ece"), 100.0, 2),
    ("Sel. Pred. (%)", ("test", "sel_pred_auc"), 100.0, 2),
    ("Set size (90 %)", ("test", "conformal_set_size"), 1.0, 2),
    *((f"{t} AUROC (%)", ("ood", n, "entropy_auroc"), 100.0, 1) for n, t in OOD_SETS.items()),
    ("Corr. ECE, sev. 5 (%)", ("corruption_summary", "5", "ece"), 100.0, 2),
)
MARKERS = ("<!-- cifar10-regularisers:begin -->", "<!-- cifar10-regularisers:end -->")


def strength_value(arm: Arm, multiple: float) -> float:
    """The strength key's value for a multiple of the regulariser's weight."""
    reference = STRENGTH[arm.strength]
    return reference / multiple if arm.strength == "fseb.prior_var" else reference * multiple


def overrides(out: Path, name: str, multiple: float) -> list[str]:
    """Every override of one arm at one multiple of its strength, seed aside."""
    arm, cache = ARMS[name], out / "cache"
    method: list[str] = []
    for item in arm.method:
        method += (
            paper_cifar10.context_methods(cache)[CONTEXT_METHOD] if item == "context" else [item]
        )
    if "context" not in arm.method:
        method.append(paper_cifar10._ood_override(posthoc._psmap_ood(cache)))
    wise = ["eval.wise_ft=true"] if arm.wise else []
    strength = f"{arm.strength}={strength_value(arm, multiple):g}"
    return [*paper_cifar10.context_defaults(cache), *method, strength, *EVAL, *wise]


def run_dir(out: Path, name: str, multiple: float, seed: int) -> Path:
    return out / "runs" / f"{name}-x{multiple:g}-seed{seed}"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def val_nll(results: dict[str, Any] | None) -> float:
    """The selection criterion: the best epoch's validation NLL (NaN when not run or diverged)."""
    return float((results or {}).get("training", {}).get("best_val_nll", math.nan))


def chosen(out: Path, name: str, seed: int) -> float | None:
    """The multiple whose finished run at ``seed`` has the lowest validation NLL (a run that
    diverged leaves no results and is passed over); None when none finished."""
    scores = {m: val_nll(_load(run_dir(out, name, m, seed) / "results.json")) for m in GRID}
    finite = {m: s for m, s in scores.items() if not math.isnan(s)}
    return min(finite, key=lambda m: (finite[m], m)) if finite else None


def _train(
    out: Path, jobs: list[tuple[str, float, int]], workers: int, extra: Sequence[str]
) -> None:
    todo = [
        [str(paper_cifar10.RECIPE), *overrides(out, name, m), *extra, f"train.seed={seed}",
         f"output.dir={run_dir(out, name, m, seed)}"]
        for name, m, seed in jobs
        if not (run_dir(out, name, m, seed) / "results.json").is_file()
    ]  # fmt: skip
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda args: posthoc._fseb_ft("train", *args), todo))


def train(out: Path, seeds: Sequence[int], workers: int, extra: Sequence[str]) -> None:
    """The grid at the first seed, then each arm's winner at the others."""
    _train(out, [(name, m, seeds[0]) for name in ARMS for m in GRID], workers, extra)
    winners = {name: chosen(out, name, seeds[0]) for name in ARMS}
    jobs = [(name, m, s) for s in seeds[1:] for name, m in winners.items() if m is not None]
    _train(out, jobs, workers, extra)


def _value(block: dict[str, Any], path: tuple[str, ...]) -> float:
    for key in path:
        if not isinstance(block, dict) or key not in block:
            return math.nan
        block = block[key]
    return float(block)  # type: ignore[arg-type]


def seconds_per_epoch(results: dict[str, Any]) -> float:
    """The mean wall-clock seconds of the run's training epochs (validation included)."""
    training = results.get("training", {})
    return training.get("seconds", math.nan) / max(training.get("epochs", 0), 1)


def blocks_of(out: Path, seeds: Sequence[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """Row label → seed → results block, each arm at its chosen strength, with its + TS and
    + WiSE blocks; a block carries its run's seconds per epoch."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for name, arm in ARMS.items():
        multiple = chosen(out, name, seeds[0])
        for seed in seeds if multiple is not None else ():
            results = _load(run_dir(out, name, multiple, seed) / "results.json")
            for key, suffix in BLOCKS if results else ():
                block = results if key is None else results.get(key)
                if block:
                    block = {**block, "seconds_per_epoch": seconds_per_epoch(results)}
                    found.setdefault(f"{arm.label}{suffix}", {})[seed] = block
    return found


def _cell(values: Sequence[float], digits: int, signed: bool = False) -> str:
    """``cell``, or a dash where a run lacks the value (a block without corruptions)."""
    return "—" if any(math.isnan(v) for v in values) else cell(values, digits, signed)


def _cells(blocks: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]] | None) -> list[str]:
    """Each column (then seconds per epoch) over ``blocks``, or its paired difference from
    ``base``, seed by seed."""
    columns = [*((p, f, d) for _, p, f, d in COLUMNS), (("seconds_per_epoch",), 1.0, 0)]
    if base is None:
        return [_cell([_value(b, p) * f for b in blocks], d) for p, f, d in columns]
    pairs = list(zip(blocks, base, strict=True))
    return [
        _cell([(_value(a, p) - _value(b, p)) * f for a, b in pairs], d, signed=True)
        for p, f, d in columns
    ]


def table(out: Path, seeds: Sequence[int]) -> str:
    """Each arm's rows, then each arm's paired difference from PS-MAP (+ TS from PS-MAP + TS)."""
    header = ["Method", "seeds", *(c[0] for c in COLUMNS), "s / epoch"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = blocks_of(out, seeds)
    for label, by_seed in rows.items():
        lines.append(row(label, sorted(by_seed), _cells(list(by_seed.values()), None)))
    for label, by_seed in rows.items():
        base_label = "PS-MAP + TS" if label.endswith(" + TS") else "PS-MAP"
        base = rows.get(base_label, {})
        common = sorted(set(by_seed) & set(base))
        if label != base_label and common:
            cells = _cells([by_seed[s] for s in common], [base[s] for s in common])
            lines.append(row(f"**Δ {label} − {base_label}**", common, cells))
    return "\n".join(lines) + "\n"


def grid_table(out: Path, seed: int) -> str:
    """Validation NLL of every arm at every multiple of its strength, the chosen one in bold."""
    header = ["Method", "strength key", *(f"× {m:g}" for m in GRID)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, arm in ARMS.items():
        best = chosen(out, name, seed)
        cells = []
        for m in GRID:
            nll = val_nll(_load(run_dir(out, name, m, seed) / "results.json"))
            text = "—" if math.isnan(nll) else f"{nll:.4f} ({arm.strength.split('.')[1]} "
            text += "" if math.isnan(nll) else f"{strength_value(arm, m):g})"
            cells.append(f"**{text}**" if m == best else text)
        lines.append("| " + " | ".join([arm.label, f"`{arm.strength}`", *cells]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: train what is missing, print and write the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.regularisers",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--corruption-limit", type=int, default=1000)
    paper_cifar10.add_output_arguments(parser, "regularisers")
    args = parser.parse_args(argv)
    if not paper_cifar10.WEIGHTS.is_dir():
        raise SystemExit(f"{paper_cifar10.WEIGHTS} not found: this benchmark needs ../shared")
    extra = [f"eval.corruption_limit={args.corruption_limit}", *args.override]
    if not args.tables_only:
        train(args.out, args.seeds, args.jobs, extra)
    command = (f"`OMP_NUM_THREADS=1 python -m benchmarks.regularisers --seeds "
               f"{' '.join(map(str, args.seeds))} --jobs {args.jobs} --corruption-limit "
               f"{args.corruption_limit}`")  # fmt: skip
    body = (
        f"{command}; mean ± standard error over the seeds, Δ rows paired by seed; each arm at "
        f"the strength its validation NLL chose at seed {args.seeds[0]}:\n\n"
        + grid_table(args.out, args.seeds[0])
        + "\n"
        + table(args.out, args.seeds)
    )
    print(body)
    write_section(args.results, body, MARKERS, runs=[args.out / "runs"])


if __name__ == "__main__":
    main()
