"""Labelled image datasets, their loaders, and albumentations transforms.

Every source (HF Hub id, image folder, ``save_to_disk`` folder, ``.npz`` arrays, IDX gzip files,
scikit-learn digits) becomes a :class:`LabeledImages`: indexable ``(uint8 HxWxC image, int label)``
pairs plus ``labels``, ``class_names`` and a short provenance string ``identity``. Transforms turn
those images into normalised float32 CHW tensors for timm backbones: evaluation with timm's own
eval transform (the preprocessing an exported model's card documents), training with
albumentations.

This module takes plain arguments; mapping a recipe onto them is the caller's job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import albumentations as A
import cv2
import datasets
import numpy as np
import PIL.Image
import timm.data
import torch
from albumentations.pytorch import ToTensorV2
from torch.utils.data import DataLoader, Dataset

from fseb_ft.config import DataConfig, DatasetSpec

__all__ = [
    "AUGMENTATIONS",
    "DIGITS_TEST_FRACTION",
    "EVAL_RESIZE",
    "FASHION_MNIST_CLASSES",
    "ArrayImages",
    "EvalTransform",
    "HFImages",
    "IndexedImages",
    "LabeledImages",
    "Splits",
    "TorchImages",
    "TransformedImages",
    "allocate",
    "as_labeled_images",
    "build_splits",
    "check_input_size",
    "check_labels",
    "check_transform_channels",
    "compose_seeded",
    "content_hash",
    "eval_transform",
    "is_deterministic",
    "load_arrays",
    "load_disk",
    "load_hub",
    "load_idx",
    "load_imagefolder",
    "load_sklearn_digits",
    "load_spec",
    "load_split",
    "make_loader",
    "normalize_to_tensor",
    "read_idx",
    "seed_transform",
    "seed_worker",
    "select_classes",
    "stratified_split",
    "train_transform",
]

FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
AUGMENTATIONS = ("none", "flip", "crop_flip", "randaug-lite")
EVAL_RESIZE: dict[str, Any] = {"interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash"}
"""How evaluation brings an image to the input size, in timm's data-config keys: squash the whole
image to (H, W) with PIL's antialiased bilinear resize, no centre-crop margin. Exported models
carry these keys in ``config.json``, so their documented transform is :func:`eval_transform`."""

# PIL modes that hold one intensity channel; everything else is converted to RGB.
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
# ITU-R BT.601 luma weights, the same PIL uses for convert("L").
_LUMA = np.array([0.299, 0.587, 0.114])
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
_Images = TypeVar("_Images", bound="LabeledImages")


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


class LabeledImages(Dataset):
    """Base class: ``data[i] -> (uint8 image (H, W, C), int label)``.

    Subclasses set ``labels`` (int64, (N,)), ``class_names``, ``identity`` and ``channels`` and
    implement :meth:`_read`, which returns the raw image of one sample. ``channels=3`` expands
    grayscale to RGB so every timm backbone accepts it; ``channels=1`` keeps (converts to) a single
    channel for small CNNs. The channel axis is always present, so transforms see (H, W, C).
    """

    labels: np.ndarray
    class_names: list[str]
    identity: str
    channels: int

    def __len__(self) -> int:
        """Number of samples."""
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """Image (H, W, channels) uint8 and integer label of sample ``index``."""
        index = self._check_index(index)
        image = _fit_channels(self._read(index), self.channels, f"image {index} of {self.identity}")
        return image, int(self.labels[index])

    @property
    def num_classes(self) -> int:
        """Number of class names (the label space size K)."""
        return len(self.class_names)

    def _read(self, index: int) -> np.ndarray:
        """Raw image of sample ``index`` (any of (H, W), (H, W, 1|3|4)); subclasses implement."""
        raise NotImplementedError

    def _check_index(self, index: int) -> int:
        """Accept Python-style negative indices; raise IndexError outside the dataset."""
        index = int(index)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for {n} samples of {self.identity}")
        return index

    def __repr__(self) -> str:
        """Short summary for logs."""
        return (
            f"{type(self).__name__}(n={len(self)}, classes={self.num_classes}, "
            f"channels={self.channels}, identity={self.identity!r})"
        )


class HFImages(LabeledImages):
    """A Hugging Face ``datasets.Dataset`` with an image column and an integer label column.

    Images may be stored as ``datasets.Image`` (decoded here, so a bad file is reported with its
    path), PIL images, numpy arrays or nested lists. ``class_names`` default to the label
    column's ``ClassLabel`` names, else ``"0" .. "K-1"``.
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        image_column: str = "image",
        label_column: str = "label",
        class_names: Sequence[str] | None = None,
        identity: str | None = None,
        channels: int = 3,
    ) -> None:
        """Wrap ``dataset``; see the class docstring."""
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(
                f"HFImages needs a datasets.Dataset (map-style), got {type(dataset).__name__}; "
                "pick a split of a DatasetDict, and do not use streaming=True"
            )
        self.identity = identity or _hf_identity(dataset)
        for column in (image_column, label_column):
            if column not in dataset.column_names:
                raise ValueError(
                    f"column {column!r} not found in {self.identity}; "
                    f"columns are {dataset.column_names}"
                )
        self.channels = _check_channels(channels)
        self.image_column = image_column
        self.labels = _int_column(dataset, label_column, self.identity)
        self.class_names = _class_names(class_names, dataset.features[label_column], self.labels)
        self._images = _undecoded(dataset.select_columns([image_column]), image_column)

    def _read(self, index: int) -> np.ndarray:
        """Decode one image, naming the sample and file when that fails."""
        value = self._images[index][self.image_column]
        return _decode_image(value, f"image {index} of {self.identity}")


