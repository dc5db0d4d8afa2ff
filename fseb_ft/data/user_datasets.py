"""A user's in-memory dataset as :class:`~fseb_ft.data.images.LabeledImages`.

:func:`as_labeled_images` takes what ``fseb_ft.finetune(train=..., ...)`` is given: a
``LabeledImages`` as it is, a ``datasets.Dataset`` as :class:`~fseb_ft.data.images.HFImages`,
any other map-style torch ``Dataset`` of (image, label) pairs as :class:`TorchImages`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset

from fseb_ft.data.images import (
    HFImages,
    LabeledImages,
    check_channels,
    content_hash,
    named_classes,
    nonempty,
)
from fseb_ft.data.pixels import any_image_to_array

__all__ = ["TorchImages", "as_labeled_images"]


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
        self.class_names = named_classes(class_names, None, self.labels)
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
