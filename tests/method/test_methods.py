"""The methods' registry (the recipe's option list names exactly the registered methods) and
L2-SP's loss against a hand-written one, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as nnf

from fseb_ft.method.methods import find_method
from fseb_ft.method.methods.l2sp import L2SP
from fseb_ft.method.methods.registry import METHODS, TrainingMethod, register_method
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError
from fseb_ft.recipe import ConfigError, options, recipe_from_dict
from tests.helpers import TinyNet

N_TRAIN, PRIOR_VAR = 40, 0.3


def test_the_registry_names_the_recipes_methods_each_in_its_own_module() -> None:
    assert sorted(METHODS) == sorted(options.METHODS), "options.METHODS and the registry differ"
    assert tuple(options.METHOD_SUMMARIES) == options.METHODS, "fseb-ft --help's list differs"
    for name, registered in METHODS.items():
        assert registered.name == name
        assert registered.__module__ == f"fseb_ft.method.methods.{name}"


def test_an_unknown_method_fails_in_one_line_and_a_name_registers_once() -> None:
    with pytest.raises(ConfigError, match=r"^fseb.method='nope': allowed values are \["):
        recipe_from_dict(
            {"data": {"train": {"source": "sklearn_digits"}}, "fseb": {"method": "nope"}}
        )
    with pytest.raises(
        ValueError, match=r"^fseb.method='nope': allowed values are \['feature', 'fseb'"
    ):
        find_method("nope")
    with pytest.raises(ValueError, match=r"method 'l2sp' is registered twice"):
        register_method("l2sp")(TrainingMethod)


def _moved_net() -> tuple[TinyNet, TinyNet]:
    """A float64 TinyNet and its copy at the start, every parameter moved from there."""
    torch.manual_seed(0)
    net = TinyNet().double()
    start = TinyNet().double()
    start.load_state_dict(net.state_dict())
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return net, start


def test_l2sp_is_the_cross_entropy_plus_decay_towards_the_start_and_the_head_towards_zero() -> None:
    net, start = _moved_net()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=g)
    objective = FSEBObjective(net, N_TRAIN, method="l2sp", prior_var=PRIOR_VAR, prior=start)
    terms = objective(x, y)  # no context: L2-SP draws none

    body = sum(((net.body[0].get_parameter(n) - start.body[0].get_parameter(n)) ** 2).sum()
               for n in ("weight", "bias"))  # fmt: skip
    head = (net.head.weight**2).sum() + (net.head.bias**2).sum()  # the new head: towards zero
    r_theta = (body + head) / (2 * PRIOR_VAR)
    expected = nnf.cross_entropy(net(x), y) + r_theta / N_TRAIN
    torch.testing.assert_close(terms["param_reg"], r_theta, rtol=1e-12, atol=0)
    torch.testing.assert_close(terms["loss"], expected, rtol=1e-12, atol=0)
    assert float(terms["fs_reg"]) == 0.0 and terms["logits"].shape == (8, 3)
    assert objective.trainable_parameters() == objective.model_parameters()
    assert objective.method_state() == {} and objective.predictor(3) is net

    # PS-MAP's fseb.param_anchor=init anchors the head at its start too: another R_θ.
    init = FSEBObjective(
        net, N_TRAIN, reg_scale=0.0, param_anchor="init", prior_var=PRIOR_VAR, prior=start
    )
    assert not torch.allclose(init(x, y)["param_reg"], r_theta)


def test_l2sp_titles_its_runs_and_needs_a_classifier() -> None:
    recipe = recipe_from_dict(
        {"data": {"train": {"source": "sklearn_digits"}}, "fseb": {"method": "l2sp"}}
    )
    assert find_method("l2sp") is L2SP and L2SP.title(recipe.fseb) == "L2-SP"
    assert not L2SP.uses_context(recipe.fseb)
    unused = recipe_from_dict(  # reg_scale is not L2-SP's: 0 does not make it PS-MAP
        {
            "data": {"train": {"source": "sklearn_digits"}},
            "fseb": {"method": "l2sp", "reg_scale": 0},
        }
    )
    assert not unused.fseb.is_ps_map and L2SP.title(unused.fseb) == "L2-SP"
    assert "This model: L2-SP with prior_var=1." in L2SP.card_text(recipe, None, None)
    linear = torch.nn.Linear(6, 3)  # no get_classifier(): no head to decay towards zero
    with pytest.raises(ModelPartsError, match=r"^fseb.method=l2sp needs the model's classifier"):
        FSEBObjective(linear, N_TRAIN, method="l2sp", feature_fn=lambda m, x: x)
