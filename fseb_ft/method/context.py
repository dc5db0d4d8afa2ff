"""Context points for the FS-EB regulariser: the pool they are drawn from and their stream.

Context points x̂ are unlabeled images at which the function-space prior is evaluated
(docs/method.md, "Choosing the context set and φ0"). A run draws them from a fixed, seeded
:class:`ContextPool` (reference: 10k images) taken from the training inputs, another dataset, or
a weighted mixture, optionally through the "perturbed training inputs" transform. The pool's
``identity`` records exactly which images and which transform were used, so it can be logged and
saved with the run. :class:`ContextStream` feeds the training loop one context batch per step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from fseb_ft.data.decode_size import min_decode_size
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import seed_worker
from fseb_ft.data.sources import load_split
from fseb_ft.data.splits import allocate
from fseb_ft.data.transforms import (
    check_transform_channels,
    epoch_seed,
    eval_transform,
    is_deterministic,
    perturbation_transform,
    seed_transform,
)
from fseb_ft.logs import progress_bar
from fseb_ft.method.regularizer import resolve_prior
from fseb_ft.recipe import ContextConfig, FSEBConfig
from fseb_ft.recipe.options import CONTEXT_KINDS

__all__ = [
    "ContextPool",
    "ContextStream",
    "build_context_pool",
    "context_sets",
    "context_stream",
    "mean_sq_feature_norm",
    "resolve_prior_on_pool",
]

if TYPE_CHECKING:
    from accelerate import Accelerator

    from fseb_ft.method.objective import FSEBObjective


MEAN_SQ_NORM_IMAGES = 1024
"""Images of a perturbed pool whose φ0 features estimate m = mean ‖h‖² (one seeded sample)."""


class ContextPool(Dataset):
    """A fixed, seeded pool of unlabeled context images: ``pool[i] -> tensor (C, H, W)``.

    ``size`` images are drawn without replacement (numpy ``Generator(seed)``) from ``sources``,
    split between them in proportion to ``weights`` (largest remainder, so counts sum to
    ``size``); a source smaller than its share contributes all of its images, and the pool is
    then smaller than ``size``. Labels are ignored.

    Attributes:
        pairs: (M, 2) int64 of (source index, sample index), the pool's membership.
        identity: dict with kind, sources, size, counts, seed, transform, fingerprint (sha256 of
            ``pairs``) for logging and saving with a run.
        is_fixed: True when the transform is deterministic, so φ0 features of the pool can be
            computed once and cached; False for the perturbation transform.
    """

    def __init__(
        self,
        sources: Sequence[LabeledImages],
        transform: Any,
        size: int = 10_000,
        seed: int = 0,
        weights: Sequence[float] | None = None,
        kind: str | None = None,
        description: str | None = None,
    ) -> None:
        """Draw the pool; see the class docstring. ``kind`` defaults from the source count."""
        sources = list(sources)
        if not sources:
            raise ValueError("a context pool needs at least one source dataset")
        if size < 1:
            raise ValueError(f"context pool size must be at least 1, got {size}")
        kind = kind or ("dataset" if len(sources) == 1 else "mixture")
        _check_kind(kind)
        weights = [1.0] * len(sources) if weights is None else list(weights)
        if len(weights) != len(sources):
            raise ValueError(
                f"got {len(weights)} mixture weights for {len(sources)} context sources"
            )
        _check_sources(sources)
        check_transform_channels(transform, sources[0].channels, sources[0].identity)
        self.sources = sources
        self.transform = transform
        self.min_size = min_decode_size(transform)  # perturbed pools decode JPEGs reduced
        self.pairs = _draw(sources, allocate(size, weights), seed)  # (M, 2)
        self.is_fixed = is_deterministic(transform)
        self.identity: dict[str, Any] = {
            "kind": kind,
            "sources": [source.identity for source in sources],
            "size": len(self.pairs),
            "counts": np.bincount(self.pairs[:, 0], minlength=len(sources)).tolist(),
            "seed": seed,
            "transform": description or repr(transform),
            "fingerprint": hashlib.sha256(self.pairs.astype("<i8").tobytes()).hexdigest(),
        }

    def __len__(self) -> int:
        """Number of context images in the pool."""
        return len(self.pairs)

    def __getitem__(self, index: int) -> torch.Tensor:
        """The transformed context image ``index`` (C, H, W) float32."""
        source, sample = self.pairs[index]
        image, _ = self.sources[source].read(sample, self.min_size)  # (H, W, C) uint8; no label
        return self.transform(image=image)["image"]  # (C, H, W)

    def reseed(self, seed: int) -> None:
        """Reseed the transform's random stream (called per DataLoader worker)."""
        seed_transform(self.transform, seed)

    def __repr__(self) -> str:
        """Short summary for logs. Its ``fingerprint`` hashes the whole :attr:`identity` (the
        sources, the members, the seed and the transform): two pools of equal size and seed
        drawn from different datasets print different ones."""
        ident = self.identity
        whole = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
        return (
            f"ContextPool(kind={ident['kind']}, size={ident['size']}, counts={ident['counts']}, "
            f"fixed={self.is_fixed}, fingerprint={whole[:12]})"
        )


