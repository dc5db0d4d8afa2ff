"""One run from its recipe: data → model and objective → context → fit → evaluate → export.

:func:`run` and :func:`run_with_predictions` read as those phases, each a function here. A run
directory (``output.dir``) receives the resolved recipe, per-epoch checkpoints, the best model
(``model/model.safetensors``), ``run.json`` (inputs, classes, context provenance, history) and
``results.json`` / ``results.md``; the commands (``fseb-ft``, ``fseb_ft.finetune(...)``, a
sweep's trials) all train through them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors.torch import load_model
from torch import nn
from torch.utils.data import DataLoader

from fseb_ft.data.holdout import split_records
from fseb_ft.data.image_cache import check_cache_size
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import close_workers
from fseb_ft.data.sources import build_splits
from fseb_ft.data.splits import Splits
from fseb_ft.data.transforms import train_transform
from fseb_ft.engine.allocator import keep_freed_memory
from fseb_ft.engine.callbacks import Callback, TrainState
from fseb_ft.engine.loop import (
    Prepared,
    Trainer,
    applied_precision,
    launch_warnings,
    make_accelerator,
)
from fseb_ft.engine.optimizers import build_optimizer, build_scheduler
from fseb_ft.engine.resume import check_resumable, check_same_data, data_files, flat_keys
from fseb_ft.engine.run_callbacks import builtin_callbacks
from fseb_ft.engine.run_checks import check_data
from fseb_ft.engine.run_data import (
    RunData,
    load_run_data,
    loader_kw,
    training_loader,
    uses_context,
)
from fseb_ft.engine.speed import apply_speed_keys
from fseb_ft.evaluation.bootstrap import Bootstrap
from fseb_ft.evaluation.features import laplace_classifier
from fseb_ft.evaluation.predictions import eval_loader, predict_splits
from fseb_ft.evaluation.wise import with_wise
from fseb_ft.method.context import context_stream, resolve_prior_on_pool
from fseb_ft.method.models import create_model, input_spec, planned_input_size
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ConfigError, Recipe, dump_recipe
from fseb_ft.runs.atomic import remove_orphans, write_text
from fseb_ft.runs.code_record import code_record
from fseb_ft.runs.feature_fit import write_feature_fit
from fseb_ft.runs.lock import run_lock
from fseb_ft.runs.report import EvalResults, write_results
from fseb_ft.runs.rundir import (
    DATA_FILES,
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RUN_INFO_FILE,
    RunInfo,
    clear_run,
    read_method_state,
    write_best_weights,
    write_json,
    write_method_state,
    write_wise_weights,
)
from fseb_ft.runs.tables import method_title
from fseb_ft.runs.upload import share_run

__all__ = ["run", "run_with_predictions"]

logger = logging.getLogger("fseb_ft")


def run(
    recipe: Recipe,
    splits: Splits | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    evaluate_test: bool = True,
) -> dict[str, Any]:
    """Train, select on validation, evaluate on test and OOD sets; return the results.

    ``splits`` replaces the datasets named in ``recipe.data`` (the Python API passes its own).
    ``callbacks`` run after the built-in ones (:mod:`fseb_ft.engine.callbacks`; a sweep's pruner
    is one). Without ``data.test`` the results are the validation split's (``results.json``:
    ``"split": "validation"``). The results are ``results.json``'s record, a JSON-ready dict
    (:func:`run_with_predictions` also keeps the predictions behind it).
    ``evaluate_test=False`` stops after training (recipe, ``run.json`` with the history,
    checkpoints and best weights): no test, OOD or corruption predictions, results files or
    model folder; the results hold only ``training``.

    Raises:
        RunInUseError: another training holds ``output.dir``'s lock (nothing was loaded).
        HubPushError: the upload of ``output.push_to_hub`` failed, once everything else is
            written (the message has the command that retries it).
    """
    if evaluate_test:
        return run_with_predictions(recipe, splits, callbacks=callbacks).results
    with run_lock(Path(recipe.output.dir)):
        trained = _train(recipe, splits, callbacks)
        _export(recipe, trained, None)
    return {"training": trained.training}


def run_with_predictions(
    recipe: Recipe, splits: Splits | None = None, *, callbacks: Sequence[Callback] = ()
) -> EvalResults:
    """:func:`run`, evaluated: its results with the predictions behind them (to draw them beside
    another run's, as ``--compare`` does)."""
    with run_lock(Path(recipe.output.dir)):
        trained = _train(recipe, splits, callbacks)
        evaluated = _evaluate(recipe, trained.splits, trained.spec, trained.parts)
        evaluated = evaluated.extended(training=trained.training)
        _export(recipe, trained, evaluated)
    return evaluated


class _Trained(NamedTuple):
    """A run once trained, its best weights loaded: what its evaluation and export need."""

    parts: Prepared
    splits: Splits
    spec: InputSpec
    run_info: RunInfo
    training: dict[str, Any]
    """The training record of ``results.json`` and ``run.json``."""


def _train(recipe: Recipe, splits: Splits | None, callbacks: Sequence[Callback]) -> _Trained:
    """The phases up to the best weights: data → model and objective → context → fit (the run
    folder checked and locked by the caller, :func:`~fseb_ft.runs.lock.run_lock`)."""
    run_dir = Path(recipe.output.dir)
    check_resumable(recipe, run_dir)
    # Before the cache is built; an hf-hub: model's size is checked once it loads.
    check_cache_size(recipe.data.cache, planned_input_size(recipe.model), recipe.model.name)
    if splits is None:  # the data first: a mistake in it stops the run before anything is written
        splits = build_splits(recipe.data, recipe.train.seed)
    check_data(recipe, splits)
    accelerator, warned = _start(recipe, run_dir)
    data = load_run_data(recipe, splits, accelerator)
    warned += _warn(accelerator, data.warnings)
    parts, spec, val_ood_loaders = _model_and_objective(recipe, data, accelerator)
    parts, prior = _context(recipe, data, spec, parts)
    run_info = _record_start(recipe, data, spec, parts, prior, warned)
    try:
        state = _fit(recipe, parts, val_ood_loaders, data, callbacks)
    finally:  # the training's loaders end their workers with it, a failed training's too
        close_workers(parts.train_loader, parts.val_loader, *val_ood_loaders.values())
    _load_best(parts, run_dir)
    return _Trained(parts, data.splits, spec, run_info, _training(recipe, state, warned))


def _start(recipe: Recipe, run_dir: Path) -> tuple[Accelerator, list[str]]:
    """The run's Accelerator, once the folder is tidied (orphans, ``train.resume=never``); the
    launch's warnings, logged; the allocator setting for CPU training; the global seed."""
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
    return accelerator, warned


def _model_and_objective(
    recipe: Recipe, data: RunData, accelerator: Accelerator
) -> tuple[Prepared, InputSpec, dict[str, DataLoader]]:
    """The model, its input spec, the loaders (the validation OOD sets' prepared apart), the
    objective, optimiser and schedule; everything prepared, the context still to come."""
    model = create_model(recipe.model, data.num_classes, in_chans=recipe.data.channels)
    if recipe.eval.laplace:  # its classifier checked now, not only after training
        laplace_classifier(model, recipe.eval)
    spec = input_spec(model, recipe.model, recipe.data)
    check_cache_size(recipe.data.cache, spec.size, recipe.model.name)
    kw, size = loader_kw(recipe), recipe.eval.batch_size
    transform = train_transform(spec.size, spec.mean, spec.std, recipe.data.augment, kw["seed"])
    train_loader = training_loader(recipe, data.splits.train, transform, accelerator)
    val_loader = eval_loader(data.splits.val, spec, size, persistent=True, **kw)
    # Prepared first, as they always were: Accelerate's checkpoints number loaders in this order.
    val_ood_loaders = {
        name: accelerator.prepare(eval_loader(images, spec, size, persistent=True, **kw))
        for name, images in data.val_ood.items()
    }
    objective = FSEBObjective.from_config(model, len(data.splits.train), recipe.fseb)
    _check_processes(objective, accelerator)
    apply_speed_keys(objective, recipe.model, recipe.train)
    params = objective.trainable_parameters()
    # The method's own parameters (FS-VI's ρ) join their network parameters' layer-decay groups.
    extra = objective.algorithm.extra_parameters()
    optimizer = build_optimizer(recipe.optim, params, model, recipe.model.name, extra)
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    objective.replace_model(model, accelerator.device)
    steps_per_epoch = math.ceil(len(train_loader) / recipe.train.grad_accum_steps)
    scheduler = build_scheduler(recipe.optim, optimizer, steps_per_epoch * recipe.train.epochs)
    parts = Prepared(
        accelerator, objective, optimizer, scheduler, train_loader, val_loader, context=None
    )
    return parts, spec, val_ood_loaders


def _context(
    recipe: Recipe, data: RunData, spec: InputSpec, parts: Prepared
) -> tuple[Prepared, dict[str, float] | None]:
    """The method's context stream (PS-MAP and L2-SP draw none) in ``parts``, and the prior
    resolved on its pool from ``fseb.prior_std`` (``None``: the recipe gives s and d)."""
    context = None
    if uses_context(recipe):
        context = context_stream(
            recipe.context,
            recipe.train.seed,
            data.splits.train,
            data.context_sets,
            spec,
            parts.accelerator,
            parts.objective,
            num_workers=recipe.data.num_workers,
        )
    prior = resolve_prior_on_pool(recipe.fseb, context, parts.objective)
    return dataclasses.replace(parts, context=context), prior


def _record_start(
    recipe: Recipe,
    data: RunData,
    spec: InputSpec,
    parts: Prepared,
    prior: dict[str, float] | None,
    warned: list[str],
) -> RunInfo:
    """The run's ``RunInfo``; refuse to resume on other data, then write the recipe and
    ``run.json`` and start the trackers."""
    run_dir, accelerator = Path(recipe.output.dir), parts.accelerator
    run_info = RunInfo(
        num_classes=data.num_classes,
        class_names=data.splits.train.class_names,
        input=spec,
        num_train=len(data.splits.train),
        data=data.splits.identities() | _identities("val_ood", data.val_ood),
        splits=split_records(data.splits, data.built),
        context=None if parts.context is None else parts.context.pool.identity,
        num_processes=accelerator.num_processes,
        device=accelerator.device.type,
        mixed_precision=applied_precision(accelerator),
        warnings=warned,
        prior=prior,
        bad_images=data.dropped or None,
        class_weights=None if data.class_weights is None else data.class_weights.tolist(),
        code=code_record(),
    )
    files = data_files(recipe.data)
    check_same_data(recipe.train, run_dir, run_info, files)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / RECIPE_FILE, dump_recipe(recipe))
        write_json(run_dir / RUN_INFO_FILE, run_info.to_json())
        write_json(run_dir / DATA_FILES, files)
    if accelerator.log_with:
        accelerator.init_trackers(run_dir.name, config=flat_keys(dataclasses.asdict(recipe)))
    return run_info