class ArrayImages(LabeledImages):
    """In-memory uint8 images (N, H, W) or (N, H, W, C) with integer labels (N,)."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        class_names: Sequence[str] | None = None,
        identity: str | None = None,
        channels: int = 3,
    ) -> None:
        """Validate and hold the arrays; ``identity`` defaults to a content hash."""
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3, 4)):
            raise ValueError(
                f"images must have shape (N, H, W) or (N, H, W, C) with C in 1, 3, 4; "
                f"got {images.shape}"
            )
        if labels.shape != (len(images),):
            raise ValueError(f"labels must have shape ({len(images)},), got {labels.shape}")
        if len(labels) and not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
        self.images = images  # (N, H, W) or (N, H, W, C)
        self.labels = labels.astype(np.int64)  # (N,)
        self.identity = identity or f"arrays#{content_hash(images, labels)}"
        self.channels = _check_channels(channels)
        self.class_names = _class_names(class_names, None, self.labels)

    def _read(self, index: int) -> np.ndarray:
        """The stored image."""
        return self.images[index]


class IndexedImages(LabeledImages):
    """A subset of another :class:`LabeledImages`, e.g. the two halves of a validation split.

    ``identity`` is the base identity plus a hash of the chosen indices, so a logged run tells a
    training subset from its validation complement.
    """

    def __init__(self, base: LabeledImages, indices: Sequence[int] | np.ndarray) -> None:
        """Select ``indices`` (any order, repeats allowed) of ``base``."""
        indices = np.asarray(indices, dtype=np.int64)  # (M,)
        if indices.ndim != 1:
            raise ValueError(f"indices must be one-dimensional, got shape {indices.shape}")
        if len(indices) and (indices.min() < 0 or indices.max() >= len(base)):
            raise IndexError(
                f"indices must lie in [0, {len(base)}) for {base.identity}; "
                f"got range [{indices.min()}, {indices.max()}]"
            )
        self.base = base
        self.indices = indices
        self.labels = base.labels[indices]  # (M,)
        self.class_names = list(base.class_names)
        self.channels = base.channels
        self.identity = f"{base.identity}|subset:{len(indices)}#{content_hash(indices)}"

    def _read(self, index: int) -> np.ndarray:
        """The base dataset's raw image."""
        return self.base._read(int(self.indices[index]))


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------


def load_hub(
    repo_id: str,
    split: str,
    revision: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    cache_dir: str | Path | None = None,
    config: str | None = None,
    channels: int = 3,
) -> HFImages:
    """Load one split of a Hugging Face Hub dataset (pin ``revision`` for reproducible runs)."""
    dataset = datasets.load_dataset(
        repo_id,
        config,
        revision=revision,
        split=split,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    name = repo_id if config is None else f"{repo_id}/{config}"
    identity = f"hub:{name}@{revision or 'default'}:{split}#{dataset._fingerprint}"
    return _nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


def load_imagefolder(
    path: str | Path,
    split: str = "train",
    cache_dir: str | Path | None = None,
    channels: int = 3,
) -> HFImages:
    """Load ``path/<split>/<class>/*`` (or a flat ``path/<class>/*`` as split "train").

    Labels follow the sorted names of this split's class folders, empty folders included.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"image folder {path} does not exist or is not a directory")
    dataset = datasets.load_dataset(
        "imagefolder",
        data_dir=str(path),
        split=split,
        # Without this, a folder with a single class (a typical OOD set) loses its label column.
        drop_labels=False,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    identity = f"imagefolder:{path}:{split}#{dataset._fingerprint}"
    data = HFImages(dataset, "image", "label", None, identity, channels)
    return _nonempty(_own_class_folders(data, path, split))


def _own_class_folders(data: HFImages, path: Path, split: str) -> HFImages:
    """Relabel ``data`` by the sorted class folders of its own split, empty ones included.

    ``datasets``' imagefolder builder numbers the class folders of all splits together and skips
    empty ones: a class folder only the test split has would become a training class without
    images, and an empty training folder would vanish without a word. Per split, a renamed or
    extra test folder is caught by :meth:`Splits.check_labels` and an empty one is reported.
    """
    present = [data.class_names[k] for k in np.unique(data.labels)]
    folder = path / split if (path / split).is_dir() else path
    folders = []
    # Not for a split stored under another folder name (e.g. "val/" for split "validation").
    if all((folder / name).is_dir() for name in present):
        folders = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    names = sorted(set(present) | set(folders))
    remap = np.array([names.index(n) if n in names else -1 for n in data.class_names], np.int64)
    data.labels = remap[data.labels]  # (N,)
    data.class_names = names
    return data


def load_disk(
    path: str | Path,
    split: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    channels: int = 3,
) -> HFImages:
    """Load a ``save_to_disk`` folder: a ``Dataset``, or one ``split`` of a ``DatasetDict``.

    ``split`` may be omitted for a ``DatasetDict`` with a single split.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset folder {path} does not exist")
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in loaded:
            raise ValueError(f"split {split!r} not found in {path}; splits are {splits}")
        dataset = loaded[split]
    else:
        dataset = loaded
        if split is not None and dataset.split is not None and str(dataset.split) != split:
            raise ValueError(f"{path} holds split {str(dataset.split)!r}, not {split!r}")
    identity = f"disk:{path}:{split or dataset.split}#{dataset._fingerprint}"
    return _nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


def load_arrays(path: str | Path, channels: int = 3) -> ArrayImages:
    """Load an ``.npz`` with ``images`` (uint8), ``labels`` and optional ``class_names``."""
    path = Path(path)
    with np.load(path, allow_pickle=False) as npz:
        missing = [key for key in ("images", "labels") if key not in npz.files]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}; it has {npz.files}")
        images = npz["images"]
        labels = npz["labels"]
        class_names = [str(c) for c in npz["class_names"]] if "class_names" in npz.files else None
    identity = f"npz:{path.name}#{content_hash(images, labels)}"
    return _nonempty(ArrayImages(images, labels, class_names, identity, channels))


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw) holding unsigned bytes.

    Layout: ``>HBB`` header (zero, dtype code 0x08 = uint8, ndim), ndim big-endian uint32 sizes,
    then the raw data, whose length must equal the product of the sizes.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise ValueError(f"{path} is not a complete gzip stream ({err})") from err
    if len(raw) < 4:
        raise ValueError(f"{path} is too short ({len(raw)} bytes) to hold an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0:
        raise ValueError(f"{path} is not an IDX file: first two bytes are {zero:#06x}, not 0")
    if dtype_code != 0x08:
        raise ValueError(f"{path} has IDX dtype {dtype_code:#04x}; only 0x08 (uint8) is supported")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path} is truncated inside its header ({ndim} dimensions announced)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header announces shape {shape} = {expected} bytes of data, "
            f"but the file holds {len(raw) - header} (truncated or corrupt)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_idx(
    images_path: str | Path,
    labels_path: str | Path,
    class_names: Sequence[str] | None = None,
    channels: int = 3,
) -> ArrayImages:
    """Load an MNIST-style pair of IDX files: images (N, H, W) and labels (N,)."""
    images = read_idx(images_path)  # (N, H, W)
    labels = read_idx(labels_path)  # (N,)
    if images.ndim != 3:
        raise ValueError(f"{images_path} holds shape {images.shape}; expected (N, H, W)")
    if labels.ndim != 1:
        raise ValueError(f"{labels_path} holds shape {labels.shape}; expected (N,)")
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    identity = (
        f"idx:{Path(images_path).name}+{Path(labels_path).name}#{content_hash(images, labels)}"
    )
    return _nonempty(ArrayImages(images, labels, class_names, identity, channels))


