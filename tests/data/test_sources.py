"""Tests for fseb_ft.data.images, sources and transforms: loaders, splits, label checks, transforms.

Fixtures are tiny generated files in tmp_path; the real-data tests read ../shared in place (or
extract a few members to tmp_path) and skip when it is absent.
"""

from __future__ import annotations

import dataclasses
import gzip
import pickle
import struct
import tarfile
from pathlib import Path

import datasets
import numpy as np
import pytest
import timm
import torch
from PIL import Image

from fseb_ft.data import sources as fdata
from fseb_ft.data.images import ArrayImages, HFImages, IndexedImages
from fseb_ft.data.inputs import EVAL_RESIZE
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.sources import hub as hub_source
from fseb_ft.data.sources import load_spec
from fseb_ft.data.sources.arrays import load_arrays
from fseb_ft.data.sources.disk import load_disk
from fseb_ft.data.sources.hub import load_hub
from fseb_ft.data.sources.idx import load_idx, read_idx
from fseb_ft.data.sources.imagefolder import load_imagefolder
from fseb_ft.data.sources.sklearn_digits import load_sklearn_digits
from fseb_ft.data.splits import (
    TooFewClassesError,
    allocate,
    check_labels,
    require_two_classes,
    stratified_split,
)
from fseb_ft.data.transforms import (
    TransformedImages,
    eval_transform,
    is_deterministic,
    train_transform,
)
from fseb_ft.data.user_datasets import as_labeled_images
from fseb_ft.errors import FsebError
from fseb_ft.recipe import DatasetSpec, recipe_from_dict
from fseb_ft.recipe.schema import ConfigError

SHARED = Path(__file__).parents[2] / ".." / "shared"
SHARED_DATA = SHARED / "data"
needs_shared = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"real data folder {SHARED_DATA.resolve()} is absent (only CI/dev checkouts have it)",
)
CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

datasets.disable_progress_bars()


# --------------------------------------------------------------------------- fixtures / helpers


def _write_folder(root: Path, layout: dict[str, dict[str, int]], size: tuple[int, int]) -> None:
    """PNG image folder ``root/<split>/<class>/<i>.png``; split "" means the flat layout.

    Pixel value encodes the class index, so a test can check images and labels agree.
    """
    for split, classes in layout.items():
        for class_index, (name, count) in enumerate(sorted(classes.items())):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = np.full((*size, 3), 40 * class_index + i, np.uint8)  # (H, W, 3)
                Image.fromarray(pixels).save(folder / f"{i}.png")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three classes, written out of alphabetical order, with train and test splits."""
    root = tmp_path / "folder"
    _write_folder(root, {"train": {"cat": 3, "ant": 2, "bee": 2}}, (6, 5))
    _write_folder(root, {"test": {"cat": 1, "ant": 1, "bee": 1}}, (6, 5))
    return root


def _hf_dataset(n: int = 6) -> datasets.Dataset:
    """In-memory HF dataset with an Image column and a ClassLabel column."""
    images = [Image.fromarray(np.full((4, 4, 3), 10 * i, np.uint8)) for i in range(n)]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])}
    )
    return datasets.Dataset.from_dict(
        {"image": images, "label": [i % 2 for i in range(n)]}, features=features
    )


def _write_idx(path: Path, array: np.ndarray) -> None:
    """Hand-built IDX gzip: >HBB header (0, 0x08, ndim), big-endian uint32 dims, raw bytes."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


# --------------------------------------------------------------------------- image folders


def test_imagefolder_loads_labels_names_and_shapes(folder: Path, tmp_path: Path) -> None:
    train = load_imagefolder(folder, "train")
    assert train.class_names == ["ant", "bee", "cat"]
    assert len(train) == 7
    assert sorted(train.labels.tolist()) == [0, 0, 1, 1, 2, 2, 2]
    assert train.labels.dtype == np.int64
    for i in range(len(train)):
        image, label = train[i]
        assert image.shape == (6, 5, 3) and image.dtype == np.uint8
        assert image[0, 0, 0] // 40 == label  # pixel value was written from the class index
    assert "imagefolder" in train.identity and ":train#" in train.identity
    test = load_imagefolder(folder, "test")
    assert test.labels.tolist() == [0, 1, 2]


