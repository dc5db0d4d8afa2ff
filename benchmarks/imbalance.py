"""Class imbalance on a real binary task: PS-MAP vs FS-EB, unweighted vs class-weighted.

    OMP_NUM_THREADS=1 python -m benchmarks.imbalance [--seeds 0 1 2] [--out runs/imbalance]
    python -m benchmarks.imbalance --quick      # smoke test: tiny generated images, seconds

Builds "frog (``--positive``) vs the other nine CIFAR-10 classes" from the JPEG CIFAR-10 of
``../shared`` (extracted once into ``--cache``, a temporary folder, never into the
repository): per seed a seeded draw of ``--train-neg`` negatives and ``--train-pos`` positives
from ``train/`` (5 % positives), of which a stratified ``data.val_fraction`` is the validation
split, and one fixed test set at the same natural rate from ``test/``. Each is a ``train.csv`` /
``test.csv`` label file read by the ``csv`` source. For every seed it runs ``--compare``
(PS-MAP and FS-EB, the same data, seed and initialisation) twice: unweighted and with
``train.class_weights=balanced``, from ``recipes/cifar10.yaml`` (ImageNet-pretrained
EfficientNet-Lite0 of ``../shared/weights``, zero head, the pretrained prior) with the task
metrics and ``eval.temperature_scaling`` on (its T fitted on the unweighted validation split).
The weighted runs' test predictions are also read back (``fseb-ft evaluate``) and given the
logit prior correction ``softmax(f − log w)`` of docs/method.md ("Class imbalance"). Every metric
is on the natural test distribution. The defaults (64 px, 2 epochs, 1,000 images per draw) fit
about 25 minutes of a shared 2-core CPU; docs/imbalance.md has the table and its reading.

Prints a Markdown table (mean ± SE over seeds per arm, then paired Δ ± SE, same seed = same
data draw and initialisation) and writes every number to ``OUT/imbalance.json``; the last line
is one JSON object of the headline deltas. ``--quick`` runs the same code on tiny generated
images with timm's ``test_byobnet`` at 16 px, one epoch.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks.paper_fmnist import SHARED, cifar_folder
from benchmarks.provenance import write_section
from fseb_ft.engine.reevaluate import evaluate_run_with_predictions
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.finetune import compare
from fseb_ft.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "cifar10.yaml"
WEIGHTS = SHARED / "weights" / "efficientnet_lite0.in1k"
NEGATIVE = "other"  # label 0; the positive class (--positive) is label 1
TASK_METRICS = ("balanced_accuracy", "roc_auc", "sensitivity_at_95_specificity")
TEST_SEED = 12345  # one test draw for every seed: the arms differ in training only
MARKERS = ("<!-- imbalance:begin -->", "<!-- imbalance:end -->")
# (column title, results.json key of "test", scale)
COLUMNS = (
    ("Bal. acc. (%)", "balanced_accuracy", 100.0),
    ("AUROC (%)", "roc_auc", 100.0),
    ("Sens. @ 95 % spec. (%)", "sensitivity_at_95_specificity", 100.0),
    ("NLL", "nll", 1.0),
    ("ECE (%)", "ece", 100.0),
)
METHODS = {"psmap": "PS-MAP", "fseb": "FS-EB"}
WEIGHTINGS = {"none": "", "balanced": "weighted"}
# Paired differences: (row title, arm, reference arm). An arm is METHOD/WEIGHTING[/VARIANT], the
# variant "ts" (+ TS, T fitted on the unweighted validation split) or "pc" (prior correction).
DELTAS = (
    ("FS-EB − PS-MAP, unweighted", "fseb/none", "psmap/none"),
    ("FS-EB − PS-MAP, weighted", "fseb/balanced", "psmap/balanced"),
    ("weighted − unweighted, PS-MAP", "psmap/balanced", "psmap/none"),
    ("weighted − unweighted, FS-EB", "fseb/balanced", "fseb/none"),
    ("weighted + TS − weighted, PS-MAP", "psmap/balanced/ts", "psmap/balanced"),
    ("weighted + TS − weighted, FS-EB", "fseb/balanced/ts", "fseb/balanced"),
    ("weighted + TS − unweighted, PS-MAP", "psmap/balanced/ts", "psmap/none"),
    ("weighted + TS − unweighted, FS-EB", "fseb/balanced/ts", "fseb/none"),
    ("weighted + prior corr. − weighted, PS-MAP", "psmap/balanced/pc", "psmap/balanced"),
    ("weighted + prior corr. − weighted, FS-EB", "fseb/balanced/pc", "fseb/balanced"),
    ("weighted + prior corr. − unweighted, PS-MAP", "psmap/balanced/pc", "psmap/none"),
    ("weighted + prior corr. − unweighted, FS-EB", "fseb/balanced/pc", "fseb/none"),
)


def write_label_file(path: Path, rows: list[tuple[str, str]]) -> None:
    """A ``csv`` source's label file: ``image`` (relative to the image folder) and ``label``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("image", "label"))
        writer.writerows(rows)


