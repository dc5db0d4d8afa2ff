"""Image → tensor transforms and their seeding (the DataLoaders: :mod:`fseb_ft.data.loaders`).

Transforms turn :class:`~fseb_ft.data.images.LabeledImages` samples into normalised float32 CHW
tensors for timm backbones: evaluation with timm's own eval transform (the preprocessing an
exported model's card documents), training and the perturbed training inputs of the context pool
with albumentations or, for ``timm``, timm's training transform (:class:`TimmTrainTransform`),
the training augmentation looked up by name among those registered with
``@augmentation("name")``. Every random stream is seeded, from (seed, epoch) where it restarts
per epoch, so a resumed run draws what an uninterrupted one would. A pipeline whose first step
shrinks every image (a resize or random resized crop to a size well below the image's) has its
JPEGs decoded at a reduced scale that step still shrinks
(:func:`~fseb_ft.data.decode_size.min_decode_size`); evaluation decodes in full, so its pixels
are timm's.

This module takes plain arguments; mapping a recipe onto them is the caller's job.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import albumentations as A
import cv2
import numpy as np
import PIL.Image
import timm.data
import torch
from albumentations.pytorch import ToTensorV2
from torch.utils.data import Dataset

from fseb_ft.data.decode_size import min_decode_size
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.inputs import EVAL_RESIZE

__all__ = [
    "AUGMENTATIONS",
    "Augmentation",
    "EvalTransform",
    "TimmTrainTransform",
    "TransformedImages",
    "augmentation",
    "check_input_size",
    "check_transform_channels",
    "compose_seeded",
    "epoch_seed",
    "eval_transform",
    "is_deterministic",
    "normalize_to_tensor",
    "perturbation_transform",
    "seed_transform",
    "train_transform",
]

# Transforms that map one input to one output, so features of their outputs can be cached.
_DETERMINISTIC = (
    A.Resize,
    A.Normalize,
    A.CenterCrop,
    A.LongestMaxSize,
    A.SmallestMaxSize,
    A.ToFloat,
    ToTensorV2,
)


def train_transform(
    input_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    augment: str = "none",
    seed: int | None = None,
) -> A.Compose | TimmTrainTransform:
    """Training pipeline: augmentation, resize to ``input_size``, normalise, CHW float32 tensor.

    ``augment`` names one of :data:`AUGMENTATIONS`: "none"; "flip" (horizontal); "crop_flip"
    (reflect-pad 4 px per 32 px of size, random crop back to size, flip: the CIFAR recipe at any
    resolution); "randaug-lite" (RandomResizedCrop with scale (0.35, 1) plus flip); "timm"
    (timm's training transform, :class:`TimmTrainTransform`). ``mean``/``std`` are in [0, 1]
    units as in timm's data config.
    """
    height, width = check_input_size(input_size)
    if augment not in AUGMENTATIONS:
        raise ValueError(f"augment must be one of {list(AUGMENTATIONS)}, got {augment!r}")
    if augment in _PIPELINES:
        pipeline = AUGMENTATIONS[augment](height, width, mean, std)
        seed_transform(pipeline, seed)
        return pipeline
    steps = AUGMENTATIONS[augment](height, width)
    return compose_seeded([*steps, *normalize_to_tensor(mean, std)], seed)


Augmentation = Callable[..., Any]
"""``(height, width) → albumentations steps`` that augment an image and bring it to that size;
or, registered with ``pipeline=True``, ``(height, width, mean, std) → the whole transform``
(normalised tensors out, called like albumentations, seeded by ``set_random_state``)."""

AUGMENTATIONS: dict[str, Augmentation] = {}
"""The training augmentations by name (``data.augment``), in the order they are defined; a test
pins the names to :data:`fseb_ft.recipe.options.AUGMENTATIONS`."""

_PIPELINES: set[str] = set()
"""The names of :data:`AUGMENTATIONS` whose builder makes the whole transform."""


def augmentation(name: str, *, pipeline: bool = False) -> Callable[[Augmentation], Augmentation]:
    """Register the decorated builder as training augmentation ``name`` (once): a builder of
    albumentations steps, or with ``pipeline`` of the whole transform (:data:`Augmentation`)."""

    def register(build: Augmentation) -> Augmentation:
        if name in AUGMENTATIONS:
            raise ValueError(f"augmentation {name!r} is registered twice ({AUGMENTATIONS[name]})")
        AUGMENTATIONS[name] = build
        if pipeline:
            _PIPELINES.add(name)
        return build

    return register


def _resize(height: int, width: int) -> A.Resize:
    """Resize with INTER_AREA when shrinking: it averages like evaluation's antialiased PIL
    resize, where cv2's bilinear reads only 2x2 pixels per output and aliases. Upscaling stays
    bilinear."""
    return A.Resize(height, width, area_for_downscale="image")


@augmentation("none")
def _no_augmentation(height: int, width: int) -> list[Any]:
    """Resize only."""
    return [_resize(height, width)]


@augmentation("flip")
def _flip(height: int, width: int) -> list[Any]:
    """Resize, then a horizontal flip half of the time."""
    return [_resize(height, width), A.HorizontalFlip(p=0.5)]


@augmentation("crop_flip")
def _crop_flip(height: int, width: int) -> list[Any]:
    """Resize, reflect-pad 4 px per 32 px of size, random crop back to size, flip: the CIFAR
    recipe at any resolution."""
    pad_h, pad_w = max(1, round(4 * height / 32)), max(1, round(4 * width / 32))
    return [
        _resize(height, width),
        A.PadIfNeeded(height + 2 * pad_h, width + 2 * pad_w, border_mode=cv2.BORDER_REFLECT_101),
        A.RandomCrop(height, width),
        A.HorizontalFlip(p=0.5),
    ]


@augmentation("randaug-lite")
def _randaug_lite(height: int, width: int) -> list[Any]:
    """RandomResizedCrop with scale (0.35, 1) (INTER_AREA when shrinking), then flip."""
    return [
        A.RandomResizedCrop(size=(height, width), scale=(0.35, 1.0), area_for_downscale="image"),
        A.HorizontalFlip(p=0.5),
    ]


@augmentation("timm", pipeline=True)
def _timm(
    height: int, width: int, mean: Sequence[float], std: Sequence[float]
) -> TimmTrainTransform:
    """timm's training transform (:class:`TimmTrainTransform`): random resized crop, flip,
    RandAugment, normalise, random erasing."""
    return TimmTrainTransform((height, width), mean, std)


TIMM_AUTO_AUGMENT = "rand-m9-mstd0.5-inc1-mmax9"
"""The RandAugment policy of ``augment: timm``: two ops of magnitude 9 (σ 0.5), the increasing
variants (timm's ImageNet recipes), the sampled magnitude clipped at 9 rather than timm's 10:
at 10, ``PosterizeIncreasing`` keeps 0 bits, which Pillow ≥ 13 refuses (an error at a random
step of a run) and older Pillow turns into a black image."""
TIMM_RE_PROB = 0.25
"""The random-erasing probability of ``augment: timm`` (timm's ImageNet recipes)."""


class TimmTrainTransform:
    """timm's training transform, called like albumentations: ``t(image=array)["image"]``.

    ``timm.data.create_transform(is_training=True, auto_augment=TIMM_AUTO_AUGMENT,
    re_prob=TIMM_RE_PROB)`` with timm's other defaults: a random resized crop (scale
    (0.08, 1)) to the input size, a horizontal flip, RandAugment, normalisation and random
    erasing (of the normalised tensor, so it is the whole pipeline). The uint8 (H, W, 1|3) array
    becomes a PIL image as for :class:`EvalTransform`. timm draws from the global streams of
    ``random``, numpy and torch; this transform keeps its own three, seeded by
    :meth:`set_random_state` and swapped in around each call, so a seeded run repeats and
    nothing else's draws move. Picklable (DataLoader workers).
    """

    def __init__(
        self, input_size: tuple[int, int], mean: Sequence[float], std: Sequence[float]
    ) -> None:
        """Build timm's transform for ``input_size`` (H, W) and ``mean``/``std`` in [0, 1] units."""
        self.input_size = check_input_size(input_size)
        self.mean, self.std = _check_stats(mean, std)
        self.transform = timm.data.create_transform(
            input_size=self.input_size,
            is_training=True,
            auto_augment=TIMM_AUTO_AUGMENT,
            re_prob=TIMM_RE_PROB,
            mean=self.mean,
            std=self.std,
        )
        self.set_random_state(np.random.default_rng(0), random.Random(0))

    def set_random_state(self, generator: np.random.Generator, py_random: random.Random) -> None:
        """Seed the transform's three streams from ``generator`` and ``py_random`` (what
        :func:`seed_transform` gives an albumentations pipeline)."""
        self._python = random.Random(py_random.getrandbits(64)).getstate()
        self._numpy = np.random.RandomState(int(generator.integers(2**32))).get_state()
        self._torch = torch.Generator().manual_seed(int(generator.integers(2**63))).get_state()

    @contextmanager
    def _own_streams(self) -> Iterator[None]:
        """Draw from this transform's streams inside, the global ones' states kept outside."""
        python, numpy_state = random.getstate(), np.random.get_state()
        random.setstate(self._python)
        np.random.set_state(self._numpy)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._torch)
            try:
                yield
            finally:
                self._python, self._numpy = random.getstate(), np.random.get_state()
                self._torch = torch.get_rng_state()
                random.setstate(python)
                np.random.set_state(numpy_state)

    def __call__(self, *, image: np.ndarray) -> dict[str, torch.Tensor]:
        """``{"image": tensor (C, H, W) float32}`` of a uint8 (H, W, C) image."""
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3):
            raise ValueError(
                f"expected a uint8 (H, W, 1|3) image, got {image.dtype} of shape {image.shape}"
            )
        pil = PIL.Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)  # L | RGB
        with self._own_streams():
            return {"image": self.transform(pil)}

    def __repr__(self) -> str:
        """The timm pipeline, for logs."""
        return f"TimmTrainTransform({self.transform})"