def load_sklearn_digits(classes: Sequence[int] | None = None, channels: int = 3) -> ArrayImages:
    """scikit-learn's 8x8 digits (1,797 images), scaled from 0..16 to uint8 0..255.

    ``classes`` keeps only those digits and relabels them 0..len(classes)-1 in the given order,
    e.g. ``[0, 1, 2, 3, 4]`` in-distribution and ``[5, 6, 7, 8, 9]`` as an OOD set.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    labels = digits.target.astype(np.int64)  # (1797,)
    if classes is None:
        return ArrayImages(
            images, labels, [str(d) for d in range(10)], "sklearn.load_digits", channels
        )
    classes = [int(c) for c in classes]
    if not classes or len(set(classes)) != len(classes) or not set(classes) <= set(range(10)):
        raise ValueError(f"classes must be distinct digits in 0..9, got {classes}")
    keep = np.isin(labels, classes)  # (1797,)
    remap = np.full(10, -1, dtype=np.int64)
    remap[classes] = np.arange(len(classes))
    identity = f"sklearn.load_digits[{','.join(map(str, classes))}]"
    return ArrayImages(
        images[keep], remap[labels[keep]], [str(c) for c in classes], identity, channels
    )


# ---------------------------------------------------------------------------------------------
# Splits and checks
# ---------------------------------------------------------------------------------------------


def stratified_split(
    labels: np.ndarray | Sequence[int], fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split into (train indices, validation indices), both sorted.

    ``fraction`` of the samples go to validation, allocated to classes in proportion to their
    size (largest remainder), but never a class's last sample: every class keeps at least one
    training sample, so a rare class may get fewer validation samples than its share.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    labels = np.asarray(labels)  # (N,)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = np.minimum(allocate(round(fraction * len(labels)), counts), counts - 1)  # (C,)
    rng = np.random.default_rng(seed)
    val = [rng.permutation(np.flatnonzero(inverse == c))[: quota[c]] for c in range(len(classes))]
    val_idx = np.sort(np.concatenate(val)).astype(np.int64)  # (V,)
    if len(val_idx) == 0:
        raise ValueError(
            f"validation fraction {fraction} of {len(labels)} samples leaves an empty "
            "validation set; raise the fraction"
        )
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx)  # (N - V,)
    return train_idx, val_idx


def allocate(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Split the integer ``total`` in proportion to ``weights`` (largest remainder method).

    The counts are non-negative integers that sum exactly to ``total``.
    """
    weights = np.asarray(weights, dtype=np.float64)  # (S,)
    if weights.ndim != 1 or len(weights) == 0:
        raise ValueError(f"weights must be a non-empty 1-D sequence, got shape {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(
            f"weights must be finite, non-negative and not all zero, got {weights.tolist()}"
        )
    exact = total * weights / weights.sum()  # (S,)
    counts = np.floor(exact).astype(np.int64)
    # Ties break towards the earlier entry (stable sort), which keeps the result reproducible.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def check_labels(data: LabeledImages, num_classes: int) -> None:
    """Raise ValueError if any label of ``data`` lies outside [0, num_classes)."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    bad = np.unique(data.labels[(data.labels < 0) | (data.labels >= num_classes)])
    if len(bad):
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise ValueError(
            f"{data.identity} has label values {shown} outside the allowed range [0, {num_classes})"
        )


def content_hash(*arrays: np.ndarray) -> str:
    """First 16 hex digits of a sha256 over the arrays' dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.data)
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def train_transform(
    input_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    augment: str = "none",
    seed: int | None = None,
) -> A.Compose:
    """Training pipeline: augmentation, resize to ``input_size``, normalise, CHW float32 tensor.

    ``augment``: "none"; "flip" (horizontal); "crop_flip" (reflect-pad 4 px per 32 px of size,
    random crop back to size, flip: the CIFAR recipe at any resolution); "randaug-lite"
    (RandomResizedCrop with scale (0.35, 1) plus flip). ``mean``/``std`` are in [0, 1] units as in
    timm's data config.
    """
    height, width = check_input_size(input_size)
    # INTER_AREA when shrinking: it averages like evaluation's antialiased PIL resize, where cv2's
    # bilinear reads only 2x2 pixels per output and aliases. Upscaling stays bilinear.
    resize = A.Resize(height, width, area_for_downscale="image")
    flip = A.HorizontalFlip(p=0.5)
    if augment == "none":
        steps: list[Any] = [resize]
    elif augment == "flip":
        steps = [resize, flip]
    elif augment == "crop_flip":
        pad_h, pad_w = max(1, round(4 * height / 32)), max(1, round(4 * width / 32))
        steps = [
            resize,
            A.PadIfNeeded(
                height + 2 * pad_h, width + 2 * pad_w, border_mode=cv2.BORDER_REFLECT_101
            ),
            A.RandomCrop(height, width),
            flip,
        ]
    elif augment == "randaug-lite":
        steps = [
            A.RandomResizedCrop(
                size=(height, width), scale=(0.35, 1.0), area_for_downscale="image"
            ),
            flip,
        ]
    else:
        raise ValueError(f"augment must be one of {list(AUGMENTATIONS)}, got {augment!r}")
    return compose_seeded([*steps, *normalize_to_tensor(mean, std)], seed)


