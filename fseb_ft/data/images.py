"""Labelled image samples: the containers every source becomes, and their content hashes.

Every source (HF Hub id, image folder, ``save_to_disk`` folder, ``.npz`` arrays, IDX gzip files,
scikit-learn digits, an in-memory dataset) becomes a :class:`LabeledImages`: indexable
``(uint8 HxWxC image, int label)`` pairs plus ``labels``, ``class_names`` and a short provenance
string ``identity``. Loading them from a recipe is :mod:`fseb_ft.data.sources`; turning them into
tensors is :mod:`fseb_ft.data.transforms`; subsets and splits of them are
:mod:`fseb_ft.data.splits`.

This module takes plain arguments; of fseb_ft it imports only :mod:`fseb_ft.data.pixels`.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset

from fseb_ft.data.pixels import (
    MinSize,
    any_image_to_array,
    as_uint8,
    decode_image,
    fit_channels,
)

__all__ = [
    "ArrayImages",
    "HFImages",
    "IndexedImages",
    "LabeledImages",
    "TorchImages",
    "as_labeled_images",
    "check_channels",
    "content_hash",
    "nonempty",
]

_Images = TypeVar("_Images", bound="LabeledImages")


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
    groups: np.ndarray | None = None
    """The group of each sample (a patient, say), (N,), when the source names one; subsets
    (:class:`IndexedImages`) keep their samples' groups."""
    metadata: Mapping[str, np.ndarray] = types.MappingProxyType({})
    """Per-sample values by column name, each (N,), when the source keeps some; subsets keep
    their samples' values."""

    def __len__(self) -> int:
        """Number of samples."""
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """Image (H, W, channels) uint8 and integer label of sample ``index``."""
        return self.read(index)

    def read(self, index: int, min_size: MinSize | None = None) -> tuple[np.ndarray, int]:
        """``data[index]``, except that a JPEG held encoded is decoded at a reduced scale where
        ``min_size`` allows it (:data:`~fseb_ft.data.pixels.MinSize`), for a transform that
        shrinks the image anyway; other images come as ``data[index]`` gives them."""
        index = self._check_index(index)
        where = f"image {index} of {self.identity}"
        image = fit_channels(self._read_at_least(index, min_size), self.channels, where)
        return image, int(self.labels[index])

    @property
    def num_classes(self) -> int:
        """Number of class names (the label space size K)."""
        return len(self.class_names)

    def _read(self, index: int) -> np.ndarray:
        """Raw image of sample ``index`` (any of (H, W), (H, W, 1|3|4)); subclasses implement."""
        raise NotImplementedError

    def _read_at_least(self, index: int, min_size: MinSize | None) -> np.ndarray:
        """:meth:`_read`, reduced as ``min_size`` allows; subclasses of encoded images override
        it, the others read in full."""
        return self._read(index)

    def encoded(self, index: int) -> tuple[str, str | bytes] | None:
        """(name, file path or bytes) of sample ``index`` while still encoded, for the check
        before training (:mod:`fseb_ft.data.screening`); ``None`` for images held decoded."""
        return None

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
        self.channels = check_channels(channels)
        self.image_column = image_column
        self.labels = _int_column(dataset, label_column, self.identity)
        self.class_names = _class_names(class_names, dataset.features[label_column], self.labels)
        self._images = _undecoded(dataset.select_columns([image_column]), image_column)
        self._encoded = isinstance(self._images.features[image_column], datasets.Image)

    def encoded(self, index: int) -> tuple[str, str | bytes] | None:
        """(file path, or ``identity[index]``; bytes, else the path) of an ``Image`` column."""
        if not self._encoded:
            return None
        value = self._images[index][self.image_column]
        name = value.get("path") or f"{self.identity}[{index}]"
        return name, value["bytes"] if value.get("bytes") is not None else value["path"]

    def _read(self, index: int) -> np.ndarray:
        """Decode one image, naming the sample and file when that fails."""
        return self._read_at_least(index, None)

    def _read_at_least(self, index: int, min_size: MinSize | None) -> np.ndarray:
        """Decode one image, a JPEG reduced as ``min_size`` allows."""
        value = self._images[index][self.image_column]
        return decode_image(value, f"image {index} of {self.identity}", min_size)