def test_imagefolder_flat_layout_is_train_and_gray_channels(tmp_path: Path) -> None:
    root = tmp_path / "flat"
    _write_folder(root, {"": {"zebra": 2, "aardvark": 1}}, (3, 4))
    data = load_imagefolder(root, "train", channels=1)
    assert data.class_names == ["aardvark", "zebra"]
    assert data[0][0].shape == (3, 4, 1)


def test_imagefolder_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_imagefolder(tmp_path / "nowhere")


def test_unreadable_image_error_names_index_and_file(folder: Path, tmp_path: Path) -> None:
    (folder / "train" / "bee" / "broken.png").write_bytes(b"\x89PNG not really")
    data = load_imagefolder(folder, "train")
    broken = [i for i in range(len(data)) if data.labels[i] == 1][-1]
    with pytest.raises(ValueError, match=rf"image {broken} .*broken\.png"):
        data[broken]


# --------------------------------------------------------------------------- HF datasets


def test_save_to_disk_round_trip(tmp_path: Path) -> None:
    dataset = _hf_dataset()
    dataset_dict = datasets.DatasetDict({"train": dataset, "test": dataset.select([0, 1])})
    dataset_dict.save_to_disk(str(tmp_path / "dd"))
    train = load_disk(tmp_path / "dd", "train")
    assert train.class_names == ["a", "b"]
    assert train.labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert np.array_equal(train[3][0], np.full((4, 4, 3), 30, np.uint8))
    assert len(load_disk(tmp_path / "dd", "test")) == 2
    with pytest.raises(ValueError, match=r"split 'validation' not found.*\['train', 'test'\]"):
        load_disk(tmp_path / "dd", "validation")
    dataset.save_to_disk(str(tmp_path / "single"))
    assert len(load_disk(tmp_path / "single")) == 6


def test_empty_split_is_an_error(tmp_path: Path) -> None:
    dataset = _hf_dataset()
    empty = dataset.filter(lambda row: False)
    datasets.DatasetDict({"train": dataset, "test": empty}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"disk:.*:test.* is empty"):
        load_disk(tmp_path / "dd", "test")
    np.savez(tmp_path / "e.npz", images=np.zeros((0, 4, 4), np.uint8), labels=np.zeros(0, int))
    with pytest.raises(ValueError, match="is empty"):
        load_arrays(tmp_path / "e.npz")


def test_missing_column_error_names_column_and_lists_columns() -> None:
    with pytest.raises(ValueError, match=r"'fine_label' not found.*\['image', 'label'\]"):
        HFImages(_hf_dataset(), label_column="fine_label")
    with pytest.raises(ValueError, match=r"column 'img' not found"):
        HFImages(_hf_dataset(), image_column="img")


def test_hf_images_from_arrays_and_subset() -> None:
    rows = {"pixels": [np.full((3, 3), i, np.uint8) for i in range(4)], "y": [3, 1, 2, 0]}
    data = HFImages(datasets.Dataset.from_dict(rows), "pixels", "y")
    assert data.class_names == ["0", "1", "2", "3"]  # no ClassLabel: names from the label range
    image, label = data[-1]
    assert image.shape == (3, 3, 3) and image[0, 0, 0] == 3 and label == 0
    subset = IndexedImages(data, [2, 0])
    assert subset.labels.tolist() == [2, 3]
    assert subset[0][0][0, 0, 0] == 2
    assert subset.identity.startswith(data.identity) and subset.identity != data.identity
    with pytest.raises(IndexError):
        subset[2]


def test_string_labels_are_refused() -> None:
    rows = {"image": [np.zeros((2, 2), np.uint8)], "label": ["cat"]}
    with pytest.raises(ValueError, match=r"label column 'label'.*integer class ids"):
        HFImages(datasets.Dataset.from_dict(rows))


