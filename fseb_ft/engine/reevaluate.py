"""Re-evaluating a saved run: its best weights predict its splits again, its results rewritten.

A run is read from its resolved ``recipe.yaml``, ``run.json`` and best weights; ``eval.*``
overrides change how it is evaluated this time only. An evaluation that computes feature OOD
scores keeps their fit with the run (``fseb_ft.runs.feature_fit``), so a run evaluated before
``fseb-ft predict`` could use one gets it here. The ensemble of several runs
(:mod:`fseb_ft.engine.ensemble`) reads and predicts each member the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from accelerate import Accelerator

from fseb_ft.data.image_cache import check_cache_size
from fseb_ft.data.screening import screen_splits
from fseb_ft.data.sources import build_splits
from fseb_ft.evaluation.bootstrap import Bootstrap
from fseb_ft.evaluation.predictions import Predictions, predict_splits
from fseb_ft.evaluation.wise import with_wise
from fseb_ft.method.models import create_model
from fseb_ft.recipe import Recipe
from fseb_ft.runs.atomic import is_not_writable
from fseb_ft.runs.export import is_exported, write_model_card
from fseb_ft.runs.feature_fit import write_feature_fit
from fseb_ft.runs.loading import load_run_model, run_predictor
from fseb_ft.runs.report import EvalResults, write_results
from fseb_ft.runs.rundir import (
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_INFO_FILE,
    RunInfo,
    epochs_done,
    read_json,
    read_run,
    write_wise_weights,
)
from fseb_ft.runs.tables import method_title

__all__ = [
    "SavedRun",
    "evaluate_run",
    "evaluate_run_with_predictions",
    "predict_run",
    "read_saved_run",
]

logger = logging.getLogger(__name__)


class SavedRun(NamedTuple):
    """A finished run as read from its folder."""

    run_dir: Path
    recipe: Recipe
    """Its resolved recipe, with this evaluation's overrides."""
    info: RunInfo
    """Its ``run.json``."""


def read_saved_run(run_dir: Path, cpu: bool, overrides: Sequence[str] = ()) -> SavedRun:
    """A finished run's resolved recipe and ``run.json``; a clear error if it is not one."""
    needed = (RECIPE_FILE, RUN_INFO_FILE, MODEL_WEIGHTS)
    recipe, info = read_run(run_dir, [f"train.cpu={str(cpu).lower()}", *overrides], needed)
    return SavedRun(run_dir, recipe, info)


def evaluate_run(
    run_dir: str | Path, cpu: bool = False, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Re-evaluate a finished run from its ``recipe.yaml``, ``run.json`` and best weights.

    Rewrites the run's ``results.json``, ``results.md`` and plots (keeping the ``training``
    record of the original results); a run folder that cannot be written to (read-only) keeps
    its files, with a warning. ``overrides`` (``eval.key=value``, e.g.
    ``eval.corruptions=all``) change evaluation settings of the saved recipe for this
    evaluation only; ``recipe.yaml`` is left as it is. Returns ``results.json``'s record, a
    JSON-ready dict (:func:`evaluate_run_with_predictions` also keeps the predictions).
    """
    return evaluate_run_with_predictions(run_dir, cpu, overrides).results


def evaluate_run_with_predictions(
    run_dir: str | Path, cpu: bool = False, overrides: Sequence[str] = ()
) -> EvalResults:
    """:func:`evaluate_run`: the results with the predictions behind them."""
    run = read_saved_run(Path(run_dir), cpu, overrides)
    run_dir, recipe, info = run
    accelerator = Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision)
    evaluated = EvalResults.of(predict_run(run, accelerator), recipe.eval, Bootstrap.of(recipe))
    previous = run_dir / RESULTS_JSON
    if previous.exists():
        training = read_json(previous).get("training")
    elif info.training is not None:  # trained without evaluation (a sweep's trial): in run.json
        training = info.training
    else:  # stopped before it finished: say so wherever these numbers are read
        training = _unfinished(run_dir, recipe.train.epochs)
        logger.warning("%s: %s", run_dir, training["warnings"][0])
    results = evaluated.extended(training=training)
    if accelerator.is_main_process:
        _rewrite_results(run_dir, results, method_title(recipe))
    return results


def _rewrite_results(run_dir: Path, results: EvalResults, title: str) -> None:
    """Write the results into the run, with the feature scores' fit when they were computed,
    then refresh an exported model folder's ``fseb.json`` and card (its results, and the feature
    scores it can compute); a folder the OS refuses to write to is left as it is."""
    try:
        write_results(run_dir, results.results, title, results.predictions)
        if results.predictions.feature_fit is not None:
            write_feature_fit(run_dir, results.predictions.feature_fit)
        write_wise_weights(run_dir, results.predictions.wise_weights)
        if is_exported(run_dir):
            write_model_card(run_dir)
    except OSError as err:
        if not is_not_writable(err):
            raise
        # Re-evaluating reads the run only: the numbers are still worth returning and printing.
        logger.warning(
            "could not write %s, %s and the plots into %s (%s): the run keeps its earlier "
            "results, and these are not saved",
            RESULTS_JSON, RESULTS_MD, run_dir, err.strerror,
        )  # fmt: skip


def _unfinished(run_dir: Path, epochs: int) -> dict[str, Any]:
    """The training record of a run stopped before its last epoch: epochs done, a warning."""
    done = epochs_done(run_dir)
    return {
        "unfinished": True,
        "epochs": done,
        "warnings": [
            f"unfinished: {done} of {epochs} epochs trained. These are the best weights of the "
            "epochs done, not of the run the recipe describes; rerun its training command to "
            "finish it"
        ],
    }


def predict_run(run: SavedRun, accelerator: Accelerator) -> Predictions:
    """Load the run's best weights and predict its test split and OOD sets (FS-VI: with the
    Monte-Carlo predictive of its saved q(θ), :func:`~fseb_ft.runs.loading.run_predictor`)."""
    run_dir, recipe, info = run
    # The images training left out (data.bad_images: skip) are left out again, so the numbers
    # are the run's; with ``stop``, an image damaged since is one clear error, not a traceback.
    check_cache_size(recipe.data.cache, info.input.size, recipe.model.name)
    with accelerator.main_process_first():  # with data.cache: the main process builds, others read
        splits, _, _ = screen_splits(
            build_splits(recipe.data, recipe.train.seed),
            [],
            recipe.data.bad_images,
            progress=accelerator.is_main_process,
            train=False,
            cache=recipe.data.cache,
        )
    model = accelerator.prepare(load_run_model(run_dir, recipe, info))
    predictor = run_predictor(run_dir, recipe, accelerator.unwrap_model(model))
    loader_kw = {"num_workers": recipe.data.num_workers, "seed": recipe.train.seed}
    predictions = predict_splits(
        predictor, splits, info.input, recipe.eval, accelerator, **loader_kw, network=model
    )
    if recipe.eval.wise_ft:  # the pretrained weights model.name names, as the run started from
        start = create_model(recipe.model, info.num_classes, in_chans=recipe.data.channels)
        predictions = with_wise(
            predictions, start, model, splits, info.input, recipe.eval, accelerator, **loader_kw
        )
    accelerator.free_memory(model)
    return predictions
