"""What a CUDA device adds that CPU tests cannot show (``pytest -m cuda``; skipped without one):
the prior's solve under bf16 autocast on the device, a bf16 + channels_last step against the
float32 one, a training step with no host synchronisation, the sync-free Cholesky fallback, and
a whole bf16 run on the GPU whose exported model predicts alike on the CPU.

``bash benchmarks/gpu/run.sh`` runs these on a GPU machine; the two-process test
(tests/engine/test_pipeline.py) is not among them (one GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

from fseb_ft.engine.speed import apply_speed_keys
from fseb_ft.finetune import run
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.regularizer import function_space_term
from fseb_ft.recipe import ModelConfig, TrainConfig, recipe_from_dict
from tests.helpers import image_folders, skip_figures, tiny_recipe

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PRIOR = {"prior_var": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}
CUDA = torch.device("cuda")


def _naive_term(F: torch.Tensor, H: torch.Tensor, s: float, d: float) -> torch.Tensor:
    """``½ Σ_k f_kᵀ Kc⁻¹ f_k`` through an explicit float64 inverse, on the CPU."""
    H = H.double().cpu()  # (M, D)
    Kc = s * (H @ H.T + 1) + d * torch.eye(H.shape[0], dtype=torch.float64)  # (M, M)
    F = F.double().cpu()  # (M, K)
    return 0.5 * torch.einsum("mk,mn,nk->", F, torch.linalg.inv(Kc), F)


def test_fs_term_under_bf16_autocast_is_solved_in_float64_on_the_device() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 10).to(CUDA)
    x = torch.randn(48, 64, device=CUDA)  # (M, P)
    H = torch.randn(48, 32, device=CUDA)  # (M, D)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = head(x)  # (M, K)
        assert logits.dtype == torch.bfloat16
        out = function_space_term(logits, H.bfloat16(), 0.01, 1.0)
    assert out.dtype == torch.float32 and out.device.type == CUDA.type
    # The solve sees the bf16 values exactly: float64 accuracy on them, not bf16's.
    ref = _naive_term(logits.detach(), H.bfloat16(), 0.01, 1.0)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-6, atol=0)
    out.backward()
    assert torch.isfinite(head.weight.grad).all()


def test_device_fallback_factor_for_duplicate_points() -> None:
    g = torch.Generator().manual_seed(1)
    H = torch.randn(4, 3, generator=g, dtype=torch.float64).repeat(3, 1)  # 12 points, rank ≤ 4
    F = torch.randn(12, 2, generator=g, dtype=torch.float64)
    out = function_space_term(F.to(CUDA), H.to(CUDA), 1.0, 0.0)  # exactly singular Kc
    assert torch.isfinite(out) and out > 0


def _objective(model_name: str = "resnet10t", **keys: bool) -> FSEBObjective:
    torch.manual_seed(0)
    objective = FSEBObjective(timm.create_model(model_name, num_classes=5), 1000, **PRIOR)
    apply_speed_keys(objective, ModelConfig(name=model_name), TrainConfig(**keys))
    return objective.to(CUDA).train()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 3, 32, 32, generator=g)  # (B, 3, 32, 32)
    context = torch.randn(8, 3, 32, 32, generator=g)  # (M, 3, 32, 32)
    return x.to(CUDA), torch.randint(0, 5, (16,), generator=g).to(CUDA), context.to(CUDA)


def test_bf16_channels_last_step_matches_float32() -> None:
    x, y, context = _batch()
    ref = _objective()(x, y, context)
    fast = _objective(channels_last=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        terms = fast(x, y, context)
    for key in ("nll", "fs_reg", "param_reg"):
        assert terms[key].dtype == torch.float32
        torch.testing.assert_close(terms[key], ref[key], rtol=5e-2, atol=1e-3)
    terms["loss"].backward()
    grads = [p.grad for p in fast.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("cached", [True, False], ids=["cached-phi0", "phi0-each-step"])
def test_training_step_never_syncs_the_host(cached: bool) -> None:
    """A step (forward, fs term, backward, optimiser) queues work without waiting for the GPU:
    CUDA's sync debug mode turns any synchronising call into an error."""
    objective = _objective(channels_last=True)
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=1e-3, momentum=0.9)
    x, y, context = _batch()
    feats = objective.prior_features(context) if cached else None  # (M, D)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            terms = objective(x, y, context, feats)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()

    step()  # the first step creates the optimiser's state and cuDNN's plans
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_bf16_run_on_the_gpu_exports_a_model_that_predicts_alike_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_figures(monkeypatch)
    folders = image_folders(tmp_path / "data", {"cat": 12, "dog": 12}, {"cat": 4, "dog": 4}, 4)
    raw = tiny_recipe(folders, tmp_path / "run", epochs=1)
    raw["train"] |= {"cpu": False, "mixed_precision": "bf16", "channels_last": True}
    results = run(recipe_from_dict(raw))
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["mixed_precision"] == "bf16"
    assert torch.isfinite(torch.tensor(results["test"]["nll"]))
    model = timm.create_model(f"local-dir:{tmp_path / 'run' / 'model'}", pretrained=True).eval()
    x = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        on_cpu = model(x)
        on_gpu = model.to(CUDA)(x.to(CUDA)).cpu()
    torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-3, atol=1e-3)
