"""Fine-tune a timm backbone with FS-EB (or PS-MAP) from a YAML recipe.

    python -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    accelerate launch -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    fseb-ft RECIPE.yaml fseb.reg_scale=0          # the PS-MAP baseline

A run directory (``output.dir``) receives the resolved recipe, per-epoch checkpoints, the best
model (``model/model.safetensors``), ``run.json`` (inputs, classes, context provenance, history)
and ``results.json`` / ``results.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from safetensors.torch import load_model, save_model
from torch import nn

from fseb_ft.allocator import keep_freed_memory
from fseb_ft.atomic import DiskFullError, cleaned_on_failure, publish, remove_orphans, write_text
from fseb_ft.config import ConfigError, Recipe, dump_recipe, load_recipe
from fseb_ft.context import build_context_pool
from fseb_ft.data import (
    Splits,
    TransformedImages,
    build_splits,
    load_split,
    make_loader,
    train_transform,
)
from fseb_ft.hub import main as push_main
from fseb_ft.hub import share_run
from fseb_ft.models import InputSpec, create_model, input_spec
from fseb_ft.objective import FSEBObjective
from fseb_ft.predict import eval_loader, predict_splits
from fseb_ft.report import eval_results, markdown_table, method_title, write_results
from fseb_ft.rundir import (
    CHECKPOINTS,
    MODEL_DIR,
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_INFO_FILE,
    RunInfo,
    latest_checkpoint,
    write_json,
)
from fseb_ft.train import (
    ContextStream,
    NonFiniteLossError,
    TrainingDivergedError,
    applied_precision,
    build_optimizer,
    build_scheduler,
    fit,
    launch_warnings,
    make_accelerator,
)

__all__ = ["cli", "compare", "main", "run"]

logger = logging.getLogger("fseb_ft")


def run(recipe: Recipe, splits: Splits | None = None) -> dict[str, Any]:
    """Train, select on validation, evaluate on test and OOD sets; return the results dict.

    ``splits`` replaces the datasets named in ``recipe.data`` (the Python API passes its own).
    """
    run_dir = Path(recipe.output.dir)
    _check_resumable(recipe, run_dir)
    accelerator = make_accelerator(recipe, run_dir)
    if accelerator.is_main_process:
        for orphan in remove_orphans(run_dir):
            accelerator.print(f"removed {orphan}, left by an interrupted run")
        if recipe.train.resume == "never":
            _clear_previous_run(run_dir)
    accelerator.wait_for_everyone()
    warned = _warn(accelerator, launch_warnings(accelerator, os.environ))
    if accelerator.device.type == "cpu":
        keep_freed_memory()
    set_seed(recipe.train.seed)
    if splits is None:
        splits = build_splits(recipe.data, recipe.train.seed)
    num_classes, data_warnings = _num_classes(recipe, splits)
    warned += _warn(accelerator, data_warnings)
    model = create_model(recipe.model, num_classes, in_chans=recipe.data.channels)
    spec = input_spec(model, recipe.model, recipe.data)
    seed = recipe.train.seed
    train_set = TransformedImages(
        splits.train, train_transform(spec.size, spec.mean, spec.std, recipe.data.augment, seed)
    )
    loader_kw = {"num_workers": recipe.data.num_workers, "seed": seed}
    train_loader = make_loader(train_set, recipe.data.batch_size, shuffle=True, **loader_kw)
    val_loader = eval_loader(splits.val, spec, recipe.eval.batch_size, **loader_kw)

    objective = FSEBObjective(model, num_train=len(splits.train), **dataclasses.asdict(recipe.fseb))
    optimizer = build_optimizer(recipe.optim, objective.trainable_parameters())
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    objective.model = model
    objective.prior.to(accelerator.device)
    steps_per_epoch = math.ceil(len(train_loader) / recipe.train.grad_accum_steps)
    scheduler = build_scheduler(recipe.optim, optimizer, steps_per_epoch * recipe.train.epochs)
    context = _context_stream(recipe, splits, spec, accelerator, objective)

    run_info = RunInfo(
        num_classes=num_classes,
        class_names=splits.train.class_names,
        input=spec,
        num_train=len(splits.train),
        data=splits.identities(),
        context=None if context is None else context.pool.identity,
        num_processes=accelerator.num_processes,
        device=accelerator.device.type,
        mixed_precision=applied_precision(accelerator),
        warnings=warned,
    )
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / RECIPE_FILE, dump_recipe(recipe))
        write_json(run_dir / RUN_INFO_FILE, run_info.to_json())
    if accelerator.log_with:
        accelerator.init_trackers(run_dir.name, config=_flat(dataclasses.asdict(recipe)))

    state = fit(
        recipe=recipe,
        accelerator=accelerator,
        objective=objective,
        optimizer=optimizer,
        scheduler=scheduler,
        train_loader=train_loader,
        val_loader=val_loader,
        context=context,
        run_dir=run_dir,
        save_best=lambda m: _save_weights(m, run_dir / MODEL_WEIGHTS),
    )
    accelerator.wait_for_everyone()
    load_model(accelerator.unwrap_model(model), str(run_dir / MODEL_WEIGHTS))
    results = eval_results(
        predict_splits(model, splits, spec, recipe.eval, accelerator, **loader_kw)
    )
    results["training"] = {
        "best_epoch": state.best_epoch,
        f"best_val_{recipe.train.select_metric}": state.best_value,
        "epochs": state.epoch,
        "steps": state.step,
        "seconds": state.seconds,
        "history": state.history,
        "warnings": [*warned, *state.warnings],
    }
    if accelerator.is_main_process:
        write_results(run_dir, results, title=method_title(recipe))
        run_info.training = results["training"]
        write_json(run_dir / RUN_INFO_FILE, run_info.to_json())
        # RUN_DIR/model/ in timm's Hub format (+ card), pushed if output.push_to_hub; never raises.
        share_run(accelerator.unwrap_model(model), run_dir, recipe, run_info, results)
    accelerator.end_training()
    return results


class RecipeMismatchError(ValueError):
    """``output.dir`` holds checkpoints of a run with a different recipe."""


# Settings that may change between a killed run and its resumption without changing its maths.
_RESUME_FREE = ("output", "eval", "train.resume", "train.log_every", "train.trackers",
                "data.num_workers")  # fmt: skip


def _check_resumable(recipe: Recipe, run_dir: Path) -> None:
    """Refuse to resume a run directory whose saved recipe differs from ``recipe``.

    Resuming restores the weights, optimiser and schedule of the saved run, so a changed
    ``fseb.reg_scale`` or ``optim.lr`` would silently be ignored or mixed with the old one.
    """
    saved = run_dir / RECIPE_FILE
    if recipe.train.resume != "auto" or latest_checkpoint(run_dir) is None or not saved.exists():
        return
    old = _flat(dataclasses.asdict(load_recipe(saved)))
    new = _flat(dataclasses.asdict(recipe))
    changed = [
        f"{key}: {old.get(key)!r} → {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and not key.startswith(_RESUME_FREE)
    ]
    if changed:
        raise RecipeMismatchError(
            f"{run_dir} holds checkpoints of a run with a different recipe ({'; '.join(changed)});"
            " resuming would mix the two. Use another output.dir, or train.resume=never to "
            "start over in this one."
        )


def _clear_previous_run(run_dir: Path) -> None:
    """``train.resume=never``: remove, and say, what an earlier run left in ``run_dir``.

    Starting over overwrites the checkpoints, best model and results anyway; removing them up
    front means a run killed early never leaves the old run's results beside its own recipe.
    """
    old = [run_dir / CHECKPOINTS, run_dir / MODEL_DIR, run_dir / RUN_INFO_FILE]
    old += [run_dir / RESULTS_JSON, run_dir / RESULTS_MD, *sorted(run_dir.glob("*.png"))]
    found = [path for path in old if path.exists()]
    if not found:
        return
    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found)
    print(f"train.resume=never: starting over in {run_dir}; removing the earlier run's {names}")
    for path in found:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _warn(accelerator: Accelerator, messages: list[str]) -> list[str]:
    """Log ``messages`` once (main process) and return them for run.json."""
    if accelerator.is_main_process:
        for message in messages:
            logger.warning(message)
    return messages


def _num_classes(recipe: Recipe, splits: Splits) -> tuple[int, list[str]]:
    """The head's class count K, after checking the splits' labels; and the data warnings."""
    found = splits.train.num_classes
    k = recipe.model.num_classes or found
    if k < found:
        raise ValueError(
            f"model.num_classes={k} but the training labels go up to {found - 1}; "
            f"set model.num_classes to at least {found} or null"
        )
    return k, splits.check_labels(k)


def _context_stream(
    recipe: Recipe,
    splits: Splits,
    spec: InputSpec,
    accelerator: Accelerator,
    objective: FSEBObjective,
) -> ContextStream | None:
    if recipe.fseb.reg_scale == 0:
        return None
    ctx = recipe.context
    others = [
        load_split(f"context.datasets[{i}]", s, recipe.data.channels, recipe.train.seed)
        for i, s in enumerate(ctx.datasets)
    ]
    pool = build_context_pool(
        kind=ctx.kind,
        train=splits.train if ctx.kind in ("train", "mixture") else None,
        datasets=others,
        weights=list(ctx.weights) or None,
        size=ctx.pool_size,
        seed=recipe.train.seed,
        input_size=spec.size,
        mean=spec.mean,
        std=spec.std,
        corrupt=ctx.corrupt,
    )
    accelerator.print(f"context: {pool!r}")
    return ContextStream(
        pool,
        ctx.batch_size,
        recipe.train.seed,
        accelerator,
        objective,
        num_workers=recipe.data.num_workers,
    )


def _save_weights(model: nn.Module, path: Path) -> None:
    """Atomically replace the best weights (a killed run never leaves a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    hint = f"the best weights so far stay in {path}" if path.exists() else ""
    with cleaned_on_failure(tmp, what="the best weights", hint=hint):
        save_model(model, str(tmp))
    publish(tmp, path)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``RECIPE [key=value ...]``, run it and print the results table."""
    parser = argparse.ArgumentParser(
        prog="fseb-ft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", type=Path, help="YAML recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="train the PS-MAP baseline (fseb.reg_scale=0) and the recipe's FS-EB into "
        "OUTPUT/psmap and OUTPUT/fseb, and print them side by side",
    )
    # Intermixed: overrides may come before or after --compare.
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Regulariser warnings (Cholesky jitter) go to the log like everything else.
    logging.captureWarnings(True)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.compare:
            return compare(args.recipe, args.overrides)
        results = run(recipe)
    except (ConfigError, RecipeMismatchError, NonFiniteLossError, TrainingDivergedError) as err:
        parser.exit(2, f"fseb-ft: error: {err}\n")
    except DiskFullError as err:
        parser.exit(1, f"fseb-ft: error: {err}\n")
    if PartialState().is_main_process:
        print(markdown_table({method_title(recipe): results}))
    return results


def compare(recipe_path: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train PS-MAP and FS-EB from one recipe and write ``comparison.md`` / ``.json``.

    The two runs differ only in ``fseb.reg_scale`` (0 for PS-MAP): same data, seed, backbone,
    optimiser and schedule — one loop, two configurations.
    """
    recipe = load_recipe(recipe_path, overrides)
    if recipe.fseb.reg_scale == 0:
        raise ValueError("--compare needs a recipe with fseb.reg_scale > 0 (its FS-EB setting)")
    out = Path(recipe.output.dir)
    results: dict[str, Any] = {}
    for label, slug, extra in (
        ("PS-MAP", "psmap", ["fseb.reg_scale=0"]),
        ("FS-EB", "fseb", []),
    ):
        sub = load_recipe(recipe_path, [*overrides, *extra, f"output.dir={out / slug}"])
        results[label] = run(sub)
    if PartialState().is_main_process:
        table = markdown_table(results)
        seconds = {k: round(v["training"]["seconds"], 1) for k, v in results.items()}
        (out / "comparison.md").write_text(f"# {recipe.model.name}: PS-MAP vs FS-EB\n\n{table}")
        write_json(out / "comparison.json", results)
        from fseb_ft.report import write_comparison_plots

        # comparison_reliability.png / comparison_selective.png from run()'s predictions.
        predictions = {k: getattr(v, "predictions", None) for k, v in results.items()}
        if all(predictions.values()):
            title = f"{recipe.model.name}: PS-MAP vs FS-EB"
            write_comparison_plots(out, predictions, title, strict=False)
        print(f"\n{table}\ntraining seconds: {seconds}; written to {out}")
    return results


def cli() -> None:
    """Console script ``fseb-ft``: ``fseb-ft RECIPE.yaml [key=value ...]``.

    Subcommands: ``fseb-ft evaluate RUN_DIR`` and ``fseb-ft push RUN_DIR user/name [--private]
    [--revision BRANCH]`` (upload the run's model folder to the Hugging Face Hub).
    """
    if len(sys.argv) > 1 and sys.argv[1] == "evaluate":
        from fseb_ft.evaluate import main as evaluate_main

        evaluate_main(sys.argv[2:], prog="fseb-ft evaluate")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "push":
        push_main(sys.argv[2:])
        return
    main()


class _CallableModule(type(sys)):  # type(sys) is types.ModuleType
    """This module, callable: ``fseb_ft.finetune(recipe, train=..., ...)`` is the Python API.

    ``fseb_ft.finetune`` has to be two things at once: the CLI module that ``python -m
    fseb_ft.finetune`` runs, and the Python API's entry point. A module object cannot be
    called, so its class is swapped for this ``ModuleType`` subclass, whose ``__call__`` forwards
    to :func:`fseb_ft.api.finetune` (imported on call: ``api`` imports this module). Attribute
    access, ``from fseb_ft.finetune import run``, pickling by reference and ``python -m`` behave
    exactly as for a plain module.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Same as :func:`fseb_ft.api.finetune`."""
        from fseb_ft.api import finetune

        return finetune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    main()