def eval_transform(
    input_size: tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> EvalTransform:
    """Evaluation pipeline: resize to ``input_size``, normalise, CHW float32 tensor.

    timm's eval transform with :data:`EVAL_RESIZE`: bit for bit what
    ``timm.data.create_transform(**timm.data.resolve_data_config(model=m))`` does to the PIL image
    for a model ``m`` exported by :mod:`fseb_ft.hub`.
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
    ToTensorV2, called as ``transform(image=array)["image"]``.
    """

    def __init__(self, base: LabeledImages, transform: Callable[..., dict[str, Any]]) -> None:
        """Pair ``base`` with ``transform``, checking normalisation matches its channels."""
        check_transform_channels(transform, base.channels, base.identity)
        self.base = base
        self.transform = transform

    def __len__(self) -> int:
        """Number of samples of the base dataset."""
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Transformed image and its label (collates to an int64 tensor)."""
        image, label = self.base[index]  # (H, W, C) uint8
        return self.transform(image=image)["image"], label  # (C, H', W') float32

    def reseed(self, seed: int) -> None:
        """Reseed the transform's random stream (called per DataLoader worker)."""
        seed_transform(self.transform, seed)


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed numpy, random and the dataset's transform.

    torch gives each worker the seed ``base_seed + worker_id`` with ``base_seed`` drawn from the
    loader's generator, so workers differ from each other yet a run is reproducible. Without the
    transform reseed, every worker would replay the same copied albumentations stream.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = torch.utils.data.get_worker_info()
    reseed = getattr(info.dataset, "reseed", None) if info is not None else None
    if callable(reseed):
        reseed(seed)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool,
    num_workers: int = 0,
    seed: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """A reproducible DataLoader: seeded shuffling, seeded workers and transforms.

    With ``num_workers == 0`` the dataset's transform is reseeded here from ``seed`` (the main
    process does the augmenting); with workers, :func:`seed_worker` reseeds each worker.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be non-negative, got {num_workers}")
    if num_workers == 0 and callable(getattr(dataset, "reseed", None)):
        dataset.reseed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=seed_worker,
        persistent_workers=num_workers > 0,
        pin_memory=torch.cuda.is_available(),
        drop_last=drop_last,
    )


# ---------------------------------------------------------------------------------------------
# Transform building blocks (shared with context.py)
# ---------------------------------------------------------------------------------------------


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
        normalises = isinstance(step, A.Normalize | EvalTransform)
        entries = int(np.size(step.mean)) if normalises else 1
        if entries not in (1, channels):
            raise ValueError(
                f"transform normalises {entries} channels but {identity} yields "
                f"{channels}-channel images; pass mean/std with {channels} entries "
                f"or load the data with channels={entries}"
            )


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _check_channels(channels: int) -> int:
    """Only 1 (grayscale) and 3 (RGB) channels are produced."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return channels


def _fit_channels(image: np.ndarray, channels: int, where: str) -> np.ndarray:
    """Return ``image`` as uint8 (H, W, channels): expand gray, drop alpha, or take luma."""
    image = _as_uint8(image, where)
    if image.ndim == 2:
        image = image[:, :, None]  # (H, W, 1)
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"{where} has shape {image.shape}; expected (H, W) or (H, W, 1|3|4)")
    if image.shape[2] == 4:
        image = image[:, :, :3]  # (H, W, 3): alpha carries no class information
    if channels == image.shape[2]:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=2)  # (H, W, 3)
    return np.round(image @ _LUMA).astype(np.uint8)[:, :, None]  # (H, W, 1)


