"""Context sources for the FS-EB regulariser (design section 2).

Context points x̂ are unlabeled images at which the function-space prior is evaluated. A run
draws them from a fixed, seeded :class:`ContextPool` (reference: 10k images) taken from the
training inputs, another dataset, or a weighted mixture, optionally through the "corrupted
training inputs" transform. The pool's ``identity`` records exactly which images and which
transform were used, so it can be logged and saved with the run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import albumentations as A
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fseb_ft.data import (
    LabeledImages,
    allocate,
    check_input_size,
    check_transform_channels,
    compose_seeded,
    eval_transform,
    is_deterministic,
    make_loader,
    normalize_to_tensor,
    seed_transform,
)

__all__ = [
    "CONTEXT_KINDS",
    "ContextPool",
    "build_context_pool",
    "context_loader",
    "corruption_transform",
    "infinite_batches",
]

CONTEXT_KINDS = ("train", "dataset", "mixture")

_Batch = TypeVar("_Batch")


def corruption_transform(
    input_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    strength: float = 1.0,
    seed: int | None = None,
) -> A.Compose:
    """The reference "corrupted training inputs": crop, flip, colour jitter, blur, solarise.

    Corruptions act on the uint8 image; the random resized crop also brings it to
    ``input_size``; then normalise and convert to a CHW float32 tensor like the eval transform.
    Magnitudes follow the BYOL/SimCLR family the reference list comes from (jitter 0.4/0.4/0.2/
    0.1 with p=0.8, blur sigma 0.1-2 px with p=0.5, solarise p=0.2, crop scale down to 0.35);
    ``strength`` scales all magnitudes and probabilities (1 = reference, capped where a
    parameter has a hard limit). ``seed`` makes the stream of corruptions reproducible.
    """
    if not strength > 0:
        raise ValueError(f"corruption strength must be positive, got {strength}")
    height, width = check_input_size(input_size)
    steps = [
        A.RandomResizedCrop(size=(height, width), scale=(max(0.08, 1 - 0.65 * strength), 1.0)),
        A.HorizontalFlip(p=0.5),
        A.ColorJitter(
            brightness=0.4 * strength,
            contrast=0.4 * strength,
            saturation=0.2 * strength,
            hue=min(0.5, 0.1 * strength),
            p=min(1.0, 0.8 * strength),
        ),
        A.GaussianBlur(sigma_limit=(0.1, 0.1 + 1.9 * strength), p=min(1.0, 0.5 * strength)),
        A.Solarize(threshold_range=(0.5, 0.5), p=min(1.0, 0.2 * strength)),
    ]
    return compose_seeded([*steps, *normalize_to_tensor(mean, std)], seed)


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
            computed once and cached; False for the corruption transform.
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
        image, _ = self.sources[source][sample]  # (H, W, C) uint8; the label is not used
        return self.transform(image=image)["image"]  # (C, H, W)

    def reseed(self, seed: int) -> None:
        """Reseed the transform's random stream (called per DataLoader worker)."""
        seed_transform(self.transform, seed)

    def __repr__(self) -> str:
        """Short summary for logs."""
        ident = self.identity
        return (
            f"ContextPool(kind={ident['kind']}, size={ident['size']}, counts={ident['counts']}, "
            f"fixed={self.is_fixed}, fingerprint={ident['fingerprint'][:12]})"
        )


def build_context_pool(
    kind: str,
    train: LabeledImages | None,
    datasets: Sequence[LabeledImages],
    weights: Sequence[float] | None,
    size: int,
    seed: int,
    input_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    corrupt: bool = False,
    strength: float = 1.0,
) -> ContextPool:
    """Build the context pool a recipe asks for.

    kind "train": the training inputs; "dataset": exactly one other dataset; "mixture": the
    training inputs (when given) followed by ``datasets``, in proportion to ``weights`` (equal
    when None). ``corrupt`` applies :func:`corruption_transform` (drawn afresh every time an
    image is read), else the plain eval transform (a fixed pool whose features can be cached).
    """
    _check_kind(kind)
    datasets = list(datasets)
    if kind == "train":
        if train is None:
            raise ValueError('context kind "train" needs the training dataset (train=None given)')
        sources = [train]
    elif kind == "dataset":
        if len(datasets) != 1:
            raise ValueError(
                f'context kind "dataset" needs exactly one dataset, got {len(datasets)}; '
                'use kind "mixture" to combine several'
            )
        sources = datasets
    else:
        sources = ([] if train is None else [train]) + datasets
        if len(sources) < 2:
            raise ValueError(
                f'context kind "mixture" needs at least two sources, got {len(sources)} '
                "(the training set, if given, counts as one)"
            )
    if kind != "mixture" and weights is not None and len(weights) != 1:
        raise ValueError(f'context kind "{kind}" takes no mixture weights, got {list(weights)}')
    settings = f"input_size={tuple(input_size)}, mean={tuple(mean)}, std={tuple(std)}"
    if corrupt:
        transform = corruption_transform(input_size, mean, std, strength, seed)
        description = f"corruption(strength={strength}, {settings})"
    else:
        transform = eval_transform(input_size, mean, std)
        description = f"eval({settings})"
    weights = weights if kind == "mixture" else None
    return ContextPool(sources, transform, size, seed, weights, kind, description)


def context_loader(
    pool: ContextPool, batch_size: int, seed: int, num_workers: int = 0
) -> DataLoader:
    """Batches of context images, reshuffled every epoch (seeded), incomplete batches dropped."""
    if batch_size > len(pool):
        raise ValueError(
            f"context batch size {batch_size} exceeds the pool of {len(pool)} images; "
            "with drop_last no batch would ever be produced"
        )
    return make_loader(pool, batch_size, True, num_workers, seed, drop_last=True)


def infinite_batches(loader: Iterable[_Batch]) -> Iterator[_Batch]:
    """Cycle through ``loader`` epoch after epoch, so a training step can always draw a batch.

    Each pass re-iterates the loader, so a shuffling loader reshuffles between passes.
    """
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced:
            raise ValueError("the loader produced no batches; cannot cycle an empty loader")


def _check_kind(kind: str) -> None:
    """Only the kinds of design section 2 exist."""
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