def test_load_hub_forwards_id_revision_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_load_dataset(path: str, name: str | None, **kwargs: object) -> datasets.Dataset:
        calls.append((path, name, kwargs))
        return _hf_dataset()

    monkeypatch.setattr(hub_source.datasets, "load_dataset", fake_load_dataset)
    data = load_hub("org/set", "test", revision="abc123", cache_dir="/tmp/c")
    assert calls == [
        ("org/set", None, {"revision": "abc123", "split": "test", "cache_dir": "/tmp/c"})
    ]
    assert data.identity.startswith("hub:org/set@abc123:test#")
    assert data.class_names == ["a", "b"]


def test_a_recipes_hub_config_reaches_load_dataset_and_only_hub_takes_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def fake_load_dataset(path: str, name: str | None, **kwargs: object) -> datasets.Dataset:
        calls.append((path, name))
        return _hf_dataset()

    monkeypatch.setattr(hub_source.datasets, "load_dataset", fake_load_dataset)
    raw = {"source": "hub", "path": "org/set", "config": "plain_text", "split": "test"}
    recipe = recipe_from_dict({"data": {"train": raw}})
    data = fdata.load_split("data.train", recipe.data.train, channels=3, seed=0)
    assert calls == [("org/set", "plain_text")]
    assert data.identity.startswith("hub:org/set/plain_text@default:test#")
    # Two configurations of one dataset are different images: validating OOD detection on one
    # and testing on the other is allowed; on the same one it is refused.
    ood = {"source": "hub", "path": "org/ood", "config": "a", "split": "test"}
    for val_config, refused in (("b", False), ("a", True)):
        data_cfg = {"train": raw, "ood": {"x": ood}, "val_ood": {"x": ood | {"config": val_config}}}
        if refused:
            with pytest.raises(ConfigError, match="the same images as the test-time OOD set"):
                recipe_from_dict({"data": data_cfg})
        else:
            recipe_from_dict({"data": data_cfg})
    with pytest.raises(ConfigError, match=r"config='plain_text': applies to source hub only"):
        DatasetSpec(source="disk", path="/x", config="plain_text")


# --------------------------------------------------------------------------- arrays and IDX


def test_npz_round_trip_and_missing_key(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)  # (N, H, W)
    np.savez(tmp_path / "a.npz", images=images, labels=[1, 0], class_names=["x", "y"])
    data = load_arrays(tmp_path / "a.npz")
    assert data.class_names == ["x", "y"]
    assert data.labels.tolist() == [1, 0]
    assert np.array_equal(data[1][0][..., 2], images[1])
    assert data.identity.startswith("npz:a.npz#")
    np.savez(tmp_path / "b.npz", images=images)
    with pytest.raises(ValueError, match=r"b\.npz lacks array\(s\) \['labels'\]"):
        load_arrays(tmp_path / "b.npz")


def test_array_images_validate_dtype_and_shape() -> None:
    with pytest.raises(ValueError, match=r"floating-point pixels .* expected values in \[0, 1\]"):
        ArrayImages(np.full((2, 3, 3), 2.0, np.float32), np.zeros(2, int))
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        ArrayImages(np.zeros((2, 3, 3), np.uint8), np.zeros(3, int))
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        ArrayImages(np.zeros((2, 3, 3), np.uint8), np.zeros(2, int), channels=2)


_GRADIENT16 = np.linspace(0, 65535, 16).astype(np.uint16).reshape(4, 4)  # 0 .. 65535, rising


def test_npz_arrays_of_16_bit_pixels_are_scaled_by_their_bit_depth(tmp_path: Path) -> None:
    twelve_bit = np.linspace(0, 4095, 16).astype(np.uint16).reshape(4, 4)  # in a 16-bit container
    np.savez(tmp_path / "a.npz", images=np.stack([_GRADIENT16, twelve_bit]), labels=[0, 1])
    data = load_arrays(tmp_path / "a.npz", channels=1)
    image = data[0][0][:, :, 0]  # (4, 4) uint8
    assert image.dtype == np.uint8 and image[0, 0] == 0 and image[-1, -1] == 255
    assert (np.diff(image.ravel().astype(int)) >= 0).all() and len(np.unique(image)) == 16
    assert np.array_equal(image, _GRADIENT16 >> 8)
    assert np.array_equal(data[1][0][:, :, 0], twelve_bit >> 8)  # the container's depth: 0..15