def _as_uint8(image: np.ndarray, where: str) -> np.ndarray:
    """Accept uint8, or integer/bool pixels already within 0..255; refuse anything else."""
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    integral = np.issubdtype(image.dtype, np.integer) or image.dtype == np.bool_
    if integral and (image.size == 0 or (image.min() >= 0 and image.max() <= 255)):
        return image.astype(np.uint8)
    low, high = (image.min(), image.max()) if image.size else (None, None)
    raise ValueError(
        f"{where} has dtype {image.dtype} with range [{low}, {high}]; expected uint8 0..255"
    )


def _decode_image(value: Any, where: str) -> np.ndarray:
    """Turn a PIL image, ``{"bytes", "path"}`` dict, array or nested list into an array."""
    if isinstance(value, PIL.Image.Image):
        return _pil_to_array(value)
    if isinstance(value, dict):
        path, data = value.get("path"), value.get("bytes")
        if data is None and path is None:
            raise ValueError(f"{where} has neither bytes nor a path")
        try:
            with PIL.Image.open(io.BytesIO(data) if data is not None else path) as image:
                image.load()  # PIL opens lazily; decode now so a truncated file fails here
                return _pil_to_array(image)
        except (OSError, ValueError, SyntaxError) as err:
            raise ValueError(f"cannot read {where} (file {path}): {err}") from err
    if isinstance(value, list) or hasattr(value, "__array__"):
        return np.asarray(value)  # numpy/torch-formatted datasets and nested lists
    raise TypeError(f"{where} is a {type(value).__name__}; expected a PIL image, dict or array")


def _pil_to_array(image: PIL.Image.Image) -> np.ndarray:
    """(H, W) for single-channel modes, (H, W, 3) otherwise (palette, CMYK, RGBA → RGB)."""
    if image.mode in _GRAY_MODES:
        return np.array(image if image.mode == "L" else image.convert("L"))  # (H, W)
    return np.array(image if image.mode == "RGB" else image.convert("RGB"))  # (H, W, 3)


def _undecoded(dataset: datasets.Dataset, column: str) -> datasets.Dataset:
    """Switch an ``Image`` column to raw ``{"bytes", "path"}`` so we decode (and name files)."""
    feature = dataset.features[column]
    if isinstance(feature, datasets.Image) and feature.decode:
        return dataset.cast_column(column, datasets.Image(decode=False))
    return dataset


def _int_column(dataset: datasets.Dataset, column: str, identity: str) -> np.ndarray:
    """A label column as int64 (N,), read through Arrow without decoding other columns."""
    values = dataset.select_columns([column]).with_format("arrow")[column]
    if values.null_count:
        raise ValueError(f"label column {column!r} of {identity} has {values.null_count} nulls")
    array = values.to_numpy()  # (N,)
    if len(array) and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"label column {column!r} of {identity} has dtype {array.dtype}; "
            "expected integer class ids (a ClassLabel or int column)"
        )
    return array.astype(np.int64)


def _class_names(given: Sequence[str] | None, feature: Any, labels: np.ndarray) -> list[str]:
    """Given names, else ClassLabel names, else "0".."max label"."""
    if given is not None:
        return [str(name) for name in given]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    return [str(k) for k in range(int(labels.max()) + 1)] if len(labels) else []


def _hf_identity(dataset: datasets.Dataset) -> str:
    """Provenance of a Dataset built in memory: builder/config, split and content fingerprint."""
    info = dataset.info
    source = "/".join(filter(None, (info.builder_name, info.config_name))) or "dataset"
    return f"hf:{source}:{dataset.split}#{dataset._fingerprint}"


def _nonempty(data: _Images) -> _Images:
    """Refuse an empty split: training or evaluating on it would silently do nothing."""
    if len(data) == 0:
        raise ValueError(f"{data.identity} is empty (0 samples)")
    return data


# ---------------------------------------------------------------------------------------------
# Recipe → datasets
# ---------------------------------------------------------------------------------------------

DIGITS_TEST_FRACTION = 0.3
"""scikit-learn's digits have no test split: a fixed stratified 30 % (seed 0) is ``test``."""


