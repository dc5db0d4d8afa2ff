"""A run that diverges or learns nothing says so: it stops, or its results and card warn."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fseb_ft.engine.callbacks import TrainingDivergedError, _chance_warning, _check_divergence
from fseb_ft.engine.loop import Trainer, param_norm
from fseb_ft.evaluation.metrics import chance_accuracy, chance_nll
from fseb_ft.finetune import run
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import recipe_from_dict
from tests.helpers import TinyNet, tiny_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def test_chance_accuracy_is_the_majority_class_rate() -> None:
    assert float(chance_accuracy(torch.tensor([2, 0, 2, 1]))) == 0.5
    assert float(chance_accuracy(torch.tensor([7]))) == 1.0
    with pytest.raises(ValueError, match="must not be empty"):
        chance_accuracy(torch.tensor([], dtype=torch.long))


def test_chance_nll_is_the_entropy_of_the_class_frequencies() -> None:
    assert float(chance_nll(torch.tensor([0, 1, 0, 1]))) == pytest.approx(math.log(2))
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert float(chance_nll(torch.tensor([2, 0, 2, 1]))) == pytest.approx(expected)
    assert float(chance_nll(torch.tensor([7, 7]))) == 0.0
    with pytest.raises(ValueError, match="must not be empty"):
        chance_nll(torch.tensor([], dtype=torch.long))


def _at_chance(accuracy: float, nll: float, labels: torch.Tensor) -> str:
    """The warning for one epoch at ``accuracy`` = chance with validation ``nll``."""
    record = {"val_accuracy": accuracy, "val_nll": nll}
    return _chance_warning([{**record, "val_chance_accuracy": accuracy}], labels)


def test_chance_warning_blames_a_validation_split_of_one_class_not_the_learning_rate() -> None:
    message = _at_chance(1.0, 0.01, torch.zeros(10, dtype=torch.long))
    assert (
        "(10 validation images)" in message and "Every validation image is of one class" in message
    )
    assert "data.val" in message and "optim.lr" not in message


def test_chance_warning_blames_the_class_balance_when_the_model_beats_the_frequencies() -> None:
    labels = torch.tensor([0] * 19 + [1])  # one class is 95 % of validation
    message = _at_chance(0.95, 0.5 * float(chance_nll(labels)), labels)
    assert "The model did learn" in message and "95% of validation" in message
    assert "not the learning rate" in message and "lower optim.lr" not in message


@pytest.mark.parametrize(("counts", "balance"), [((3, 3, 3), False), ((18, 1, 1), True)])
def test_chance_warning_points_at_the_training_when_nothing_was_learned(
    counts: tuple[int, ...], balance: bool
) -> None:
    labels = torch.cat([torch.full((n,), k) for k, n in enumerate(counts)])
    message = _at_chance(max(counts) / sum(counts), float(chance_nll(labels)), labels)
    assert "learned nothing measurable" in message and "lower optim.lr" in message
    assert ("class balance (90% of validation is one class)" in message) == balance


def test_the_norm_at_start_and_each_epochs_count_the_frozen_parameters_alike() -> None:
    net = TinyNet()
    objective = FSEBObjective(net, 10, reg_scale=0.0)
    every = param_norm(list(net.parameters()))
    net.body.requires_grad_(False)  # model.freeze after the start's norm was measured
    trainer = SimpleNamespace(objective=objective)
    assert param_norm(Trainer._network_parameters(trainer)) == every
    assert param_norm(objective.model_parameters()) != every
    source = inspect.getsource(Trainer)
    assert source.count("param_norm(self._network_parameters())") == 2  # start and each epoch
    assert "param_norm(self.objective.model_parameters())" not in source


def test_divergence_check_stops_on_norm_growth_or_non_finite_predictions() -> None:
    finite = torch.zeros(4, 3)  # (N, K) validation log-probabilities
    record = {"epoch": 3, "param_norm": 9.0, "train_param_reg": 1.0, "train_fs_reg": 2.0}
    kw = {"suggest_zero_head": False}
    _check_divergence(record, finite, start=1.0, limit=10.0, **kw)  # 9× is within the limit
    record["param_norm"] = 11.0
    with pytest.raises(TrainingDivergedError, match=r"epoch 3: the parameter norm grew from 1 to"):
        _check_divergence(record, finite, start=1.0, limit=10.0, **kw)
    _check_divergence(record, finite, start=1.0, limit=None, **kw)
    with pytest.raises(TrainingDivergedError, match=r"validation predictions are not finite"):
        _check_divergence(record, torch.full((4, 3), float("nan")), start=1.0, limit=None, **kw)


@pytest.mark.parametrize("suggest", [True, False])
def test_divergence_advises_a_zero_head_only_when_asked(suggest: bool) -> None:
    record = {"epoch": 1, "param_norm": 11.0}
    with pytest.raises(TrainingDivergedError) as stop:
        _check_divergence(record, torch.zeros(4, 3), 1.0, 10.0, suggest_zero_head=suggest)
    message = str(stop.value)
    assert ("model.head_init=zeros" in message) == suggest
    assert message.endswith(
        "Lower optim.lr, start from model.head_init=zeros, or widen the prior (raise "
        "fseb.prior_cov_diag or prior_cov_scale)."
        if suggest
        else "Lower optim.lr or widen the prior (raise fseb.prior_cov_diag or prior_cov_scale)."
    )


def test_a_diverging_run_stops_before_it_writes_results_or_a_model_card(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    # The new user's failure: a random head under a tight prior (s = 1e-5, d = 1e-2) blows up.
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    recipe["model"]["head_init"] = "timm"
    recipe["fseb"].update(prior_cov_scale=1e-5, prior_cov_diag=1e-2)
    recipe["optim"]["lr"] = 0.05
    with pytest.raises(TrainingDivergedError, match=r"training diverged in epoch 1") as stop:
        run(recipe_from_dict(recipe))
    # Trained from scratch (model.pretrained: false), its random head is needed: no zero head.
    assert "head_init" not in str(stop.value) and "Lower optim.lr or widen" in str(stop.value)
    assert not (tmp_path / "run" / "results.json").exists()
    assert not (tmp_path / "run" / "model" / "README.md").exists()


def test_a_run_that_never_beats_chance_warns_in_its_results_and_model_card(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A zero head that never moves predicts class 0 for everything: exactly chance.
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    recipe["model"]["head_init"] = "zeros"
    recipe["fseb"]["reg_scale"] = 0.0
    recipe["optim"].update(lr=1e-30, warmup_steps=0)
    results = run(recipe_from_dict(recipe))
    warnings = results["training"]["warnings"]
    assert len(warnings) == 1 and "never beat chance in 1 epoch(s)" in warnings[0]
    assert "33.33% for always predicting the most frequent class (9 validation" in warnings[0]
    assert "learned nothing measurable" in warnings[0] and "lower optim.lr" in warnings[0]
    for page in ("results.md", "model/README.md"):
        assert (
            "> **Warning:** validation accuracy never beat chance"
            in (tmp_path / "run" / page).read_text()
        )
    # Logged once, as the run's other warnings are (logs.configure_logging: "WARNING fseb_ft: …").
    logged = [r for r in caplog.records if "never beat chance" in r.getMessage()]
    assert [(r.name, r.levelname) for r in logged] == [("fseb_ft", "WARNING")]
    out = capsys.readouterr().out
    epoch_lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 1 and epoch_lines[0].startswith("epoch 1/1: train loss ")
    assert "val acc 33.33%, nll " in epoch_lines[0] and len(epoch_lines[0]) <= 80