def build_context_pool(
    kind: str,
    train: LabeledImages | None,
    datasets: Sequence[LabeledImages],
    spec: InputSpec,
    *,
    weights: Sequence[float] | None = None,
    size: int = 10_000,
    seed: int = 0,
    perturb: bool = False,
    strength: float = 1.0,
) -> ContextPool:
    """Build the context pool a recipe asks for, its images prepared as ``spec`` says.

    kind "train": the training inputs; "dataset": exactly one other dataset; "mixture": the
    training inputs (when given) followed by ``datasets``, in proportion to ``weights`` (equal
    when None). ``perturb`` applies :func:`~fseb_ft.data.transforms.perturbation_transform` (drawn
    afresh every time an image is read), else the plain eval transform (a fixed pool whose
    features can be cached).
    """
    sources = _pool_sources(kind, train, datasets)
    if kind != "mixture" and weights is not None and len(weights) != 1:
        raise ValueError(f'context kind "{kind}" takes no mixture weights, got {list(weights)}')
    settings = f"input_size={tuple(spec.size)}, mean={tuple(spec.mean)}, std={tuple(spec.std)}"
    if perturb:
        transform = perturbation_transform(spec.size, spec.mean, spec.std, strength, seed)
        description = f"perturbation(strength={strength}, {settings})"
    else:
        transform = eval_transform(spec.size, spec.mean, spec.std)
        description = f"eval({settings})"
    weights = weights if kind == "mixture" else None
    return ContextPool(sources, transform, size, seed, weights, kind, description)


def _pool_sources(
    kind: str, train: LabeledImages | None, datasets: Sequence[LabeledImages]
) -> list[LabeledImages]:
    """The datasets a pool of ``kind`` draws from (see :func:`build_context_pool`)."""
    _check_kind(kind)
    datasets = list(datasets)
    if kind == "train":
        if train is None:
            raise ValueError('context kind "train" needs the training dataset (train=None given)')
        return [train]
    if kind == "dataset":
        if len(datasets) != 1:
            raise ValueError(
                f'context kind "dataset" needs exactly one dataset, got {len(datasets)}; '
                'use kind "mixture" to combine several'
            )
        return datasets
    sources = ([] if train is None else [train]) + datasets
    if len(sources) < 2:
        raise ValueError(
            f'context kind "mixture" needs at least two sources, got {len(sources)} '
            "(the training set, if given, counts as one)"
        )
    return sources


class _SeededPermutations(Sampler[int]):
    """An endless stream of seeded permutations of ``range(n)``, restarted by :meth:`set_epoch`."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        while True:
            yield from torch.randperm(self.n, generator=g).tolist()


class _IndexedPool(torch.utils.data.Dataset):
    """``(image, pool index)`` so cached φ0 features can be looked up by index."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool  # ContextStream's: sized, indexable, with reseed (TransformedImages)

    def __len__(self) -> int:
        return len(self.pool)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.pool[i], i

    def reseed(self, seed: int) -> None:
        """Reseed the pool's transform (DataLoader workers call this)."""
        self.pool.reseed(seed)


