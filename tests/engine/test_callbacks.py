"""The training loop's callbacks: their events in order, a user's stop, a sweep's pruning."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from torch import Tensor

from fseb_ft.engine.callbacks import Callback, PruningCallback, TrainerView, Validation
from fseb_ft.engine.loop import Trainer
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.rundir import latest_checkpoint
from tests.helpers import tiny_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _psmap(folders: dict[str, Path], out: Path, epochs: int) -> dict[str, Any]:
    """A PS-MAP recipe (no context pool: the fastest run) of 27 training images, 4 batches."""
    raw = tiny_recipe(folders, out, epochs=epochs)
    raw["data"]["ood"] = {}
    raw["fseb"]["reg_scale"] = 0.0
    raw["train"]["trackers"] = []
    return raw


class Recorder(Callback):
    """Every event with ``(state.epoch, state.step)`` as the trainer has them at that moment."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def _note(self, trainer: TrainerView, event: str, *more: Any) -> None:
        run_dir = trainer.run_dir
        saved = latest_checkpoint(run_dir).name if latest_checkpoint(run_dir) else None
        self.events.append((event, trainer.state.epoch, trainer.state.step, saved, *more))

    def on_train_begin(self, trainer: TrainerView) -> None:
        self._note(trainer, "train_begin")

    def on_epoch_begin(self, trainer: TrainerView, epoch: int) -> None:
        self._note(trainer, "epoch_begin", epoch)

    def on_step_end(self, trainer: TrainerView, terms: Mapping[str, Tensor]) -> None:
        assert {"loss", "nll", "fs_reg", "param_reg"} <= set(terms)
        self._note(trainer, "step_end")

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        assert validation.logits.shape == (9, 3) and validation.labels.shape == (9,)
        validation.metrics["mine"] = 0.5 * validation.record["epoch"]
        self._note(trainer, "validation_end", validation.record["epoch"])

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        assert trainer.state.history[-1] is record
        self._note(trainer, "epoch_end", record["epoch"])

    def on_train_end(self, trainer: TrainerView) -> None:
        self._note(trainer, "train_end")


def test_a_callback_gets_every_event_in_order_with_its_epoch_and_step(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    raw = _psmap(folders, tmp_path / "run", epochs=2)
    raw["train"]["grad_accum_steps"] = 2  # 4 batches an epoch: 2 optimiser steps
    recorder = Recorder()
    results = run(recipe_from_dict(raw), callbacks=[recorder])

    # (event, epochs done, steps taken, newest checkpoint, the event's own numbers)
    e1, e2 = "epoch-0001", "epoch-0002"
    assert recorder.events == [
        ("train_begin", 0, 0, None),
        ("epoch_begin", 0, 0, None, 0),
        ("step_end", 0, 1, None),
        ("step_end", 0, 2, None),
        ("validation_end", 1, 2, None, 1),
        ("epoch_end", 1, 2, None, 1),  # before its checkpoint: what it changes is saved
        ("epoch_begin", 1, 2, e1, 1),
        ("step_end", 1, 3, e1),
        ("step_end", 1, 4, e1),
        ("validation_end", 2, 4, e1, 2),
        ("epoch_end", 2, 4, e1, 2),
        ("train_end", 2, 4, e2),
    ]
    history = results["training"]["history"]
    assert [r["val_mine"] for r in history] == [0.5, 1.0]
    # A callback's metric comes after the loop's own and the built-in callbacks'.
    assert list(history[0])[-3:] == ["val_chance_accuracy", "val_mine", "seconds"]


class StopAfter(Callback):
    """Ask the trainer to stop once ``epochs`` epochs are done."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.ended = epochs, False

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        if record["epoch"] >= self.epochs:
            trainer.should_stop = True

    def on_train_end(self, trainer: TrainerView) -> None:
        self.ended = True


def test_a_users_callback_can_stop_training_and_the_run_still_finishes(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    stop = StopAfter(1)
    results = run(recipe_from_dict(_psmap(folders, out, epochs=3)), callbacks=[stop])
    assert stop.ended
    assert results["training"]["epochs"] == 1 and len(results["training"]["history"]) == 1
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["epoch-0001"]
    # The stopped run is evaluated and exported as a finished one.
    assert results["test"]["n"] == 13 and (out / "results.json").is_file()
    assert (out / "model" / "model.safetensors").is_file()


class _Trial:
    """An Optuna trial's reporting side: what it was told, and a pruner that always prunes."""

    def __init__(self) -> None:
        self.reports: list[tuple[float, int]] = []

    def report(self, value: float, step: int) -> None:
        self.reports.append((value, step))

    def should_prune(self) -> bool:
        return True


def test_the_pruning_callback_prunes_once_the_epoch_is_saved(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "trial"
    trial = _Trial()
    with pytest.raises(optuna.TrialPruned, match=r"val_nll after epoch 1 is behind other trials"):
        run(
            recipe_from_dict(_psmap(folders, out, epochs=2)),
            callbacks=[PruningCallback(trial, "nll", epochs=2)],
            evaluate_test=False,
        )
    assert [step for _, step in trial.reports] == [1]
    assert latest_checkpoint(out) == out / "checkpoints" / "epoch-0001"  # the pruned epoch kept


def test_the_pruning_callback_never_prunes_after_the_last_epoch() -> None:
    trial, trainer = _Trial(), SimpleNamespace(should_stop=False)
    pruning = PruningCallback(trial, "accuracy", epochs=2)
    pruning.on_epoch_end(trainer, {"epoch": 2, "val_accuracy": 0.75})
    pruning.on_train_end(trainer)  # nothing raised: the trial is trained
    assert trial.reports == [(0.75, 2)] and not trainer.should_stop


def test_two_callbacks_cannot_save_their_state_under_one_name() -> None:
    parts = SimpleNamespace(accelerator=None, objective=None)
    with pytest.raises(ValueError, match=r"distinct state_key values, got \['Recorder', 'Rec"):
        Trainer(parts, None, None, Path(), print, [Recorder(), Recorder()])