@pytest.mark.parametrize(
    ("pixels", "expected"),
    [
        (torch.from_numpy(_GRADIENT16.astype(np.int32)).to(torch.uint16), _GRADIENT16 >> 8),
        (torch.linspace(0, 1, 16).reshape(1, 4, 4), np.round(np.linspace(0, 255, 16))),
        (np.arange(0, 256, 17).reshape(4, 4).astype(np.int64), np.arange(0, 256, 17)),
        (np.eye(4, dtype=bool), np.eye(4) * 255),
    ],
    ids=["uint16-tensor", "float-tensor-in-0-1", "int64-in-0-255", "bool"],
)
def test_in_memory_images_follow_the_same_rule(pixels: object, expected: np.ndarray) -> None:
    image = as_labeled_images([(pixels, 0), (pixels, 1)], channels=1)[0][0]
    assert image.dtype == np.uint8 and np.array_equal(image.ravel(), expected.ravel())


@pytest.mark.parametrize(
    ("pixels", "message"),
    [
        (np.full((4, 4), 255.0, np.float32), r"floating-point pixels \(float32\) in \[255.0, "),
        (np.full((4, 4), np.nan), r"floating-point pixels \(float64\) in \[nan, nan\]"),
        (np.full((4, 4), 4095, np.int32), r"signed integer pixels \(int32\) in \[4095, .*uint16"),
    ],
)
def test_pixels_without_a_known_scale_are_refused_naming_the_image(
    pixels: np.ndarray, message: str
) -> None:
    data = as_labeled_images([(pixels, 0), (pixels, 1)])
    with pytest.raises(ValueError, match=f"image 1 of .*{message}"):
        data[1]
    with pytest.raises(ValueError, match=message):
        ArrayImages(pixels[None], np.zeros(1, int))  # refused when the arrays are loaded


def test_channels_rgb_to_gray_and_back() -> None:
    rgb = np.zeros((1, 2, 2, 3), np.uint8)
    rgb[..., 0] = 200  # pure red: luma 0.299 * 200
    gray = ArrayImages(rgb, np.zeros(1, int), channels=1)[0][0]
    assert gray.shape == (2, 2, 1) and gray[0, 0, 0] == round(0.299 * 200)
    expanded = ArrayImages(rgb[..., :1], np.zeros(1, int))[0][0]
    assert expanded.shape == (2, 2, 3) and (expanded == 200).all()


