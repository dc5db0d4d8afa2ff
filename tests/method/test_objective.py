"""FSEBObjective: reg_scale 0 ≡ weight decay, σ 0 ≡ MAP, φ0 frozen, the timm interface."""

from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
import torch.nn.functional as nnf
from torch import nn

from fseb_ft.method.objective import FSEBObjective, timm_features
from fseb_ft.recipe import ConfigError, FSEBConfig, FSVIConfig
from tests.helpers import TinyNet

N_TRAIN = 500


def _batch(seed: int = 0, B: int = 8, M: int = 10) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, 6, generator=g, dtype=torch.float64),
        torch.randint(0, 3, (B,), generator=g),
        torch.randn(M, 6, generator=g, dtype=torch.float64),
    )


def _net(**kwargs: object) -> TinyNet:
    torch.manual_seed(0)
    return TinyNet(**kwargs).double()


def _naive_loss(
    net: TinyNet,
    prior: TinyNet,
    x,
    y,
    ctx,
    reg_scale: float,
    pv: float,
    s: float,
    d: float,
    reg_points: str = "context",
) -> torch.Tensor:
    """The design §1 loss written out with an explicit matrix inverse, float64."""
    at = ctx if reg_points == "context" else torch.cat([x, ctx])  # the points R_f is taken at
    H = prior.forward_features(at).detach()
    M = H.shape[0]
    Kc = s * (H @ H.T + torch.ones(M, M, dtype=H.dtype)) + d * torch.eye(M, dtype=H.dtype)
    F = net(at)
    r_f = 0.5 * torch.trace(F.T @ torch.linalg.inv(Kc) @ F)
    r_theta = sum((p**2).sum() for p in net.parameters()) / (2 * pv)
    return nnf.cross_entropy(net(x), y) + (reg_scale * r_f + r_theta) / N_TRAIN


def test_loss_equals_the_written_out_objective() -> None:
    net = _net()
    obj = FSEBObjective(net, N_TRAIN, reg_scale=2.0, prior_var=0.1, prior_cov_scale=0.01,
                        prior_cov_diag=1.0)  # fmt: skip
    x, y, ctx = _batch()
    # Move θ away from φ0 so the two models differ.
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3)
    out = obj(x, y, ctx)
    ref = _naive_loss(net, obj.prior, x, y, ctx, 2.0, 0.1, 0.01, 1.0)
    torch.testing.assert_close(out["loss"], ref, rtol=1e-10, atol=1e-12)
    assert set(out) == {"loss", "nll", "fs_reg", "param_reg", "logits"}
    assert out["logits"].shape == (8, 3)


@pytest.mark.parametrize("forward_mode", ["joint", "separate"])
def test_joint_reg_points_take_r_f_at_the_training_and_context_batch(forward_mode: str) -> None:
    net = _net()
    kw = {"reg_scale": 2.0, "prior_var": 0.1, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}
    obj = FSEBObjective(net, N_TRAIN, forward_mode=forward_mode, reg_points="joint", **kw)
    x, y, ctx = _batch()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3)
    ref = _naive_loss(net, obj.prior, x, y, ctx, 2.0, 0.1, 0.01, 1.0, reg_points="joint")
    out = obj(x, y, ctx)
    torch.testing.assert_close(out["loss"], ref, rtol=1e-10, atol=1e-12)
    assert out["logits"].shape == (8, 3)
    # Cached context features still work: only the training batch's are computed per step.
    cached = obj(x, y, ctx, context_features=obj.prior_features(ctx))
    torch.testing.assert_close(cached["loss"], ref, rtol=1e-10, atol=1e-12)
    context_only = FSEBObjective(net, N_TRAIN, forward_mode=forward_mode, prior=obj.prior, **kw)(
        x, y, ctx
    )
    assert out["fs_reg"] > context_only["fs_reg"]  # B more points, each a positive quadratic
    # The EB-VI path evaluates R_f at the same points: tiny σ agrees with the MAP value.
    sampled = {"param_noise_std": 1e-10, "likelihood_samples": 1, "reg_samples": 2}
    noisy = FSEBObjective(
        net,
        N_TRAIN,
        forward_mode=forward_mode,
        reg_points="joint",
        prior=obj.prior,
        **sampled,
        **kw,
    )
    torch.testing.assert_close(noisy(x, y, ctx)["loss"], ref, rtol=1e-6, atol=1e-8)


