"""Class imbalance: the class-weighted likelihood (``train.class_weights``, the ``ClassWeights``
callback) and the class-balanced sampler (``train.sampler: balanced``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as nnf
from accelerate.data_loader import get_sampler, prepare_data_loader
from safetensors.torch import load_file
from sklearn.utils.class_weight import compute_class_weight
from timm.data.mixup import mixup_target
from torch.utils.data import TensorDataset

from fseb_ft.data.loaders import make_loader
from fseb_ft.data.sampling import BalancedSampler
from fseb_ft.engine.callbacks import Callback, ClassWeights, TrainerView
from fseb_ft.finetune import run
from fseb_ft.method.likelihood import class_weights, example_weights, likelihood_term
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ConfigError, recipe_from_dict
from tests.helpers import (
    TinyNet,
    image_folders,
    kill_after_checkpoint,
    tiny_recipe,
)

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

LABELS = np.array([0] * 12 + [1] * 3 + [2] * 5)  # 20 training labels, 60 / 15 / 25 %


def _logits(seed: int, B: int, K: int, dtype: torch.dtype = torch.float32) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, K, generator=g, dtype=dtype) * 4, torch.randint(0, K, (B,), generator=g)


def test_the_weighted_likelihood_is_the_hand_computed_float64_one() -> None:
    z, y = _logits(0, 7, 3, torch.float64)
    w = torch.tensor([0.5, 2.0, 1.25], dtype=torch.float64)
    by_hand = 0.0
    for row, label in zip(z.tolist(), y.tolist(), strict=True):
        log_norm = math.log(sum(math.exp(v) for v in row))
        by_hand += w[label].item() * (log_norm - row[label])
    by_hand /= len(y)  # the mean over the batch, not over Σ w_{y_i}
    assert likelihood_term(z, y, w).item() == pytest.approx(by_hand, rel=1e-12)
    assert likelihood_term(z, y, w).item() != pytest.approx(
        nnf.cross_entropy(z, y, weight=w).item(), rel=1e-6
    )


def test_the_objective_weights_the_likelihood_and_not_the_priors() -> None:
    torch.manual_seed(0)
    net = TinyNet().double()
    objective = FSEBObjective(net, 50, reg_scale=0.0, prior_var=0.1)
    x = torch.randn(9, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    unweighted = objective(x, y)
    w = torch.tensor([0.25, 3.0, 1.0], dtype=torch.float64)
    objective.set_class_weights(w)
    terms = objective(x, y)
    assert terms["nll"].item() == pytest.approx(likelihood_term(net(x), y, w).item(), rel=1e-12)
    assert torch.equal(terms["param_reg"], unweighted["param_reg"])
    expected = terms["nll"] + terms["param_reg"] / 50  # N_train unchanged in the prior term
    assert terms["loss"].item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_smoothing_keeps_the_class_balance_of_the_weights(epsilon: float) -> None:
    # 99:1: mean_k w_k is dominated by the rare class, so weighting by the smoothed target
    # t @ w would lift the majority's weight from 0.505 to about 3 and undo the balance.
    labels = torch.tensor([0] * 99 + [1])
    w = class_weights("balanced", labels.numpy(), 2).float()
    t = mixup_target(labels, 2, smoothing=epsilon)  # timm's smoothed one-hot targets
    per_example = example_weights(t, w, epsilon)  # (100,)
    totals = [per_example[labels == k].sum().item() for k in (0, 1)]
    assert totals == pytest.approx([50.0, 50.0], rel=1e-5)
    assert per_example.mean().item() == pytest.approx(1.0, rel=1e-5)
    assert torch.allclose(per_example, w[labels])  # each example weighs its label's weight


def test_a_smoothed_mixed_pair_weighs_the_mix_of_its_two_classes_weights() -> None:
    w = torch.tensor([0.5, 4.0, 1.0], dtype=torch.float64)
    a, b, lam, epsilon = torch.tensor([0]), torch.tensor([1]), 0.3, 0.1
    mix = lam * mixup_target(a, 3, smoothing=epsilon) + (1 - lam) * mixup_target(
        b, 3, smoothing=epsilon
    )
    expected = lam * 0.5 + (1 - lam) * 4.0
    assert example_weights(mix.double(), w, epsilon).item() == pytest.approx(expected, rel=1e-6)


def test_the_objective_undoes_the_smoothing_the_class_weights_callback_names() -> None:
    torch.manual_seed(0)
    net = TinyNet().double()
    objective = FSEBObjective(net, 50, reg_scale=0.0, prior_var=0.1)
    x, y = torch.randn(9, 6, dtype=torch.float64), torch.randint(0, 3, (9,))
    w = torch.tensor([0.25, 3.0, 1.0], dtype=torch.float64)
    trainer = SimpleNamespace(objective=objective, accelerator=SimpleNamespace(device="cpu"))
    ClassWeights(w, smoothing=0.2).on_train_begin(trainer)
    t = mixup_target(y, 3, smoothing=0.2).double()
    per_example = -(t * torch.log_softmax(net(x), -1)).sum(-1)  # (9,)
    expected = (per_example * w.float()[y].double()).mean()
    assert objective(x, t)["nll"].item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_weights_of_ones_give_the_unweighted_loss_exactly(seed: int) -> None:
    z, y = _logits(seed, 5 + 37 * seed, 2 + 3 * seed)
    ones = torch.ones(z.shape[1])
    assert torch.equal(likelihood_term(z, y, ones), nnf.cross_entropy(z, y))

    torch.manual_seed(seed)
    net = TinyNet()
    objective = FSEBObjective(net, 40, reg_scale=1.0, prior_cov_scale=0.01, prior_cov_diag=1.0)
    x, ctx = torch.randn(8, 6), torch.randn(5, 6)
    y = torch.randint(0, 3, (8,))
    plain = objective(x, y, ctx)
    objective.set_class_weights(torch.ones(3))
    weighted = objective(x, y, ctx)
    assert all(torch.equal(plain[k], weighted[k]) for k in ("loss", "nll", "fs_reg"))


def test_balanced_weights_are_sklearns_and_average_one_over_the_training_images() -> None:
    weights = class_weights("balanced", LABELS, 3)
    sklearn = compute_class_weight("balanced", classes=np.arange(3), y=LABELS)
    np.testing.assert_allclose(weights.numpy(), sklearn, rtol=1e-12)
    assert weights[LABELS].mean().item() == pytest.approx(1.0, rel=1e-12)
    # A class without training images (model.num_classes=4) enters no loss; it gets 1.
    wider = class_weights("balanced", LABELS, 4)
    np.testing.assert_allclose(wider.numpy(), [*sklearn, 1.0], rtol=1e-12)


def test_listed_weights_keep_their_ratios_and_average_one() -> None:
    weights = class_weights([1.0, 4.0, 2.0], LABELS, 3)
    assert weights[LABELS].mean().item() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose((weights / weights[0]).numpy(), [1.0, 4.0, 2.0], rtol=1e-12)
    # Equal weights scale to ones: the unweighted objective, as for none.
    assert class_weights([2.0, 2.0, 2.0], LABELS, 3) is None
    assert class_weights("none", LABELS, 3) is None
    assert class_weights("balanced", np.array([0, 1, 2, 0, 1, 2]), 3) is None
    with pytest.raises(ConfigError, match=r"^train.class_weights=\[1.0, 2.0\]: needs one weight"):
        class_weights([1.0, 2.0], LABELS, 3)


BASE = {"data": {"train": {"source": "sklearn_digits"}}}


@pytest.mark.parametrize(
    ("train", "model", "message"),
    [
        (
            {"class_weights": [1.0, 0.0]},
            {},
            r"train.class_weights=\[1.0, 0.0\]: a list of positive",
        ),
        ({"class_weights": [1.0]}, {}, r"train.class_weights=\[1.0\]: a list of positive"),
        (
            {"class_weights": [1, float("inf")]},
            {},
            r"train.class_weights\[1\]=inf: expected a finite",
        ),
        ({"class_weights": "even"}, {}, r"allowed values are \['none', 'balanced'\]"),
        (
            {"class_weights": [1.0, 2.0]},
            {"num_classes": 3},
            r"train.class_weights=\[1.0, 2.0\]: needs one weight per class: 3 \(model.num_classes",
        ),
        ({"sampler": "even"}, {}, r"train.sampler='even': allowed values are"),
        (
            {"sampler": "balanced", "class_weights": "balanced"},
            {},
            r"train.sampler='balanced': balanced rebalances the classes itself",
        ),
    ],
)
def test_the_recipe_refuses_bad_class_weights_and_samplers(
    train: dict, model: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        recipe_from_dict({**BASE, "train": train, "model": model})
    ok = recipe_from_dict({**BASE, "train": {"class_weights": [1, 2.5]}})
    assert ok.train.class_weights == (1.0, 2.5)


def _epoch_draws(sampler: BalancedSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_the_balanced_sampler_balances_an_epoch_and_is_seeded_per_epoch() -> None:
    labels = np.array([0] * 900 + [1] * 100)
    sampler = BalancedSampler(labels, seed=3)
    draws = _epoch_draws(sampler, 0)
    assert len(draws) == len(sampler) == len(labels)  # the epoch keeps its length
    share = np.bincount(labels[draws], minlength=2) / len(draws)
    assert 0.4 < share[1] < 0.6  # 10 % of the images, about half of the draws
    assert _epoch_draws(BalancedSampler(labels, seed=3), 0) == draws
    assert _epoch_draws(BalancedSampler(labels, seed=3), 1) != draws
    assert _epoch_draws(BalancedSampler(labels, seed=4), 0) != draws


def _prepared_batches(processes: int, index: int, epoch: int) -> list[list[int]]:
    """The batches of indices one process of ``processes`` gets in ``epoch`` from a balanced
    loader prepared by Accelerate, as ``accelerator.prepare`` does on ``processes`` processes."""
    labels = np.array([0] * 45 + [1] * 5)
    loader = make_loader(
        TensorDataset(torch.arange(50)), 4, False, sampler=BalancedSampler(labels, 3), seed=3
    )
    prepared = prepare_data_loader(
        loader, num_processes=processes, process_index=index, put_on_device=False,
        use_seedable_sampler=True,
    )  # fmt: skip
    prepared.set_epoch(epoch)  # as the loop does each epoch
    return [batch[0].tolist() for batch in prepared]


def test_accelerate_shares_out_one_epochs_balanced_draws_between_processes() -> None:
    single = _prepared_batches(1, 0, epoch=2)
    labels = np.array([0] * 45 + [1] * 5)
    assert [i for batch in single for i in batch] == _epoch_draws(BalancedSampler(labels, 3), 2)
    # Two processes: the same draws, batch by batch in turn (13 batches: the second process
    # wraps round to the first batch to make its 7th).
    first, second = _prepared_batches(2, 0, epoch=2), _prepared_batches(2, 1, epoch=2)
    assert first[:6] == single[0:12:2] and second[:6] == single[1:12:2]
    assert _prepared_batches(1, 0, epoch=3) != single


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_folders(
        tmp_path_factory.mktemp("imbalanced"),
        {"cat": 20, "dog": 8, "fox": 4},
        {"cat": 4, "dog": 2, "fox": 2},
        owls=3,
    )


class SeenWeights(Callback):
    """The objective's class weights at every optimiser step, and after training."""

    def __init__(self) -> None:
        self.during: list[torch.Tensor | None] = []
        self.after: object = "not ended"

    def on_step_end(self, trainer: TrainerView, terms: object) -> None:
        self.during.append(trainer.objective.class_weights)

    def on_train_end(self, trainer: TrainerView) -> None:
        self.after = trainer.objective.class_weights


