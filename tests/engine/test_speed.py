"""train.channels_last, train.compile and model.grad_checkpointing: the same loss (and, for
checkpointing, gradients) as without them; the function-space term never in a compiled graph;
the errors; a run with channels_last, checkpointing, a frozen stem and layer decay exports a
model folder that timm loads by the usual names.

Inductor (the default backend) took 257 s to compile test_byobnet's forward and backward once on
the 2-core CI machine, so the compile tests trace with TorchDynamo into a backend that records
the graphs and runs them eagerly: what is captured, and the numbers, are the same.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import timm
import timm.layers.config
import torch
from safetensors.torch import load_file
from torch import fx

from fseb_ft.engine.speed import apply_speed_keys
from fseb_ft.finetune import run
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError
from fseb_ft.recipe import ModelConfig, TrainConfig, recipe_from_dict
from tests.helpers import TinyNet, image_folders, skip_figures, tiny_recipe

PRIOR = {"prior_var": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}


def _objective(dtype: torch.dtype = torch.float32, **hyper: Any) -> FSEBObjective:
    torch.manual_seed(0)
    model = timm.create_model("test_byobnet", num_classes=3).to(dtype)
    return FSEBObjective(model, 20, **(PRIOR | hyper))


def _batch(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 16, 16, generator=generator, dtype=dtype)
    context = torch.randn(3, 3, 16, 16, generator=generator, dtype=dtype)
    return x, torch.tensor([0, 1, 2, 0]), context


class Recorder:
    """A TorchDynamo backend that keeps every graph it is given and runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, graph: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        self.graphs.append(graph)
        return graph.forward


def test_grad_checkpointing_gives_the_same_loss_and_gradients() -> None:
    plain = _objective(torch.float64)
    checkpointed = copy.deepcopy(plain)
    apply_speed_keys(checkpointed, ModelConfig(grad_checkpointing=True), TrainConfig())
    assert checkpointed.model.grad_checkpointing and not plain.model.grad_checkpointing
    found = []
    for objective in (plain, checkpointed):
        terms = objective(*_batch(torch.float64))
        terms["loss"].backward()
        grads = {n: p.grad for n, p in objective.model.named_parameters()}
        found.append((terms["loss"].detach(), terms["fs_reg"].detach(), grads))
    (loss_a, reg_a, grads_a), (loss_b, reg_b, grads_b) = found
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reg_b, reg_a, rtol=1e-12, atol=1e-12)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def _train_steps(objective: FSEBObjective, steps: int = 2) -> dict[str, torch.Tensor]:
    """``steps`` SGD steps of ``objective`` in train mode; the network's state (weights and
    buffers) after them."""
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=0.1)
    objective.train()
    torch.manual_seed(3)  # the same drop-path draws for each objective
    for _ in range(steps):
        terms = objective(*_batch(torch.float64))
        terms["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
    return objective.model.state_dict()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("reg_scale", [0.0, 1.0], ids=["batchnorm-net", "fseb-joint"])
def test_grad_checkpointing_trains_the_same_weights_and_batchnorm_statistics(
    reg_scale: float, reentrant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each recomputed segment runs its forward again in train mode: its BatchNorm statistics
    # must not move twice, and its drop-path masks must be the first forward's.
    monkeypatch.setattr(timm.layers.config, "_USE_REENTRANT_CKPT", reentrant)
    torch.manual_seed(0)
    model = timm.create_model("test_byobnet", num_classes=3, drop_path_rate=0.5).double()
    plain = FSEBObjective(model, 20, **(PRIOR | {"reg_scale": reg_scale}))
    checkpointed = copy.deepcopy(plain)
    apply_speed_keys(checkpointed, ModelConfig(grad_checkpointing=True), TrainConfig())
    expected, found = _train_steps(plain), _train_steps(checkpointed)
    assert int(expected["stages.1.0.conv1_1x1.bn.num_batches_tracked"]) == 2
    assert list(found) == list(expected)
    for name, value in expected.items():
        assert torch.equal(found[name], value), name


def test_grad_checkpointing_refused_for_a_model_without_it() -> None:
    objective = FSEBObjective(TinyNet(), 10)
    with pytest.raises(ModelPartsError, match=r"^model.grad_checkpointing: model.name='tiny'"):
        apply_speed_keys(
            objective, ModelConfig(name="tiny", grad_checkpointing=True), TrainConfig()
        )


def test_channels_last_gives_the_same_loss() -> None:
    eager = _objective()
    fast = copy.deepcopy(eager)
    apply_speed_keys(fast, ModelConfig(), TrainConfig(channels_last=True))
    conv = fast.model.stem.conv.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    prior_conv = fast.prior.stem.conv.weight
    assert prior_conv.is_contiguous(memory_format=torch.channels_last)
    a, b = eager(*_batch()), fast(*_batch())
    for key in ("loss", "nll", "fs_reg", "param_reg"):
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=key)


def test_compile_gives_the_same_loss_and_leaves_the_fs_term_outside() -> None:
    eager = _objective()
    compiled = copy.deepcopy(eager)
    recorder = Recorder()
    apply_speed_keys(compiled, ModelConfig(), TrainConfig(compile=True), backend=recorder)
    a, b = eager(*_batch()), compiled(*_batch())
    assert recorder.graphs, "the model's forward was compiled"
    for key in ("loss", "nll", "fs_reg", "param_reg"):
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    captured = " ".join(str(g.graph) for g in recorder.graphs)
    assert "cholesky" not in captured and "float64" not in captured
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_folders(
        tmp_path_factory.mktemp("data"), {"cat": 8, "dog": 8}, {"cat": 3, "dog": 3}, owls=3
    )


def test_a_run_with_grad_checkpointing_exports_the_same_model_and_results(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_figures(monkeypatch)
    found = []
    for checkpointing in (False, True):
        out = tmp_path / str(checkpointing)
        recipe = tiny_recipe(folders, out, epochs=1)
        recipe["model"] |= {"grad_checkpointing": checkpointing}
        results = run(recipe_from_dict(recipe))
        found.append((load_file(str(out / "model" / "model.safetensors")), results["test"]))
    (weights, metrics), (weights_gc, metrics_gc) = found
    assert list(weights_gc) == list(weights)
    for name, value in weights.items():
        assert torch.equal(weights_gc[name], value), name
    assert metrics_gc == metrics


def test_a_run_with_the_keys_exports_a_model_timm_loads(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_figures(monkeypatch)
    # Without compile, which costs 20 s here even with TorchDynamo's eager backend; its weights
    # keep their names (test_compile_...), and nothing else of it reaches the export.
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    recipe["model"] |= {"grad_checkpointing": True, "freeze": 1}
    recipe["train"] |= {"channels_last": True}
    recipe["optim"] |= {"layer_decay": 0.75}
    run(recipe_from_dict(recipe))
    loaded = timm.create_model(f"local-dir:{tmp_path / 'run' / 'model'}", pretrained=True)
    fresh = timm.create_model("test_byobnet", num_classes=2)
    assert list(loaded.state_dict()) == list(fresh.state_dict())
    assert not any("_orig_mod" in k for k in loaded.state_dict())
