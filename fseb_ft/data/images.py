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
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import datasets
import numpy as np
from torch.utils.data import Dataset

from fseb_ft.data.pixels import (
    MinSize,
    as_uint8,
    decode_image,
    fit_channels,
)

__all__ = [
    "ArrayImages",
    "HFImages",
    "IndexedImages",
    "LabeledImages",
    "check_channels",
    "content_hash",
    "named_classes",
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
        self.class_names = named_classes(class_names, dataset.features[label_column], self.labels)
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
        self.class_names = named_classes(class_names, None, self.labels)

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


def named_classes(given: Sequence[str] | None, feature: Any, labels: np.ndarray) -> list[str]:
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
