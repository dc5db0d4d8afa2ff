"""Feature-SP (``fseb.method: feature``): its loss against a hand-written one in float64, at the
training points and at the training and context points; φ0 out of the gradient; its settings;
and a tiny run that trains, evaluates, exports and predicts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as nnf
from torch import Tensor

from fseb_ft.finetune import run
from fseb_ft.method.methods import find_method
from fseb_ft.method.methods.feature import FeatureSP
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError
from fseb_ft.prediction import predict_images
from fseb_ft.prediction.loading import load_model
from fseb_ft.recipe import ConfigError, recipe_from_dict
from tests.helpers import TinyNet, tiny_recipe

pytestmark = pytest.mark.no_figures

N_TRAIN, PRIOR_VAR, REG_SCALE = 40, 0.3, 2.5
DIGITS = {"train": {"source": "sklearn_digits"}}


def _moved_net() -> tuple[TinyNet, TinyNet]:
    """A float64 TinyNet with BatchNorm and its copy at the start, every parameter moved."""
    torch.manual_seed(0)
    net = TinyNet(bn=True).double()
    start = TinyNet(bn=True).double()
    start.load_state_dict(net.state_dict())
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return net, start.eval()


def _batch(n: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,))


@pytest.mark.parametrize("points", ["train", "joint"])
def test_feature_sp_is_the_cross_entropy_plus_the_squared_feature_distance_to_phi0(
    points: str,
) -> None:
    net, start = _moved_net()
    x, y = _batch(8, 1)
    context = _batch(5, 2)[0] if points == "joint" else None
    objective = FSEBObjective(
        net,
        N_TRAIN,
        method="feature",
        reg_scale=REG_SCALE,
        prior_var=PRIOR_VAR,
        feature={"points": points},
        prior=start,
    )
    terms = objective(x, y, context)

    # By hand: θ's features in one training-mode pass over every point (BatchNorm sees them
    # all), φ0's in eval mode; the logits are the network's on x.
    inputs = x if context is None else torch.cat([x, context])
    h = net.forward_features(inputs)
    r_h = ((h - start.forward_features(inputs)) ** 2).sum()
    r_theta = sum((p**2).sum() for p in net.parameters()) / (2 * PRIOR_VAR)
    logits = net.head(h[:8])
    expected = nnf.cross_entropy(logits, y) + (REG_SCALE * r_h + r_theta) / N_TRAIN
    torch.testing.assert_close(terms["fs_reg"], r_h, rtol=1e-12, atol=0)
    torch.testing.assert_close(terms["param_reg"], r_theta, rtol=1e-12, atol=0)
    torch.testing.assert_close(terms["loss"], expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(terms["logits"], logits, rtol=1e-12, atol=0)
    assert float(r_h.detach()) > 0  # the moved network's features are away from φ0's


def test_the_gradient_reaches_theta_and_never_phi0() -> None:
    net, start = _moved_net()
    before = {n: p.clone() for n, p in start.named_parameters()}
    x, y = _batch(8, 1)
    objective = FSEBObjective(
        net, N_TRAIN, method="feature", feature={"points": "joint"}, prior=start
    )
    with pytest.raises(ValueError, match=r"^fseb.method='feature' with these settings draws"):
        objective(x, y)  # joint points: a context batch is needed
    # The method keeps no parameter of the network (its classifier is looked up per step).
    assert objective.trainable_parameters() == objective.model_parameters()
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=0.1)
    objective(x, y, _batch(5, 2)[0])["fs_reg"].backward()
    assert all(p.grad is None for p in start.parameters())
    assert float(net.body[0].weight.grad.abs().sum()) > 0
    optimizer.step()
    assert all(torch.equal(p, before[n]) for n, p in start.named_parameters())


def test_feature_sp_titles_its_runs_validates_its_keys_and_needs_a_classifier() -> None:
    recipe = recipe_from_dict({"data": DIGITS, "fseb": {"method": "feature"}})
    assert find_method("feature") is FeatureSP and FeatureSP.title(recipe.fseb) == "Feature-SP"
    assert recipe.fseb.feature.points == "train" and not FeatureSP.uses_context(recipe.fseb)
    assert "This model: Feature-SP with reg_scale=1, prior_var=1, at the training images " in (
        FeatureSP.card_text(recipe, None, None)
    )
    joint = recipe_from_dict(
        {"data": DIGITS, "fseb": {"method": "feature", "feature": {"points": "joint"}}}
    )
    assert FeatureSP.uses_context(joint.fseb)
    assert "and the context images" in FeatureSP.card_text(joint, None, None)
    for fseb, message in (
        ({"feature": {"points": "context"}}, r"^fseb.feature.points='context': allowed values"),
        ({"reg_scale": 0}, r"^fseb.reg_scale=0.0: must be > 0 with method feature \(0 is PS-MAP"),
        ({"param_noise_std": 0.1}, r"^fseb.param_noise_std=0.1: must be 0 with method feature"),
    ):
        with pytest.raises(ConfigError, match=message):
            recipe_from_dict({"data": DIGITS, "fseb": {"method": "feature", **fseb}})
    linear = torch.nn.Linear(6, 3)  # no get_classifier(): nothing maps the features to logits
    with pytest.raises(ModelPartsError, match=r"^fseb.method=feature needs the model's classifier"):
        FSEBObjective(linear, N_TRAIN, method="feature", feature_fn=lambda m, x: x)


def test_a_feature_sp_run_with_context_points_trains_evaluates_exports_and_predicts(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    raw = tiny_recipe(folders, tmp_path, epochs=1)
    raw["fseb"].update(method="feature", reg_scale=0.5, feature={"points": "joint"})
    results = run(recipe_from_dict(raw))

    assert results["training"]["history"][0]["train_fs_reg"] > 0
    assert 0 <= results["test"]["accuracy"] <= 1
    card = (tmp_path / "model" / "README.md").read_text()
    assert "with **Feature-SP**" in card and "DELTA: Li et al., ICLR 2019" in card
    assert "Feature-SP · test_byobnet" in (tmp_path / "results.md").read_text()
    images = sorted((folders["ind"] / "test").rglob("*.png"))[:2]
    assert load_model(tmp_path).model is not None
    assert len(predict_images(tmp_path, images, progress=False).rows) == 2
