"""Fine-tune a timm backbone with FS-EB (or PS-MAP) from a YAML recipe, or on datasets in memory.

    python -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    accelerate launch -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    fseb-ft RECIPE.yaml fseb.reg_scale=0          # the PS-MAP baseline

    import fseb_ft
    results = fseb_ft.finetune("recipes/cifar10.yaml", train=hf_train, test=hf_test,
                               ood={"cifar100": hf_cifar100_test}, train__epochs=5)

A run directory (``output.dir``) receives the resolved recipe, per-epoch checkpoints, the best
model (``model/model.safetensors``), ``run.json`` (inputs, classes, context provenance, history)
and ``results.json`` / ``results.md``. The module itself is callable: ``fseb_ft.finetune(...)``
is :func:`finetune`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import logging
import math
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from safetensors.torch import load_model, save_model
from torch import nn

from fseb_ft.cli import run_entry
from fseb_ft.data.images import IndexedImages, LabeledImages, as_labeled_images
from fseb_ft.data.screening import screen_splits
from fseb_ft.data.sources import build_splits, load_split
from fseb_ft.data.splits import Splits, require_two_classes, stratified_split
from fseb_ft.data.transforms import TransformedImages, make_loader, train_transform
from fseb_ft.engine.allocator import keep_freed_memory
from fseb_ft.engine.loop import (
    NonFiniteLossError,
    TrainingDivergedError,
    applied_precision,
    build_optimizer,
    build_scheduler,
    fit,
    launch_warnings,
    make_accelerator,
)
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.predictions import eval_loader, predict_splits
from fseb_ft.logs import configure_logging
from fseb_ft.method.context import context_sets, context_stream, resolve_prior_on_pool
from fseb_ft.method.models import create_model, head_init, input_spec
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import (
    ConfigError,
    DatasetSpec,
    Recipe,
    TrainConfig,
    dump_recipe,
    load_recipe,
    override_path,
    read_recipe_file,
    recipe_from_dict,
)
from fseb_ft.recipe.datasets import IN_MEMORY
from fseb_ft.recipe.schema import plain_tree, set_key
from fseb_ft.runs.atomic import (
    DiskFullError,
    cleaned_on_failure,
    publish,
    remove_orphans,
    write_text,
)
from fseb_ft.runs.report import (
    eval_results,
    markdown_table,
    method_title,
    split_note,
    write_results,
)
from fseb_ft.runs.rundir import (
    COMPARISON_JSON,
    COMPARISON_MD,
    MODEL_DIR,
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_INFO_FILE,
    RunInfo,
    check_output_dir,
    clear_run,
    latest_checkpoint,
    read_json,
    read_method_state,
    write_json,
    write_method_state,
)
from fseb_ft.runs.upload import share_run

__all__ = ["compare", "finetune", "main", "resolve_recipe", "run"]

logger = logging.getLogger("fseb_ft")


def run(
    recipe: Recipe,
    splits: Splits | None = None,
    *,
    on_epoch_end: Callable[[dict[str, float]], None] | None = None,
    evaluate_test: bool = True,
) -> dict[str, Any]:
    """Train, select on validation, evaluate on test and OOD sets; return the results dict.

    ``splits`` replaces the datasets named in ``recipe.data`` (the Python API passes its own).
    ``on_epoch_end`` is called with each epoch's record after its validation and checkpoint (a
    sweep reports to its pruner there). Without ``data.test`` the results are the validation
    split's (``results.json``: ``"split": "validation"``). ``evaluate_test=False`` stops after
    training (recipe, ``run.json`` with the history, checkpoints and best weights): no test, OOD
    or corruption predictions, results files or model folder; the results dict holds only
    ``training``.
    """
    run_dir = Path(recipe.output.dir)
    check_output_dir(run_dir)
    _check_resumable(recipe, run_dir)
    if splits is None:  # the data first: a mistake in it stops the run before anything is written
        splits = build_splits(recipe.data, recipe.train.seed)
    _require_two_classes(recipe.data.train, splits.train)
    accelerator = make_accelerator(recipe.train, run_dir)
    if accelerator.is_main_process:
        for orphan in remove_orphans(run_dir):
            accelerator.print(f"removed {orphan}, left by an interrupted run")
        if recipe.train.resume == "never" and (removed := clear_run(run_dir)):
            accelerator.print(
                f"train.resume=never: starting over in {run_dir}; removing the earlier run's "
                + ", ".join(removed)
            )
    accelerator.wait_for_everyone()
    warned = _warn(accelerator, launch_warnings(accelerator, os.environ))
    if accelerator.device.type == "cpu":
        keep_freed_memory()
    set_seed(recipe.train.seed)
    fseb_run = not recipe.fseb.is_ps_map  # PS-MAP draws no context
    seed = recipe.train.seed
    splits, others, dropped = screen_splits(
        splits,
        context_sets(recipe.context, recipe.data.channels, seed) if fseb_run else [],
        recipe.data.bad_images,
        accelerator.is_main_process,
    )
    num_classes, data_warnings = _num_classes(recipe, splits)
    warned += _warn(accelerator, data_warnings)
    model = create_model(recipe.model, num_classes, in_chans=recipe.data.channels)
    spec = input_spec(model, recipe.model, recipe.data)
    train_set = TransformedImages(
        splits.train, train_transform(spec.size, spec.mean, spec.std, recipe.data.augment, seed)
    )
    loader_kw = {"num_workers": recipe.data.num_workers, "seed": seed}
    train_loader = make_loader(train_set, recipe.data.batch_size, shuffle=True, **loader_kw)
    val_loader = eval_loader(splits.val, spec, recipe.eval.batch_size, **loader_kw)
    val_ood = {
        name: load_split(f"data.val_ood.{name}", ood_spec, recipe.data.channels, seed)
        for name, ood_spec in recipe.data.val_ood.items()
    }
    val_ood_loaders = {
        name: accelerator.prepare(eval_loader(data, spec, recipe.eval.batch_size, **loader_kw))
        for name, data in val_ood.items()
    }

    objective = FSEBObjective.from_config(model, len(splits.train), recipe.fseb)
    if objective.variational is not None and accelerator.num_processes > 1:
        raise ConfigError(
            "fseb.method=fsvi runs in one process: its σ is not synchronised across processes"
        )
    optimizer = build_optimizer(recipe.optim, objective.trainable_parameters())
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    objective.replace_model(model, accelerator.device)
    steps_per_epoch = math.ceil(len(train_loader) / recipe.train.grad_accum_steps)
    scheduler = build_scheduler(recipe.optim, optimizer, steps_per_epoch * recipe.train.epochs)
    context = (
        context_stream(
            recipe.context,
            seed,
            splits.train,
            others,
            spec,
            accelerator,
            objective,
            num_workers=recipe.data.num_workers,
        )
        if fseb_run
        else None
    )
    prior = resolve_prior_on_pool(recipe.fseb, context, objective)

    run_info = RunInfo(
        num_classes=num_classes,
        class_names=splits.train.class_names,
        input=spec,
        num_train=len(splits.train),
        data=splits.identities() | _identities("val_ood", val_ood),
        context=None if context is None else context.pool.identity,
        num_processes=accelerator.num_processes,
        device=accelerator.device.type,
        mixed_precision=applied_precision(accelerator),
        warnings=warned,
        prior=prior,
        bad_images=dropped or None,
    )
    _check_same_data(recipe.train, run_dir, run_info)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / RECIPE_FILE, dump_recipe(recipe))
        write_json(run_dir / RUN_INFO_FILE, run_info.to_json())
    if accelerator.log_with:
        accelerator.init_trackers(run_dir.name, config=_flat(dataclasses.asdict(recipe)))

    state = fit(
        train=recipe.train,
        optim=recipe.optim,
        num_workers=recipe.data.num_workers,
        accelerator=accelerator,
        objective=objective,
        optimizer=optimizer,
        scheduler=scheduler,
        train_loader=train_loader,
        val_loader=val_loader,
        context=context,
        run_dir=run_dir,
        save_best=lambda m: _save_best(m, objective, run_dir),
        on_epoch_end=on_epoch_end,
        val_ood_loaders=val_ood_loaders,
        ood_score_name=recipe.eval.ood_scores[0],
        # A zero head helps a pretrained backbone's random one, not a network trained from scratch.
        suggest_zero_head=recipe.model.pretrained and head_init(recipe.model) != "zeros",
    )
    accelerator.wait_for_everyone()
    load_model(accelerator.unwrap_model(model), str(run_dir / MODEL_WEIGHTS))
    if objective.method_state():
        objective.load_method_state(read_method_state(run_dir))
    results: dict[str, Any] = {}
    if evaluate_test:  # a sweep's trials skip it: only the sweep's winner sees the test split
        results = eval_results(
            predict_splits(
                objective.predictor(seed), splits, spec, recipe.eval, accelerator, **loader_kw
            ),
            recipe.eval.ood_scores,
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
        # run.json before results.json: a results file marks a finished run, so a kill between
        # the two must not leave one whose run.json lacks its training record.
        run_info.training = results["training"]
        write_json(run_dir / RUN_INFO_FILE, run_info.to_json())
        if evaluate_test:
            write_results(run_dir, results, title=method_title(recipe))
            # RUN_DIR/model/ (timm's Hub format + card), pushed if output.push_to_hub; never raises.
            share_run(accelerator.unwrap_model(model), run_dir, recipe, run_info, results)
    accelerator.end_training()
    return results


class RecipeMismatchError(FsebError, ValueError):
    """``output.dir`` holds checkpoints of a run with a different recipe."""


# Settings that may change between a killed run and its resumption without changing its maths.
_RESUME_FREE = ("output", "eval", "sweep", "train.resume", "train.log_every", "train.trackers",
                "data.num_workers")  # fmt: skip


def _check_resumable(recipe: Recipe, run_dir: Path) -> None:
    """Refuse to resume a run directory whose saved recipe differs from ``recipe``.

    Resuming restores the weights, optimiser and schedule of the saved run, so a changed
    ``fseb.reg_scale`` or ``optim.lr`` would silently be ignored or mixed with the old one.
    A changed ``train.epochs`` alone gets its own message: why, and how to train on.
    """
    saved = run_dir / RECIPE_FILE
    if recipe.train.resume != "auto" or latest_checkpoint(run_dir) is None or not saved.exists():
        return
    old_recipe = load_recipe(saved)
    old = _flat(dataclasses.asdict(old_recipe))
    new = _flat(dataclasses.asdict(recipe))
    keys = [
        key
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and not key.startswith(_RESUME_FREE)
    ]
    if keys == ["train.epochs"]:
        raise RecipeMismatchError(_epochs_message(run_dir, old_recipe, recipe.train.epochs))
    if keys:
        changed = "; ".join(f"{key}: {old.get(key)!r} → {new.get(key)!r}" for key in keys)
        raise RecipeMismatchError(
            f"{run_dir} holds checkpoints of a run with a different recipe ({changed});"
            " resuming would mix the two. Use another output.dir, or train.resume=never to "
            "start over in this one."
        )


def _epochs_message(run_dir: Path, old: Recipe, epochs: int) -> str:
    """Why a rerun into ``run_dir`` cannot change ``train.epochs`` from ``old``'s to ``epochs``,
    and, for more epochs, the command that trains on from the run's exported weights."""
    was, optim = old.train.epochs, old.optim
    cosine = optim.schedule == "cosine"
    end_lr = optim.lr * (optim.min_lr_ratio if cosine else 1.0)
    why = (
        f"its cosine schedule decays the learning rate to its end (optim.lr × optim.min_lr_ratio"
        f" = {end_lr:.3g}) over those epochs, and train.epochs={epochs} would "
        "change the schedule of the epochs already trained"
        if cosine
        else "a run is only resumed with its own recipe"
    )
    said = f"{run_dir} holds a run of train.epochs={was}, which a rerun cannot change: {why}."
    if epochs < was:
        return f"{said} Use another output.dir, or train.resume=never to start over in this one."
    # model.head_init=timm keeps the trained head (auto would zero a pretrained model's head).
    warmup = ["optim.warmup_steps=0"] if optim.warmup_steps else []
    command = shlex.join([
        "fseb-ft", str(run_dir / RECIPE_FILE), f"model.name=local-dir:{run_dir / MODEL_DIR}",
        "model.pretrained=true", "model.head_init=timm", "optim.schedule=constant",
        f"optim.lr={end_lr:.3g}", *warmup, f"train.epochs={epochs - was}",
        f"output.dir={run_dir}-more",
    ])  # fmt: skip
    finished = (run_dir / MODEL_DIR / "config.json").is_file()
    first = "" if finished else f"finish it first (rerun it with train.epochs={was}), then "
    return (
        f"{said} To train {epochs - was} more epoch(s), {first}start a new run from its exported "
        "weights (the epoch best on validation; they are then also its φ0) at a constant "
        f"learning rate: {command}"
    )


