"""The EMA of the weights (``train.ema_decay``, the ``WeightEMA`` callback on timm's
``ModelEmaV3``): the average, what validation and the export use, and resuming it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from fseb_ft.engine.callbacks import Callback, TrainerView, TrainState, Validation
from fseb_ft.engine.ema import WeightEMA
from fseb_ft.finetune import run
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ConfigError, recipe_from_dict
from tests.helpers import (
    TinyNet,
    kill_after_checkpoint,
    tiny_recipe,
)

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_average_is_the_hand_computed_ema_of_parameters_and_buffers() -> None:
    torch.manual_seed(0)
    model = TinyNet(bn=True).double()
    objective = FSEBObjective(model, 10, reg_scale=1.0)
    phi0 = _state(objective.prior)
    trainer = SimpleNamespace(objective=objective, state=TrainState())
    decay = 0.8
    ema = WeightEMA(model, decay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    expected: dict[str, torch.Tensor] = {}
    for step in range(1, 5):
        x = torch.randn(8, 6, dtype=torch.float64)
        model.train()
        optimizer.zero_grad()
        model(x).square().mean().backward()  # BatchNorm's running statistics move too
        optimizer.step()
        trainer.state.step = step
        ema.on_step_end(trainer, {})
        theta = _state(model)
        # timm's first update copies θ_1; then e_t = d · e_{t−1} + (1 − d) · θ_t
        expected = {
            k: v
            if step == 1 or not v.is_floating_point()
            else decay * expected[k] + (1 - decay) * v
            for k, v in theta.items()
        }
    averaged = ema.ema.module.state_dict()
    assert averaged.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(averaged[key], value, rtol=1e-12, atol=1e-12, msg=key)
    assert not torch.equal(averaged["head.weight"], model.head.weight)  # an average, not a copy
    assert averaged["norm.num_batches_tracked"] == 4  # an integer buffer is copied
    for key, value in objective.prior.state_dict().items():  # φ0 is not averaged
        assert torch.equal(value, phi0[key]), key


class SeenWeights(Callback):
    """The network's weights at each validation and each epoch end, and the EMA's then."""

    def __init__(self) -> None:
        self.validated: list[dict[str, torch.Tensor]] = []
        self.averages: list[dict[str, torch.Tensor]] = []
        self.trained: list[dict[str, torch.Tensor]] = []

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        ema = next(c for c in trainer.callbacks if isinstance(c, WeightEMA))
        self.validated.append(_state(trainer.objective.model))
        self.averages.append(_state(ema.ema.module))

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        self.trained.append(_state(trainer.objective.model))


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _recipe(folders: dict[str, Path], out: Path, **train: object) -> dict:
    raw = tiny_recipe(folders, out)
    del raw["data"]["ood"]
    raw["train"].update(ema_decay=0.5, **train)
    return raw


def test_a_run_validates_selects_and_exports_the_average(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    seen = SeenWeights()
    results = run(recipe_from_dict(_recipe(folders, tmp_path / "run")), callbacks=[seen])
    assert len(seen.validated) == 2
    for validated, average, trained in zip(
        seen.validated, seen.averages, seen.trained, strict=True
    ):
        assert _equal(validated, average) and not _equal(average, trained)
    best = results["training"]["best_epoch"] - 1
    exported = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert _equal(exported, {k: v for k, v in seen.averages[best].items() if k in exported})
    # The checkpoint holds the trained weights (training goes on from them) and the average.
    checkpoint = tmp_path / "run" / "checkpoints" / "epoch-0002"
    assert _equal(load_file(checkpoint / "model.safetensors"), seen.trained[-1])
    # custom_checkpoint_0 is the schedule
    saved = torch.load(checkpoint / "custom_checkpoint_1.pkl", weights_only=True)
    assert _equal({k.removeprefix("module."): v for k, v in saved.items()}, seen.averages[-1])


def test_ema_eval_false_validates_and_exports_the_trained_weights(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    raw = _recipe(folders, tmp_path / "run", ema_eval=False, epochs=1)
    seen = SeenWeights()
    run(recipe_from_dict(raw), callbacks=[seen], evaluate_test=False)
    assert _equal(seen.validated[0], seen.trained[0])
    assert not _equal(seen.averages[0], seen.trained[0])
    exported = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert _equal(exported, {k: v for k, v in seen.trained[0].items() if k in exported})
    record = json.loads((tmp_path / "run" / "run.json").read_text())["training"]["history"][0]
    assert 0 <= record["val_ema_accuracy"] <= 1 and record["val_ema_nll"] > 0


def test_a_killed_run_with_an_ema_resumes_bit_identically(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(recipe_from_dict(_recipe(folders, straight)), evaluate_test=False)
    kill_after_checkpoint(monkeypatch)  # the first epoch's
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(_recipe(folders, resumed)), evaluate_test=False)
    run(recipe_from_dict(_recipe(folders, resumed)), evaluate_test=False)
    for name in (
        "checkpoints/epoch-0002/model.safetensors",
        "model/model.safetensors",
    ):
        assert _equal(load_file(straight / name), load_file(resumed / name)), name
    name = "checkpoints/epoch-0002/custom_checkpoint_1.pkl"
    a, b = (torch.load(d / name, weights_only=True) for d in (straight, resumed))
    assert _equal(a, b)
    histories = [
        [
            {k: v for k, v in r.items() if k != "seconds"}
            for r in json.loads((d / "run.json").read_text())["training"]["history"]
        ]
        for d in (straight, resumed)
    ]
    assert histories[0] == histories[1]


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_the_recipe_refuses_a_decay_outside_0_1(decay: float) -> None:
    with pytest.raises(ConfigError, match=rf"train.ema_decay={decay!r}: must be in \(0, 1\)"):
        recipe_from_dict({"train": {"ema_decay": decay}})
