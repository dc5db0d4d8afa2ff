"""``fseb.prior_std``: the prior stated as a logit's standard deviation, resolved into s and d."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import Tensor, nn

import fseb_ft.method.methods.fseb as fseb_method
from fseb_ft.finetune import run
from fseb_ft.method.context import mean_sq_feature_norm
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.regularizer import prior_std_of, resolve_prior
from fseb_ft.recipe import ConfigError, FSEBConfig, recipe_from_dict
from tests.helpers import tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


@pytest.mark.parametrize(
    ("scale", "diag", "m"),
    [(1e-5, 1e-2, 1060.0), (0.01, 1.0, 37.5), (1.0, 10.0, 0.0), (0.0, 2.0, 5.0), (3.0, 0.0, 9.0)],
)
def test_resolve_prior_reproduces_a_given_scale_and_diag(scale: float, diag: float, m: float):
    prior_std, share = prior_std_of(scale, diag, m)
    assert prior_std**2 == pytest.approx(scale * (m + 1) + diag, rel=1e-12)
    s, d = resolve_prior(prior_std, share, m)
    assert s == pytest.approx(scale, rel=1e-12, abs=1e-300)
    assert d == pytest.approx(diag, rel=1e-12, abs=1e-15)


def test_the_default_share_is_the_pretrained_reference_at_its_feature_norm():
    _, share = prior_std_of(1e-5, 1e-2, 1060.0)  # EfficientNet-Lite0 at 64 px (docs/method.md)
    assert abs(share - FSEBConfig().prior_feature_share) < 0.02


@pytest.mark.parametrize(
    ("prior_std", "share", "m"), [(0.0, 0.5, 1.0), (1.0, 1.5, 1.0), (1.0, 0.5, -1.0)]
)
def test_resolve_prior_rejects_values_outside_its_domain(prior_std: float, share: float, m: float):
    with pytest.raises(ValueError):
        resolve_prior(prior_std, share, m)


def test_prior_std_leaves_scale_and_diag_to_the_run_and_the_recipe_says_so():
    cfg = FSEBConfig(prior_std=0.3)
    assert cfg.prior_cov_scale is None and cfg.prior_cov_diag is None
    assert FSEBConfig(prior_std=0.3, prior_cov_scale=None, prior_cov_diag=None) == cfg
    assert FSEBConfig().prior_cov_scale == 1e-5  # unset prior_std: s and d as before


@pytest.mark.parametrize("key", ["prior_cov_scale", "prior_cov_diag"])
def test_prior_std_with_an_explicit_scale_or_diag_fails_naming_both(key: str, tmp_path: Path):
    raw = {"fseb": {"prior_std": 0.3, key: 0.5}, "output": {"dir": str(tmp_path)}}
    with pytest.raises(ConfigError, match=rf"fseb.prior_std and fseb.{key} are both set"):
        recipe_from_dict(raw)


@pytest.mark.parametrize(
    ("fseb", "key"),
    [
        ({"prior_std": 0.3, "prior_feature_share": 1.5}, "prior_feature_share"),
        ({"prior_feature_share": -0.1}, "prior_feature_share"),
        ({"prior_std": -1.0}, "prior_std"),
        ({"prior_cov_diag": None}, "prior_cov_diag"),
    ],
)
def test_invalid_prior_settings_fail_at_load(fseb: dict, key: str, tmp_path: Path):
    with pytest.raises(ConfigError, match=rf"fseb.{key}="):
        recipe_from_dict({"fseb": fseb, "output": {"dir": str(tmp_path)}})


class _ConstantPool(torch.utils.data.Dataset):
    """Image i is filled with the value i; ``reseed`` is recorded (a perturbed pool's hook)."""

    def __init__(self, n: int) -> None:
        self.n, self.reseeded = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tensor:
        return torch.full((1, 2, 2), float(i))  # (C, H, W)

    def reseed(self, seed: int) -> None:
        self.reseeded.append(seed)


def test_mean_sq_feature_norm_averages_over_a_seeded_sample():
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    obj = FSEBObjective(net, 10, feature_fn=lambda prior, x: x.flatten(1))  # ‖h_i‖² = 4 i²
    pool = _ConstantPool(6)
    m_all = mean_sq_feature_norm(pool, obj, "cpu", seed=3, batch_size=4)
    assert m_all == pytest.approx(4 * sum(i * i for i in range(6)) / 6, rel=1e-12)
    assert pool.reseeded == [3]
    big = _ConstantPool(50)
    first = mean_sq_feature_norm(big, obj, "cpu", seed=1, max_images=8)
    assert mean_sq_feature_norm(big, obj, "cpu", seed=1, max_images=8) == first
    assert first != pytest.approx(4 * sum(i * i for i in range(50)) / 50)  # a sample, not all


def test_a_run_with_prior_std_resolves_logs_and_uses_scale_and_diag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = tmp_path / "data"
    write_image_folder(root, "train", {"cat": 8, "dog": 8})
    write_image_folder(root, "test", {"cat": 3, "dog": 3})
    folders = {"ind": root, "ood": root}
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    del recipe["fseb"]["prior_cov_scale"], recipe["fseb"]["prior_cov_diag"]
    recipe["fseb"].update(prior_std=0.7, prior_feature_share=0.25)
    del recipe["data"]["ood"]
    used: list[tuple[float, float]] = []
    term = fseb_method.function_space_term

    def spy(logits: Tensor, features: Tensor, scale: float, diag: float, solver: str) -> Tensor:
        used.append((scale, diag))
        return term(logits, features, scale, diag, solver)

    monkeypatch.setattr(fseb_method, "function_space_term", spy)
    run(recipe_from_dict(recipe))

    out = tmp_path / "run"
    prior = json.loads((out / "run.json").read_text())["prior"]
    m, s, d = prior["mean_sq_norm"], prior["prior_cov_scale"], prior["prior_cov_diag"]
    assert m > 0 and prior["prior_std"] == 0.7 and prior["feature_share"] == 0.25
    assert s * (m + 1) + d == pytest.approx(0.49, rel=1e-12)
    assert s * (m + 1) == pytest.approx(0.25 * 0.49, rel=1e-12)
    assert used and set(used) == {(s, d)}
    saved = yaml.safe_load((out / "recipe.yaml").read_text())["fseb"]
    assert saved["prior_cov_scale"] is None and saved["prior_std"] == 0.7
    card = (out / "model" / "README.md").read_text()
    assert f"prior_cov_scale={s:g}" in card and "resolved from prior_std=0.7" in card
    meta = json.loads((out / "model" / "fseb.json").read_text())
    assert meta["prior"] == prior


def test_an_objective_from_a_prior_std_recipe_needs_its_covariance_set():
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    obj = FSEBObjective.from_config(
        net, 10, FSEBConfig(prior_std=0.5), feature_fn=lambda prior, x: x.flatten(1)
    )
    x, y = torch.randn(3, 1, 2, 2), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="set_prior_covariance"):
        obj(x, y, context=x)
    obj.set_prior_covariance(*resolve_prior(0.5, 0.5, 4.0))
    assert torch.isfinite(obj(x, y, context=x)["loss"])