class ContextStream:
    """Context batches ``x̂`` (and, for a fixed pool, their cached φ0 features) for every step.

    A fixed pool (deterministic transform) has its features ``h(x̂; φ0)`` computed once, so the
    step runs no φ0 forward. Each process draws from its own seeded permutation of the pool, so
    processes regularise different context batches (docs/method.md, "Several processes").
    """

    def __init__(
        self,
        pool: Any,
        batch_size: int,
        seed: int,
        accelerator: Accelerator,
        objective: FSEBObjective,
        num_workers: int = 0,
    ) -> None:
        self.pool = pool
        self.device = accelerator.device
        self.num_workers = num_workers
        self.pool_seed = seed  # the same in every process, unlike the stream's own seed
        self.seed = seed + 7919 * accelerator.process_index
        self.sampler = _SeededPermutations(len(pool), self.seed)
        # Reseeded every epoch: it draws the workers' seeds, which seed_worker hands to the
        # pool's transform, so each worker and each epoch perturbs afresh, reproducibly.
        self.generator = torch.Generator()
        self.loader = DataLoader(
            _IndexedPool(pool),
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=num_workers,
            worker_init_fn=seed_worker,
            generator=self.generator,
            drop_last=True,
            pin_memory=self.device.type == "cuda",
        )
        self.features = self._cache(pool, objective, accelerator) if pool.is_fixed else None

    def _cache(self, pool: Any, objective: FSEBObjective, accelerator: Accelerator) -> Tensor:
        loader = DataLoader(pool, batch_size=256, num_workers=self.num_workers)
        chunks = []
        with accelerator.autocast():
            for x in progress_bar(loader, desc="φ0 features", show=accelerator.is_main_process):
                chunks.append(objective.prior_features(x.to(self.device)).float())
        return torch.cat(chunks)  # (P, D)

    def mean_sq_norm(self, objective: FSEBObjective) -> float:
        """m = mean ‖h(x̂; φ0)‖² over the pool, which ``fseb.prior_std`` is resolved with.

        A fixed pool: all its cached features. A perturbed pool: :func:`mean_sq_feature_norm` of
        a seeded sample, seeded by the run's seed, so every process (same pool, same seed) and a
        resumed run get the same m.
        """
        if self.features is not None:
            return float(self.features.double().square().sum(dim=1).mean())
        return mean_sq_feature_norm(self.pool, objective, self.device, self.pool_seed)

    def epoch(self, epoch: int) -> Iterator[tuple[Tensor, Tensor | None]]:
        """Endless ``(x̂, cached features or None)`` for one training epoch, seeded by epoch."""
        self.sampler.set_epoch(epoch)
        self.generator.manual_seed(epoch_seed(self.seed, epoch))
        if self.num_workers == 0:
            self.pool.reseed(epoch_seed(self.seed, epoch))
        for x, idx in self.loader:
            x = x.to(self.device, non_blocking=True)  # (M, C, H, W)
            feats = (
                None
                if self.features is None
                else self.features[idx.to(self.device, non_blocking=True)]
            )
            yield x, feats


@torch.no_grad()
def mean_sq_feature_norm(
    pool: Any,
    objective: FSEBObjective,
    device: torch.device | str,
    seed: int,
    max_images: int = MEAN_SQ_NORM_IMAGES,
    batch_size: int = 256,
) -> float:
    """m = mean ‖h(x̂; φ0)‖² over a seeded sample of at most ``max_images`` images of ``pool``.

    One pass of φ0, no autograd, in float32. The sample (a seeded permutation) and the pool's
    random perturbations (its transform reseeded with ``seed``) depend only on ``seed``; the
    training stream reseeds the transform itself every epoch, so this draws nothing from it.
    """
    count = min(len(pool), max_images)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:count]
    pool.reseed(seed)
    total = 0.0
    for start in range(0, count, batch_size):
        batch = order[start : start + batch_size].tolist()
        x = torch.stack([pool[i] for i in batch])  # (b, C, H, W)
        h = objective.prior_features(x.to(device)).double()  # (b, D)
        total += float(h.square().sum())
    return total / count


