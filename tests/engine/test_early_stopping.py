"""Early stopping (``train.early_stopping``, the ``EarlyStopping`` callback): when it stops, what
a run keeps and records, and resuming its patience."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from fseb_ft.engine.callbacks import Callback, TrainerView, TrainState, Validation
from fseb_ft.engine.early_stopping import EarlyStopping
from fseb_ft.engine.loop import Trainer, _improved
from fseb_ft.finetune import run
from fseb_ft.recipe import ConfigError, recipe_from_dict
from tests.helpers import kill_after_checkpoint, tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _stopped_after(metric: str, values: list[float], patience: int) -> int | None:
    """The epoch after which early stopping stops a run whose validation ``metric`` takes
    ``values``, the loop's selection scripted around it; ``None``: it trains every epoch."""
    config = SimpleNamespace(select_metric=metric, epochs=len(values))
    trainer = SimpleNamespace(
        state=TrainState(), config=config, should_stop=False, accelerator=SimpleNamespace()
    )
    trainer.accelerator.print = lambda *args: None
    stopping = EarlyStopping(patience)
    stopping.on_train_begin(trainer)
    for value in values:
        state = trainer.state
        state.epoch += 1
        if _improved(metric, value, state.best_value):  # the loop's selection
            state.best_value, state.best_epoch = value, state.epoch
        stopping.on_epoch_end(trainer, {})
        if trainer.should_stop:
            assert f"stopped after epoch {state.epoch} of {len(values)}" in state.stopped
            return state.epoch
    assert trainer.state.stopped is None
    return None


@pytest.mark.parametrize(
    ("metric", "values", "patience", "expected"),
    [
        ("nll", [1.0, 0.8, 0.9, 0.85, 0.81, 0.7], 3, 5),  # best at 2; 3, 4, 5 are worse
        ("nll", [1.0, 0.8, 0.9, 0.7, 0.75, 0.72], 3, None),  # 4 improves: waits 2 at the end
        ("nll", [1.0, 0.8, 0.8, 0.9, 0.1], 2, 4),  # an equal value is no improvement
        ("accuracy", [0.5, 0.6, 0.55, 0.7, 0.6], 1, 3),  # accuracy rises
        ("accuracy", [0.5, 0.6, 0.6, 0.6], 5, None),  # patience beyond the epochs
        ("nll", [float("nan"), float("nan"), 1.0, 1.1], 2, None),  # a number beats NaN
        ("nll", [1.0, float("nan"), float("nan"), 2.0, 0.1], 3, 4),  # NaN never improves
        ("nll", [1.0, 2.0, 3.0], 2, None),  # stopping at the last epoch is no early stop
    ],
)
def test_it_stops_after_patience_epochs_without_improvement(
    metric: str, values: list[float], patience: int, expected: int | None
) -> None:
    assert _stopped_after(metric, values, patience) == expected


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "ind", "train", {"cat": 8, "dog": 8, "fox": 8})
    write_image_folder(root / "ind", "test", {"cat": 2, "dog": 2, "fox": 2})
    return {"ind": root / "ind", "ood": root / "ood"}


SCRIPTED_NLL = [3.0, 2.0, 1.0, 1.5, 1.2, 0.5]
"""The validation NLL the tiny runs see: best after epoch 3, no better in 4 and 5."""


class ScriptedNLL(Callback):
    """Replace each epoch's validation NLL by :data:`SCRIPTED_NLL`'s; keep each epoch's weights."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        validation.metrics["nll"] = SCRIPTED_NLL[int(validation.record["epoch"]) - 1]

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        model = trainer.objective.model
        self.weights[int(record["epoch"])] = {
            k: v.detach().clone() for k, v in model.state_dict().items()
        }


def _recipe(folders: dict[str, Path], out: Path) -> dict:
    raw = tiny_recipe(folders, out, epochs=len(SCRIPTED_NLL))
    del raw["data"]["ood"], raw["data"]["test"]
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    raw["train"]["early_stopping"] = 2
    return raw


def test_a_run_stops_at_the_right_epoch_and_keeps_the_best_weights(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    scripted = ScriptedNLL()
    run(recipe_from_dict(_recipe(folders, tmp_path / "run")), callbacks=[scripted])
    training = json.loads((tmp_path / "run" / "run.json").read_text())["training"]
    assert training["epochs"] == 5 and len(training["history"]) == 5
    assert training["best_epoch"] == 3 and training["best_val_nll"] == 1.0
    assert training["stopped"] == (
        "early stopping: val_nll did not improve for 2 epochs after its best, epoch 3 "
        "(train.early_stopping=2); stopped after epoch 5 of 6"
    )
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["training"]["stopped"] == training["stopped"]
    exported = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert all(torch.equal(exported[k], scripted.weights[3][k]) for k in exported)
    assert not all(torch.equal(exported[k], scripted.weights[5][k]) for k in exported)


def test_a_resumed_run_keeps_its_patience_and_stays_stopped(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    kill_after_checkpoint(monkeypatch, count=4)  # one epoch without improvement is done
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(_recipe(folders, out)), callbacks=[ScriptedNLL()], evaluate_test=False)

    trained = []
    original = Trainer._train_epoch

    def counting(self: Trainer, epoch: int) -> dict[str, float]:
        trained.append(epoch + 1)
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "_train_epoch", counting)
    recipe = recipe_from_dict(_recipe(folders, out))
    training = run(recipe, callbacks=[ScriptedNLL()], evaluate_test=False)["training"]
    assert (
        trained == [5] and training["epochs"] == 5 and "after epoch 5 of 6" in training["stopped"]
    )
    again = run(recipe, callbacks=[ScriptedNLL()], evaluate_test=False)["training"]
    assert trained == [5] and again["epochs"] == 5 and again["stopped"] == training["stopped"]


@pytest.mark.parametrize("patience", [0, -1])
def test_the_recipe_refuses_a_patience_below_one(patience: int) -> None:
    with pytest.raises(ConfigError, match=rf"train.early_stopping={patience}: a patience"):
        recipe_from_dict({"train": {"early_stopping": patience}})