def test_reg_scale_zero_is_cross_entropy_plus_weight_decay() -> None:
    x, y, _ = _batch()
    net_a, net_b = _net(), _net()
    obj = FSEBObjective(net_a, N_TRAIN, reg_scale=0.0, prior_var=0.05)
    wd = 1.0 / (0.05 * N_TRAIN)
    opt_a = torch.optim.SGD(obj.trainable_parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(net_b.parameters(), lr=0.1, momentum=0.9, weight_decay=wd)
    for _ in range(3):
        opt_a.zero_grad()
        obj(x, y)["loss"].backward()
        opt_a.step()
        opt_b.zero_grad()
        nnf.cross_entropy(net_b(x), y).backward()
        opt_b.step()
    for pa, pb in zip(net_a.parameters(), net_b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-14)


def test_reg_scale_zero_needs_no_context_and_ignores_it() -> None:
    x, y, ctx = _batch()
    obj = FSEBObjective(_net(), N_TRAIN, reg_scale=0.0)
    a, b = obj(x, y), obj(x, y, ctx)
    assert a["fs_reg"] == 0 and b["fs_reg"] == 0
    torch.testing.assert_close(a["loss"], b["loss"])


def test_sigma_zero_is_exactly_map_and_tiny_sigma_is_numerically_map() -> None:
    x, y, ctx = _batch()
    net = _net()
    kw = {"reg_scale": 1.0, "prior_var": 0.1, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}
    ref = _naive_loss(net, _net(), x, y, ctx, 1.0, 0.1, 0.01, 1.0)
    exact = FSEBObjective(net, N_TRAIN, param_noise_std=0.0, **kw)(x, y, ctx)["loss"]
    torch.testing.assert_close(exact, ref, rtol=1e-12, atol=1e-12)
    # The paper's σ² = 1e-20 goes through the Monte-Carlo path and must agree with MAP.
    sampled = FSEBObjective(
        net, N_TRAIN, param_noise_std=1e-10, likelihood_samples=2, reg_samples=3, **kw
    )(x, y, ctx)
    torch.testing.assert_close(sampled["loss"], ref, rtol=1e-8, atol=1e-9)


def test_parameter_noise_draws_the_requested_samples_and_trains() -> None:
    x, y, ctx = _batch()
    net = _net()
    calls = []
    net.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    obj = FSEBObjective(
        net, N_TRAIN, param_noise_std=0.1, likelihood_samples=2, reg_samples=3,
        forward_mode="separate",
    )  # fmt: skip
    calls.clear()
    out = obj(x, y, ctx)
    assert sorted(calls) == [8, 8, 10, 10, 10]  # S = 2 likelihood, J = 3 regulariser forwards
    out["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    torch.manual_seed(1)
    again = obj(x, y, ctx)["loss"]
    assert not torch.allclose(out["loss"], again)  # a fresh draw each call


def test_prior_is_frozen_in_eval_and_outside_the_optimiser() -> None:
    net = _net(bn=True)
    obj = FSEBObjective(net, N_TRAIN, reg_scale=1.0, prior_cov_scale=0.01, prior_cov_diag=1.0)
    obj.train()
    assert net.training and not obj.prior.training
    assert all(not p.requires_grad for p in obj.prior.parameters())
    trainable = {id(p) for p in obj.trainable_parameters()}
    assert trainable == {id(p) for p in net.parameters()}
    assert not trainable & {id(p) for p in obj.prior.parameters()}
    before = {k: v.clone() for k, v in obj.prior.state_dict().items()}
    opt = torch.optim.SGD(obj.trainable_parameters(), lr=0.5)
    for seed in range(3):
        x, y, ctx = _batch(seed)
        opt.zero_grad()
        obj(x, y, ctx)["loss"].backward()
        opt.step()
    for k, v in obj.prior.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)  # incl. BN running stats
    assert any(not torch.equal(p, before[n]) for n, p in net.named_parameters())


def test_joint_and_separate_agree_without_batchnorm_and_cached_features_match() -> None:
    x, y, ctx = _batch()
    net = _net()
    kw = {"reg_scale": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}
    joint = FSEBObjective(net, N_TRAIN, forward_mode="joint", **kw)
    sep = FSEBObjective(net, N_TRAIN, forward_mode="separate", **kw)
    torch.testing.assert_close(joint(x, y, ctx)["loss"], sep(x, y, ctx)["loss"])
    cached = joint.prior_features(ctx)
    assert not cached.requires_grad
    torch.testing.assert_close(
        joint(x, y, ctx, context_features=cached)["loss"], joint(x, y, ctx)["loss"]
    )


def test_init_anchor_is_zero_at_the_start() -> None:
    x, y, _ = _batch()
    obj = FSEBObjective(_net(), N_TRAIN, param_anchor="init", reg_scale=0.0)
    assert obj(x, y)["param_reg"] == 0


def test_works_with_a_real_timm_model_and_any_module_with_a_feature_fn() -> None:
    model = timm.create_model("resnet10t", pretrained=False, num_classes=4)
    obj = FSEBObjective(model, N_TRAIN, reg_scale=1.0)
    x, ctx = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 32, 32)
    assert obj.prior_features(ctx).shape == (3, model.num_features)
    torch.testing.assert_close(timm_features(obj.prior, ctx), obj.prior_features(ctx))
    obj.train()
    out = obj(x, torch.tensor([0, 3]), ctx)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])

    plain = nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 2))
    with pytest.raises(TypeError, match="feature_fn"):
        FSEBObjective(plain, N_TRAIN)
    obj = FSEBObjective(plain, N_TRAIN, feature_fn=lambda m, inp: m[:3](inp))
    out = obj(torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 1, 0]), torch.randn(5, 3, 2, 2))
    assert torch.isfinite(out["loss"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reg_scale": -1.0}, "reg_scale"),
        ({"prior_var": 0.0}, "prior_var"),
        ({"forward_mode": "both"}, "forward_mode"),
        ({"reg_points": "train"}, r"reg_points='train': allowed values are \['context', 'joint'\]"),
        ({"param_anchor": "pretrained"}, "param_anchor"),
        ({"likelihood_samples": 0}, "likelihood_samples"),
    ],
)
def test_bad_settings_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FSEBObjective(_net(), N_TRAIN, **kwargs)