def _check_kind(kind: str) -> None:
    """Only the kinds of docs/method.md, "Choosing the context set and φ0", exist."""
    if kind not in CONTEXT_KINDS:
        raise ValueError(f"context kind must be one of {list(CONTEXT_KINDS)}, got {kind!r}")


def _check_sources(sources: Sequence[LabeledImages]) -> None:
    """Sources must be non-empty and agree on channels, since one batch stacks them."""
    for source in sources:
        if len(source) == 0:
            raise ValueError(f"context source {source.identity} is empty")
    channels = {source.identity: source.channels for source in sources}
    if len(set(channels.values())) > 1:
        raise ValueError(f"context sources disagree on image channels: {channels}")


def _draw(sources: Sequence[LabeledImages], counts: np.ndarray, seed: int) -> np.ndarray:
    """(M, 2) int64 (source, sample) pairs: ``counts[s]`` distinct samples of each source."""
    rng = np.random.default_rng(seed)
    chosen = []
    for s, (source, count) in enumerate(zip(sources, counts, strict=True)):
        count = min(int(count), len(source))
        # Sorted so reading the pool walks each source in storage order.
        samples = np.sort(rng.choice(len(source), size=count, replace=False))  # (count,)
        chosen.append(np.stack([np.full(count, s), samples], axis=1))  # (count, 2)
    return np.concatenate(chosen).astype(np.int64)  # (M, 2)


def context_sets(ctx: ContextConfig, channels: int, seed: int) -> list[LabeledImages]:
    """The datasets of ``context.datasets``, loaded with the run's ``channels`` and ``seed``."""
    return [
        load_split(f"context.datasets[{i}]", s, channels, seed) for i, s in enumerate(ctx.datasets)
    ]


def context_stream(
    ctx: ContextConfig,
    seed: int,
    train: LabeledImages,
    others: list[LabeledImages],
    spec: InputSpec,
    accelerator: Accelerator,
    objective: FSEBObjective,
    num_workers: int = 0,
) -> ContextStream:
    """The stream of context batches of a FS-EB run, its pool drawn from ``train`` and/or
    ``others`` (:func:`context_sets`) as ``ctx`` says, seeded by the run's ``seed``."""
    pool = build_context_pool(
        kind=ctx.kind,
        train=train if ctx.kind in ("train", "mixture") else None,
        datasets=others,
        spec=spec,
        weights=list(ctx.weights) or None,
        size=ctx.pool_size,
        seed=seed,
        perturb=ctx.perturb,
    )
    accelerator.print(f"context: {pool!r}")
    return ContextStream(
        pool, ctx.batch_size, seed, accelerator, objective, num_workers=num_workers
    )


def resolve_prior_on_pool(
    fseb: FSEBConfig, context: ContextStream | None, objective: FSEBObjective
) -> dict[str, float] | None:
    """Resolve ``fseb.prior_std`` into s and d from m = mean ‖h(x̂; φ0)‖² over the context pool,
    set them on ``objective`` and return them for run.json (``None``: the recipe gives s and d).

    Every process builds the same pool with the same seed, so each resolves the same s and d.
    """
    if fseb.prior_std is None or context is None:
        return None
    m = context.mean_sq_norm(objective)
    scale, diag = resolve_prior(fseb.prior_std, fseb.prior_feature_share, m)
    objective.set_prior_covariance(scale, diag)
    return {
        "prior_std": fseb.prior_std,
        "feature_share": fseb.prior_feature_share,
        "mean_sq_norm": m,
        "prior_cov_scale": scale,
        "prior_cov_diag": diag,
    }
