"""model.freeze and train.linear_probe_epochs (LP-FT): which parameters timm's groups freeze;
frozen parameters (and BatchNorm statistics, and momentum) bit-identical through the linear
probe, then trained; a run killed mid-LP-FT resumes to the same weights; the errors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import load_file

from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.engine.freezing import Freeze
from fseb_ft.finetune import run
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError, frozen_names, head_names, layer_decay_groups
from fseb_ft.recipe import ConfigError, recipe_from_dict
from tests.helpers import (
    TinyNet,
    image_folders,
    kill_after_checkpoint,
    tiny_recipe,
)

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

_ONE_PROCESS = SimpleNamespace(num_processes=1, unwrap_model=lambda m: m)


def test_frozen_names_follow_timms_groups() -> None:
    model = timm.create_model("resnet10t", num_classes=3)
    names = [n for n, _ in model.named_parameters()]
    assert frozen_names(model, "none") == []
    assert frozen_names(model, "backbone") == [n for n in names if not n.startswith("fc.")]
    two = frozen_names(model, 2)  # the stem and the first stage
    assert two == [n for n in names if n.startswith(("conv1.", "bn1.", "layer1."))]
    assert frozen_names(model, 4)[-1].startswith("layer3.")
    with pytest.raises(ModelPartsError, match=r"^model.freeze=5: .* has 5 stages .* use 1–4"):
        frozen_names(model, 5, "resnet10t")
    assert frozen_names(TinyNet(), "backbone") == ["body.0.weight", "body.0.bias"]
    with pytest.raises(ModelPartsError, match=r"^model.freeze needs .*group_matcher"):
        frozen_names(TinyNet(), 1, "tiny")


def _distilled_deit() -> torch.nn.Module:
    """A tiny DeiT whose get_classifier() is a tuple: (head, head_dist)."""
    return timm.create_model(
        "deit_tiny_distilled_patch16_224",
        img_size=32,
        embed_dim=24,
        depth=2,
        num_heads=2,
        num_classes=3,
    )


def test_a_two_headed_classifier_is_the_head_and_the_rest_freezes() -> None:
    model = _distilled_deit()
    assert isinstance(model.get_classifier(), tuple)
    names = [n for n, _ in model.named_parameters()]
    heads = [n for n in names if n.startswith(("head.", "head_dist."))]
    assert len(heads) == 4
    assert frozen_names(model, "backbone") == [n for n in names if n not in heads]
    freeze = Freeze(frozen_names(model, "backbone"), head_names(model), 0)
    trainer = SimpleNamespace(objective=SimpleNamespace(model=model), accelerator=_ONE_PROCESS)
    freeze.on_epoch_begin(trainer, 0)
    model(torch.randn(2, 3, 32, 32)).sum().backward()  # the heads still get gradients
    assert {n for n, p in model.named_parameters() if p.grad is not None} == set(heads)
    scales = {
        id(p): g["lr_scale"] for g in layer_decay_groups(model, 0.1, 0.5) for p in g["params"]
    }
    assert {scales[id(p)] for n, p in model.named_parameters() if n in heads} == {1.0}


def test_a_model_without_classifier_parameters_stops_with_one_line() -> None:
    model = TinyNet()
    model.head = torch.nn.Identity()
    with pytest.raises(ModelPartsError, match=r"^model.freeze needs the model's classifier"):
        frozen_names(model, "backbone", "tiny")


def test_the_end_of_training_restores_the_models_own_requires_grad_flags() -> None:
    model = TinyNet()
    model.body[0].bias.requires_grad_(False)  # fixed by design, not by model.freeze
    trainer = SimpleNamespace(objective=SimpleNamespace(model=model), accelerator=_ONE_PROCESS)
    freeze = Freeze(["body.0.weight", "body.0.bias"], ["head.weight", "head.bias"], 0)
    freeze.on_train_begin(trainer)
    freeze.on_epoch_begin(trainer, 0)
    assert not model.body[0].weight.requires_grad
    freeze.on_train_end(trainer)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert flags == {
        "body.0.weight": True,
        "body.0.bias": False,
        "head.weight": True,
        "head.bias": True,
    }


def test_parameter_prior_anchors_each_trainable_parameter_at_its_own_start() -> None:
    torch.manual_seed(0)
    model = TinyNet()
    objective = FSEBObjective(model, 10, reg_scale=0.0, prior_var=1.0, param_anchor="init")
    with torch.no_grad():
        model.head.weight.add_(1.0)
        model.body[0].weight.add_(5.0)
    model.body.requires_grad_(False)  # frozen: a constant of the loss, outside R_θ
    terms = objective(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))
    assert float(terms["param_reg"].detach()) == pytest.approx(model.head.weight.numel() / 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": {"freeze": 0}}, r"model.freeze=0: none, backbone, or the number"),
        ({"model": {"freeze": "head"}}, r"model.freeze='head'"),
        ({"train": {"linear_probe_epochs": 2}}, r"linear_probe_epochs=2: .* below train.epochs"),
        (
            {"train": {"linear_probe_epochs": 1}, "model": {"freeze": "backbone"}},
            r"linear_probe_epochs=1: must be 0 with model.freeze=backbone",
        ),
        (
            {"fseb": {"method": "fsvi", "fsvi": {"variance": "all"}}, "model": {"freeze": 1}},
            r"^fseb.fsvi.variance='all': needs model.freeze=none and train.linear_probe_epochs=0",
        ),
        (
            {
                "fseb": {"method": "fsvi", "fsvi": {"variance": "all"}},
                "train": {"epochs": 2, "linear_probe_epochs": 1},
            },
            r"^fseb.fsvi.variance='all': needs model.freeze=none",
        ),
    ],
)
def test_recipe_errors(overrides: dict[str, dict[str, Any]], message: str, tmp_path: Path) -> None:
    recipe = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "out")
    for section, values in overrides.items():
        recipe[section] = recipe[section] | values
    with pytest.raises(ConfigError, match=message):
        recipe_from_dict(recipe)


class Snapshots(Callback):
    """The model's state (parameters and buffers) at the start and after each epoch, and which
    parameters have optimiser state (momentum) after each epoch."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []
        self.with_momentum: list[set[str]] = []

    def _model(self, trainer: TrainerView) -> torch.nn.Module:
        return trainer.accelerator.unwrap_model(trainer.objective.model)

    def on_train_begin(self, trainer: TrainerView) -> None:
        self.states.append({k: v.clone() for k, v in self._model(trainer).state_dict().items()})

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        model = self._model(trainer)
        self.states.append({k: v.clone() for k, v in model.state_dict().items()})
        optimizer = trainer.parts.optimizer  # type: ignore[attr-defined]
        self.with_momentum.append(
            {n for n, p in model.named_parameters() if optimizer.state.get(p)}
        )

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_folders(
        tmp_path_factory.mktemp("data"), {"cat": 8, "dog": 8}, {"cat": 3, "dog": 3}, owls=3
    )