# What a resumed run must find as it was: the classes, the images of every split and the context.
_DATA_FACTS = ("num_classes", "class_names", "num_train", "data", "context")


def _check_same_data(train: TrainConfig, run_dir: Path, info: RunInfo) -> None:
    """Refuse to resume a run directory whose run was trained on other data than ``info`` says.

    Called before anything is written: resuming would load weights trained on the old images
    (or fail on a head of another size) and then describe them by the new data, so the model's
    ``label_names`` would name classes it never saw. Compared: the class names and count, the
    training-set size, every split's identity (image folders: names, sizes and times of their
    files) and the context pool's.
    """
    saved = run_dir / RUN_INFO_FILE
    if train.resume != "auto" or latest_checkpoint(run_dir) is None or not saved.is_file():
        return
    old = read_json(saved)
    new = json.loads(json.dumps(info.to_json()))  # as run.json would hold it: lists, not tuples
    changed = [f"{key}: {_short(a)} → {_short(b)}" for key, a, b in _changes(old, new, _DATA_FACTS)]
    if changed:
        raise RecipeMismatchError(
            f"{run_dir} holds checkpoints of a run trained on other data ({'; '.join(changed)});"
            " resuming would describe its weights by the new data. Use another output.dir, or "
            "train.resume=never to start over in this one."
        )


