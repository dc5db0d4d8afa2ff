"""FS-EB against the post-hoc methods that cost nothing at training time (issue 26, item 7).

    OMP_NUM_THREADS=1 python -m benchmarks.posthoc --seeds 0 1 2 --jobs 2

The setting is the CIFAR-10 transfer protocol of docs/results.md with the paper's distant
context (``benchmarks.paper_cifar10 --protocol context``): the ImageNet-pretrained
EfficientNet-Lite0 of ``../shared`` on 9,000 CIFAR-10 training images at 64 px (1,000 held out
for validation), 3 epochs, batch 64, SGD lr 0.02; FS-EB with the 10,000 CIFAR-100 images as its
context and the prior validation NLL chose there (d = 1). OOD sets: MNIST, FashionMNIST and
Tiny-ImageNet, 5,000 each (CIFAR-100 is FS-EB's context, so it is no OOD set of this table).

Every run draws its images with one ``data.seed`` (0), so the seeds differ in their training
randomness only and share one validation split; each is evaluated with:

- ``eval.temperature_scaling``: the "+ TS" rows;
- ``eval.laplace``: the "+ LLLA" rows, last-layer Laplace (Kronecker GGN on the training split's
  penultimate features, prior precision by marginal likelihood, GLM probit predictive);
- ``eval.conformal=0.9``: LAC sets calibrated on validation, their test coverage and mean size;
- ``eval.ood_scores``: entropy and the feature scores (Mahalanobis, relative Mahalanobis, KNN,
  ViM) of the penultimate features.

Then ``fseb-ft evaluate --ensemble`` averages the three PS-MAP runs (the deep ensemble) and the
three FS-EB runs. Steps are skipped when their results are on disk. The tables go between the
markers ``<!-- cifar10-posthoc:begin/end -->`` of ``--results``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import paper_cifar10
from benchmarks.provenance import write_section
from benchmarks.seeds import cell, row

ARMS = {"psmap": "PS-MAP", "fseb": "FS-EB"}
CONTEXT_METHOD = "FS-EB (cifar100, d=1)"  # the context protocol's validation-chosen prior
OOD_SETS = {"mnist": "MNIST", "fmnist": "FMNIST", "tiny_imagenet": "Tiny-ImageNet"}
FEATURE_SCORES = ("mahalanobis", "relative_mahalanobis", "knn", "vim")
SCORE_TITLES = {
    "entropy": "entropy",
    "mahalanobis": "Maha.",
    "relative_mahalanobis": "rel. Maha.",
    "knn": "KNN",
    "vim": "ViM",
}
EVAL = (
    "data.seed=0",
    "eval.temperature_scaling=true",
    "eval.laplace=true",
    "eval.conformal=0.9",
    f"eval.ood_scores=[entropy, {', '.join(FEATURE_SCORES)}]",
)
# (results block key or None for the run's own, row suffix)
BLOCKS = ((None, ""), ("temperature_scaled", " + TS"), ("laplace", " + LLLA"))
# (column title, key of a block's test/ood part, OOD set or None, scale)
COLUMNS = (
    ("Acc. (%)", "accuracy", None, 100.0),
    ("NLL", "nll", None, 1.0),
    ("ECE (%)", "ece", None, 100.0),
    ("Sel. Pred. (%)", "sel_pred_auc", None, 100.0),
    ("Cov. 90 (%)", "conformal_coverage", None, 100.0),
    ("Set size", "conformal_set_size", None, 1.0),
    *((f"{title} AUROC (%)", "entropy_auroc", name, 100.0) for name, title in OOD_SETS.items()),
)
MARKERS = ("<!-- cifar10-posthoc:begin -->", "<!-- cifar10-posthoc:end -->")


def overrides(out: Path, arm: str) -> list[str]:
    """The context protocol's overrides for one arm (PS-MAP: no function-space term)."""
    cache = out / "cache"
    method = (
        paper_cifar10.context_methods(cache)[CONTEXT_METHOD]
        if arm == "fseb"
        else [*paper_cifar10.METHODS["PS-MAP"], paper_cifar10._ood_override(_psmap_ood(cache))]
    )
    return [*paper_cifar10.context_defaults(cache), *method, *EVAL]


