"""Soft targets (``train.label_smoothing``, ``data.mixup``: the ``SoftTargets`` callback, the
soft-target likelihood) and timm's training transform (``data.augment: timm``)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as nnf
from PIL import Image
from safetensors.torch import load_file
from timm.data import Mixup
from timm.data.mixup import mixup_target
from torchvision.transforms import Normalize

from fseb_ft.data.images import ArrayImages
from fseb_ft.data.transforms import TransformedImages, seed_transform, train_transform
from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.engine.soft_targets import SoftTargets, mixing_seed, soft_target_callbacks
from fseb_ft.finetune import run
from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ConfigError, MixupConfig, apply_overrides, recipe_from_dict
from tests.helpers import (
    TinyNet,
    image_folders,
    kill_after_checkpoint,
    tiny_recipe,
)

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

K = 4


def _trainer(seed: int = 3, process: int = 0) -> SimpleNamespace:
    """What SoftTargets reads of the trainer: the seed and the process index."""
    return SimpleNamespace(
        config=SimpleNamespace(seed=seed), accelerator=SimpleNamespace(process_index=process)
    )


def _batch(B: int, shape: tuple[int, ...] = (3, 8, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(B)
    return torch.randn(B, *shape, generator=g), torch.randint(0, K, (B,), generator=g)


def _started(callback: SoftTargets, epoch: int = 2) -> SoftTargets:
    trainer = _trainer()
    callback.on_train_begin(trainer)
    callback.on_epoch_begin(trainer, epoch)
    return callback


MIXES = [
    MixupConfig(mixup_alpha=0.8),
    MixupConfig(cutmix_alpha=1.0),
    MixupConfig(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, prob=0.9),
    MixupConfig(mixup_alpha=0.4, cutmix_alpha=1.0, mode="pair"),
    MixupConfig(mixup_alpha=0.4, cutmix_alpha=1.0, mode="elem"),
]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: f"{m.mode}-{m.mixup_alpha}-{m.cutmix_alpha}")
def test_mixed_targets_sum_to_one_and_are_timms_on_the_epochs_seed(mix: MixupConfig) -> None:
    callback = _started(SoftTargets(K, 0.1, mix))
    x, y = _batch(8)
    np.random.seed(123)
    outside = np.random.rand(3)  # the global stream, as nothing had drawn from it
    np.random.seed(123)
    mixed, targets = callback.on_batch_begin(_trainer(), x.clone(), y)
    assert np.array_equal(np.random.rand(3), outside)  # timm drew from the callback's stream

    np.random.seed(mixing_seed(3, 2, 0))
    timm_mix = Mixup(
        mixup_alpha=mix.mixup_alpha,
        cutmix_alpha=mix.cutmix_alpha,
        prob=mix.prob,
        switch_prob=mix.switch_prob,
        mode=mix.mode,
        label_smoothing=0.1,
        num_classes=K,
    )
    expected_x, expected_t = timm_mix(x.clone(), y)
    assert torch.equal(mixed, expected_x) and torch.equal(targets, expected_t)
    assert targets.shape == (8, K)
    torch.testing.assert_close(targets.sum(1), torch.ones(8), rtol=0, atol=1e-6)
    assert (targets >= 0).all()


def test_an_odd_batch_mixes_its_pairs_and_keeps_its_last_image() -> None:
    callback = _started(SoftTargets(K, 0.2, MixupConfig(mixup_alpha=1.0)))
    x, y = _batch(7)
    mixed, targets = callback.on_batch_begin(_trainer(), x.clone(), y)
    assert mixed.shape == x.shape and targets.shape == (7, K)
    assert torch.equal(mixed[6], x[6])
    assert torch.equal(targets[6:], mixup_target(y[6:], K, smoothing=0.2))
    torch.testing.assert_close(targets.sum(1), torch.ones(7), rtol=0, atol=1e-6)
    assert not torch.equal(mixed[:6], x[:6])  # Beta(1, 1) never draws λ = 1 exactly
    one = callback.on_batch_begin(_trainer(), x[:1].clone(), y[:1])  # nothing to pair with
    assert torch.equal(one[0], x[:1]) and torch.equal(one[1], mixup_target(y[:1], K, 1.0, 0.2))


def test_epochs_and_processes_mix_apart_and_an_epoch_mixes_again_alike() -> None:
    x, y = _batch(8)

    def targets(epoch: int, process: int) -> torch.Tensor:
        callback = SoftTargets(K, 0.0, MixupConfig(mixup_alpha=1.0))
        callback.on_train_begin(_trainer())
        callback.on_epoch_begin(_trainer(process=process), epoch)
        return callback.on_batch_begin(_trainer(), x.clone(), y)[1]

    assert torch.equal(targets(1, 0), targets(1, 0))  # a resumed epoch mixes as the first time
    assert not torch.equal(targets(1, 0), targets(2, 0))
    assert not torch.equal(targets(1, 0), targets(1, 1))


def _logits(seed: int, B: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(B, K, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 3


@pytest.mark.parametrize("weighted", [False, True])
def test_the_soft_target_likelihood_is_the_hand_computed_float64_one(weighted: bool) -> None:
    z = _logits(0, 6)
    t = torch.softmax(_logits(1, 6), -1)  # (6, K) rows summing to one
    w = torch.tensor([0.5, 2.0, 1.25, 0.75], dtype=torch.float64)
    by_hand = 0.0
    for row, target in zip(z.tolist(), t.tolist(), strict=True):
        log_norm = math.log(sum(math.exp(v) for v in row))
        ce = sum(tk * (log_norm - zk) for tk, zk in zip(target, row, strict=True))
        weight = sum(tk * wk for tk, wk in zip(target, w.tolist(), strict=True))
        by_hand += ce * (weight if weighted else 1.0)
    by_hand /= len(z)  # the mean over the batch
    value = likelihood_term(z, t, w if weighted else None)
    assert value.dtype == torch.float64 and value.item() == pytest.approx(by_hand, rel=1e-12)


def test_one_hot_targets_give_the_labels_class_weighted_likelihood() -> None:
    z, y = _logits(2, 9), torch.arange(9) % K
    w = torch.tensor([0.5, 2.0, 1.25, 0.75], dtype=torch.float64)
    one_hot = mixup_target(y, K).double()
    assert likelihood_term(z, one_hot, w).item() == pytest.approx(
        likelihood_term(z, y, w).item(), rel=1e-12
    )


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.3])
def test_label_smoothing_is_torchs_cross_entropy_with_label_smoothing(epsilon: float) -> None:
    z, y = _logits(3, 10, torch.float32), torch.arange(10) % K
    _, targets = _started(SoftTargets(K, epsilon)).on_batch_begin(_trainer(), z, y)
    expected = nnf.cross_entropy(z, y, label_smoothing=epsilon)  # the mean over the batch
    assert likelihood_term(z, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_without_smoothing_or_mixup_no_callback_and_the_loss_of_today() -> None:
    base = {"data": {"train": {"source": "sklearn_digits"}}}
    recipe = recipe_from_dict(base)
    assert soft_target_callbacks(recipe.train, recipe.data, 5) == []
    smoothed = recipe_from_dict({**base, "train": {"label_smoothing": 0.1}})
    assert len(soft_target_callbacks(smoothed.train, smoothed.data, 5)) == 1

    torch.manual_seed(0)
    net = TinyNet(k=K)
    objective = FSEBObjective(net, 40, reg_scale=1.0, prior_cov_scale=0.01, prior_cov_diag=1.0)
    x, ctx, y = torch.randn(8, 6), torch.randn(5, 6), torch.arange(8) % K
    assert torch.equal(objective(x, y, ctx)["nll"], nnf.cross_entropy(net(x), y))


def test_mixup_changes_the_likelihood_and_not_the_function_space_or_parameter_terms() -> None:
    torch.manual_seed(0)
    objective = FSEBObjective(
        TinyNet(k=K).double(), 40, reg_scale=1.0, prior_cov_scale=0.01, prior_cov_diag=1.0
    )
    x, ctx = torch.randn(8, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    y = torch.arange(8) % K
    plain = objective(x, y, ctx)
    callback = _started(SoftTargets(K, 0.1, MixupConfig(mixup_alpha=1.0)))
    mixed = objective(*callback.on_batch_begin(_trainer(), x.clone(), y), ctx)
    assert torch.equal(mixed["fs_reg"], plain["fs_reg"])  # the same context batch
    assert torch.equal(mixed["param_reg"], plain["param_reg"])
    assert mixed["nll"].item() != pytest.approx(plain["nll"].item(), rel=1e-3)
    expected = mixed["nll"] + (mixed["fs_reg"] + mixed["param_reg"]) / 40
    assert mixed["loss"].item() == pytest.approx(expected.item(), rel=1e-12)


BASE = {"data": {"train": {"source": "sklearn_digits"}}}


@pytest.mark.parametrize(
    ("data", "train", "message"),
    [
        ({"mixup": {}}, {}, r"^data.mixup.mixup_alpha=0.0: with cutmix_alpha=0.0: one of them"),
        ({"mixup": {"mixup_alpha": -0.2}}, {}, r"^data.mixup.mixup_alpha=-0.2: must be ≥ 0"),
        ({"mixup": {"cutmix_alpha": 1, "prob": 0}}, {}, r"^data.mixup.prob=0.0: must be in"),
        ({"mixup": {"cutmix_alpha": 1, "switch_prob": 2}}, {}, r"^data.mixup.switch_prob=2.0"),
        ({"mixup": {"mixup_alpha": 1, "mode": "row"}}, {}, r"^data.mixup.mode='row': allowed"),
        ({"mixup": {"alpha": 1}}, {}, r"^unknown key 'data.mixup.alpha'"),
        ({}, {"label_smoothing": 1.0}, r"^train.label_smoothing=1.0: must be in \[0, 1\)"),
        ({}, {"label_smoothing": -0.1}, r"^train.label_smoothing=-0.1: must be in \[0, 1\)"),
        ({"augment": "timm-lite"}, {}, r"^data.augment='timm-lite': allowed values are \[.*'timm'"),
    ],
)
def test_the_recipe_refuses_bad_smoothing_and_mixup(data: dict, train: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        recipe_from_dict({"data": {**BASE["data"], **data}, "train": train})


def test_mixup_is_off_by_default_and_one_key_turns_it_on() -> None:
    assert recipe_from_dict(BASE).data.mixup is None
    assert recipe_from_dict(BASE).train.label_smoothing == 0.0
    on = recipe_from_dict(apply_overrides(BASE, ["data.mixup.cutmix_alpha=1.0"]))
    assert on.data.mixup == MixupConfig(cutmix_alpha=1.0)


MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


@pytest.mark.parametrize("channels", [1, 3])
def test_timms_transform_gives_normalised_tensors_of_the_input_size(channels: int) -> None:
    mean, std = MEAN[:channels], STD[:channels]
    transform = train_transform((12, 10), mean, std, "timm", seed=0)
    image = np.random.default_rng(0).integers(0, 256, (20, 17, channels), dtype=np.uint8)
    out = transform(image=image)["image"]
    assert out.shape == (channels, 12, 10) and out.dtype == torch.float32
    steps = {type(s).__name__: s for s in transform.transform.transforms}
    assert {"RandAugment", "RandomErasing"} <= set(steps)
    normalize = steps["Normalize"]
    assert isinstance(normalize, Normalize)
    assert tuple(normalize.mean.tolist()) == pytest.approx(mean)
    assert tuple(normalize.std.tolist()) == pytest.approx(std)
    low = (0 - torch.tensor(mean)) / torch.tensor(std)  # pixel 0 and 255, normalised
    high = (1 - torch.tensor(mean)) / torch.tensor(std)
    assert (out >= low[:, None, None] - 1e-5).all() and (out <= high[:, None, None] + 1e-5).all()


def test_timms_transform_is_seeded_and_leaves_the_global_streams_alone() -> None:
    image = np.random.default_rng(1).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    transform = train_transform((12, 12), MEAN, STD, "timm", seed=5)

    def draws() -> list[torch.Tensor]:
        return [transform(image=image)["image"] for _ in range(6)]

    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    first = draws()
    after = (random.random(), np.random.rand(), torch.rand(1))
    seed_transform(transform, 5)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    again = draws()
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert (random.random(), np.random.rand(), torch.rand(1)) == after  # untouched
    assert len({tuple(t.flatten().tolist()) for t in first}) > 1  # it does augment
    seed_transform(transform, 6)
    assert not all(torch.equal(a, b) for a, b in zip(first, draws(), strict=True))


def test_every_randaugment_op_works_at_the_policys_largest_magnitude() -> None:
    transform = train_transform((12, 12), MEAN, STD, "timm", seed=0)
    (rand,) = [s for s in transform.transform.transforms if type(s).__name__ == "RandAugment"]
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (12, 12, 3), np.uint8))
    for op in rand.ops:
        top = op.magnitude_max or 10  # timm's bound on a sampled magnitude
        op.prob, op.magnitude, op.magnitude_std = 1.0, top, 0.0
        assert op(image).size == image.size, op.name  # Pillow ≥ 13 raised on 0 posterize bits
        if op.name == "PosterizeIncreasing":
            assert op.level_fn(top, op.hparams)[0] >= 1  # never a black image


def test_timms_transform_refuses_statistics_of_other_channels() -> None:
    gray = ArrayImages(np.zeros((2, 4, 4), np.uint8), np.zeros(2, int), channels=1)
    with pytest.raises(ValueError, match=r"normalises 3 channels but .* 1-channel"):
        TransformedImages(gray, train_transform((8, 8), MEAN, STD, "timm"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_folders(
        tmp_path_factory.mktemp("mixup"),
        {"cat": 10, "dog": 8, "fox": 6},
        {"cat": 2, "dog": 2, "fox": 2},
        owls=3,
    )


class SeenTargets(Callback):
    """The training batches' targets as the objective gets them (after the built-in ones)."""

    def __init__(self) -> None:
        self.targets: list[torch.Tensor] = []

    def on_batch_begin(
        self, trainer: TrainerView, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.targets.append(y)
        return x, y


def _recipe(folders: dict[str, Path], out: Path, epochs: int = 1) -> dict:
    raw = tiny_recipe(folders, out, epochs=epochs)
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    del raw["data"]["ood"]
    raw["data"]["augment"] = "timm"
    raw["data"]["mixup"] = {"mixup_alpha": 0.4, "cutmix_alpha": 1.0}
    raw["train"]["label_smoothing"] = 0.1
    raw["train"]["class_weights"] = "balanced"
    return raw


def test_a_run_trains_on_timms_transform_and_mixed_targets_and_resumes_to_the_same_weights(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = SeenTargets()
    straight = _recipe(folders, tmp_path / "straight", epochs=2)
    results = run(recipe_from_dict(straight), callbacks=[seen])
    # 18 training images in batches of 8 (6 validate), two epochs
    assert [tuple(t.shape) for t in seen.targets] == [(8, 3), (8, 3), (2, 3)] * 2
    for targets in seen.targets:
        torch.testing.assert_close(targets.sum(1), torch.ones(len(targets)), rtol=0, atol=1e-6)
        assert targets.min() > 0  # smoothed: no class at zero
    assert results["test"]["n"] == 6 and math.isfinite(results["test"]["nll"])

    kill_after_checkpoint(monkeypatch)  # the first epoch's
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(_recipe(folders, tmp_path / "resumed", epochs=2)))
    run(recipe_from_dict(_recipe(folders, tmp_path / "resumed", epochs=2)))
    name = "model/model.safetensors"
    a, b = load_file(tmp_path / "straight" / name), load_file(tmp_path / "resumed" / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
