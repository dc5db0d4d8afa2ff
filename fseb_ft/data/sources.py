"""Loading the datasets a recipe names: every source becomes
:class:`~fseb_ft.data.images.LabeledImages`.

Sources: a Hugging Face Hub id, an image folder, a ``save_to_disk`` folder, ``.npz`` arrays, IDX
gzip files (MNIST-style) and scikit-learn's digits. :func:`load_spec` maps one recipe
:class:`~fseb_ft.recipe.DatasetSpec` onto them and :func:`build_splits` a whole ``data`` section;
this is the only data module that reads the recipe.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np

from fseb_ft.data.files import FileImages
from fseb_ft.data.images import (
    ArrayImages,
    HFImages,
    IndexedImages,
    LabeledImages,
    content_hash,
    nonempty,
)
from fseb_ft.data.splits import Splits, select_classes, stratified_split
from fseb_ft.errors import FsebError
from fseb_ft.recipe import DataConfig, DatasetSpec
from fseb_ft.recipe.datasets import IN_MEMORY

__all__ = [
    "DIGITS_TEST_FRACTION",
    "FASHION_MNIST_CLASSES",
    "build_splits",
    "load_arrays",
    "load_disk",
    "load_hub",
    "load_idx",
    "load_imagefolder",
    "load_sklearn_digits",
    "load_spec",
    "load_split",
    "read_idx",
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
DIGITS_TEST_FRACTION = 0.3
"""scikit-learn's digits have no test split: a fixed stratified 30 % (seed 0) is ``test``."""


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
    return nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


def load_imagefolder(path: str | Path, split: str = "train", channels: int = 3) -> FileImages:
    """Load ``path/<split>/<class>/*`` (or a flat ``path/<class>/*`` as split "train").

    Labels follow the sorted names of this split's class folders, empty folders included; any
    subfolder name is a split (``val/`` is split ``val``, and split ``validation`` finds it too).
    The folder is listed directly (:mod:`fseb_ft.data.files`), not through ``datasets``.
    """
    return nonempty(FileImages.from_folder(path, split, channels))


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
    return nonempty(HFImages(dataset, image_column, label_column, None, identity, channels))


def load_arrays(path: str | Path, channels: int = 3) -> ArrayImages:
    """Load an ``.npz`` with ``images``, ``labels`` and optional ``class_names``.

    ``images`` are uint8, uint16 (16-bit, scaled ``>> 8``) or floats in [0, 1]
    (:func:`fseb_ft.data.pixels.as_uint8`); they are held as uint8.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as npz:
        missing = [key for key in ("images", "labels") if key not in npz.files]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}; it has {npz.files}")
        images = npz["images"]
        labels = npz["labels"]
        class_names = [str(c) for c in npz["class_names"]] if "class_names" in npz.files else None
    identity = f"npz:{path.name}#{content_hash(images, labels)}"
    return nonempty(ArrayImages(images, labels, class_names, identity, channels))


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
    return nonempty(ArrayImages(images, labels, class_names, identity, channels))


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
# Recipe → datasets
# ---------------------------------------------------------------------------------------------


def load_spec(spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """Load the dataset a recipe's :class:`~fseb_ft.recipe.DatasetSpec` describes.

    ``classes`` filters and relabels; ``fraction`` keeps a seeded stratified share of each class
    and ``limit`` a seeded random subset (quick runs).
    """
    path = Path(spec.path) if spec.path else None
    if spec.source == "hub":
        data: LabeledImages = load_hub(
            spec.path, spec.split, spec.revision, spec.image_column, spec.label_column,
            config=spec.config, channels=channels,
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
    if spec.fraction is not None and spec.fraction < 1.0:
        # The complement of a stratified hold-out of 1 − fraction: the same share of each class.
        keep, _ = stratified_split(data.labels, 1.0 - spec.fraction, seed)
        data = IndexedImages(data, keep)
    if spec.limit is not None and spec.limit < len(data):
        keep = np.random.default_rng(seed).choice(len(data), spec.limit, replace=False)
        data = IndexedImages(data, np.sort(keep))
    return data


def load_split(key: str, spec: DatasetSpec, channels: int = 3, seed: int = 0) -> LabeledImages:
    """:func:`load_spec`, with an error prefixed by the recipe key: ``data.test: ...``.

    Raises:
        FsebError: the spec stands for data the Python API was given in memory.
    """
    if spec.path.startswith(IN_MEMORY):
        raise FsebError(
            f"{key} is {spec.path!r}: the run was trained through the Python API "
            "(fseb_ft.finetune) on data held in memory, which cannot be read again. Save it "
            "(datasets' save_to_disk, or an image folder) and point this key of the run's "
            "recipe.yaml at it (source: disk or imagefolder)"
        )
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
