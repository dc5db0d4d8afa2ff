"""optim.layer_decay: the optimiser's groups are timm's layer-decay groups, each at its scaled
learning rate with no decoupled decay; FS-VI's ρ at the classifier's; a model without timm's
group_matcher stops with one line."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

from fseb_ft.engine.optimizers import build_optimizer, build_scheduler
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError
from fseb_ft.recipe import ConfigError, OptimConfig
from tests.helpers import TinyNet


def _scales(model: torch.nn.Module, optimizer: torch.optim.Optimizer, key: str) -> dict[str, float]:
    """Each parameter's group value ``key`` (``lr_scale``, or ``lr`` divided by 0.1), by name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: g[key] / (0.1 if key == "lr" else 1.0)
        for g in optimizer.param_groups
        for p in g["params"]
    }


@pytest.mark.parametrize("name", ["resnet10t", "test_byobnet"])
def test_groups_equal_timms_layer_decay(name: str) -> None:
    model = timm.create_model(name, num_classes=3)
    for opt in ("sgd", "adamw"):
        cfg = OptimConfig(name=opt, lr=0.1, layer_decay=0.75)
        ours = build_optimizer(cfg, list(model.parameters()), model, name)
        theirs = create_optimizer_v2(model, opt=opt, lr=0.1, weight_decay=0.0, layer_decay=0.75)
        assert _scales(model, ours, "lr") == pytest.approx(_scales(model, theirs, "lr_scale"))
        assert all(g["weight_decay"] == 0.0 for g in ours.param_groups)
    scales = _scales(model, ours, "lr")
    head = [n for n in scales if n.startswith(("fc.", "head."))]
    assert {scales[n] for n in head} == {1.0}
    assert min(scales.values()) < 0.75**3  # the stem learns slowest

    # The schedule scales every group alike: the ratios stay.
    scheduler = build_scheduler(OptimConfig(lr=0.1, warmup_steps=4), ours, 10)
    ratio = [g["lr"] / g["initial_lr"] for g in ours.param_groups]
    ours.step()  # no gradients: nothing moves
    scheduler.step()
    ratio_after = [g["lr"] / g["initial_lr"] for g in ours.param_groups]
    assert len(set(ratio)) == len(set(ratio_after)) == 1 and ratio != ratio_after


def test_off_is_one_group_and_each_fsvi_rho_learns_at_its_parameters_rate() -> None:
    model = timm.create_model("test_byobnet", num_classes=3)
    plain = build_optimizer(OptimConfig(lr=0.1), list(model.parameters()), model, "x")
    assert len(plain.param_groups) == 1 and plain.param_groups[0]["lr"] == 0.1

    objective = FSEBObjective(model, 10, method="fsvi", fsvi={"variance": "all"})
    q = objective.algorithm.q
    rho = dict(zip(q.names, q.rho, strict=True))
    params = objective.trainable_parameters()
    optimizer = build_optimizer(OptimConfig(lr=0.1, layer_decay=0.5), params, model, "x", rho)
    lr = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert {lr[id(r)] for r in rho.values()} != {0.1}  # not all at the classifier's rate
    assert all(lr[id(r)] == lr[id(named[n])] for n, r in rho.items())
    held = sum(len(g["params"]) for g in optimizer.param_groups)
    assert held == len(params)


def test_layer_decay_without_a_model_stops_rather_than_being_dropped() -> None:
    model = TinyNet()
    with pytest.raises(ModelPartsError, match=r"^optim.layer_decay needs"):
        build_optimizer(OptimConfig(layer_decay=0.75), list(model.parameters()), None)


def test_a_model_without_group_matcher_stops_with_one_line() -> None:
    model = TinyNet()
    cfg = OptimConfig(layer_decay=0.75)
    with pytest.raises(ModelPartsError, match=r"^optim.layer_decay needs .*'tiny'") as err:
        build_optimizer(cfg, list(model.parameters()), model, "tiny")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [0.0, 1.5, -0.5])
def test_recipe_refuses_a_layer_decay_outside_0_1(value: float) -> None:
    with pytest.raises(ConfigError, match=r"layer_decay=.*must be in \(0, 1\] or null"):
        OptimConfig(layer_decay=value)
