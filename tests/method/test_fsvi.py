"""FS-VI's function-space KL against naive float64 references, and its σ → 0 limit (FS-EB)."""

from __future__ import annotations

import copy
import dataclasses
import errno
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd.functional import jacobian
from torch.func import functional_call

import fseb_ft.engine.run as run_module
import fseb_ft.runs.rundir as rundir
from fseb_ft.method.fsvi import FUNCTION_JITTER, function_kl, inverse_softplus, softplus_std
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.regularizer import function_space_term, prior_covariance
from fseb_ft.method.variational import (
    MCPredictive,
    MeanFieldGaussian,
    _jacobian_covariance,
    context_moments,
    variance_parameters,
)
from fseb_ft.recipe import ConfigError, DataConfig, DatasetSpec, Recipe, TrainConfig
from fseb_ft.runs.atomic import DiskFullError
from fseb_ft.runs.loading import run_predictor
from fseb_ft.runs.rundir import MODEL_DIR, read_method_state, write_method_state
from tests.helpers import TinyNet

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

M, K, D_IN, HIDDEN = 6, 3, 4, 5
S, DIAG = 0.3, 0.7


def _tiny_net() -> TinyNet:
    """The two-layer MLP the tests draw under their seed: D_IN → HIDDEN (tanh) → K."""
    return TinyNet(d_in=D_IN, width=HIDDEN, k=K).double()


def _setup(seed: int = 0, scope: str = "all") -> tuple[TinyNet, MeanFieldGaussian, torch.Tensor]:
    torch.manual_seed(seed)
    net = _tiny_net()
    q = MeanFieldGaussian(variance_parameters(net, scope), init_std=0.1)
    with torch.no_grad():  # a different σ per parameter, so the diag(σ²) weighting is tested
        for rho in q.rho:
            rho.copy_(inverse_softplus(0.05 + 0.3 * torch.rand_like(rho)))
    context = torch.randn(M, D_IN, dtype=torch.float64)
    return net, q, context