def draw_split(
    folder: Path, split: str, counts: tuple[int, int], positive: str, seed: int
) -> list[tuple[str, str]]:
    """``counts[0]`` images drawn from the classes of ``folder/split`` other than ``positive``
    (pooled, so their mix is the folder's) and ``counts[1]`` of ``positive``, seeded: ``(path
    relative to folder, label)`` rows, the negatives labelled :data:`NEGATIVE`."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, count in zip((NEGATIVE, positive), counts, strict=True):
        pool = sorted(
            p.relative_to(folder).as_posix()
            for d in sorted((folder / split).iterdir())
            if d.is_dir() and (d.name == positive) == (label == positive)
            for p in d.iterdir()
        )
        if count > len(pool):
            raise SystemExit(f"{folder / split}: {count} {label} images asked, {len(pool)} there")
        rows += [(pool[i], label) for i in sorted(rng.choice(len(pool), count, replace=False))]
    return rows


def csv_spec(label_file: Path, folder: Path, positive: str) -> str:
    """The recipe's dataset spec (YAML flow) of a label file of :func:`write_label_file`."""
    return (
        f"{{source: csv, path: '{label_file}', image_dir: '{folder}', image_column: image, "
        f"label_column: label, classes: [{NEGATIVE}, {positive}]}}"
    )


def generated_folder(root: Path, positive: str) -> Path:
    """``--quick``'s image folder: noisy 16-px PNGs, ``{train,test}/<class>/``, the positive
    class brighter."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 30), ("test", 20)):
        for name in (positive, "neg0", "neg1"):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                level = 150 if name == positive else 90
                pixels = np.clip(level + rng.integers(-60, 60, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


def overrides(args: argparse.Namespace, task: Path, folder: Path, seed: int) -> list[str]:
    """``recipes/cifar10.yaml`` pointed at one seed's label files (no OOD set), the budget."""
    model = [f"model.name=local-dir:{WEIGHTS}", f"model.input_size={args.input_size}"]
    if args.quick:  # a network from scratch: the from-scratch prior (docs/method.md)
        model = ["model.name=test_byobnet", "model.pretrained=false", "model.input_size=16"]
        model += ["fseb.prior_cov_scale=0.01", "eval.batch_size=64"]
    return [
        *model,
        f"data.train={csv_spec(task / f'seed{seed}' / 'train.csv', folder, args.positive)}",
        f"data.test={csv_spec(task / 'test.csv', folder, args.positive)}",
        "data.ood={}",
        f"data.val_fraction={args.val_fraction}",
        f"data.batch_size={args.batch_size}",
        "data.num_workers=0",
        f"context.pool_size={args.pool_size}",
        f"fseb.prior_cov_diag={args.prior_cov_diag}",
        f"optim.lr={args.lr}",
        f"train.epochs={args.epochs}",
        f"train.seed={seed}",
        "train.trackers=[]",
        f"eval.metrics=[{', '.join(TASK_METRICS)}]",
        "eval.temperature_scaling=true",
        *args.override,
    ]


def prior_corrected(run_dir: Path) -> dict[str, float]:
    """The test metrics of ``softmax(f − log w)`` for a weighted run: its test predictions read
    back (``fseb-ft evaluate``) and ``run.json``'s ``class_weights``."""
    weights = json.loads((run_dir / "run.json").read_text())["class_weights"]
    log_probs, labels = evaluate_run_with_predictions(run_dir).predictions.test
    # log p = f − logsumexp(f): the row's constant cancels in the softmax.
    shifted = torch.log_softmax(log_probs - torch.tensor(weights).log(), dim=1)
    found = classification_metrics(shifted, labels, TASK_METRICS)
    return {k: float(v) for k, v in found.items()}


