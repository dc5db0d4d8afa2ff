"""Image folders listed without `datasets`: the same samples, labels and pixels as its imagefolder
builder, any subfolder as a split, fingerprints that follow the files, and left-out files named."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from fseb_ft.data.files import FileImages, list_split
from fseb_ft.data.images import HFImages
from fseb_ft.data.sources import load_spec
from fseb_ft.data.sources.imagefolder import load_imagefolder
from fseb_ft.recipe import DatasetSpec

datasets.disable_progress_bars()


def _image(path: Path, mode: str, value: int, size: tuple[int, int] = (5, 4)) -> None:
    """A ``size`` (W, H) image of ``mode`` whose pixels encode ``value``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "I;16":
        pixels = np.full(size[::-1], 200 * value, np.uint16)  # (H, W): 16-bit, above 255
        image = Image.fromarray(pixels)
        assert image.mode == "I;16"
        image.save(path)
        return
    rgb = Image.fromarray(np.full((*size[::-1], 3), 30 * value, np.uint8))  # (H, W, 3)
    converted = rgb.convert(mode) if mode != "P" else rgb.quantize(4)
    converted.save(path)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/ with an empty class folder and odd-mode images; val/ and test/ with a class a-b."""
    root = tmp_path_factory.mktemp("folder")
    modes = ["RGB", "L", "RGBA", "P", "I;16", "CMYK"]
    for i, mode in enumerate(modes):
        ext = "jpg" if mode == "CMYK" else "png"
        _image(root / "train" / ("cat" if i % 2 else "ant") / f"{i}.{ext}", mode, i)
    (root / "train" / "bee").mkdir()  # an empty class: still a class, between ant and cat
    for split in ("val", "test"):
        for i, name in enumerate(["ant", "bee", "cat", "a-b"]):
            _image(root / split / name / f"x{i}.png", "RGB", i)
    return root


def _datasets_reference(root: Path, split: str, cache: Path) -> tuple[list[str], HFImages]:
    """Class name of each sample and the samples, as the `datasets` imagefolder path gave them."""
    dataset = datasets.load_dataset(
        "imagefolder", data_dir=str(root), split=split, drop_labels=False, cache_dir=str(cache)
    )
    names = dataset.features["label"].names
    return [names[k] for k in dataset["label"]], HFImages(dataset, "image", "label")


@pytest.mark.parametrize(("split", "hf_split"), [("train", "train"), ("val", "validation")])
def test_same_samples_labels_and_pixels_as_the_datasets_imagefolder(
    root: Path, tmp_path: Path, split: str, hf_split: str
) -> None:
    data = load_imagefolder(root, split)
    expected, reference = _datasets_reference(root, hf_split, tmp_path)
    assert [data.class_names[k] for k in data.labels] == expected  # same order, same classes
    for i in range(len(data)):
        image, _ = data[i]
        assert image.dtype == np.uint8 and image.shape[2] == 3
        assert np.array_equal(image, reference[i][0])  # gray, RGBA, palette, 16-bit converted


def test_class_order_is_the_sorted_class_folders_of_the_split_empty_ones_included(
    root: Path,
) -> None:
    assert load_imagefolder(root, "train").class_names == ["ant", "bee", "cat"]
    assert load_imagefolder(root, "test").class_names == ["a-b", "ant", "bee", "cat"]
    train = load_imagefolder(root, "train", channels=1)
    assert np.bincount(train.labels, minlength=3).tolist() == [3, 0, 3]
    assert train[0][0].shape == (4, 5, 1)


def test_classes_are_named_by_folder_or_label(root: Path) -> None:
    spec = {"source": "imagefolder", "path": str(root), "split": "test"}
    by_name = load_spec(DatasetSpec(**spec, classes=("cat", "a-b")))  # folders a-b ant bee cat
    by_label = load_spec(DatasetSpec(**spec, classes=(3, 0)))
    assert by_name.class_names == by_label.class_names == ["cat", "a-b"]
    assert by_name.labels.tolist() == by_label.labels.tolist() == [1, 0]  # sorted paths
    assert np.array_equal(by_name[0][0], by_label[0][0])
    assert load_spec(DatasetSpec(**spec, classes=("bee", 0))).class_names == ["bee", "a-b"]
    with pytest.raises(ValueError, match=r"classes \['owl'\] are not class names of .*"
                       r"its classes are \['a-b', 'ant', 'bee', 'cat'\]"):  # fmt: skip
        load_spec(DatasetSpec(**spec, classes=("cat", "owl")))
    with pytest.raises(ValueError, match=r"name one class twice \(labels \[3, 3\]\)"):
        load_spec(DatasetSpec(**spec, classes=("cat", 3)))


def test_any_subfolder_is_the_split_it_is_called(root: Path, tmp_path: Path) -> None:
    val = load_imagefolder(root, "val")
    assert load_imagefolder(root, "validation").files == val.files  # datasets' name finds val/
    assert ":val#" in val.identity
    other = tmp_path / "other"
    _image(other / "holdout" / "cat" / "0.png", "RGB", 1)
    _image(other / "train" / "cat" / "0.png", "RGB", 1)
    assert len(load_imagefolder(other, "holdout")) == 1
    with pytest.raises(FileNotFoundError, match=r"no subfolder for split 'test'.*\['holdout', 'tr"):
        load_imagefolder(other, "test")


def test_a_flat_folder_is_split_train(tmp_path: Path) -> None:
    for name in ("zebra", "aardvark"):
        _image(tmp_path / "flat" / name / "0.png", "RGB", 1)
    data = load_imagefolder(tmp_path / "flat", "train")
    assert data.class_names == ["aardvark", "zebra"] and len(data) == 2
    expected, _ = _datasets_reference(tmp_path / "flat", "train", tmp_path / "cache")
    assert [data.class_names[k] for k in data.labels] == expected
    with pytest.raises(FileNotFoundError, match="no subfolder for split 'test'"):
        load_imagefolder(tmp_path / "flat", "test")


def test_images_in_subfolders_of_a_class_belong_to_it(tmp_path: Path) -> None:
    _image(tmp_path / "f" / "train" / "n01" / "images" / "0.JPEG", "RGB", 1)  # Tiny-ImageNet
    _image(tmp_path / "f" / "train" / "n02" / "1.png", "RGB", 2)
    data = load_imagefolder(tmp_path / "f", "train")
    assert data.files == ["n01/images/0.JPEG", "n02/1.png"] and data.labels.tolist() == [0, 1]


def test_fingerprint_is_stable_and_follows_the_files(tmp_path: Path) -> None:
    for i in range(3):
        _image(tmp_path / "f" / "train" / "cat" / f"{i}.png", "RGB", i)
    first = load_imagefolder(tmp_path / "f").identity
    assert load_imagefolder(tmp_path / "f").identity == first
    assert first.startswith(f"imagefolder:{tmp_path / 'f'}:train#")
    seen = {first}

    def changed() -> None:
        identity = load_imagefolder(tmp_path / "f").identity
        assert identity not in seen
        seen.add(identity)

    file = tmp_path / "f" / "train" / "cat" / "0.png"
    os.utime(file, ns=(0, 12345))
    changed()  # rewritten (same size, another mtime)
    file.rename(file.with_name("9.png"))
    changed()
    _image(tmp_path / "f" / "train" / "cat" / "3.png", "RGB", 3)
    changed()
    (tmp_path / "f" / "train" / "dog").mkdir()
    changed()  # a new (empty) class changes the labels' meaning


def test_files_without_an_image_extension_are_left_out_with_one_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _image(tmp_path / "f" / "train" / "cat" / "0.png", "RGB", 1)
    for i in range(12):
        (tmp_path / "f" / "train" / "cat" / f"note{i:02d}.txt").write_text("not an image")
    (tmp_path / "f" / "train" / "README").write_text("outside any class folder")
    (tmp_path / "f" / "train" / "cat" / ".DS_Store").write_text("hidden: ignored silently")
    with caplog.at_level(logging.WARNING, logger="fseb_ft"):
        data = load_imagefolder(tmp_path / "f")
    assert data.files == ["cat/0.png"]
    (record,) = caplog.records
    message = record.getMessage()
    assert "left out 13 file(s)" in message and "README" in message and "3 more" in message
    assert "cat/note00.txt" in message and ".DS_Store" not in message


def test_missing_folder_and_listing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_imagefolder(tmp_path / "nowhere")
    _image(tmp_path / "f" / "b" / "1.png", "RGB", 1)
    _image(tmp_path / "f" / "a" / "0.png", "RGB", 1)
    listing = list_split(tmp_path / "f", "train")
    assert listing.folder == tmp_path / "f" and listing.files == ["a/0.png", "b/1.png"]
    data = FileImages(listing.folder, listing.files, listing.labels, ["a", "b"], "x")
    assert data.encoded(1) == (str(tmp_path / "f" / "b" / "1.png"),) * 2


@pytest.mark.parametrize("ext", ["png", "tif"])
def test_a_16_bit_gradient_is_scaled_to_8_bits_in_order_not_clipped_white(
    tmp_path: Path, ext: str
) -> None:
    gradient = np.linspace(0, 65535, 64).astype(np.uint16).reshape(8, 8)  # rising, row by row
    twelve_bit = np.linspace(0, 4095, 64).astype(np.uint16).reshape(8, 8)  # 12-bit in 16 bits
    for name, pixels in (("a", gradient), ("b", twelve_bit)):
        (tmp_path / "train" / name).mkdir(parents=True)
        Image.fromarray(pixels).save(tmp_path / "train" / name / f"x.{ext}")
        with Image.open(tmp_path / "train" / name / f"x.{ext}") as image:
            assert image.mode == "I;16"
    data = load_imagefolder(tmp_path, "train", channels=1)
    image = data[0][0][:, :, 0]  # (8, 8) uint8
    assert image[0, 0] == 0 and image[-1, -1] == 255 and len(np.unique(image)) > 32
    assert (np.diff(image.ravel().astype(int)) >= 0).all()
    assert np.array_equal(image, gradient >> 8)
    # By the container's bit depth (value >> 8), not the image's range: 12-bit data is dark.
    assert np.array_equal(data[1][0][:, :, 0], twelve_bit >> 8)
    rgb = load_imagefolder(tmp_path, "train", channels=3)[0][0]
    assert np.array_equal(rgb, np.repeat(image[:, :, None], 3, axis=2))