def _naive_kl(net: TinyNet, q: MeanFieldGaussian, context: torch.Tensor, H: torch.Tensor):
    """Explicit Jacobian (autograd.functional) and the textbook Gaussian KL, in float64."""
    names = q.names
    shapes = [p.shape for p in q.rho]
    flat = torch.cat([dict(net.named_parameters())[n].detach().flatten() for n in names])

    def logits(theta: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for n, shape in zip(names, shapes, strict=True):
            params[n] = theta[i : i + shape.numel()].view(shape)
            i += shape.numel()
        return functional_call(net, params, (context,))  # (M, K)

    J = jacobian(logits, flat)  # (M, K, P)
    var = torch.cat([s.detach().flatten() ** 2 for s in q.stds().values()])  # (P,)
    mean = logits(flat).detach()  # (M, K)
    Kc = S * (H @ H.T + 1) + DIAG * torch.eye(M, dtype=torch.float64)
    Kinv = torch.linalg.inv(Kc)
    total = torch.zeros((), dtype=torch.float64)
    for k in range(K):
        Sk = J[:, k] @ torch.diag(var) @ J[:, k].T + FUNCTION_JITTER * torch.eye(M).double()
        m = mean[:, k]
        total += 0.5 * (
            torch.trace(Kinv @ Sk) + m @ Kinv @ m - M + torch.logdet(Kc) - torch.logdet(Sk)
        )
    return total


def test_kl_matches_naive_float64_reference() -> None:
    net, q, context = _setup()
    H = torch.randn(M, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mean, cov = context_moments(net, q, context, "all", lambda m, x: m.forward_features(x))
    kl = function_kl(mean, cov, H, S, DIAG)
    assert kl.dtype == torch.float64
    torch.testing.assert_close(kl, _naive_kl(net, q, context, H), rtol=1e-9, atol=1e-9)


def test_head_scope_covariance_equals_its_jacobian() -> None:
    """The head's closed form ``H diag(σ²_w) Hᵀ + σ²_b`` is ``J diag(σ²) Jᵀ`` of its Jacobian."""
    net, q, context = _setup(scope="head")
    assert set(q.names) == {"head.weight", "head.bias"}
    _, closed = context_moments(net, q, context, "head", lambda m, x: m.forward_features(x))
    exact = _jacobian_covariance(net, q, context, K)
    torch.testing.assert_close(closed, exact, rtol=1e-10, atol=1e-12)


def test_sigma_to_zero_leaves_fseb_mahalanobis_plus_a_constant() -> None:
    """As σ → 0, S_k → εI: KL = R_f(f(x̂; μ)) + K/2 [ε tr Kc⁻¹ − M log ε + log|Kc| − M]."""
    H = torch.randn(M, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    Kc = prior_covariance(H, S, DIAG)
    eps = FUNCTION_JITTER
    const = (
        0.5
        * K
        * (
            eps * torch.linalg.inv(Kc).trace()
            - M * torch.log(torch.tensor(eps))
            + torch.logdet(Kc)
            - M
        )
    )
    for seed in (0, 1):  # two different μ: the same constant
        net, q, context = _setup(seed)
        with torch.no_grad():
            for rho in q.rho:
                rho.fill_(float(inverse_softplus(1e-12)))
        mean, cov = context_moments(net, q, context, "all", lambda m, x: m.forward_features(x))
        kl = function_kl(mean, cov, H, S, DIAG)
        r_f = function_space_term(mean, H, S, DIAG, solver="cholesky")
        torch.testing.assert_close(kl - r_f, const.double(), rtol=1e-7, atol=1e-7)


def test_softplus_round_trip() -> None:
    std = torch.tensor([1e-8, 1e-3, 0.5, 30.0], dtype=torch.float64)
    torch.testing.assert_close(softplus_std(inverse_softplus(std)), std, rtol=1e-12, atol=0)
    # σ = 0 (float32 underflow in the exponential tail) loads as the smallest normal float32.
    tiny = torch.finfo(torch.float32).tiny
    rho = inverse_softplus(torch.zeros(1)).float()
    assert torch.isfinite(rho).all() and 0 < float(softplus_std(rho)) <= 2 * tiny


def test_objective_fsvi_terms_and_gradients() -> None:
    """The objective's loss: MC likelihood + KL / N, no R_θ; gradients reach μ and ρ."""
    torch.manual_seed(0)
    net = _tiny_net()
    obj = FSEBObjective(
        net, num_train=50, method="fsvi", fsvi={"variance": "all", "init_std": 0.05},
        prior_cov_scale=S, prior_cov_diag=DIAG,
    )  # fmt: skip
    x = torch.randn(8, D_IN, dtype=torch.float64)
    y = torch.randint(0, K, (8,))
    context = torch.randn(M, D_IN, dtype=torch.float64)
    terms = obj(x, y, context)
    H = obj.prior_features(context)
    mean, cov = context_moments(net, obj.algorithm.q, context, "all", obj.feature_fn)
    torch.testing.assert_close(terms["fs_reg"], function_kl(mean, cov, H, S, DIAG))
    assert float(terms["param_reg"]) == 0.0
    torch.testing.assert_close(terms["loss"], terms["nll"] + terms["fs_reg"] / 50)
    terms["loss"].backward()
    assert len(obj.trainable_parameters()) == 2 * len(obj.model_parameters())
    for p in obj.trainable_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_mc_predictive_averages_probabilities_reproducibly() -> None:
    net, q, context = _setup()
    predictive = MCPredictive(net, q, samples=4, seed=3)
    log_p = predictive(context)  # (M, K)
    expected = torch.stack(
        [torch.softmax(functional_call(net, d, (context,)), -1) for d in predictive.draws]
    ).mean(0)
    torch.testing.assert_close(log_p.exp(), expected.float())
    torch.testing.assert_close(MCPredictive(net, q, samples=4, seed=3)(context), log_p)
    assert not torch.equal(MCPredictive(net, q, samples=4, seed=4)(context), log_p)


def test_training_and_a_saved_run_predict_with_the_same_draws(tmp_path: Path) -> None:
    """The objective's predictor and a run's, rebuilt from the saved σ, are one function of q:
    the same outputs, bit for bit, as long as the seed is the run's."""
    torch.manual_seed(0)
    net = _tiny_net()
    obj = FSEBObjective(
        net, num_train=50, method="fsvi",
        fsvi={"variance": "all", "init_std": 0.2, "predict_samples": 4},
        prior_cov_scale=S, prior_cov_diag=DIAG,
    )  # fmt: skip
    with torch.no_grad():  # σ that differ per parameter, as after training
        for rho in obj.algorithm.q.rho:
            rho.add_(torch.randn_like(rho) * 1e-4)
    (tmp_path / MODEL_DIR).mkdir()
    state_file = obj.method_state_file
    assert state_file == "variational.safetensors"  # the name old FS-VI runs have
    write_method_state(tmp_path, obj.method_state(), state_file)
    obj.load_method_state(read_method_state(tmp_path, state_file))  # as training reloads σ
    digits = DataConfig(train=DatasetSpec(source="sklearn_digits"))
    recipe = Recipe(data=digits, fseb=obj.config, train=TrainConfig(seed=7))
    saved = run_predictor(tmp_path, recipe, copy.deepcopy(net))
    x = torch.randn(5, D_IN, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(saved(x), obj.predictor(7)(x))
        assert not torch.equal(saved(x), obj.predictor(8)(x))
    with pytest.raises(FileNotFoundError, match=r"variational.safetensors is missing"):
        run_predictor(tmp_path / "other", recipe, net)
    fseb = FSEBObjective(net, num_train=50)  # a MAP method keeps no state, reads none
    assert fseb.method_state() == {} and fseb.predictor(7) is net
    map_recipe = dataclasses.replace(recipe, fseb=fseb.config)
    assert run_predictor(tmp_path / "other", map_recipe, net) is net


def test_the_objective_names_its_state_and_its_one_process_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a run says about FS-VI comes from the objective: the name of its state in a failed
    write, and why it refuses several processes; FS-EB has neither limit."""
    net = _tiny_net()
    fsvi, fseb = FSEBObjective(net, 50, method="fsvi"), FSEBObjective(net, 50)
    two, one = SimpleNamespace(num_processes=2), SimpleNamespace(num_processes=1)
    reason = "fseb.method=fsvi runs in one process: its σ is not synchronised across processes"
    with pytest.raises(ConfigError, match=f"^{reason}$"):
        run_module._check_processes(fsvi, two)
    run_module._check_processes(fsvi, one)
    run_module._check_processes(fseb, two)
    assert fseb.single_process_reason is None

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "save_file", full)
    (tmp_path / MODEL_DIR).mkdir()
    with pytest.raises(DiskFullError, match="could not write FS-VI's standard deviations"):
        run_module._save_best(torch.nn.Linear(1, 1), fsvi, tmp_path)
    run_module._save_best(torch.nn.Linear(1, 1), fseb, tmp_path)  # no state: nothing written


def test_fsvi_run_trains_evaluates_and_exports_the_mean(tmp_path) -> None:
    """A few steps of FS-VI on the digits: MC predictions, σ saved, the export is μ, and
    ``fseb-ft evaluate`` reproduces the run's test metrics with the same MC predictive."""
    import timm
    from safetensors.torch import load_file

    from fseb_ft.engine.reevaluate import evaluate_run
    from fseb_ft.finetune import run
    from fseb_ft.recipe import recipe_from_dict
    from fseb_ft.runs.loading import load_run_model
    from fseb_ft.runs.rundir import MODEL_WEIGHTS, read_run

    digits = {"source": "sklearn_digits", "limit": 120}
    recipe = recipe_from_dict(
        {
            "model": {"name": "fseb_cnn", "pretrained": False, "input_size": 28},
            "data": {
                "train": {**digits, "classes": [0, 1, 2]},
                "test": {**digits, "split": "test", "classes": [0, 1, 2]},
                "ood": {"other": {**digits, "split": "test", "classes": [7, 8]}},
                "channels": 1, "augment": "none", "batch_size": 32, "num_workers": 0,
            },
            "context": {"pool_size": 64, "batch_size": 16},
            # σ large enough that the MC predictive and μ alone score differently.
            "fseb": {"method": "fsvi", "prior_cov_scale": 0.01, "prior_cov_diag": 1.0,
                     "fsvi": {"predict_samples": 3, "init_std": 0.3}},
            "optim": {"lr": 0.05},
            "train": {"epochs": 1, "trackers": []},
            "output": {"dir": str(tmp_path / "run")},
        }
    )  # fmt: skip
    results = run(recipe)
    assert 0 <= results["test"]["accuracy"] <= 1 and results["training"]["steps"] > 0
    assert results["training"]["history"][0]["train_fs_reg"] > 0
    run_dir = tmp_path / "run"
    stds = load_file(str(run_dir / MODEL_DIR / "variational.safetensors"))
    assert set(stds) == {"head.weight", "head.bias"} and all((s > 0).all() for s in stds.values())
    card = (run_dir / "model" / "README.md").read_text()
    assert "FS-VI" in card and "variational mean μ" in card
    exported = timm.create_model(f"local-dir:{run_dir / 'model'}", pretrained=True, in_chans=1)
    weights = load_file(str(run_dir / MODEL_WEIGHTS))
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, weights[name])

    again = evaluate_run(run_dir)
    for metric in ("nll", "accuracy", "ece", "brier"):
        assert again["test"][metric] == pytest.approx(results["test"][metric], rel=1e-6, abs=1e-9)
    for name, scores in results["ood"].items():
        assert again["ood"][name] == pytest.approx(scores, rel=1e-6, abs=1e-9)
    # μ alone (what evaluate scored before) is a different predictor.
    recipe, info = read_run(run_dir)
    mu = load_run_model(run_dir, recipe, info).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        gap = (torch.log_softmax(mu(x), -1) - run_predictor(run_dir, recipe, mu)(x)).abs().max()
    assert gap > 1e-3


def _sigma_after_sgd(steps: int) -> tuple[float, float]:
    """Mean head σ before and after ``steps`` SGD steps of FS-VI on a tiny separable problem
    with N = 2,000 (the KL's pull on each σ is of order 1/N per step)."""
    torch.manual_seed(0)
    net = _tiny_net()
    obj = FSEBObjective(
        net, num_train=2000, method="fsvi", fsvi={"variance": "head", "init_std": 1e-3},
        prior_cov_scale=S, prior_cov_diag=DIAG,
    )  # fmt: skip
    opt = torch.optim.SGD(obj.trainable_parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(32, D_IN, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # K = 3 classes
    context = torch.randn(M, D_IN, dtype=torch.float64)

    def mean_std() -> float:
        stds = obj.algorithm.q.stds().values()
        return float(torch.cat([s.detach().flatten() for s in stds]).mean())

    before = mean_std()
    for _ in range(steps):
        opt.zero_grad()
        obj(x, y, context)["loss"].backward()
        opt.step()
    return before, mean_std()


def test_sigma_moves_under_sgd_at_the_shared_learning_rate(monkeypatch) -> None:
    """σ = τ softplus(ρ/τ) moves σ itself: 20 SGD steps at μ's learning rate take the head's σ
    well away from its 1e-3 start. With the plain softplus (τ = 1; ≈ log σ there), the same
    steps leave it within 1 %: the stuck σ this parametrisation fixes."""
    before, after = _sigma_after_sgd(20)
    assert before == pytest.approx(1e-3) and after > 10 * before
    monkeypatch.setattr("fseb_ft.method.fsvi.STD_SCALE", 1.0)
    before, after = _sigma_after_sgd(20)
    assert after == pytest.approx(before, rel=1e-2)