def _psmap_ood(cache: Path) -> dict[str, str]:
    """PS-MAP's OOD sets: FS-EB's (CIFAR-100 is its context, never an OOD set of this table)."""
    sets = paper_cifar10._IDX_SETS | paper_cifar10._distant_sets(cache)
    return {name: spec for name, spec in sets.items() if name in OOD_SETS}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / f"{arm}-seed{seed}"


def _fseb_ft(*args: str) -> None:
    """One ``fseb-ft`` process; a run that stops (diverges) is a result, not a reason to stop."""
    subprocess.run([sys.executable, "-m", "fseb_ft.cli", *args], check=False)


def train(out: Path, seeds: Sequence[int], jobs: int, extra: Sequence[str]) -> None:
    """Every arm at every seed not yet run, ``jobs`` at a time, seed-major."""
    todo = [
        [str(paper_cifar10.RECIPE), *overrides(out, arm), *extra, f"train.seed={seed}",
         f"output.dir={run_dir(out, arm, seed)}"]
        for seed in seeds for arm in ARMS
        if not (run_dir(out, arm, seed) / "results.json").is_file()
    ]  # fmt: skip
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda args: _fseb_ft("train", *args), todo))


def ensembles(out: Path, seeds: Sequence[int]) -> None:
    """The ensemble of each arm's runs, evaluated once."""
    for arm in ARMS:
        target = out / "ensembles" / arm
        if not (target / "results.json").is_file():
            runs = [str(run_dir(out, arm, seed)) for seed in seeds]
            _fseb_ft("evaluate", *runs, "--ensemble", "--out", str(target))


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _value(block: dict[str, Any], key: str, ood: str | None) -> float:
    part = block["test"] if ood is None else block["ood"][ood]
    return part.get(key, float("nan"))


def _digits(scale: float, key: str) -> int:
    return 2 if scale != 1.0 or key == "conformal_set_size" else 4


def _cells(blocks: Sequence[dict[str, Any]]) -> list[str]:
    return [cell([_value(b, k, o) * f for b in blocks], _digits(f, k)) for _, k, o, f in COLUMNS]


def _delta(a: dict[int, dict], b: dict[int, dict]) -> tuple[list[int], list[str]]:
    """Seeds both have, and per column ``a − b`` as mean ± standard error over them."""
    common = sorted(set(a) & set(b))
    return common, [
        cell([(_value(a[s], k, o) - _value(b[s], k, o)) * f for s in common], _digits(f, k),
             signed=True)
        for _, k, o, f in COLUMNS
    ]  # fmt: skip


def blocks_of(out: Path, seeds: Sequence[int]) -> dict[str, dict[int, dict]]:
    """Row label → seed → results block, for every arm and post-hoc block found on disk."""
    found: dict[str, dict[int, dict]] = {}
    for arm, label in ARMS.items():
        for seed in seeds:
            results = _load(run_dir(out, arm, seed) / "results.json")
            for key, suffix in BLOCKS if results else ():
                block = results if key is None else results.get(key)
                if block:
                    found.setdefault(f"{label}{suffix}", {})[seed] = block
    return found