def test_missing_context_is_a_clear_error() -> None:
    x, y, _ = _batch()
    with pytest.raises(ValueError, match="context"):
        FSEBObjective(_net(), N_TRAIN, reg_scale=1.0)(x, y)


def test_the_hyper_parameters_are_the_recipe_section_given_or_as_keywords() -> None:
    cfg = FSEBConfig(reg_scale=0.5, prior_cov_diag=3.0, solver="cholesky")
    assert FSEBObjective(_net(), N_TRAIN).config == FSEBConfig()
    assert FSEBObjective(_net(), N_TRAIN, cfg).config == cfg
    assert FSEBObjective.from_config(_net(), N_TRAIN, cfg).config == cfg
    keywords = {"reg_scale": 0.5, "prior_cov_diag": 3.0, "solver": "cholesky"}
    assert FSEBObjective(_net(), N_TRAIN, **keywords).config == cfg
    # Keywords replace the config's fields, and every field is one.
    both = FSEBObjective(_net(), N_TRAIN, cfg, reg_scale=2, forward_mode="separate").config
    assert both == dataclasses.replace(cfg, reg_scale=2.0, forward_mode="separate")
    resolved = FSEBObjective(_net(), N_TRAIN, prior_std=0.5)
    assert (resolved.prior_cov_scale, resolved.prior_cov_diag) == (None, None)
    with pytest.raises(TypeError, match=r"\['reg_scal'\]; its hyper-parameters are FSEBConfig"):
        FSEBObjective(_net(), N_TRAIN, reg_scal=1.0)
    with pytest.raises(TypeError, match="config must be an FSEBConfig"):
        FSEBObjective(_net(), N_TRAIN, {"reg_scale": 1.0})