def test_idx_round_trip(tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    _write_idx(tmp_path / "img.gz", images)
    _write_idx(tmp_path / "lab.gz", np.array([0, 1, 2, 1, 0], np.uint8))
    assert np.array_equal(read_idx(tmp_path / "img.gz"), images)
    data = load_idx(tmp_path / "img.gz", tmp_path / "lab.gz")
    assert len(data) == 5 and data.class_names == ["0", "1", "2"]
    assert np.array_equal(data[4][0][..., 1], images[4])


def test_idx_truncated_and_malformed_files_are_named(tmp_path: Path) -> None:
    images = np.zeros((5, 4, 3), np.uint8)
    _write_idx(tmp_path / "ok.gz", images)
    raw = (tmp_path / "ok.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"cut\.gz is not a complete gzip stream"):
        read_idx(tmp_path / "cut.gz")
    header = struct.pack(">HBB3I", 0, 0x08, 3, 5, 4, 3)
    (tmp_path / "short.gz").write_bytes(gzip.compress(header + bytes(50)))
    with pytest.raises(ValueError, match=r"short\.gz: header announces shape \(5, 4, 3\) = 60"):
        read_idx(tmp_path / "short.gz")
    (tmp_path / "float.gz").write_bytes(gzip.compress(struct.pack(">HBBI", 0, 0x0D, 1, 0)))
    with pytest.raises(ValueError, match=r"float\.gz has IDX dtype 0x0d"):
        read_idx(tmp_path / "float.gz")
    (tmp_path / "magic.gz").write_bytes(gzip.compress(b"\x12\x34\x08\x01" + bytes(8)))
    with pytest.raises(ValueError, match=r"magic\.gz is not an IDX file"):
        read_idx(tmp_path / "magic.gz")


def test_idx_count_mismatch(tmp_path: Path) -> None:
    _write_idx(tmp_path / "img.gz", np.zeros((3, 2, 2), np.uint8))
    _write_idx(tmp_path / "lab.gz", np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match=r"3 images but .*lab\.gz has 4 labels"):
        load_idx(tmp_path / "img.gz", tmp_path / "lab.gz")


# --------------------------------------------------------------------------- real data


@needs_shared
def test_real_fashion_mnist_train() -> None:
    folder = SHARED_DATA / "fashion-mnist"
    data = load_idx(
        folder / "train-images-idx3-ubyte.gz",
        folder / "train-labels-idx1-ubyte.gz",
    )
    assert data.images.shape == (60000, 28, 28) and data.images.dtype == np.uint8
    assert np.bincount(data.labels).tolist() == [6000] * 10
    image, label = data[0]
    # The first training sample is an ankle boot on a black background (Zalando's README).
    assert label == 9
    assert image.shape == (28, 28, 3) and image[0, 0].tolist() == [0, 0, 0]
    assert image.max() > 200


@needs_shared
def test_real_mnist_test_split() -> None:
    folder = SHARED_DATA / "mnist"
    data = load_idx(folder / "t10k-images-idx3-ubyte.gz", folder / "t10k-labels-idx1-ubyte.gz")
    assert data.images.shape == (10000, 28, 28)
    assert data.labels[:3].tolist() == [7, 2, 1]  # the well-known first LeCun test digits


@needs_shared
def test_real_cifar10_members_as_imagefolder(tmp_path: Path) -> None:
    root, per_class = tmp_path / "cifar", 2
    taken: dict[str, int] = {}
    # Stream the tar and stop once the test split (stored first) is behind us: ~15 MB read.
    with tarfile.open(SHARED_DATA / "cifar10-jpeg" / "CIFAR-10-images.tar", "r|") as tar:
        for member in tar:
            parts = member.name.split("/")
            if parts[0] == "train":
                break
            if not member.isfile() or len(parts) != 3 or taken.get(parts[1], 0) >= per_class:
                continue
            taken[parts[1]] = taken.get(parts[1], 0) + 1
            target = root / "test" / parts[1] / parts[2]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    data = load_imagefolder(root, "test")
    assert data.class_names == CIFAR10_CLASSES
    assert np.bincount(data.labels).tolist() == [per_class] * 10
    assert data[0][0].shape == (32, 32, 3)


# --------------------------------------------------------------------------- digits, splits


def test_sklearn_digits_filter_and_remap() -> None:
    full = load_sklearn_digits()
    assert len(full) == 1797 and full.identity == "sklearn.load_digits"
    ood = load_sklearn_digits([9, 5])
    assert ood.identity == "sklearn.load_digits[9,5]"
    assert ood.class_names == ["9", "5"]
    assert set(ood.labels.tolist()) == {0, 1}
    assert (ood.labels == 0).sum() == (full.labels == 9).sum()
    assert ood.images.dtype == np.uint8 and ood.images.max() == 255 and ood.images.min() == 0
    with pytest.raises(ValueError, match=r"distinct digits in 0\.\.9"):
        load_sklearn_digits([3, 3])
    with pytest.raises(ValueError, match=r"distinct digits in 0\.\.9"):
        load_sklearn_digits([10])


def test_stratified_split_preserves_proportions_and_partitions() -> None:
    labels = np.repeat([0, 1, 2], [60, 30, 10])
    train, val = stratified_split(labels, 0.2, seed=1)
    assert np.bincount(labels[val]).tolist() == [12, 6, 2]
    assert len(np.intersect1d(train, val)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(100))
    again = stratified_split(labels, 0.2, seed=1)
    other = stratified_split(labels, 0.2, seed=2)
    assert np.array_equal(again[1], val) and not np.array_equal(other[1], val)


def test_stratified_split_keeps_a_training_sample_per_class() -> None:
    labels = np.array([0, 0, 0, 0, 1, 2, 2])
    train, _ = stratified_split(labels, 0.5, seed=0)
    assert set(labels[train].tolist()) == {0, 1, 2}
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match=r"must lie in \(0, 1\)"):
            stratified_split(labels, fraction, seed=0)


def test_allocate_sums_exactly() -> None:
    assert allocate(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert allocate(7, [0.5, 0.25, 0.25]).sum() == 7
    with pytest.raises(ValueError, match="non-negative"):
        allocate(5, [1, -1])


def test_check_labels_names_offending_values() -> None:
    data = ArrayImages(np.zeros((4, 2, 2), np.uint8), np.array([0, 5, -1, 2]))
    with pytest.raises(ValueError, match=r"label values -1, 5 outside the allowed range \[0, 3\)"):
        check_labels(data, 3)
    data.labels = np.array([0, 1, 2, 2])
    check_labels(data, 3)


def _imagefolder_splits(root: Path, train: dict[str, int], test: dict[str, int]) -> fdata.Splits:
    """build_splits of an image folder with the given class folders (count 0: an empty folder)."""
    _write_folder(root, {"train": train, "test": test}, (4, 4))
    spec = {"source": "imagefolder", "path": str(root)}
    recipe = recipe_from_dict(
        {"data": {"train": {**spec, "split": "train"}, "test": {**spec, "split": "test"}}}
    )
    return fdata.build_splits(recipe.data, seed=0)


def test_empty_training_class_folder_is_a_class_and_is_warned_about(tmp_path: Path) -> None:
    splits = _imagefolder_splits(
        tmp_path / "f", {"ant": 3, "bee": 0, "cat": 3}, {"ant": 1, "bee": 1, "cat": 1}
    )
    assert splits.train.class_names == ["ant", "bee", "cat"]
    assert sorted(splits.test.labels.tolist()) == [0, 1, 2]
    (warning,) = splits.check_labels(3)
    assert "data.train" in warning and "no images of class(es) ['bee']" in warning


def test_training_images_of_one_class_are_refused_saying_what_was_found(tmp_path: Path) -> None:
    splits = _imagefolder_splits(tmp_path / "f", {"ant": 8, "bee": 0}, {"ant": 1, "bee": 1})
    expected = r"^X has images of only 1 of its 2 classes \('ant'\): a classifier needs images of "
    with pytest.raises(TooFewClassesError, match=expected + r"at least 2 classes\. Y$"):
        require_two_classes(splits.train, "X", "Y")
    assert isinstance(TooFewClassesError("x"), FsebError)  # fseb-ft prints it in one line
    require_two_classes(splits.test, "X", "Y")  # two classes: nothing to say


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ({"ant": 1, "bee": 1, "cat": 1, "owl": 1}, r"it has \['owl'\] that data.train lacks"),
        ({"ant": 1, "bee": 1, "wolf": 1}, r"\['wolf'\] that data.train lacks; it lacks \['cat'\]"),
        ({"ant": 1, "cat": 1}, r"it lacks \['bee'\]"),  # would score cats as bees
    ],
)
def test_test_folder_with_other_classes_fails_naming_split_and_classes(
    tmp_path: Path, test: dict[str, int], message: str
) -> None:
    splits = _imagefolder_splits(tmp_path / "f", {"ant": 2, "bee": 2, "cat": 2}, test)
    assert splits.train.class_names == ["ant", "bee", "cat"]
    with pytest.raises(ValueError, match=r"^data\.test \(imagefolder:.*:test#.*\) does not match"):
        splits.check_labels(3)
    with pytest.raises(ValueError, match=message):
        splits.check_labels(3)