def table(out: Path, seeds: Sequence[int]) -> str:
    """Each arm with its + TS and + LLLA rows, the ensembles, then the paired differences."""
    header = ["Method", "seeds", *(c[0] for c in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = blocks_of(out, seeds)
    for label, by_seed in rows.items():
        lines.append(row(label, sorted(by_seed), _cells(list(by_seed.values()))))
    for arm, label in ARMS.items():
        results = _load(out / "ensembles" / arm / "results.json")
        for key, suffix in BLOCKS[:2] if results else ():
            block = results if key is None else results.get(key)
            if block:
                lines.append(row(f"Ensemble of {len(seeds)} {label}{suffix}", seeds,
                                  _cells([block])))  # fmt: skip
    pairs = [("FS-EB", "PS-MAP"), ("FS-EB + TS", "PS-MAP + TS"),
             ("FS-EB + LLLA", "PS-MAP + LLLA"), ("FS-EB", "PS-MAP + TS"),
             ("FS-EB", "PS-MAP + LLLA")]  # fmt: skip
    for a, b in pairs:
        if a in rows and b in rows:
            common, cells = _delta(rows[a], rows[b])
            lines.append(row(f"**Δ {a} − {b}**", common, cells))
    return "\n".join(lines) + "\n"


def feature_table(out: Path, seeds: Sequence[int]) -> str:
    """OOD AUROC of entropy and of each feature score, per arm, and FS-EB − PS-MAP."""
    scores = ("entropy", *FEATURE_SCORES)
    header = ["Method", "seeds"] + [
        f"{title} {SCORE_TITLES[s]}" for title in OOD_SETS.values() for s in scores
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = blocks_of(out, seeds)
    columns = [(name, s) for name in OOD_SETS for s in scores]

    def values(block: dict[str, Any], name: str, score: str) -> float:
        return 100.0 * block["ood"][name].get(f"{score}_auroc", float("nan"))

    for label in ARMS.values():
        got = rows.get(label, {})
        if got:
            cells = [cell([values(b, n, s) for b in got.values()], 1) for n, s in columns]
            lines.append(row(label, sorted(got), cells))
    if all(label in rows for label in ARMS.values()):
        a, b = rows["FS-EB"], rows["PS-MAP"]
        common = sorted(set(a) & set(b))
        cells = [cell([values(a[s], n, sc) - values(b[s], n, sc) for s in common], 1,
                      signed=True) for n, sc in columns]  # fmt: skip
        lines.append(row("**Δ FS-EB − PS-MAP**", common, cells))
    return "\n".join(lines) + "\n"


def laplace_priors(out: Path, seeds: Sequence[int]) -> str:
    """One line per arm: the marginal-likelihood prior precision of each seed's LLLA."""
    text = ""
    for arm, label in ARMS.items():
        found = []
        for seed in seeds:
            results = _load(run_dir(out, arm, seed) / "results.json") or {}
            if "laplace" in results:
                found.append(f"{results['laplace']['prior_precision']:.3g}")
        if found:
            text += f"- {label}: LLLA prior precision {', '.join(found)} (seeds {seeds}).\n"
    return text


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: train, ensemble, print and write the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.posthoc",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    paper_cifar10.add_output_arguments(parser, "posthoc")
    args = parser.parse_args(argv)
    if not paper_cifar10.WEIGHTS.is_dir():
        raise SystemExit(f"{paper_cifar10.WEIGHTS} not found: this benchmark needs ../shared")
    if not args.tables_only:
        train(args.out, args.seeds, args.jobs, args.override)
        ensembles(args.out, args.seeds)
    command = (f"`OMP_NUM_THREADS=1 python -m benchmarks.posthoc --seeds "
               f"{' '.join(map(str, args.seeds))} --jobs {args.jobs}`")  # fmt: skip
    body = (
        f"{command}; mean ± standard error over the seeds, Δ rows paired by seed.\n\n"
        + table(args.out, args.seeds)
        + "\nOOD detection, AUROC (%) of each score; the scores of the penultimate features do "
        "not depend on TS or LLLA:\n\n"
        + feature_table(args.out, args.seeds)
        + "\n"
        + laplace_priors(args.out, args.seeds)
    )
    print(body)
    write_section(args.results, body, MARKERS, runs=[args.out])


if __name__ == "__main__":
    main()