class ArrayImages(LabeledImages):
    """In-memory images (N, H, W) or (N, H, W, C) with integer labels (N,).

    The images are held as uint8, converted once at construction by
    :func:`fseb_ft.data.pixels.as_uint8` (uint16 scaled by ``>> 8``, floats in [0, 1] by 255), so an
    image type or range it refuses stops the load, not a training step.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        class_names: Sequence[str] | None = None,
        identity: str | None = None,
        channels: int = 3,
    ) -> None:
        """Validate and hold the arrays; ``identity`` defaults to a content hash."""
        images = as_uint8(images, f"the images of {identity or 'an array'}")
        labels = np.asarray(labels)
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
        self.channels = check_channels(channels)
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
        self.groups = None if base.groups is None else base.groups[indices]  # (M,)
        self.metadata = {name: values[indices] for name, values in base.metadata.items()}
        self.identity = f"{base.identity}|subset:{len(indices)}#{content_hash(indices)}"

    def _read(self, index: int) -> np.ndarray:
        """The base dataset's raw image."""
        return self.base._read(int(self.indices[index]))

    def _read_at_least(self, index: int, min_size: MinSize | None) -> np.ndarray:
        """The base dataset's raw image, reduced as the base allows."""
        return self.base._read_at_least(int(self.indices[index]), min_size)

    def encoded(self, index: int) -> tuple[str, str | bytes] | None:
        """The base dataset's encoded image."""
        return self.base.encoded(int(self.indices[index]))


class TorchImages(LabeledImages):
    """Any map-style ``torch.utils.data.Dataset`` of ``(image, label)`` pairs.

    ``dataset[i]`` may return a pair (or longer tuple: image first, label second) or a mapping
    with ``image_key`` / ``label_key``. Images may be PIL images, numpy arrays (H, W), (H, W, C)
    or (C, H, W), or torch tensors (C, H, W) / (H, W): uint8, uint16 (16-bit, scaled ``>> 8``) or
    float in [0, 1] (as ``torchvision.transforms.ToTensor`` gives);
    :func:`fseb_ft.data.pixels.as_uint8`
    has the rule. Give un-augmented, un-normalised images: fseb_ft augments and normalises with
    the model's data config. The dataset should be deterministic — a random transform inside it
    would leak into evaluation.

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
        self.channels = check_channels(channels)
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
        """The image of item ``index`` as an array (H, W) or (H, W, C), made uint8 by the caller."""
        image = self._split_item(self.dataset[index], index)[0]
        return any_image_to_array(image, f"image {index} of {self.identity}")


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
        return nonempty(HFImages(data, image_column, label_column, class_names, identity, channels))
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return nonempty(
            TorchImages(
                data, class_names, identity, channels, image_column or "image",
                label_column or "label",
            )
        )  # fmt: skip
    raise TypeError(
        f"cannot use a {type(data).__name__} as a dataset: pass a datasets.Dataset, a map-style "
        "torch Dataset of (image, label) pairs or a fseb_ft.data.images.LabeledImages"
    )


def content_hash(*arrays: np.ndarray) -> str:
    """First 16 hex digits of a sha256 over the arrays' dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.data)
    return digest.hexdigest()[:16]


def check_channels(channels: int) -> int:
    """Only 1 (grayscale) and 3 (RGB) channels are produced."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return channels


def nonempty(data: _Images) -> _Images:
    """Refuse an empty split: training or evaluating on it would silently do nothing."""
    if len(data) == 0:
        raise ValueError(f"{data.identity} is empty (0 samples)")
    return data


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