def column_values(results: dict[str, Any]) -> dict[str, float]:
    """The columns' numbers of one results block's ``test``."""
    return {key: float(results["test"][key]) for _, key, _ in COLUMNS}


def run_seed(args: argparse.Namespace, task: Path, folder: Path, seed: int) -> dict[str, dict]:
    """One seed's four arms (and their + TS and prior-corrected variants): arm → metrics."""
    arms: dict[str, dict] = {}
    for weighting in WEIGHTINGS:
        out = args.out / "runs" / f"seed{seed}" / weighting
        extra = [f"train.class_weights={weighting}", f"output.dir={out}"]
        recipe = load_recipe(RECIPE, [*overrides(args, task, folder, seed), *extra])
        started = time.perf_counter()
        results = compare(recipe)
        print(f"seed {seed}, {weighting}: {time.perf_counter() - started:.0f} s", flush=True)
        for slug, label in METHODS.items():
            block = results[label]
            arms[f"{slug}/{weighting}"] = column_values(block)
            arms[f"{slug}/{weighting}/ts"] = column_values(block["temperature_scaled"])
            if weighting != "none":
                arms[f"{slug}/{weighting}/pc"] = prior_corrected(out / slug)
    return arms


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (NaN with fewer than two values)."""
    mean = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return mean, se


def _cell(values: list[float], scale: float, digits: int, signed: bool = False) -> str:
    mean, se = mean_se([v * scale for v in values])
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    text = text.replace("-", "−")
    return text if math.isnan(se) else f"{text} ± {se:.{digits}f}"


def arm_title(arm: str) -> str:
    """``fseb/balanced/ts`` → ``FS-EB, weighted + TS``."""
    slug, weighting, *variant = arm.split("/")
    title = METHODS[slug] + (f", {WEIGHTINGS[weighting]}" if WEIGHTINGS[weighting] else "")
    return title + {"ts": " + TS", "pc": " + prior corr."}.get(variant[0] if variant else "", "")


def table(per_seed: dict[int, dict[str, dict]]) -> str:
    """Markdown: each arm's mean ± SE over seeds, then the paired Δ rows of :data:`DELTAS`."""
    seeds = sorted(per_seed)
    arms = [
        f"{slug}/{weighting}{variant}"
        for weighting in WEIGHTINGS
        for variant in ("", "/ts", "/pc")
        for slug in METHODS
        if f"{slug}/{weighting}{variant}" in per_seed[seeds[0]]
    ]
    head = "| | " + " | ".join(title for title, _, _ in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    for arm in arms:
        cells = [
            _cell([per_seed[s][arm][key] for s in seeds], scale, 2 if scale > 1 else 3)
            for _, key, scale in COLUMNS
        ]
        lines.append(f"| {arm_title(arm)} | " + " | ".join(cells) + " |")
    for title, arm, ref in DELTAS:
        if arm in arms and ref in arms:
            cells = [
                _cell(
                    [per_seed[s][arm][key] - per_seed[s][ref][key] for s in seeds],
                    scale,
                    2 if scale > 1 else 3,
                    signed=True,
                )
                for _, key, scale in COLUMNS
            ]
            lines.append(f"| Δ {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


HEADLINE = {  # name: (row of DELTAS, metric)
    "weighted_vs_unweighted_balanced_accuracy_psmap": (2, "balanced_accuracy"),
    "weighted_vs_unweighted_balanced_accuracy_fseb": (3, "balanced_accuracy"),
    "weighted_vs_unweighted_sensitivity_at_95_psmap": (2, "sensitivity_at_95_specificity"),
    "weighted_vs_unweighted_sensitivity_at_95_fseb": (3, "sensitivity_at_95_specificity"),
    "weighted_vs_unweighted_nll_psmap": (2, "nll"),
    "weighted_vs_unweighted_nll_fseb": (3, "nll"),
    "weighted_vs_unweighted_ece_psmap": (2, "ece"),
    "weighted_vs_unweighted_ece_fseb": (3, "ece"),
    "weighted_ts_vs_weighted_nll_psmap": (4, "nll"),
    "weighted_ts_vs_weighted_nll_fseb": (5, "nll"),
    "weighted_ts_vs_weighted_ece_psmap": (4, "ece"),
    "weighted_ts_vs_weighted_ece_fseb": (5, "ece"),
    "fseb_vs_psmap_unweighted_roc_auc": (0, "roc_auc"),
    "fseb_vs_psmap_weighted_roc_auc": (1, "roc_auc"),
    "fseb_vs_psmap_weighted_balanced_accuracy": (1, "balanced_accuracy"),
    "fseb_vs_psmap_weighted_nll": (1, "nll"),
}


def headline(per_seed: dict[int, dict[str, dict]]) -> dict[str, list[float | None]]:
    """The deltas of :data:`HEADLINE` as ``name: [mean, se]`` over seeds (metrics unscaled; the
    standard error ``None`` for one seed)."""
    out = {}
    for name, (row, key) in HEADLINE.items():
        _, arm, ref = DELTAS[row]
        diffs = [arms[arm][key] - arms[ref][key] for arms in per_seed.values()]
        out[name] = [None if math.isnan(v) else round(v, 5) for v in mean_se(diffs)]
    return out


def build_task(args: argparse.Namespace) -> tuple[Path, Path]:
    """The image folder and the label files of every seed: ``(task folder, image folder)``."""
    if args.quick:
        folder = generated_folder(args.cache / "quick-images", args.positive)
    else:
        if not WEIGHTS.is_dir():
            raise SystemExit(f"{WEIGHTS} not found: this benchmark needs ../shared")
        folder = cifar_folder(args.cache)
    task = args.out / "task"
    test = draw_split(folder, "test", (args.test_neg, args.test_pos), args.positive, TEST_SEED)
    write_label_file(task / "test.csv", test)
    for seed in args.seeds:
        rows = draw_split(folder, "train", (args.train_neg, args.train_pos), args.positive, seed)
        write_label_file(task / f"seed{seed}" / "train.csv", rows)
    return task, folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` swaps in the smoke test's tiny sizes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--positive", default="frog", help="the positive class (label 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--input-size", type=int, default=64, help="resolution (pretrained: 224)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="SGD (recipe: 0.005 for 50 epochs)")
    parser.add_argument("--pool-size", type=int, default=2000, help="FS-EB context pool")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument(
        "--prior-cov-diag",
        type=float,
        default=1.0,
        help="FS-EB's d (recipe: 1e-2; 1.0 won on CIFAR-10 validation, docs/results.md)",
    )
    parser.add_argument("--train-neg", type=int, default=950, help="negatives per training draw")
    parser.add_argument("--train-pos", type=int, default=50, help="positives per training draw")
    parser.add_argument("--test-neg", type=int, default=950, help="test negatives")
    parser.add_argument("--test-pos", type=int, default=50, help="test positives")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "imbalance")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fseb_ft-imbalance",
        help="where the CIFAR-10 JPEGs are extracted (outside the repository)",
    )
    parser.add_argument("--doc", type=Path, default=None, help="write the table into this file")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--quick", action="store_true", help="smoke test on generated images")
    parser.add_argument(
        "--table-only", action="store_true", help="no training: the table of OUT/imbalance.json"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.batch_size, args.pool_size, args.val_fraction = 1, 8, 16, 0.25
        args.train_neg, args.train_pos, args.test_neg, args.test_pos = 24, 8, 24, 8
        args.cache = args.out
    return args


def main(argv: list[str] | None = None) -> dict[str, list[float | None]]:
    """Run every seed's four arms, print and write the table; return the headline deltas."""
    args = parse_args(argv)
    if args.table_only:  # the numbers of an earlier run, laid out again
        saved = json.loads((args.out / "imbalance.json").read_text())
        per_seed, minutes = {int(s): a for s, a in saved["per_seed"].items()}, saved["minutes"]
    else:
        started = time.perf_counter()
        task, folder = build_task(args)
        per_seed = {seed: run_seed(args, task, folder, seed) for seed in args.seeds}
        minutes = (time.perf_counter() - started) / 60
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "minutes": minutes}
        record |= {"per_seed": per_seed, "headline": headline(per_seed)}
        (args.out / "imbalance.json").write_text(json.dumps(record, indent=1))
    text = table(per_seed)
    print(f"\n{text}\nwall time: {minutes:.1f} min", flush=True)
    deltas = headline(per_seed)
    if args.doc:
        write_section(args.doc, text, MARKERS, runs=[args.out / "runs"])
    print(json.dumps(deltas))
    return deltas


if __name__ == "__main__":
    main()