def eval_transform(
    input_size: tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> EvalTransform:
    """Evaluation pipeline: resize to ``input_size``, normalise, CHW float32 tensor.

    timm's eval transform with :data:`~fseb_ft.data.inputs.EVAL_RESIZE`: bit for bit what
    ``timm.data.create_transform(**timm.data.resolve_data_config(model=m))`` does to the PIL image
    for a model ``m`` exported by :mod:`fseb_ft.push`.
    """
    return EvalTransform(input_size, mean, std)


class EvalTransform:
    """timm's evaluation transform, called like albumentations: ``t(image=array)["image"]``.

    The uint8 (H, W, 1|3) array becomes a PIL image of mode "L" or "RGB" (what
    ``Image.open(path).convert(mode)`` gives for the same pixels), which
    ``timm.data.create_transform`` in eval mode resizes, converts and normalises. Deterministic
    and picklable (DataLoader workers).
    """

    def __init__(
        self, input_size: tuple[int, int], mean: Sequence[float], std: Sequence[float]
    ) -> None:
        """Build timm's transform for ``input_size`` (H, W) and ``mean``/``std`` in [0, 1] units."""
        self.input_size = check_input_size(input_size)
        self.mean, self.std = _check_stats(mean, std)
        self.transform = timm.data.create_transform(
            input_size=self.input_size, is_training=False, mean=self.mean, std=self.std,
            **EVAL_RESIZE,
        )  # fmt: skip

    def __call__(self, *, image: np.ndarray) -> dict[str, torch.Tensor]:
        """``{"image": tensor (C, H, W) float32}`` of a uint8 (H, W, C) image."""
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3):
            raise ValueError(
                f"expected a uint8 (H, W, 1|3) image, got {image.dtype} of shape {image.shape}"
            )
        pil = PIL.Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)  # L | RGB
        return {"image": self.transform(pil)}

    def __repr__(self) -> str:
        """The timm pipeline, for logs."""
        return f"EvalTransform({self.transform})"