def test_test_folder_with_fewer_classes_in_the_same_order_is_fine(tmp_path: Path) -> None:
    splits = _imagefolder_splits(tmp_path / "f", {"ant": 2, "bee": 2, "cat": 2}, {"ant": 1})
    assert splits.check_labels(3) == []


def test_unnamed_labels_out_of_range_name_the_split() -> None:
    def arrays(labels: list[int]) -> ArrayImages:
        return ArrayImages(np.zeros((len(labels), 2, 2), np.uint8), np.array(labels))

    splits = fdata.Splits(arrays([0, 1, 2]), arrays([0, 1]), arrays([0, 3]), {})
    with pytest.raises(ValueError, match=r"^data\.test: arrays#\w+ has label values 3 outside"):
        splits.check_labels(3)


def test_dataset_without_label_column_names_the_split(tmp_path: Path) -> None:
    _hf_dataset().remove_columns("label").save_to_disk(str(tmp_path / "nolabel"))
    spec = {"source": "disk", "path": str(tmp_path / "nolabel")}
    data = {"train": {"source": "sklearn_digits"}, "test": spec}
    with pytest.raises(ValueError, match=r"^data\.test: column 'label' not found in disk:"):
        fdata.build_splits(recipe_from_dict({"data": data}).data, seed=0)
    data = {"train": {"source": "sklearn_digits"}, "ood": {"blank": spec}}
    with pytest.raises(ValueError, match=r"^data\.ood\.blank: column 'label' not found"):
        fdata.build_splits(recipe_from_dict({"data": data}).data, seed=0)


