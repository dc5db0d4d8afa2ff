"""FashionMNIST, the paper's Tables 1 and 3: PS-MAP vs FS-EB on real data, several seeds.

    python -m benchmarks.paper_fmnist [--epochs 3] [--seeds 0 1 2]

Trains the paper's CNN (``recipes/fmnist.yaml``) on the real FashionMNIST in ``../shared``,
evaluates on its test set with MNIST test as the semantic-shift set, and writes a Markdown table
(mean ± standard error over seeds) into ``docs/results.md`` between ``<!-- fmnist:begin -->`` and
``<!-- fmnist:end -->`` (``--section NAME`` writes another marked section). FS-EB runs with
these context sets:

- ``train-corr``: corrupted training inputs (the paper's "Train Corr." ablation);
- ``train-corr, joint``: the same context with ``R_f`` also taken at the training batch
  (``fseb.reg_points=joint``), as the authors' public FashionMNIST config does;
- ``cifar10-gray``: a fixed pool of 10,000 CIFAR-10 training images in grayscale at 28×28 (a
  different real dataset), whose φ0 features are cached;
- ``kmnist``: the paper's own context, the 10,000 KMNIST test images in ``../shared`` (its
  training images are not available), a fixed pool whose φ0 features are cached; ``kmnist,
  joint`` also takes ``R_f`` at the training batch, and ``kmnist, M=32`` / ``M=64`` draw
  smaller context batches than the recipe's 128.

FS-VI (``fseb.method=fsvi``, variance on the classifier head, 10 Monte-Carlo draws per
prediction) runs with the ``train-corr`` and ``kmnist`` contexts; ``FS-VI (kmnist)`` is the
paper's Table 1 row.

Model selection uses the validation split (10 % of train), never the test split. The table ends
with the paper's own rows (its Tables 1 and 3 and context-distribution appendix, from
``benchmarks/paper_numbers.yaml`` through ``benchmarks.paper_rows``) and a line on what differs.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import paper_rows
from benchmarks.provenance import write_section
from benchmarks.seeds import cell, value_at
from fseb_ft.engine.run import run
from fseb_ft.recipe import load_recipe
from fseb_ft.runs.plots import learning_curves

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RECIPE = REPO / "recipes" / "fmnist.yaml"
CIFAR_TAR = SHARED / "data" / "cifar10-jpeg" / "CIFAR-10-images.tar"
KMNIST = SHARED / "data" / "kmnist"
SHIFT_MARKERS = ("<!-- fmnist-shift:begin -->", "<!-- fmnist-shift:end -->")

# (column title, results path, scale): percentages as in the paper's tables.
COLUMNS = (
    ("Acc. (%)", ("test", "accuracy"), 100.0),
    ("NLL", ("test", "nll"), 1.0),
    ("ECE (%)", ("test", "ece"), 100.0),
    ("ECE-10 (%)", ("test", "ece_10bin"), 100.0),
    ("Sel. Pred. (%)", ("test", "sel_pred_auc"), 100.0),
    ("MNIST AUROC (%)", ("ood", "mnist", "entropy_auroc"), 100.0),
)


def cifar_folder(cache: Path) -> Path:
    """CIFAR-10's JPEG image folder extracted once from ``../shared`` into ``cache``."""
    target = cache / "cifar10-jpeg"
    if not (target / "train").is_dir():
        if not CIFAR_TAR.is_file():
            raise FileNotFoundError(f"{CIFAR_TAR} not found: the CIFAR-10 context needs ../shared")
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(CIFAR_TAR) as tar:
            tar.extractall(target, filter="data")
        inner = [p for p in target.iterdir() if p.is_dir() and (p / "train").is_dir()]
        if inner:  # the archive wraps the splits in one top-level folder
            for split in inner[0].iterdir():
                split.rename(target / split.name)
    return target