def perturbation_transform(
    input_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    strength: float = 1.0,
    seed: int | None = None,
) -> A.Compose:
    """The reference "perturbed training inputs": crop, flip, colour jitter, blur, solarise.

    Perturbations act on the uint8 image; the random resized crop also brings it to
    ``input_size``; then normalise and convert to a CHW float32 tensor like the eval transform.
    Magnitudes follow the BYOL/SimCLR family the reference list comes from (jitter 0.4/0.4/0.2/
    0.1 with p=0.8, blur sigma 0.1-2 px with p=0.5, solarise p=0.2, crop scale down to 0.35);
    ``strength`` scales all magnitudes and probabilities (1 = reference, capped where a
    parameter has a hard limit). ``seed`` makes the stream of perturbations reproducible.
    """
    if not strength > 0:
        raise ValueError(f"perturbation strength must be positive, got {strength}")
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


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's random stream in a run seeded ``seed``.

    Derived from (seed, epoch) alone, not carried over in iterator state, so a resumed run
    reseeds epoch ``epoch`` exactly as an uninterrupted one; the prime factor keeps the seeds of
    different (seed, epoch) pairs apart for any realistic number of epochs.
    """
    return seed * 1_000_003 + epoch


def seed_transform(transform: Any, seed: int | None) -> None:
    """Give an albumentations pipeline one shared random stream seeded with ``seed``.

    ``Compose(seed=...)`` seeds every inner transform with the *same* seed, so their coin flips
    are correlated (e.g. flip and blur always co-occur); one shared generator avoids that.
    Other callables are left alone.
    """
    if hasattr(transform, "set_random_state"):
        transform.set_random_state(np.random.default_rng(seed), random.Random(seed))


def is_deterministic(transform: Any) -> bool:
    """True for :class:`EvalTransform` and albumentations pipelines of fixed steps only.

    Unknown transforms count as random, which is the safe answer for caching.
    """
    if isinstance(transform, EvalTransform):
        return True
    if isinstance(transform, A.Compose):
        return transform.p == 1 and all(is_deterministic(t) for t in transform.transforms)
    return isinstance(transform, _DETERMINISTIC) and transform.p == 1


class TransformedImages(Dataset):
    """``(tensor (C, H, W) float32, int label)`` pairs: a :class:`LabeledImages` plus a transform.

    ``transform`` is an :class:`EvalTransform` or an albumentations pipeline ending in
    ToTensorV2, called as ``transform(image=array)["image"]``. Images are read as small as the
    transform allows (:func:`min_decode_size`).
    """

    def __init__(self, base: LabeledImages, transform: Callable[..., dict[str, Any]]) -> None:
        """Pair ``base`` with ``transform``, checking normalisation matches its channels."""
        check_transform_channels(transform, base.channels, base.identity)
        self.base = base
        self.transform = transform
        self.min_size = min_decode_size(transform)

    def __len__(self) -> int:
        """Number of samples of the base dataset."""
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Transformed image and its label (collates to an int64 tensor)."""
        image, label = self.base.read(index, self.min_size)  # (H, W, C) uint8
        return self.transform(image=image)["image"], label  # (C, H', W') float32

    def reseed(self, seed: int) -> None:
        """Reseed the transform's random stream (called per DataLoader worker)."""
        seed_transform(self.transform, seed)