def test_a_run_with_balanced_class_weights_trains_on_them(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    raw = tiny_recipe(folders, tmp_path / "run", epochs=1)
    raw["train"]["class_weights"] = "balanced"
    seen = SeenWeights()
    results = run(recipe_from_dict(raw), callbacks=[seen])
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    train_counts = np.array([15, 6, 3])  # 24 of the 32 training images; 8 validate (25 %)
    assert info["num_train"] == train_counts.sum()
    expected = train_counts.sum() / (3 * train_counts)
    np.testing.assert_allclose(info["class_weights"], expected, rtol=1e-12)
    assert len(seen.during) == 3 and all(
        torch.allclose(w.cpu().double(), torch.from_numpy(expected)) for w in seen.during
    )
    assert seen.after is None  # the objective predicts and evaluates unweighted
    assert results["test"]["n"] == 8 and math.isfinite(results["test"]["nll"])


def test_the_recipe_refuses_a_weight_list_of_other_length_than_the_training_classes(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    raw = tiny_recipe(folders, tmp_path / "run")
    raw["train"]["class_weights"] = [1.0, 2.0]
    raw["data"]["cache"] = {"size": 16, "dir": str(tmp_path / "cache")}
    with pytest.raises(ConfigError, match=r"needs one weight per class, 3 \(the classes of data"):
        run(recipe_from_dict(raw))
    assert not (tmp_path / "run" / "run.json").exists()  # stopped before anything was written
    assert not (tmp_path / "cache").exists()  # and before the screen built the cache


class LoaderSampler(Callback):
    """The training loader's sampler, as the loop draws from it."""

    def on_train_begin(self, trainer: TrainerView) -> None:
        self.sampler = get_sampler(trainer.parts.train_loader)


def test_a_balanced_sampler_run_resumes_to_the_same_weights(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def recipe(out: Path):
        raw = tiny_recipe(folders, out)
        raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
        del raw["data"]["ood"]
        raw["train"]["sampler"] = "balanced"
        return recipe_from_dict(raw)

    spy = LoaderSampler()
    run(recipe(tmp_path / "straight"), callbacks=[spy])
    assert isinstance(spy.sampler, BalancedSampler)

    kill_after_checkpoint(monkeypatch)  # the first epoch's
    with pytest.raises(KeyboardInterrupt):
        run(recipe(tmp_path / "resumed"))
    run(recipe(tmp_path / "resumed"))
    for name in ("checkpoints/epoch-0002/model.safetensors", "model/model.safetensors"):
        a, b = load_file(tmp_path / "straight" / name), load_file(tmp_path / "resumed" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
