"""The method seam: a method defined here, with one registration, trains, resumes, exports and
predicts through the run like a built-in one, every layer asking it rather than naming it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as nnf
from safetensors.torch import load_file
from torch import Tensor, nn

import fseb_ft.recipe.sections as sections
from fseb_ft.finetune import run
from fseb_ft.method.methods.registry import METHODS, Objective, TrainingMethod, register_method
from fseb_ft.prediction import predict_images
from fseb_ft.prediction.loading import load_model
from fseb_ft.recipe import FSEBConfig, Recipe, recipe_from_dict
from tests.helpers import kill_after_checkpoint, tiny_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


class Tempered(nn.Module):
    """The network's logits divided by the toy's learned temperature."""

    def __init__(self, network: nn.Module, log_t: Tensor) -> None:
        super().__init__()
        self.network, self.log_t = network, log_t

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x) / self.log_t.exp()


class Toy(TrainingMethod):
    """Cross-entropy of the logits over a learned temperature: a parameter of its own, state
    beside the weights, its own predictor and card text."""

    state_file = "toy.safetensors"
    state_name = "the toy's temperature"

    def __init__(self, model: nn.Module, config: FSEBConfig) -> None:
        super().__init__(model, config)
        self.log_t = nn.Parameter(torch.zeros(()))

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        return "Toy"

    @classmethod
    def card_text(
        cls, recipe: Recipe, prior: Mapping[str, Any] | None, context: Mapping[str, Any] | None
    ) -> str:
        return "This model: the toy method, a learned temperature.\n"

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        logits = objective.model(x) / self.log_t.exp()
        nll = nnf.cross_entropy(logits, y)
        return {"loss": nll, "nll": nll, "logits": logits}

    def checkpointed_modules(self) -> list[nn.Module]:
        return [self]

    def state(self) -> dict[str, Tensor]:
        return {"log_t": self.log_t.detach()}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        with torch.no_grad():
            self.log_t.copy_(state["log_t"])

    def predictor(self, network: nn.Module, seed: int) -> nn.Module:
        return Tempered(network, self.log_t)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``fseb.method: toy`` for one test: its registration, and its name in the recipe's option
    list (which a test holds equal to the built-in registry)."""
    register_method("toy")(Toy)
    monkeypatch.setattr(sections, "Method", Literal["fseb", "fsvi", "l2sp", "toy"])
    try:
        yield
    finally:
        del METHODS["toy"]


def _recipe(folders: dict[str, Path], out: Path) -> Recipe:
    raw = tiny_recipe(folders, out)
    raw["fseb"]["method"] = "toy"
    return recipe_from_dict(raw)


def test_a_method_from_a_test_module_trains_resumes_exports_and_predicts(
    toy: None, folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(_recipe(folders, straight), evaluate_test=False)
    with monkeypatch.context() as killing:
        kill_after_checkpoint(killing)  # the first epoch's
        with pytest.raises(KeyboardInterrupt):
            run(_recipe(folders, resumed))
    results = run(_recipe(folders, resumed))
    # Resumed with the toy's parameter from the checkpoint: the same weights and state.
    for name in ("model/model.safetensors", "model/toy.safetensors"):
        a, b = load_file(straight / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    log_t = load_file(resumed / "model" / "toy.safetensors")["log_t"]
    assert float(log_t) != 0.0  # trained
    history = results["training"]["history"]
    assert [r["train_fs_reg"] for r in history] == [0.0, 0.0]  # a term the toy lacks

    card = (resumed / "model" / "README.md").read_text()
    assert "with **Toy**" in card and "the toy method, a learned temperature" in card
    assert "Toy · test_byobnet" in (resumed / "results.md").read_text()

    loaded = load_model(resumed)  # the run's predictor: the toy's, with the saved temperature
    assert isinstance(loaded.model, Tempered) and torch.equal(loaded.model.log_t, log_t)
    images = sorted((folders["ind"] / "test").rglob("*.png"))[:3]
    rows = predict_images(resumed, images, progress=False).rows
    assert len(rows) == 3 and all(0 <= r["probability"] <= 1 for r in rows)