def methods(cifar: Path) -> dict[str, list[str]]:
    """Method name → recipe overrides. One loop, three configurations."""
    return {
        "PS-MAP": ["fseb.reg_scale=0"],
        "FS-EB (train-corr)": ["context.kind=train", "context.perturb=true"],
        # The authors' public config: R_f at the training and the context batch.
        "FS-EB (train-corr, joint)": [
            "context.kind=train",
            "context.perturb=true",
            "fseb.reg_points=joint",
        ],
        "FS-EB (cifar10-gray)": [
            "context.kind=dataset",
            "context.perturb=false",
            f"context.datasets=[{{source: imagefolder, path: '{cifar}', split: train}}]",
        ],
        "FS-EB (kmnist)": [*KMNIST_CONTEXT],
        "FS-EB (kmnist, joint)": [*KMNIST_CONTEXT, "fseb.reg_points=joint"],
        # The paper's context-batch-size appendix: M = 128 is the recipe's.
        "FS-EB (kmnist, M=32)": [*KMNIST_CONTEXT, "context.batch_size=32"],
        "FS-EB (kmnist, M=64)": [*KMNIST_CONTEXT, "context.batch_size=64"],
        # The paper's third method under the same prior; variance on the classifier head.
        "FS-VI (train-corr)": ["fseb.method=fsvi", "context.kind=train", "context.perturb=true"],
        "FS-VI (kmnist)": ["fseb.method=fsvi", *KMNIST_CONTEXT],
    }


KMNIST_CONTEXT = (
    "context.kind=dataset",
    "context.perturb=false",
    f"context.datasets=[{{source: idx, path: '{KMNIST}', split: t10k}}]",
)


def _has(results: dict, path: Sequence[str]) -> bool:
    for key in path:
        if not isinstance(results, dict) or key not in results:
            return False
        results = results[key]
    return True


Column = tuple[str, tuple[str, ...], float]  # (title, path in results.json, scale)


