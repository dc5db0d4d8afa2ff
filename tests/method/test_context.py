"""Tests for fseb_ft.method.context: pools, mixtures, perturbation transform and context batches."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fseb_ft.data.images import ArrayImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.transforms import eval_transform, perturbation_transform
from fseb_ft.method.context import (
    ContextPool,
    ContextStream,
    build_context_pool,
)

MEAN, STD = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # identity normalisation: pixel value / 255
SIZE = (8, 8)


def _distinct(n: int, offset: int = 0, name: str = "src") -> ArrayImages:
    """n constant 8x8 images whose pixel value ``offset + i`` identifies the sample."""
    images = (offset + np.arange(n, dtype=np.uint8))[:, None, None] * np.ones((1, 8, 8), np.uint8)
    return ArrayImages(images, np.zeros(n, np.int64), ["x"], identity=name)  # (n, 8, 8)


def _ids(batch: torch.Tensor) -> list[int]:
    """Recover the sample ids of an identity-normalised batch (B, C, H, W)."""
    return torch.round(batch[:, 0, 0, 0] * 255).long().tolist()


def _pool(kind: str = "dataset", seed: int = 0, size: int = 20, **kw: object) -> ContextPool:
    datasets = kw.pop("datasets", [_distinct(50)])
    train, weights = kw.pop("train", None), kw.pop("weights", None)
    spec = InputSpec(SIZE, MEAN, STD)
    return build_context_pool(
        kind, train, datasets, spec, weights=weights, size=size, seed=seed, **kw
    )


def test_pool_is_deterministic_under_a_seed() -> None:
    a, b, c = _pool(seed=1), _pool(seed=1), _pool(seed=2)
    assert len(a) == 20 and a.identity["size"] == 20
    assert a.identity["fingerprint"] == b.identity["fingerprint"]
    assert np.array_equal(a.pairs, b.pairs)
    assert a.identity["fingerprint"] != c.identity["fingerprint"]
    assert len(set(a.pairs[:, 1].tolist())) == 20  # drawn without replacement
    assert a.identity["kind"] == "dataset" and a.identity["sources"] == ["src"]
    assert a.identity["seed"] == 1 and "eval(" in a.identity["transform"]


def test_the_log_line_tells_pools_of_other_datasets_apart() -> None:
    """Same size, seed and so the same members' indices, other images: the identities' member
    fingerprints agree, the log lines' fingerprints do not."""
    a, b = _pool(datasets=[_distinct(50, name="kmnist")]), _pool(datasets=[_distinct(50, 1, "c")])
    assert a.identity["fingerprint"] == b.identity["fingerprint"]  # the members alone
    assert repr(a) != repr(b) and repr(a) == repr(_pool(datasets=[_distinct(50, name="kmnist")]))
    assert repr(a).startswith("ContextPool(kind=dataset, size=20, counts=[20], fixed=True, ")


def test_pool_uses_whole_source_when_smaller() -> None:
    pool = _pool(size=10_000)
    assert len(pool) == 50 and sorted(pool.pairs[:, 1].tolist()) == list(range(50))


def test_mixture_counts_follow_weights() -> None:
    train, other = _distinct(100, 0, "train"), _distinct(100, 100, "other")
    pool = _pool("mixture", size=40, train=train, datasets=[other], weights=[3, 1])
    assert pool.identity["counts"] == [30, 10]
    assert pool.identity["sources"] == ["train", "other"]
    ids = [int(_ids(pool[i][None])[0]) for i in range(len(pool))]
    assert sum(i >= 100 for i in ids) == 10
    three = _pool(
        "mixture", size=10, datasets=[_distinct(9, 0, "a"), _distinct(9, 9, "b"), _distinct(9, 18)]
    )
    assert three.identity["counts"] == [4, 3, 3] and len(three) == 10


def test_kind_validation_lists_allowed_values() -> None:
    with pytest.raises(
        ValueError, match=r"one of \['train', 'dataset', 'mixture'\], got 'imagenet'"
    ):
        _pool("imagenet")
    with pytest.raises(ValueError, match="needs the training dataset"):
        _pool("train")
    with pytest.raises(ValueError, match="exactly one dataset, got 2"):
        _pool("dataset", datasets=[_distinct(5), _distinct(5)])
    with pytest.raises(ValueError, match="at least two sources"):
        _pool("mixture")
    with pytest.raises(ValueError, match="2 mixture weights for 3"):
        _pool("mixture", train=_distinct(5), datasets=[_distinct(5), _distinct(5)], weights=[1, 1])


def test_sources_must_agree_on_channels() -> None:
    gray = ArrayImages(np.zeros((4, 8, 8), np.uint8), np.zeros(4, int), identity="g", channels=1)
    with pytest.raises(ValueError, match="disagree on image channels"):
        _pool("mixture", train=gray, datasets=[_distinct(5)])


def test_train_pool_with_perturbation_is_not_fixed() -> None:
    plain = _pool("train", train=_distinct(30), datasets=[])
    perturbed = _pool("train", train=_distinct(30), datasets=[], perturb=True)
    assert plain.is_fixed and not perturbed.is_fixed
    assert perturbed.identity["transform"].startswith("perturbation(strength=1.0")
    assert perturbed[0].shape == plain[0].shape == (3, *SIZE)


def test_perturbation_transform_changes_pixels_keeps_shape_and_is_seeded() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)  # (H, W, 3)
    clean = eval_transform(SIZE, MEAN, STD)(image=image)["image"]
    first = perturbation_transform(SIZE, MEAN, STD, seed=5)
    second = perturbation_transform(SIZE, MEAN, STD, seed=5)
    outs = [first(image=image)["image"] for _ in range(4)]
    assert all(
        out.shape == clean.shape == (3, *SIZE) and out.dtype == torch.float32 for out in outs
    )
    assert all(not torch.allclose(out, clean) for out in outs)
    assert all(torch.equal(out, second(image=image)["image"]) for out in outs)
    with pytest.raises(ValueError, match="strength must be positive"):
        perturbation_transform(SIZE, MEAN, STD, strength=0.0)


def test_context_stream_workers_perturb_afresh_each_epoch_and_reproducibly() -> None:
    # Identical images: any difference between batches comes from the perturbation's randomness.
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    same = ArrayImages(np.repeat(image[None], 16, axis=0), np.zeros(16, np.int64), ["x"])
    pool = _pool("dataset", datasets=[same], size=16, perturb=True)
    accelerator = SimpleNamespace(device=torch.device("cpu"), process_index=0)

    def first_batches(epoch: int) -> list[torch.Tensor]:
        stream = ContextStream(pool, 4, 0, accelerator, objective=None, num_workers=2)
        return [x for x, _ in itertools.islice(stream.epoch(epoch), 2)]  # one per worker

    epoch0, epoch1 = first_batches(0), first_batches(1)
    assert not torch.equal(epoch0[0], epoch0[1])  # the two workers draw differently
    assert not torch.equal(epoch0[0], epoch1[0])  # a new epoch draws afresh
    again = first_batches(0)
    assert all(torch.equal(a, b) for a, b in zip(epoch0, again, strict=True))