@dataclass
class Splits:
    """The datasets a recipe names, loaded and split."""

    train: LabeledImages
    """Training images (without the held-out validation part)."""
    val: LabeledImages
    """Validation images: model selection only."""
    test: LabeledImages | None
    """In-distribution test images, reported once at the end."""
    ood: dict[str, LabeledImages]
    """Named semantic-shift sets."""

    def identities(self) -> dict[str, Any]:
        """Provenance of every split, for ``run.json``."""
        return {
            "train": self.train.identity,
            "val": self.val.identity,
            "test": None if self.test is None else self.test.identity,
            "ood": {name: data.identity for name, data in self.ood.items()},
        }

    def check_labels(self, num_classes: int) -> list[str]:
        """Check every labelled split against ``[0, num_classes)`` and train's classes.

        Raises ValueError naming the split (``data.test: ...``) when val/test call a label by
        another class name than train (an extra or renamed class folder) or a label is out of
        range. Returns a warning for training classes without images (an empty class folder).
        """
        for key, data in (("train", self.train), ("val", self.val), ("test", self.test)):
            if data is None:
                continue
            if key != "train":
                _check_same_classes(data, self.train, f"data.{key}")
            try:
                check_labels(data, num_classes)
            except ValueError as err:
                raise ValueError(f"data.{key}: {err}") from err
        counts = np.bincount(self.train.labels, minlength=num_classes)  # (K,)
        empty = [name for name, n in zip(self.train.class_names, counts, strict=False) if n == 0]
        if not empty:
            return []
        return [
            f"data.train ({self.train.identity}) has no images of class(es) {empty}: their "
            f"outputs of the {num_classes}-way head are never trained (an empty class folder?)"
        ]


def _check_same_classes(data: LabeledImages, train: LabeledImages, key: str) -> None:
    """Raise when ``data`` names a label it uses differently from ``train`` (both named)."""
    if not (_named(data) and _named(train)):
        return
    names, known = data.class_names, train.class_names
    used = [int(k) for k in np.unique(data.labels) if 0 <= k < len(names)]
    if all(k < len(known) and names[k] == known[k] for k in used):
        return
    extra = [names[k] for k in used if names[k] not in known]
    missing = [name for name in known if name not in names]
    found = [f"it has {extra} that data.train lacks"] if extra else []
    found += [f"it lacks {missing}"] if missing else []
    found = found or [f"it numbers its classes {names}, data.train {known}"]
    raise ValueError(
        f"{key} ({data.identity}) does not match the classes of data.train "
        f"({train.identity}): {'; '.join(found)}. Give every split the same class folders "
        "(an empty one is fine) with the same names."
    )


def _named(data: LabeledImages) -> bool:
    """Whether ``data`` has real class names, not the "0".."K-1" stand-ins."""
    return data.class_names != [str(k) for k in range(len(data.class_names))]


def select_classes(data: LabeledImages, classes: Sequence[int]) -> IndexedImages:
    """Keep the samples of ``classes`` and relabel them ``0..len(classes)-1`` in that order."""
    known = set(np.unique(data.labels).tolist())
    absent = [c for c in classes if c not in known]
    if absent:
        raise ValueError(f"classes {absent} do not occur in {data.identity}")
    subset = IndexedImages(data, np.flatnonzero(np.isin(data.labels, classes)))
    remap = np.full(int(data.labels.max()) + 1, -1, dtype=np.int64)
    remap[list(classes)] = np.arange(len(classes))
    subset.labels = remap[subset.labels]  # (M,)
    names = data.class_names
    subset.class_names = [names[c] if c < len(names) else str(c) for c in classes]
    subset.identity += f"|classes:{','.join(map(str, classes))}"
    return subset