def _lpft(folders: dict[str, Path], out: Path) -> dict[str, Any]:
    recipe = tiny_recipe(folders, out, epochs=3)
    recipe["model"]["freeze"] = 1  # the stem, throughout
    recipe["train"]["linear_probe_epochs"] = 2
    return recipe


@pytest.fixture(scope="module")
def straight(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An LP-FT run trained straight through, and its snapshots."""
    out, snaps = tmp_path_factory.mktemp("straight"), Snapshots()
    run(recipe_from_dict(_lpft(folders, out)), callbacks=[snaps])
    return out, snaps


def test_linear_probe_keeps_the_rest_bit_identical_then_fine_tunes(straight: Any) -> None:
    start, *epochs = straight[1].states
    head = {k for k in start if k.startswith("head.")}
    stem = {k for k in start if k.startswith("stem.")}
    for state in epochs[:2]:  # the linear probe: all but the head, buffers too
        assert {k for k in start if not torch.equal(start[k], state[k])} <= head
    assert all(not torch.equal(start[k], epochs[0][k]) for k in ("head.fc.weight",))
    assert all(torch.equal(start[k], epochs[2][k]) for k in stem)  # frozen throughout
    moved = {k for k in start if not torch.equal(epochs[1][k], epochs[2][k])}
    assert any(k.startswith("stages.") and k.endswith(".weight") for k in moved)
    assert any(k.endswith("running_mean") and k.startswith("stages.") for k in moved)
    momentum_lp, _, momentum_ft = straight[1].with_momentum
    assert momentum_lp == {"head.fc.weight", "head.fc.bias"}
    assert not any(n.startswith("stem.") for n in momentum_ft)
    assert any(n.startswith("stages.") for n in momentum_ft)


def test_a_run_killed_mid_linear_probe_resumes_to_the_same_weights(
    folders: dict[str, Path], straight: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resumed = tmp_path / "resumed"
    kill_after_checkpoint(monkeypatch)  # the first epoch's, inside the linear probe
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(_lpft(folders, resumed)))
    monkeypatch.undo()
    run(recipe_from_dict(_lpft(folders, resumed)))
    for name in ("checkpoints/epoch-0003/model.safetensors", "model/model.safetensors"):
        a, b = load_file(straight[0] / name), load_file(resumed / name)
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key].numpy(), b[key].numpy()), f"{name}: {key}"