def _fit(
    recipe: Recipe,
    parts: Prepared,
    val_ood_loaders: Mapping[str, DataLoader],
    data: RunData,
    callbacks: Sequence[Callback],
) -> TrainState:
    """Train with the recipe's built-in callbacks (:func:`builtin_callbacks`), then
    ``callbacks``, validating ``data.task_metrics`` too."""
    run_dir, objective = Path(recipe.output.dir), parts.objective
    builtin = builtin_callbacks(
        recipe, parts, val_ood_loaders, data.class_weights, data.num_classes
    )
    trainer = Trainer(
        parts,
        recipe.train,
        recipe.optim,
        run_dir,
        save_best=lambda m: _save_best(m, objective, run_dir),
        callbacks=[*builtin, *callbacks],
        task_metrics=data.task_metrics,
    )
    return trainer.fit()


def _load_best(parts: Prepared, run_dir: Path) -> None:
    """The best epoch's weights, and the method's state saved beside them, into the model."""
    parts.accelerator.wait_for_everyone()
    load_model(parts.accelerator.unwrap_model(parts.objective.model), str(run_dir / MODEL_WEIGHTS))
    name = parts.objective.method_state_file
    if name is not None:
        parts.objective.load_method_state(read_method_state(run_dir, name))


def _evaluate(recipe: Recipe, splits: Splits, spec: InputSpec, parts: Prepared) -> EvalResults:
    """The results on the test split (validation without one), OOD sets and corruptions.

    A sweep's trials skip it: only the sweep's winner sees the test split.
    """
    predictions = predict_splits(
        parts.objective.predictor(recipe.train.seed),
        splits,
        spec,
        recipe.eval,
        parts.accelerator,
        **loader_kw(recipe),
        network=parts.objective.model,
    )
    if recipe.eval.wise_ft:  # towards φ0, the frozen start the objective keeps
        objective = parts.objective
        predictions = with_wise(
            predictions, objective.prior, objective.model, splits, spec, recipe.eval,
            parts.accelerator, **loader_kw(recipe),
        )  # fmt: skip
    return EvalResults.of(predictions, recipe.eval, Bootstrap.of(recipe))