def compose_seeded(steps: list[Any], seed: int | None) -> A.Compose:
    """Compose ``steps`` with one shared random stream (see :func:`seed_transform`)."""
    pipeline = A.Compose(steps)
    seed_transform(pipeline, seed)
    return pipeline


def normalize_to_tensor(mean: Sequence[float], std: Sequence[float]) -> list[Any]:
    """Normalise (mean/std in [0, 1] units) and convert to a CHW float32 tensor."""
    mean, std = _check_stats(mean, std)
    return [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]


def _check_stats(
    mean: Sequence[float], std: Sequence[float]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Normalisation statistics as float tuples of 1 or 3 entries, std positive."""
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean) != len(std) or len(mean) not in (1, 3):
        raise ValueError(
            f"mean and std need 1 or 3 entries each (one per channel), got {mean} and {std}"
        )
    if min(std) <= 0:
        raise ValueError(f"std entries must be positive, got {std}")
    return mean, std


def check_input_size(input_size: Sequence[int]) -> tuple[int, int]:
    """Validate an (H, W) pair."""
    if len(input_size) != 2 or min(input_size) < 1:
        raise ValueError(f"input_size must be (height, width) of positive ints, got {input_size}")
    return int(input_size[0]), int(input_size[1])


def check_transform_channels(transform: Any, channels: int, identity: str) -> None:
    """Fail early when Normalize's per-channel statistics do not fit the images.

    albumentations silently broadcasts a 3-entry mean over a 1-channel image (and vice versa),
    which would feed wrongly normalised inputs to the model without any error.
    """
    steps = transform.transforms if isinstance(transform, A.Compose) else [transform]
    for step in steps:
        normalises = isinstance(step, A.Normalize | EvalTransform | TimmTrainTransform)
        entries = int(np.size(step.mean)) if normalises else 1
        if entries not in (1, channels):
            raise ValueError(
                f"transform normalises {entries} channels but {identity} yields "
                f"{channels}-channel images; pass mean/std with {channels} entries "
                f"or load the data with channels={entries}"
            )