# --------------------------------------------------------------------------- transforms


@pytest.mark.parametrize("augment", ["none", "flip", "crop_flip", "randaug-lite"])
def test_train_transform_shapes(augment: str) -> None:
    transform = train_transform((12, 10), MEAN, STD, augment, seed=0)
    out = transform(image=np.zeros((7, 9, 3), np.uint8))["image"]
    assert out.shape == (3, 12, 10) and out.dtype == torch.float32


def test_eval_transform_normalises_a_constant_image() -> None:
    out = eval_transform((8, 8), (0.2, 0.4, 0.6), (0.1, 0.2, 0.3))(
        image=np.full((5, 5, 3), 102, np.uint8)
    )["image"]  # 102 / 255 = 0.4
    assert out.shape == (3, 8, 8)
    assert torch.allclose(out.mean(dim=(1, 2)), torch.tensor([2.0, 0.0, -2 / 3]), atol=1e-5)


def test_transform_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"augment must be one of \['none', 'flip'"):
        train_transform((8, 8), MEAN, STD, "mixup")
    with pytest.raises(ValueError, match="1 or 3 entries"):
        eval_transform((8, 8), (0.5, 0.5), (0.5, 0.5))
    gray = ArrayImages(np.zeros((2, 4, 4), np.uint8), np.zeros(2, int), channels=1)
    with pytest.raises(ValueError, match=r"normalises 3 channels but .* 1-channel"):
        TransformedImages(gray, eval_transform((8, 8), MEAN, STD))


def test_transformed_images_expand_gray_to_three_channels() -> None:
    data = ArrayImages(np.full((2, 5, 5), 128, np.uint8), np.array([1, 0]))
    image, label = TransformedImages(data, eval_transform((6, 6), MEAN, STD))[0]
    assert image.shape == (3, 6, 6) and image.dtype == torch.float32 and label == 1
    single = ArrayImages(np.full((2, 5, 5), 128, np.uint8), np.array([1, 0]), channels=1)
    image, _ = TransformedImages(single, eval_transform((6, 6), (0.5,), (0.5,)))[0]
    assert image.shape == (1, 6, 6)


@pytest.mark.parametrize(
    ("channels", "input_size", "image_size"),
    [(3, (12, 20), (37, 29)), (3, (16, 16), (10, 41)), (1, (28, 28), (40, 33))],
)
def test_eval_transform_is_timms_eval_transform_bit_for_bit(
    channels: int, input_size: tuple[int, int], image_size: tuple[int, int]
) -> None:
    # What the card's snippet runs for an exported model: its config.json's data config.
    mean, std = (0.4, 0.5, 0.6)[:channels], (0.2, 0.25, 0.3)[:channels]
    exported = {"input_size": (channels, *input_size), "mean": mean, "std": std, **EVAL_RESIZE}
    timm_transform = timm.data.create_transform(
        **timm.data.resolve_data_config(pretrained_cfg=exported)
    )
    rng = np.random.default_rng(channels)
    image = rng.integers(0, 256, (*image_size, channels), dtype=np.uint8)  # (H, W, C)
    expected = timm_transform(Image.fromarray(image[:, :, 0] if channels == 1 else image))
    transform = eval_transform(input_size, mean, std)
    assert torch.equal(transform(image=image)["image"], expected)
    assert expected.shape == (channels, *input_size)
    copied = pickle.loads(pickle.dumps(transform))  # DataLoader workers get a pickled copy
    assert torch.equal(copied(image=image)["image"], expected)