def test_every_hyper_parameter_reads_as_an_attribute_and_is_the_configs() -> None:
    cfg = FSEBConfig(
        reg_scale=0.5,
        prior_var=2.0,
        forward_mode="separate",
        reg_points="joint",
        param_anchor="init",
        solver="woodbury",
        fsvi=FSVIConfig(predict_samples=3),
    )
    objective = FSEBObjective(_net(), N_TRAIN, cfg, prior_cov_diag=3.0)
    for field in dataclasses.fields(FSEBConfig):
        assert getattr(objective, field.name) == getattr(objective.config, field.name), field.name
    assert (objective.solver, objective.prior_var, objective.prior_cov_diag) == ("woodbury", 2, 3)
    fsvi = FSEBObjective(_net(), N_TRAIN, method="fsvi", fsvi={"variance": "all"})
    assert (fsvi.method, fsvi.fsvi.variance, fsvi.fsvi.init_std) == ("fsvi", "all", 1e-3)

    # A hyper-parameter is fixed: setting one says so (the loss reads the config); s and d of Kc
    # are the objective's own, resolved per run.
    with pytest.raises(AttributeError, match=r"reg_scale is its config's .* reg_scale=0\.0\)"):
        objective.reg_scale = 0.0
    assert objective.reg_scale == 0.5 and "reg_scale" not in vars(objective)
    objective.set_prior_covariance(0.25, 4.0)
    assert (objective.prior_cov_scale, objective.prior_cov_diag) == (0.25, 4.0)
    assert objective.config.prior_cov_scale == cfg.prior_cov_scale  # the recipe's, unchanged


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"solver": "lu"}, r"solver='lu': allowed values are \['auto', 'cholesky', 'woodbury'\]"),
        ({"fsvi": {"init_std": 0.0}}, r"fsvi.init_std=0.0: must be > 0"),
        ({"fsvi": {"predict_samples": 0}}, r"fsvi.predict_samples=0: must be ≥ 1"),
        ({"likelihood_samples": 1.5}, r"likelihood_samples=1.5: expected an integer"),
        ({"prior_cov_scale": 0.0, "prior_cov_diag": 0.0}, "cannot both be 0"),
        ({"method": "fsvi", "reg_scale": 0.0}, r"reg_scale=0.0: must be > 0 with method fsvi"),
        ({"method": "fsvi", "reg_points": "joint"}, r"reg_points='joint': must be 'context'"),
    ],
)
def test_the_objective_checks_every_rule_of_the_recipe_section(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FSEBObjective(_net(), N_TRAIN, **kwargs)


def test_a_config_built_by_hand_is_checked_as_a_recipe_is() -> None:
    unchecked = FSEBConfig(solver="lu", forward_mode="both")  # Literal types: no check here
    with pytest.raises(ConfigError, match=r"forward_mode='both': allowed values are"):
        FSEBObjective(_net(), N_TRAIN, unchecked)


def test_replace_model_takes_the_wrapped_network_and_refuses_another() -> None:
    class Wrapper(nn.Module):  # what DDP and Accelerate's prepare look like to unwrap_model
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    net = _net()
    obj = FSEBObjective(net, N_TRAIN)
    wrapped = Wrapper(net)
    obj.replace_model(wrapped, "cpu")
    assert obj.model is wrapped
    with pytest.raises(ValueError, match="same network"):
        obj.replace_model(_net())