def table(
    all_results: dict[str, list[dict]],
    columns: Sequence[Column] = COLUMNS,
    baseline: str = "PS-MAP",
    paper: str | None = None,
) -> str:
    """Markdown: one row per method, mean ± standard error over seeds.

    Each other method also gets a "Δ vs PS-MAP" row: the mean ± standard error of its per-seed
    differences from ``baseline``, paired by seed (same split, same initial head, same data
    order), which is the comparison the seeds can actually resolve. ``paper`` names a pairing of
    ``benchmarks.paper_rows``: the paper's rows for these columns follow ours, then a line on
    what differs.
    """
    header = ["Method", "seeds", *(title for title, _, _ in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = all_results.get(baseline)
    for method, runs in all_results.items():
        rows = [(method, runs, None)]
        if base and method != baseline and len(base) == len(runs) > 1:
            rows.append((f"Δ {method} − {baseline}", runs, base))
        for label, members, ref in rows:
            cells = [label, str(len(members))]
            for _, path, scale in columns:
                if not all(_has(r, path) for r in [*members, *(ref or [])]):
                    cells.append("—")  # e.g. an OOD set that is this method's context
                    continue
                values = [value_at(r, path) * scale for r in members]
                if ref is not None:
                    pairs = zip(values, ref, strict=True)
                    values = [v - value_at(b, path) * scale for v, b in pairs]
                cells.append(cell(values, 2 if scale != 1.0 else 4, signed=ref is not None))
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    return paper_rows.extend(text, paper) if paper else text


def corruption_table(
    all_results: dict[str, list[dict]], severities: Sequence[int], baseline: str = "PS-MAP"
) -> str:
    """Markdown: accuracy and ECE per severity (mean over corruptions), mean ± SE over seeds.

    Each other method also gets a paired "Δ" row against ``baseline`` (per-seed differences,
    as :func:`table`), in points.
    """
    header = ["Method", "clean Acc. / ECE (%)"]
    header += [f"severity {s} Acc. / ECE (%)" for s in severities]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = all_results.get(baseline)
    for method, runs in all_results.items():
        rows = [(method, runs, None)]
        if base and method != baseline and len(base) == len(runs):
            rows.append((f"Δ {method} − {baseline}", runs, base))
        for label, members, ref in rows:
            cells = [label, _pair(members, ref, _clean(members))]
            cells += [_pair(members, ref, ("corruption_summary", str(s))) for s in severities]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _clean(runs: list[dict]) -> tuple[str]:
    """The clean row's results key: the corrupted images uncorrupted (``corruption_clean``, the
    ``eval.corruption_limit`` subset), or ``test`` in results written before that key."""
    return ("corruption_clean",) if all("corruption_clean" in r for r in runs) else ("test",)


def shift_delta_table(
    runs: list[dict], base: list[dict], severities: Sequence[int], title: str
) -> str:
    """Markdown: the paired Δ (``runs`` − ``base``, seed by seed) under covariate shift.

    One row per severity (clean first), each the mean over the corruptions: accuracy, NLL and
    ECE, so calibration under shift reads apart from accuracy under shift. A cell is the mean
    ± standard error of the per-seed differences; accuracy and ECE in points.
    """
    lines = [
        f"| {title} | Δ Acc. (points) | Δ NLL | Δ ECE (points) |",
        "|---|---|---|---|",
    ]
    for name, path in [("clean", _clean(runs))] + [
        (f"severity {s}", ("corruption_summary", str(s))) for s in severities
    ]:
        cells = [_delta(runs, base, (*path, key), scale) for key, scale in _SHIFT_METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def corruption_delta_table(
    runs: list[dict], base: list[dict], severities: Sequence[int], title: str
) -> str:
    """Markdown: the paired Δ accuracy / Δ ECE (points) per corruption and severity.

    Shows which corruptions carry a difference in the mean over the suite. The last row is that
    mean (as :func:`shift_delta_table`).
    """
    header = [title, *(f"severity {s} Δ Acc. / Δ ECE" for s in severities)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    names = list(runs[0]["corruptions"])
    rows = [(name, ("corruptions", name)) for name in names]
    rows.append(("mean over corruptions", ("corruption_summary",)))
    for name, path in rows:
        cells = [
            f"{_delta(runs, base, (*path, str(s), 'accuracy'), 100.0)} / "
            f"{_delta(runs, base, (*path, str(s), 'ece'), 100.0)}"
            for s in severities
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_SHIFT_METRICS = (("accuracy", 100.0), ("nll", 1.0), ("ece", 100.0))


def _delta(
    runs: list[dict], base: list[dict], path: Sequence[str], scale: float, digits: int = 0
) -> str:
    """Mean ± SE of the per-seed differences at ``path`` (paired by position: by seed), at
    ``digits`` decimals (0: 2 for percentages, 3 otherwise)."""
    pairs = zip(runs, base, strict=True)
    values = [(value_at(r, path) - value_at(b, path)) * scale for r, b in pairs]
    return cell(values, digits or (2 if scale != 1.0 else 3), signed=True)


def _pair(members: list[dict], ref: list[dict] | None, path: Sequence[str]) -> str:
    """``accuracy / ECE`` (%) at ``path``: mean ± SE over seeds, or the paired Δ to ``ref``."""
    if ref is not None:
        acc, ece = (_delta(members, ref, (*path, key), 100.0, 1) for key in ("accuracy", "ece"))
        return f"{acc} / {ece}"
    acc = cell([100 * value_at(m, (*path, "accuracy")) for m in members], 1)
    ece = cell([100 * value_at(m, (*path, "ece")) for m in members], 1)
    return f"{acc} / {ece}"


def finished_results(run_dir: Path) -> dict:
    """The saved ``results.json`` of a finished run (``--tables-only``: no training, no eval)."""
    path = run_dir / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run the benchmark without --tables-only first")
    return json.loads(path.read_text())


def training_record(run_dir: Path) -> dict:
    """The ``training`` record of a run's ``run.json``: best epoch, validation NLL, history."""
    return json.loads((run_dir / "run.json").read_text())["training"]


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces a table: the epochs, seeds, method subset, overrides, curve,
    section and, with ``--corruptions``, the corruptions and severities (one command writes
    both the table and the covariate-shift table)."""
    line = f"python -m benchmarks.paper_fmnist --epochs {args.epochs} --seeds "
    line += " ".join(map(str, args.seeds))
    subset = "".join(f" '{m}'" for m in args.methods or ())
    line += f" --methods{subset}" if subset else ""
    line += "".join(f" --override {o}" for o in args.override)
    line += f" --curve {args.curve}" if args.curve else ""
    line += f" --section {args.section}" if args.section != "fmnist" else ""
    if args.corruptions:
        line += f" --corruptions {' '.join(args.corruptions)}"
        line += f" --severities {' '.join(map(str, args.severities))}"
    return line


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every paper driver shares: ``--tables-only`` and ``--override``."""
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="train and evaluate nothing: rebuild the tables from the runs' saved results.json",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra recipe override for every run (repeatable), e.g. data.num_workers=0",
    )


def main() -> None:
    """CLI: train every method and seed, print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (paper: 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "paper_fmnist")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "results.md")
    parser.add_argument("--methods", nargs="+", default=None, help="subset of method names")
    parser.add_argument(
        "--curve",
        type=Path,
        default=None,
        help="also plot each method's per-epoch validation NLL (mean ± SE over seeds) here",
    )
    parser.add_argument(
        "--section",
        default="fmnist",
        help="name of the marked section of --results to write (<!-- NAME:begin -->)",
    )
    parser.add_argument(
        "--corruptions",
        nargs="+",
        default=None,
        help="also evaluate under these corruptions (e.g. all); finished runs are resumed, "
        "not retrained, and only re-evaluated",
    )
    parser.add_argument("--severities", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    add_run_arguments(parser)
    args = parser.parse_args()
    corruption_overrides = []
    if args.corruptions:
        corruption_overrides = [
            f"eval.corruptions=[{', '.join(args.corruptions)}]",
            f"eval.severities=[{', '.join(map(str, args.severities))}]",
        ]
    if not (SHARED / "data" / "fashion-mnist").is_dir():
        raise SystemExit(f"{SHARED}/data/fashion-mnist not found: this benchmark needs ../shared")
    chosen = methods(cifar_folder(args.out / "cache"))
    if args.methods:
        chosen = {k: v for k, v in chosen.items() if k in args.methods}
    all_results: dict[str, list[dict]] = {}
    curves: dict[str, list[list[float]]] = {}
    run_dirs: list[Path] = []
    for name, overrides in chosen.items():
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        for seed in args.seeds:
            out = args.out / slug / f"seed{seed}"
            run_dirs.append(out)
            recipe = load_recipe(
                RECIPE,
                [*overrides, f"train.epochs={args.epochs}", f"train.seed={seed}",
                 f"output.dir={out}", "train.trackers=[]", *corruption_overrides,
                 *args.override],
            )  # fmt: skip
            result = finished_results(out) if args.tables_only else run(recipe)
            all_results.setdefault(name, []).append(result)
            history = training_record(out)["history"]
            curves.setdefault(name, []).append([record["val_nll"] for record in history])
    body = (
        f"FashionMNIST test (10,000) and MNIST test (10,000, semantic shift); {args.epochs} "
        f"epochs (paper: 200), seeds {args.seeds}; `{command_line(args)}`.\n\n"
        + table(all_results, paper=paper_rows.SECTIONS.get(args.section))
    )
    if args.curve:
        learning_curves(curves, "NLL", args.curve, title=f"FashionMNIST, {args.section}")
    print(body)
    markers = (f"<!-- {args.section}:begin -->", f"<!-- {args.section}:end -->")
    write_section(args.results, body, markers, runs=run_dirs)
    if args.corruptions:
        shift = (
            f"FashionMNIST test under {', '.join(args.corruptions)} corruptions (CIFAR-10-C "
            f"parameters, `fseb_ft.data.corruptions`), accuracy / ECE averaged over corruptions; "
            f"`{command_line(args)}`.\n\n" + corruption_table(all_results, args.severities)
        )
        print(shift)
        write_section(args.results, shift, SHIFT_MARKERS, runs=run_dirs)
    (args.out / "results.json").write_text(json.dumps(all_results, indent=1))


if __name__ == "__main__":
    main()