def load_spec(spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """Load the dataset a recipe's :class:`~fseb_ft.config.DatasetSpec` describes.

    ``classes`` filters and relabels; ``limit`` keeps a seeded random subset (quick runs).
    """
    path = Path(spec.path) if spec.path else None
    if spec.source == "hub":
        data: LabeledImages = load_hub(
            spec.path, spec.split, spec.revision, spec.image_column, spec.label_column,
            channels=channels,
        )  # fmt: skip
    elif spec.source == "imagefolder":
        data = load_imagefolder(path, spec.split, channels=channels)
    elif spec.source == "disk":
        data = load_disk(path, spec.split, spec.image_column, spec.label_column, channels)
    elif spec.source == "arrays":
        data = load_arrays(path, channels)
    elif spec.source == "idx":
        images = path / f"{spec.split}-images-idx3-ubyte.gz"
        labels = path / f"{spec.split}-labels-idx1-ubyte.gz"
        for file in (images, labels):
            if not file.is_file():
                raise FileNotFoundError(
                    f"{file} not found: an idx source needs {spec.split}-images-idx3-ubyte.gz and "
                    f"{spec.split}-labels-idx1-ubyte.gz in {path}"
                )
        data = load_idx(images, labels, channels=channels)
    else:
        data = _digits_split(spec, channels)
    if spec.classes is not None and spec.source != "sklearn_digits":
        data = select_classes(data, spec.classes)
    if spec.limit is not None and spec.limit < len(data):
        keep = np.random.default_rng(seed).choice(len(data), spec.limit, replace=False)
        data = IndexedImages(data, np.sort(keep))
    return data


def load_split(key: str, spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """:func:`load_spec`, with an error prefixed by the recipe key: ``data.test: ...``."""
    try:
        return load_spec(spec, channels, seed)
    except (ValueError, TypeError, OSError) as err:
        try:
            prefixed = type(err)(f"{key}: {err}")
        except TypeError:  # an exception type that needs other arguments
            prefixed = ValueError(f"{key}: {err}")
        raise prefixed from err


def build_splits(cfg: DataConfig, seed: int) -> Splits:
    """Load train/val/test/OOD; without ``val``, hold out a seeded stratified part of train."""
    full = load_split("data.train", cfg.train, cfg.channels, seed)
    if cfg.val is not None:
        train, val = full, load_split("data.val", cfg.val, cfg.channels, seed)
    else:
        train_idx, val_idx = stratified_split(full.labels, cfg.val_fraction, seed)
        train, val = IndexedImages(full, train_idx), IndexedImages(full, val_idx)
    test = None if cfg.test is None else load_split("data.test", cfg.test, cfg.channels, seed)
    ood = {
        name: load_split(f"data.ood.{name}", spec, cfg.channels, seed)
        for name, spec in cfg.ood.items()
    }
    return Splits(train=train, val=val, test=test, ood=ood)


def _digits_split(spec: DatasetSpec, channels: int) -> LabeledImages:
    if spec.split not in ("train", "test", "all"):
        raise ValueError(
            f"split={spec.split!r} for sklearn_digits: allowed are 'train', 'test' (a fixed "
            f"stratified {DIGITS_TEST_FRACTION:.0%}) and 'all'"
        )
    data = load_sklearn_digits(spec.classes, channels)
    if spec.split == "all":
        return data
    train_idx, test_idx = stratified_split(data.labels, DIGITS_TEST_FRACTION, seed=0)
    return IndexedImages(data, train_idx if spec.split == "train" else test_idx)


# ---------------------------------------------------------------------------------------------
# Adapters: in-memory datasets (the Python API)
# ---------------------------------------------------------------------------------------------


class TorchImages(LabeledImages):
    """Any map-style ``torch.utils.data.Dataset`` of ``(image, label)`` pairs.

    ``dataset[i]`` may return a pair (or longer tuple: image first, label second) or a mapping
    with ``image_key`` / ``label_key``. Images may be PIL images, numpy arrays (H, W), (H, W, C)
    or (C, H, W) in uint8, or torch tensors (C, H, W) / (H, W) in uint8 or float in [0, 1] (as
    ``torchvision.transforms.ToTensor`` gives). Give un-augmented, un-normalised images:
    fseb_ft augments and normalises with the model's data config. The dataset should be
    deterministic — a random transform inside it would leak into evaluation.

    All labels are needed up front (stratified splits, class counts): they are read from a
    ``targets`` attribute when there is one (torchvision datasets, ``Subset`` of them), else by
    one pass over the dataset. ``class_names`` default to the dataset's ``classes`` attribute,
    else ``"0" .. "K-1"``. ``identity`` defaults to the type name, length and a hash of the
    labels (the images are not hashed).
    """

    def __init__(
        self,
        dataset: Dataset,
        class_names: Sequence[str] | None = None,
        identity: str | None = None,
        channels: int = 3,
        image_key: str = "image",
        label_key: str = "label",
    ) -> None:
        """Wrap ``dataset``; see the class docstring."""
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"TorchImages needs a map-style dataset with __len__ and __getitem__, got "
                f"{type(dataset).__name__} (an IterableDataset cannot be split or indexed)"
            )
        self.dataset = dataset
        self.image_key = image_key
        self.label_key = label_key
        self.channels = _check_channels(channels)
        self.labels = _torch_labels(dataset, self._label_of)  # (N,)
        self.identity = identity or (
            f"torch:{type(dataset).__name__}:n={len(self.labels)}#{content_hash(self.labels)}"
        )
        if class_names is None:
            class_names = _torch_class_names(dataset, self.labels)
        self.class_names = _class_names(class_names, None, self.labels)
        if len(self.labels) and self.labels.min() < 0:
            raise ValueError(f"{self.identity} has negative labels; expected classes 0..K-1")

    def _split_item(self, item: Any, index: int) -> tuple[Any, Any]:
        """(image, label) of one raw item: a tuple/list or a mapping."""
        if isinstance(item, Mapping):
            missing = [k for k in (self.image_key, self.label_key) if k not in item]
            if missing:
                raise KeyError(
                    f"item {index} of {type(self.dataset).__name__} lacks key(s) {missing}; "
                    f"it has {list(item)} (pass image_key=/label_key=)"
                )
            return item[self.image_key], item[self.label_key]
        if isinstance(item, tuple | list) and len(item) >= 2:
            return item[0], item[1]
        raise TypeError(
            f"item {index} of {type(self.dataset).__name__} is a {type(item).__name__}; "
            "expected an (image, label) pair or a mapping with image and label keys"
        )

    def _label_of(self, index: int) -> int:
        """The label of item ``index`` (reads the whole item)."""
        return _to_int_label(self._split_item(self.dataset[index], index)[1], index)

    def _read(self, index: int) -> np.ndarray:
        """The image of item ``index`` as a uint8 array (H, W) or (H, W, C)."""
        image = self._split_item(self.dataset[index], index)[0]
        return _any_image_to_array(image, f"image {index} of {self.identity}")


def as_labeled_images(
    data: Any,
    class_names: Sequence[str] | None = None,
    channels: int = 3,
    image_column: str | None = None,
    label_column: str | None = None,
    identity: str | None = None,
) -> LabeledImages:
    """Wrap ``data`` as :class:`LabeledImages`, whatever it is.

    - a :class:`LabeledImages` is returned as it is (its ``channels`` must match);
    - a ``datasets.Dataset`` becomes :class:`HFImages`: the image column is ``image_column``,
      else the first ``datasets.Image`` feature, else ``image`` or ``img``; the label column is
      ``label_column``, else the first ``ClassLabel`` feature, else ``label`` or ``labels``;
      class names come from the ``ClassLabel`` (else ``"0" .. "K-1"``);
    - any other map-style torch ``Dataset`` becomes :class:`TorchImages`.
    """
    if isinstance(data, LabeledImages):
        if data.channels != channels:
            raise ValueError(
                f"{data.identity} yields {data.channels}-channel images but {channels} are "
                "needed (data.channels); build it with the matching channels"
            )
        return data
    if isinstance(data, datasets.DatasetDict):
        raise TypeError(
            f"got a DatasetDict with splits {list(data)}; pass one split, e.g. ds['train'], "
            "and the others as val=/test="
        )
    if isinstance(data, datasets.IterableDataset | torch.utils.data.IterableDataset):
        raise TypeError(
            f"got an iterable (streaming) dataset {type(data).__name__}; fseb_ft needs a "
            "map-style dataset it can index and split (load without streaming=True)"
        )
    if isinstance(data, datasets.Dataset):
        image_column = image_column or _find_column(data, datasets.Image, ("image", "img"))
        label_column = label_column or _find_column(data, datasets.ClassLabel, ("label", "labels"))
        return _nonempty(
            HFImages(data, image_column, label_column, class_names, identity, channels)
        )
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _nonempty(
            TorchImages(
                data, class_names, identity, channels, image_column or "image",
                label_column or "label",
            )
        )  # fmt: skip
    raise TypeError(
        f"cannot use a {type(data).__name__} as a dataset: pass a datasets.Dataset, a map-style "
        "torch Dataset of (image, label) pairs or a fseb_ft.data.LabeledImages"
    )


def _find_column(data: datasets.Dataset, feature_type: type, names: Sequence[str]) -> str:
    """First column with a feature of ``feature_type``, else the first of ``names`` present."""
    for name, feature in data.features.items():
        if isinstance(feature, feature_type):
            return name
    for name in names:
        if name in data.column_names:
            return name
    kind = feature_type.__name__
    raise ValueError(
        f"cannot tell which column holds the {'image' if kind == 'Image' else 'label'}: no "
        f"{kind} feature and none of {list(names)} among {data.column_names}; pass "
        f"{'image_column' if kind == 'Image' else 'label_column'}="
    )


def _torch_labels(dataset: Any, label_of: Callable[[int], int]) -> np.ndarray:
    """Labels (N,) int64 from ``targets`` (also through ``Subset``), else by reading every item."""
    targets = _targets_attribute(dataset)
    if targets is not None and len(targets) == len(dataset):
        labels = np.asarray(targets)
        if labels.ndim == 1 and (len(labels) == 0 or np.issubdtype(labels.dtype, np.integer)):
            return labels.astype(np.int64)
    return np.array([label_of(i) for i in range(len(dataset))], dtype=np.int64)


def _targets_attribute(dataset: Any) -> np.ndarray | None:
    """``dataset.targets``, or the base targets at a ``Subset``'s indices; None if absent."""
    if isinstance(dataset, torch.utils.data.Subset):
        base = _targets_attribute(dataset.dataset)
        return None if base is None else np.asarray(base)[np.asarray(dataset.indices)]
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return None
    if isinstance(targets, torch.Tensor):
        return targets.detach().cpu().numpy()
    try:
        return np.asarray(targets)
    except (TypeError, ValueError):
        return None


def _torch_class_names(dataset: Any, labels: np.ndarray) -> list[str] | None:
    """The dataset's (or a ``Subset`` base's) ``classes`` list when it covers every label."""
    while isinstance(dataset, torch.utils.data.Subset):
        dataset = dataset.dataset
    classes = getattr(dataset, "classes", None)
    if isinstance(classes, Sequence) and not isinstance(classes, str):
        names = [str(c) for c in classes]
        if names and (len(labels) == 0 or int(labels.max()) < len(names)):
            return names
    return None


def _to_int_label(label: Any, index: int) -> int:
    """A Python int from an int, numpy integer or one-element integer tensor/array."""
    if isinstance(label, torch.Tensor):
        if label.numel() != 1 or label.is_floating_point() or label.is_complex():
            raise ValueError(f"label of item {index} is {label!r}; expected one integer class id")
        return int(label.item())
    value = np.asarray(label)
    if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(f"label of item {index} is {label!r}; expected one integer class id")
    return int(value.reshape(()))


def _any_image_to_array(image: Any, where: str) -> np.ndarray:
    """PIL, numpy (HW, HWC, CHW; uint8 or float in [0, 1]) or tensor (CHW, HW) → uint8 array."""
    if isinstance(image, PIL.Image.Image):
        return _pil_to_array(image)
    chw = isinstance(image, torch.Tensor)
    array = image.detach().cpu().numpy() if chw else np.asarray(image)
    if array.ndim == 3:
        channel_first = array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4)
        if chw or channel_first:
            array = np.moveaxis(array, 0, -1)  # (C, H, W) -> (H, W, C)
    elif array.ndim != 2:
        raise ValueError(
            f"{where} has shape {array.shape}; expected (H, W), (H, W, C) or (C, H, W)"
        )
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (not np.isfinite(array).all() or array.min() < 0 or array.max() > 1):
            raise ValueError(
                f"{where} is floating point with range [{array.min()}, {array.max()}]; expected "
                "values in [0, 1] (as ToTensor gives) or uint8 0..255 — pass images before "
                "normalisation, fseb_ft normalises with the model's data config"
            )
        return np.round(array * 255.0).astype(np.uint8)
    return array