def _changes(
    old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]
) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` of what differs under ``keys``, nested mappings
    followed down to the values that differ."""
    out = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            sub = _changes(a, b, sorted(set(a) | set(b)))
            out += [(f"{key}.{child}", x, y) for child, x, y in sub]
        elif a != b:
            out.append((key, a, b))
    return out


def _short(value: Any, width: int = 80) -> str:
    """``repr(value)``, cut in the middle to ``width`` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width // 2 - 2]}…{text[-(width // 2 - 1) :]}"


def _identities(key: str, sets: Mapping[str, Any]) -> dict[str, Any]:
    """``{key: {name: provenance}}`` for run.json's ``data``; ``{}`` when ``sets`` is empty."""
    return {key: {name: data.identity for name, data in sets.items()}} if sets else {}


def _warn(accelerator: Accelerator, messages: list[str]) -> list[str]:
    """Log ``messages`` once (main process) and return them for run.json."""
    if accelerator.is_main_process:
        for message in messages:
            logger.warning(message)
    return messages


def _require_two_classes(spec: DatasetSpec, train: LabeledImages) -> None:
    """Stop a run whose training images are of fewer than two classes, naming where they are
    from: an image folder pointed one level too high (its only class ``train_images``)."""
    if spec.path.startswith(IN_MEMORY):
        require_two_classes(train, f"train= ({train.identity})", "Pass images of every class.")
        return
    where = ", ".join(
        [f"{spec.source} {spec.path}".strip(), f"split {spec.split}"]
        + ([f"classes {list(spec.classes)}"] if spec.classes is not None else [])
    )
    hint = (
        "Point data.train.path at the folder whose sub-folders are the classes "
        "(PATH/<split>/<class>/*.jpg or PATH/<class>/*.jpg)."
        if spec.source == "imagefolder"
        else "Check data.train's split, label column and classes."
    )
    require_two_classes(train, f"data.train ({where})", hint)


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


def _save_best(model: nn.Module, objective: FSEBObjective, run_dir: Path) -> None:
    """The best weights (FS-VI: μ), and the method's state beside them (FS-VI: σ)."""
    _save_weights(model, run_dir / MODEL_WEIGHTS)
    write_method_state(run_dir, objective.method_state())


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


_CLI_USAGE = """Fine-tune a timm backbone with FS-EB (PS-MAP: fseb.reg_scale=0) from a YAML recipe.

Any section.key=value overrides the recipe. The run directory (output.dir) receives the resolved
recipe, checkpoints, the best model in timm's Hub format (model/), run.json and the results.
Rerunning the same command continues a killed run."""


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft") -> dict[str, Any]:
    """Parse ``RECIPE [key=value ...] [--compare]``, run it and print the results table."""
    parser = argparse.ArgumentParser(
        prog=prog, description=_CLI_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", type=Path, help="YAML recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="train the PS-MAP baseline (fseb.reg_scale=0) and the recipe's FS-EB into "
        "OUTPUT/psmap and OUTPUT/fseb, and print them side by side",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' INFO lines"
    )
    # Intermixed: overrides may come before or after --compare.
    args = parser.parse_intermixed_args(argv)
    configure_logging(args.verbose)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.compare:
            return compare(recipe)
        results = run(recipe)
    except (ConfigError, RecipeMismatchError, NonFiniteLossError, TrainingDivergedError) as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    except DiskFullError as err:
        parser.exit(1, f"{prog}: error: {err}\n")
    if PartialState().is_main_process:
        print(markdown_table({method_title(recipe): results}))
        print(_written(Path(recipe.output.dir)))
    return results


def _written(run_dir: Path) -> str:
    """The line that tells a person where a run's results, plots and model are."""
    plots = ", ".join(p.name for p in sorted(run_dir.glob("*.png")))
    return (
        f"written to {run_dir}: {RESULTS_MD} (this table), {RESULTS_JSON}, "
        + (f"{plots}, " if plots else "")
        + f"{MODEL_DIR}/ (the best model, timm's Hub format)"
    )


def compare(recipe: Recipe | str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train PS-MAP and FS-EB from one recipe and write ``comparison.md`` / ``.json``.

    The two runs differ only in ``fseb.reg_scale`` (0 for PS-MAP): same data, seed, backbone,
    optimiser and schedule — one loop, two configurations. ``recipe`` is a :class:`Recipe` or a
    YAML file (read with ``overrides``); its runs go to ``output.dir``/psmap and /fseb (/fsvi
    with ``fseb.method=fsvi``, whose PS-MAP run also has ``method=fseb``).

    Raises:
        ConfigError: the recipe's ``fseb.reg_scale`` is 0, so it has no FS-EB setting.
    """
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)
    if recipe.fseb.is_ps_map:
        raise ConfigError(
            "fseb.reg_scale=0: --compare trains PS-MAP (reg_scale 0) beside the recipe's FS-EB, "
            "so the recipe must set fseb.reg_scale > 0"
        )
    out = Path(recipe.output.dir)
    check_output_dir(out)
    results: dict[str, Any] = {}
    for label, slug, reg_scale, method in (
        ("PS-MAP", "psmap", 0.0, "fseb"),
        (recipe.fseb.method_name, recipe.fseb.method, recipe.fseb.reg_scale, recipe.fseb.method),
    ):
        sub = dataclasses.replace(
            recipe,
            fseb=dataclasses.replace(recipe.fseb, reg_scale=reg_scale, method=method),
            output=dataclasses.replace(recipe.output, dir=str(out / slug)),
        )
        results[label] = run(sub)
    if PartialState().is_main_process:
        table = markdown_table(results)
        seconds = {k: round(v["training"]["seconds"], 1) for k, v in results.items()}
        title = f"{recipe.model.name}: PS-MAP vs {recipe.fseb.method_name}"
        note = split_note(results["PS-MAP"])  # both runs report on the same split
        write_text(out / COMPARISON_MD, f"# {title}\n\n{note}{table}")
        write_json(out / COMPARISON_JSON, results)
        from fseb_ft.runs.report import write_comparison_plots

        # comparison_reliability.png / comparison_selective.png from run()'s predictions.
        predictions = {k: getattr(v, "predictions", None) for k, v in results.items()}
        if all(predictions.values()):
            write_comparison_plots(out, predictions, title, strict=False)
        print(f"\n{table}\ntraining seconds: {seconds}; written to {out}")
    return results


# --------------------------------------------------------------------------------------------
# The in-memory API: fseb_ft.finetune(recipe, train=..., test=...)
# --------------------------------------------------------------------------------------------

_SECTIONS = tuple(f.name for f in dataclasses.fields(Recipe))


def finetune(
    recipe: str | Path | Recipe | Mapping[str, Any] | None = None,
    train: Any = None,
    val: Any = None,
    test: Any = None,
    ood: Mapping[str, Any] | None = None,
    *,
    class_names: Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Fine-tune with FS-EB (or PS-MAP, ``fseb__reg_scale=0``) on in-memory datasets.

    Args:
        recipe: a YAML recipe path, a :class:`~fseb_ft.recipe.Recipe`, a mapping of sections as
            in a YAML file, or ``None`` for all defaults (ImageNet-pretrained ResNet-18).
        train: the training data: a ``datasets.Dataset`` (image and label columns found from
            their ``Image`` / ``ClassLabel`` features, else ``image``/``img`` and
            ``label``/``labels``), any map-style torch ``Dataset`` of ``(image, label)`` pairs
            (image: PIL, numpy (H, W[, C]) or a (C, H, W) tensor, in uint8, uint16 (16-bit,
            scaled ``>> 8``) or float in [0, 1]; :func:`fseb_ft.data.pixels.as_uint8`), or a
            :class:`fseb_ft.data.images.LabeledImages`.
        val: validation data for model selection; ``None`` holds out a stratified, seeded
            ``data.val_fraction`` of ``train``.
        test: the in-distribution test data the results are reported on; ``None``: they are
            reported on the validation data, which selected the checkpoint, so they are
            optimistic (``results.json`` says ``"split": "validation"``).
        ood: named semantic-shift sets scored against ``test`` (labels are not used).
        class_names: class names, index = label; default: the ``ClassLabel`` names, the
            dataset's ``classes`` attribute, else ``"0" .. "K-1"``.
        image_column: image column (HF) or item key (torch datasets yielding mappings).
        label_column: label column (HF) or item key.
        **overrides: recipe overrides, in any of three spellings (values are Python objects,
            not YAML text): a section mapping, merged into the recipe (``fseb={"reg_scale": 0}``);
            ``section__key=value``, a double underscore for each dot (``fseb__reg_scale=0``,
            ``output__dir="runs/mine"``); dotted keys through a dict (``**{"fseb.reg_scale":
            0}``). ``train=`` is the training dataset, so the ``train`` *section* takes the
            second or third spelling (``train__epochs=5``), never ``train={...}``.

    Returns:
        The results dict of :func:`fseb_ft.finetune.run` (``test``, ``ood``, ``training``),
        also written to ``output.dir/results.json``. The run directory gets everything a CLI
        run writes; its ``recipe.yaml`` names the data ``in-memory:<split>`` and ``run.json``
        records the datasets' provenance, so re-evaluating it with ``fseb-ft evaluate`` needs
        the data saved to disk and the recipe's ``data`` pointing at it.
    """
    if train is None:
        raise TypeError("finetune() needs train=: the training dataset")
    resolved = resolve_recipe(
        recipe, overrides, has_val=val is not None, ood_names=ood or {}, has_test=test is not None
    )
    wrap = {
        "class_names": class_names,
        "channels": resolved.data.channels,
        "image_column": image_column,
        "label_column": label_column,
    }
    splits = Splits(
        train=as_labeled_images(train, **wrap),
        val=None,  # set below
        test=None if test is None else as_labeled_images(test, **wrap),
        ood={name: as_labeled_images(data, **wrap) for name, data in (ood or {}).items()},
    )
    if val is None:
        splits.train, splits.val = _hold_out(splits.train, resolved)
    else:
        splits.val = as_labeled_images(val, **wrap)
    return run(resolved, splits=splits)


def resolve_recipe(
    recipe: str | Path | Recipe | Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None = None,
    has_val: bool = False,
    ood_names: Sequence[str] | Mapping[str, Any] = (),
    has_test: bool = True,
) -> Recipe:
    """The validated recipe ``finetune`` runs: ``recipe`` plus ``overrides``, data in memory.

    ``data.train`` (``data.test`` when ``has_test``, ``data.val`` when ``has_val``, ``data.ood``
    for ``ood_names``) become ``in-memory:<name>`` placeholders: the datasets passed to
    :func:`finetune` replace them.
    """
    raw = _raw_recipe(recipe)
    for key, value in (overrides or {}).items():
        _apply(raw, key, value)
    data = raw.setdefault("data", {})
    if not isinstance(data, dict):
        raise ConfigError(f"data must be a mapping of keys, got {data!r}")
    data["train"] = _placeholder("train")
    data["val"] = _placeholder("val") if has_val else None
    data["test"] = _placeholder("test") if has_test else None
    data["ood"] = {str(name): _placeholder(f"ood/{name}") for name in ood_names}
    return recipe_from_dict(raw)


def _raw_recipe(recipe: str | Path | Recipe | Mapping[str, Any] | None) -> dict[str, Any]:
    """A mutable nested dict of the recipe, as it would be read from YAML."""
    if recipe is None:
        return {}
    if isinstance(recipe, Recipe):
        return plain_tree(dataclasses.asdict(recipe))
    if isinstance(recipe, Mapping):
        return plain_tree(copy.deepcopy(dict(recipe)))
    return read_recipe_file(recipe)


def _apply(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set one override: ``section={...}`` merges, ``a__b=v`` and ``a.b=v`` set a dotted key."""
    parts = override_path(key.replace("__", "."))
    if parts[0] not in _SECTIONS or not all(parts):
        raise ConfigError(
            f"unknown override {key!r}: use a recipe section {list(_SECTIONS)} as "
            "section={...}, section__key=value or **{'section.key': value}"
        )
    set_key(raw, parts, value, merge=True)


def _placeholder(name: str) -> dict[str, str]:
    return {"source": "arrays", "path": f"{IN_MEMORY}{name}", "split": name}


def _hold_out(full: Any, recipe: Recipe) -> tuple[Any, Any]:
    """(train, val): a stratified, seeded ``data.val_fraction`` of ``full`` held out."""
    train_idx, val_idx = stratified_split(full.labels, recipe.data.val_fraction, recipe.train.seed)
    return IndexedImages(full, train_idx), IndexedImages(full, val_idx)


class _CallableModule(type(sys)):  # type(sys) is types.ModuleType
    """This module, callable: ``fseb_ft.finetune(recipe, train=..., ...)`` is the Python API.

    ``fseb_ft.finetune`` has to be two things at once: the CLI module that ``python -m
    fseb_ft.finetune`` runs, and the Python API's entry point. A module object cannot be
    called, so its class is swapped for this ``ModuleType`` subclass, whose ``__call__`` is
    :func:`finetune` and whose signature is its signature. Attribute access, ``from
    fseb_ft.finetune import run``, pickling by reference and ``python -m`` behave exactly as for
    a plain module.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Same as :func:`finetune`."""
        return finetune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
sys.modules[__name__].__signature__ = inspect.signature(finetune)


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.finetune")