def test_train_resize_shrinks_with_antialiasing_like_evaluation() -> None:
    # Noise shrunk 4x / 3x: cv2's plain bilinear aliases (about 37 grey levels away from the
    # eval transform's PIL resize); INTER_AREA averages as PIL does (about 9).
    image = np.random.default_rng(0).integers(0, 256, (64, 48, 3), dtype=np.uint8)  # (H, W, 3)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    train = train_transform((16, 16), mean, std, "none")(image=image)["image"]  # (3, 16, 16)
    evaluation = eval_transform((16, 16), mean, std)(image=image)["image"]
    assert (train - evaluation).abs().mean().item() * 0.25 * 255 < 15


def test_is_deterministic() -> None:
    assert is_deterministic(eval_transform((8, 8), MEAN, STD))
    assert is_deterministic(train_transform((8, 8), MEAN, STD, "none"))
    assert not is_deterministic(train_transform((8, 8), MEAN, STD, "flip"))


# --------------------------------------------------------------------------- loaders


def _augmented_digits() -> TransformedImages:
    return TransformedImages(
        load_sklearn_digits([0, 1]), train_transform((8, 8), MEAN, STD, "randaug-lite")
    )


def test_make_loader_is_reproducible_under_a_seed() -> None:
    def first_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return next(iter(make_loader(_augmented_digits(), 16, shuffle=True, seed=seed)))

    (x1, y1), (x2, y2), (x3, _) = first_batch(3), first_batch(3), first_batch(4)
    assert x1.shape == (16, 3, 8, 8) and y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)


def test_worker_streams_differ_and_repeat() -> None:
    # Same image everywhere: any difference between batches comes from the augmentation.
    same = ArrayImages(
        np.tile(np.arange(64, dtype=np.uint8).reshape(1, 8, 8), (8, 1, 1)), np.zeros(8, int)
    )

    def batches() -> list[torch.Tensor]:
        data = TransformedImages(same, train_transform((8, 8), MEAN, STD, "randaug-lite"))
        return [x for x, _ in make_loader(data, 4, shuffle=False, num_workers=2, seed=0)]

    first, second = batches(), batches()
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    # Worker 0 yields batch 0, worker 1 batch 1: without the per-worker reseed they are equal.
    assert not torch.equal(first[0], first[1])


def test_fraction_keeps_the_same_seeded_share_of_every_class(tmp_path: Path) -> None:
    labels = np.repeat([0, 1, 2], [40, 20, 4])  # (64,) imbalanced on purpose
    images = np.arange(64, dtype=np.uint8)[:, None, None].repeat(4, 1).repeat(4, 2)  # (64, 4, 4)
    np.savez(tmp_path / "set.npz", images=images, labels=labels)
    spec = DatasetSpec(source="arrays", path=str(tmp_path / "set.npz"), fraction=0.25)
    kept = load_spec(spec, channels=1, seed=3)
    assert np.bincount(kept.labels).tolist() == [10, 5, 1]
    first = [int(kept[i][0].ravel()[0]) for i in range(len(kept))]
    again = load_spec(spec, channels=1, seed=3)
    assert first == [int(again[i][0].ravel()[0]) for i in range(len(again))]
    other = load_spec(spec, channels=1, seed=4)
    assert first != [int(other[i][0].ravel()[0]) for i in range(len(other))]
    whole = load_spec(dataclasses.replace(spec, fraction=1.0), channels=1, seed=3)
    assert len(whole) == 64
    with pytest.raises(ConfigError, match="fraction"):
        DatasetSpec(source="arrays", path="x.npz", fraction=0.0)