def _training(recipe: Recipe, state: TrainState, warned: list[str]) -> dict[str, Any]:
    """The training record of ``results.json`` and ``run.json`` (``stopped``: why it ended
    before ``train.epochs``, only when it did)."""
    return {
        "best_epoch": state.best_epoch,
        f"best_val_{recipe.train.select_metric}": state.best_value,
        "epochs": state.epoch,
        "steps": state.step,
        "seconds": state.seconds,
        "history": state.history,
        "warnings": [*warned, *state.warnings],
    } | ({} if state.stopped is None else {"stopped": state.stopped})


def _export(recipe: Recipe, trained: _Trained, evaluated: EvalResults | None) -> None:
    """``run.json`` with the training record; with the results (``evaluated``) the results files
    and the model folder (pushed if ``output.push_to_hub``; a failed push is raised last, a
    :class:`~fseb_ft.runs.upload.HubPushError`, everything written)."""
    accelerator, run_dir = trained.parts.accelerator, Path(recipe.output.dir)
    try:
        _write_outputs(recipe, trained, evaluated, run_dir)
    finally:
        accelerator.end_training()


def _write_outputs(
    recipe: Recipe, trained: _Trained, evaluated: EvalResults | None, run_dir: Path
) -> None:
    """:func:`_export`'s files, written by the main process."""
    accelerator = trained.parts.accelerator
    if accelerator.is_main_process:
        # run.json before results.json: a results file marks a finished run, so a kill between
        # the two must not leave one whose run.json lacks its training record.
        trained.run_info.training = trained.training
        write_json(run_dir / RUN_INFO_FILE, trained.run_info.to_json())
        if evaluated is not None:
            title = method_title(recipe)
            write_results(run_dir, evaluated.results, title, evaluated.predictions)
            if evaluated.predictions.feature_fit is not None:  # before the folder's fseb.json
                write_feature_fit(run_dir, evaluated.predictions.feature_fit)
            write_wise_weights(run_dir, evaluated.predictions.wise_weights)  # before its push
            # RUN_DIR/model/ (timm's Hub format + card), pushed if output.push_to_hub; a disk
            # error there is logged with its retry command, not raised: the results are written.
            model = accelerator.unwrap_model(trained.parts.objective.model)
            share_run(model, run_dir, recipe, trained.run_info, evaluated.results)


def _check_processes(objective: FSEBObjective, accelerator: Accelerator) -> None:
    """Stop a method that trains in one process only (its ``single_process_reason``) launched
    on several."""
    reason = objective.single_process_reason
    if reason is not None and accelerator.num_processes > 1:
        raise ConfigError(reason)


def _identities(key: str, sets: Mapping[str, Any]) -> dict[str, Any]:
    """``{key: {name: provenance}}`` for run.json's ``data``; ``{}`` when ``sets`` is empty."""
    return {key: {name: data.identity for name, data in sets.items()}} if sets else {}


def _warn(accelerator: Accelerator, messages: list[str]) -> list[str]:
    """Log ``messages`` once (main process) and return them for run.json."""
    if accelerator.is_main_process:
        for message in messages:
            logger.warning(message)
    return messages


def _save_best(model: nn.Module, objective: FSEBObjective, run_dir: Path) -> None:
    """The best weights, and the method's state beside them (:meth:`FSEBObjective.method_state`)."""
    write_best_weights(model, run_dir / MODEL_WEIGHTS)
    name = objective.method_state_file
    if name is not None:
        write_method_state(run_dir, objective.method_state(), name, objective.method_state_name)
