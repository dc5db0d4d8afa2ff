"""Evaluation: predictions → metrics (test split and named OOD sets) → JSON and Markdown.

``python -m fseb_ft.evaluate RUN_DIR`` re-evaluates a saved run from its resolved recipe and
best weights, and rewrites its ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import load_model
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fseb_ft.config import Recipe, load_recipe
from fseb_ft.data import Splits, TransformedImages, build_splits, eval_transform, make_loader
from fseb_ft.metrics import classification_metrics, ood_metrics
from fseb_ft.models import InputSpec, create_model

__all__ = [
    "MODEL_WEIGHTS",
    "eval_loader",
    "evaluate_predictions",
    "evaluate_run",
    "evaluate_splits",
    "main",
    "markdown_table",
    "method_title",
    "predict",
    "write_json",
    "write_results",
]

MODEL_WEIGHTS = Path("model") / "model.safetensors"
"""Where a run directory keeps its best (validation-selected) weights."""

# (results key, column title, scale) — percentages as in the paper's tables.
_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("accuracy", "Acc. (%)", 100.0),
    ("nll", "NLL", 1.0),
    ("ece", "ECE (%)", 100.0),
    ("ece_10bin", "ECE-10 (%)", 100.0),
    ("brier", "Brier", 1.0),
    ("sel_pred_auc", "Sel. Pred. (%)", 100.0),
    ("aurc", "AURC (%)", 100.0),
)
_OOD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("entropy_auroc", "AUROC (%)"),
    ("entropy_aupr", "AUPR (%)"),
    ("entropy_fpr95", "FPR95 (%)"),
)


@torch.no_grad()
def predict(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 log-probabilities (N, K) and labels (N,) on CPU, each sample counted once.

    ``gather_for_metrics`` drops the samples Accelerate duplicated to even out the last batch
    across processes, so N is the dataset size whatever the process count.
    """
    was_training = model.training
    model.eval()
    log_probs, labels = [], []
    for x, y in tqdm(loader, desc="predict", disable=not accelerator.is_main_process, leave=False):
        with accelerator.autocast():
            logits = model(x)  # (B, K)
        lp = torch.log_softmax(logits.float(), dim=-1)  # (B, K)
        lp, y = accelerator.gather_for_metrics((lp, y))
        log_probs.append(lp.cpu())
        labels.append(y.cpu())
    model.train(was_training)
    return torch.cat(log_probs), torch.cat(labels)


def evaluate_predictions(
    test: tuple[Tensor, Tensor], ood: Mapping[str, Tensor] | None = None
) -> dict[str, Any]:
    """Metrics of design §3 for the test predictions and each named OOD set.

    Args:
        test: (log-probabilities (N, K), labels (N,)) on the in-distribution test split.
        ood: name → log-probabilities (N_o, K) on that semantic-shift set.

    Returns:
        ``{"test": {metric: float, "n": N}, "ood": {name: {metric: float, "n": N_o}}}``.
    """
    log_probs, labels = test
    out: dict[str, Any] = {
        "test": {k: float(v) for k, v in classification_metrics(log_probs, labels).items()}
    }
    out["test"]["n"] = len(labels)
    probs_in = log_probs.exp()  # (N, K)
    out["ood"] = {}
    for name, lp in (ood or {}).items():
        scores = {k: float(v) for k, v in ood_metrics(probs_in, lp.exp()).items()}
        out["ood"][name] = scores | {"n": len(lp)}
    return out


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of several runs' results, one row per method (e.g. PS-MAP, FS-EB)."""
    ood_names = sorted({n for r in results.values() for n in r.get("ood", {})})
    header = ["Method", *(title for _, title, _ in _COLUMNS)]
    header += [f"{name} {title}" for name in ood_names for _, title in _OOD_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, res in results.items():
        row = [method]
        row += [_num(res["test"].get(key), scale) for key, _, scale in _COLUMNS]
        for name in ood_names:
            scores = res.get("ood", {}).get(name, {})
            row += [_num(scores.get(key), 100.0) for key, _ in _OOD_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_results(run_dir: Path, results: Mapping[str, Any], title: str) -> None:
    """Write ``results.json`` (machines) and ``results.md`` (people) into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    md = f"# {title}\n\n" + markdown_table({title: results})
    (run_dir / "results.md").write_text(md)


def evaluate_run(run_dir: str | Path, cpu: bool = False) -> dict[str, Any]:
    """Re-evaluate a finished run from its ``recipe.yaml``, ``run.json`` and best weights."""
    run_dir = Path(run_dir)
    for needed in ("recipe.yaml", "run.json", str(MODEL_WEIGHTS)):
        if not (run_dir / needed).exists():
            raise FileNotFoundError(f"{run_dir} is not a finished run: {needed} is missing")
    recipe = load_recipe(run_dir / "recipe.yaml", [f"train.cpu={str(cpu).lower()}"])
    info = json.loads((run_dir / "run.json").read_text())
    accelerator = Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision)
    splits = build_splits(recipe.data, recipe.train.seed)
    # The weights come from the run, so never fetch pretrained ones again.
    model_cfg = dataclasses.replace(recipe.model, pretrained=False)
    model = create_model(model_cfg, info["num_classes"], in_chans=recipe.data.channels)
    load_model(model, str(run_dir / MODEL_WEIGHTS))
    spec = InputSpec(**{k: tuple(v) for k, v in info["input"].items()})
    model = accelerator.prepare(model)
    results = evaluate_splits(model, splits, spec, recipe, accelerator)
    previous = run_dir / "results.json"
    if previous.exists():
        results["training"] = json.loads(previous.read_text()).get("training")
    if accelerator.is_main_process:
        write_results(run_dir, results, title=method_title(recipe))
    return results


def evaluate_splits(
    model: nn.Module, splits: Splits, spec: InputSpec, recipe: Recipe, accelerator: Accelerator
) -> dict[str, Any]:
    """Predict the test split and every OOD set with ``model`` and compute their metrics."""
    if splits.test is None:
        raise ValueError("data.test is not set: there is no test split to evaluate")
    test = predict(model, accelerator.prepare(eval_loader(splits.test, spec, recipe)), accelerator)
    ood = {
        name: predict(model, accelerator.prepare(eval_loader(data, spec, recipe)), accelerator)[0]
        for name, data in splits.ood.items()
    }
    return evaluate_predictions(test, ood)


def eval_loader(data: Any, spec: InputSpec, recipe: Recipe) -> torch.utils.data.DataLoader:
    """Un-augmented, un-shuffled loader (resize + normalise) for evaluation."""
    dataset = TransformedImages(data, eval_transform(spec.size, spec.mean, spec.std))
    return make_loader(
        dataset,
        recipe.eval.batch_size,
        shuffle=False,
        num_workers=recipe.data.num_workers,
        seed=recipe.train.seed,
    )


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def method_title(recipe: Recipe) -> str:
    """ "FS-EB · model" or "PS-MAP · model" for tables and titles."""
    method = "FS-EB" if recipe.fseb.reg_scale > 0 else "PS-MAP"
    return f"{method} · {recipe.model.name}"


def _num(value: float | None, scale: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * scale:.2f}" if scale != 1.0 else f"{value:.4f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """CLI: re-evaluate a saved run directory with its best weights."""
    parser = argparse.ArgumentParser(prog="python -m fseb_ft.evaluate", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory written by fseb_ft.finetune")
    parser.add_argument("--cpu", action="store_true", help="evaluate on CPU")
    args = parser.parse_args(argv)
    return evaluate_run(args.run_dir, cpu=args.cpu)


if __name__ == "__main__":
    main()
