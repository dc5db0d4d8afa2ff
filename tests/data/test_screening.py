"""The check before training: unreadable images stop a run before its first step, or are skipped
and recorded (run.json, model card); a truncated JPEG is caught, though PIL's verify() passes it."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

import fseb_ft.data.pixels as pixels
from fseb_ft.data.files import read_image
from fseb_ft.data.images import ArrayImages, HFImages, IndexedImages
from fseb_ft.data.screening import BadImagesError, check_image, find_bad_images, screen
from fseb_ft.data.sources import build_splits
from fseb_ft.data.sources.imagefolder import load_imagefolder
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.finetune import run
from fseb_ft.recipe import ConfigError, DataConfig, DatasetSpec, ImageCacheConfig, recipe_from_dict
from fseb_ft.recipe.datasets import PIL_MAX_IMAGE_PIXELS
from tests.commands.test_cli_errors import QUICKSTART, _fails
from tests.helpers import tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _jpeg(side: int = 16, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _truncated_jpeg(side: int = 16) -> bytes:
    """A JPEG cut in the middle of its compressed data: the header (and size) still read."""
    return _jpeg(side)[: len(_jpeg(side)) * 3 // 4]


def test_a_truncated_jpeg_passes_open_size_and_verify_but_not_the_check(tmp_path: Path) -> None:
    path = tmp_path / "cut.jpg"
    path.write_bytes(_truncated_jpeg())
    with Image.open(path) as image:
        assert image.size == (16, 16)
        image.verify()  # PIL's verify() checks nothing for JPEG: a header check is not enough
    assert "truncated" in check_image(str(path))
    assert "truncated" in check_image(path.read_bytes())
    assert check_image(_jpeg()) is None


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16", "1"])
def test_odd_modes_pass_the_check(tmp_path: Path, mode: str) -> None:
    pixels = np.arange(48, dtype=np.uint16).reshape(6, 8) * (1000 if mode == "I;16" else 5)
    image = Image.fromarray(pixels) if mode == "I;16" else Image.fromarray(pixels.astype(np.uint8))
    image = image if mode == "I;16" else image.convert(mode)
    image.save(tmp_path / "x.png")
    assert check_image(str(tmp_path / "x.png")) is None


@pytest.mark.parametrize(
    ("name", "pixels", "mode", "reason"),
    [
        ("in-0-1.tif", np.linspace(0, 1, 48, dtype=np.float32), "F", None),
        ("0-4095.tif", np.linspace(0, 4095, 48, dtype=np.float32), "F", "floating-point pixels"),
        ("0-255.tif", np.arange(48, dtype=np.int32) * 5, "I", None),
        ("16-bit.pgm", np.arange(48, dtype=np.uint16) * 1000, "I", "signed integer pixels"),
    ],
)
def test_wide_pixels_fseb_ft_cannot_scale_are_found_by_the_check(
    tmp_path: Path, name: str, pixels: np.ndarray, mode: str, reason: str | None
) -> None:
    Image.fromarray(pixels.reshape(6, 8)).save(tmp_path / name)
    with Image.open(tmp_path / name) as image:
        assert image.mode == mode  # a 16-bit PGM opens as 32-bit integers: no bit depth known
    found = check_image(str(tmp_path / name))
    assert found is None if reason is None else reason in found


def test_broken_pngs_and_non_images_are_caught(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buffer, "PNG")
    assert check_image(buffer.getvalue()[:-30]) is not None  # truncated inside its data
    (tmp_path / "x.png").write_text("not an image")
    assert "cannot identify image file" in check_image(str(tmp_path / "x.png"))


def _folder_with_bad_files(root: Path, bad: int) -> list[str]:
    """train/cat with 4 good PNGs and ``bad`` truncated JPEGs; their paths."""
    write_image_folder(root, "train", {"cat": 4})
    paths = []
    for i in range(bad):
        path = root / "train" / "cat" / f"bad{i:02d}.jpg"
        path.write_bytes(_truncated_jpeg())
        paths.append(str(path))
    return paths


def test_stop_names_every_bad_file_up_to_a_limit_and_the_count(tmp_path: Path) -> None:
    paths = _folder_with_bad_files(tmp_path / "f", 23)
    data = load_imagefolder(tmp_path / "f")
    with pytest.raises(BadImagesError) as caught:
        screen({"data.train": data}, "stop", progress=False)
    message = str(caught.value)
    assert message.startswith("23 image(s) cannot be read")
    assert f"data.train: {paths[0]} (image file is truncated" in message
    assert paths[19] in message and paths[20] not in message and "and 3 more" in message
    assert "data.bad_images=skip" in message and "\n" not in message


def test_skip_drops_the_bad_images_and_logs_their_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = _folder_with_bad_files(tmp_path / "f", 2)
    data = load_imagefolder(tmp_path / "f")
    arrays = ArrayImages(np.zeros((3, 2, 2), np.uint8), np.array([0, 1, 0]))
    with caplog.at_level(logging.WARNING, logger="fseb_ft"):
        kept, dropped = screen({"data.train": data, "data.test": arrays}, "skip", progress=False)
    assert dropped == {"data.train": paths}
    assert isinstance(kept["data.train"], IndexedImages) and len(kept["data.train"]) == 4
    assert kept["data.test"] is arrays
    assert all(kept["data.train"][i][0].shape == (16, 16, 3) for i in range(4))
    assert "left out 2 image(s)" in caplog.text
    assert screen({"data.train": kept["data.train"]}, "stop", progress=False) == (
        {"data.train": kept["data.train"]},
        {},
    )


@pytest.mark.parametrize("cached", [False, True], ids=["screen", "cache"])
def test_a_dangling_symlink_in_a_class_folder_is_an_unreadable_image(
    tmp_path: Path, cached: bool
) -> None:
    write_image_folder(tmp_path / "f", "train", {"cat": 2})
    link = tmp_path / "f" / "train" / "cat" / "gone.png"
    link.symlink_to(tmp_path / "nowhere.png")
    data = load_imagefolder(tmp_path / "f")
    assert data.files == ["cat/000.png", "cat/001.png", "cat/gone.png"]
    cache = ImageCacheConfig(size=8, dir=str(tmp_path / "cache")) if cached else None
    with pytest.raises(BadImagesError) as caught:
        screen({"data.train": data}, "stop", progress=False, cache=cache)
    reason = f"broken symbolic link to {tmp_path / 'nowhere.png'}"
    assert f"data.train: {link} ({reason})" in str(caught.value)
    kept, dropped = screen({"data.train": data}, "skip", progress=False, cache=cache)
    assert dropped == {"data.train": [str(link)]} and len(kept["data.train"]) == 2
    with pytest.raises(ValueError, match=f"cannot read image {link}.*: {reason}"):
        read_image(link, 3)  # predict's reader says the same


def test_the_decompression_bomb_limit_is_the_recipes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        DataConfig(train=DatasetSpec("sklearn_digits")).max_image_pixels
        == PIL_MAX_IMAGE_PIXELS
        == Image.MAX_IMAGE_PIXELS
    )
    with pytest.raises(ConfigError, match=r"data.max_image_pixels=0: must be ≥ 1 or null"):
        recipe_from_dict({"data": {"train": {"source": "sklearn_digits"}, "max_image_pixels": 0}})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PIL_MAX_IMAGE_PIXELS)  # restored after the test
    monkeypatch.setenv("FSEB_FT_MAX_IMAGE_PIXELS", str(PIL_MAX_IMAGE_PIXELS))
    write_image_folder(tmp_path / "f", "train", {"cat": 2, "dog": 2})  # 16 × 16 = 256 pixels
    train = DatasetSpec("imagefolder", str(tmp_path / "f"))
    splits = build_splits(DataConfig(train=train, val_fraction=0.5, max_image_pixels=100), 0)
    with pytest.raises(BadImagesError, match=r"exceeds limit of 200 pixels.*data.max_image_pix"):
        screen({"data.train": splits.train}, "stop", progress=False)
    # A worker process started afresh (spawn, as on macOS) applies the same limit on import.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PIL_MAX_IMAGE_PIXELS)
    pixels._inherit_max_image_pixels()
    assert Image.MAX_IMAGE_PIXELS == 100
    splits = build_splits(DataConfig(train=train, val_fraction=0.5, max_image_pixels=None), 0)
    assert screen({"data.train": splits.train}, "stop", progress=False)[1] == {}


def test_a_folder_is_checked_again_once_its_files_change(tmp_path: Path) -> None:
    _folder_with_bad_files(tmp_path / "f", 0)
    assert find_bad_images(load_imagefolder(tmp_path / "f"), "data.train", progress=False) == []
    file = tmp_path / "f" / "train" / "cat" / "000.png"
    file.write_bytes(file.read_bytes()[:-30])  # truncated after the check: checked again
    (bad,) = find_bad_images(load_imagefolder(tmp_path / "f"), "data.val", progress=False)
    assert (bad.key, bad.name) == ("data.val", str(file))


def test_hub_and_disk_datasets_are_checked_in_their_encoded_bytes() -> None:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(2)})
    images = [{"bytes": _jpeg(), "path": None}, {"bytes": _truncated_jpeg(), "path": "b.jpg"}]
    dataset = datasets.Dataset.from_dict({"image": images, "label": [0, 1]}, features=features)
    (bad,) = find_bad_images(HFImages(dataset), "data.test", progress=False)
    assert (bad.index, bad.name) == (1, "b.jpg")
    subset = IndexedImages(HFImages(dataset), [1, 0])
    assert [b.index for b in find_bad_images(subset, "data.val", progress=False)] == [0]
    decoded = datasets.Dataset.from_dict({"image": [np.zeros((2, 2), np.uint8)], "label": [0]})
    assert HFImages(decoded).encoded(0) is None  # arrays: decoded already, nothing to check


def _bad_run(tmp_path: Path, policy: str) -> tuple[dict, str]:
    """A tiny run whose training folder holds a truncated JPEG and a text file."""
    root = tmp_path / "data"
    write_image_folder(root / "ind", "train", {"cat": 6, "dog": 6})
    write_image_folder(root / "ind", "test", {"cat": 2, "dog": 2})
    bad = root / "ind" / "train" / "dog" / "cut.jpg"
    bad.write_bytes(_truncated_jpeg())
    (root / "ind" / "train" / "dog" / "notes.txt").write_text("labelled by hand")
    recipe = tiny_recipe({"ind": root / "ind", "ood": root / "ind"}, tmp_path / "run", epochs=1)
    recipe["data"]["ood"] = {}
    recipe["data"]["bad_images"] = policy
    return recipe, str(bad)


def test_a_run_stops_before_training_naming_the_truncated_jpeg(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe, bad = _bad_run(tmp_path, "stop")
    stops = pytest.raises(BadImagesError, match=rf"^1 image\(s\) cannot be read.*{bad}")
    with caplog.at_level(logging.WARNING, logger="fseb_ft"), stops:
        run(recipe_from_dict(recipe))
    assert "notes.txt" in caplog.text  # left out, with a note, not reported as a bad image
    assert not (tmp_path / "run" / "run.json").exists()  # stopped before anything was written


def test_a_skipping_run_records_the_dropped_files_and_reevaluates_without_them(
    tmp_path: Path,
) -> None:
    recipe, bad = _bad_run(tmp_path, "skip")
    bad_test = tmp_path / "data" / "ind" / "test" / "cat" / "cut.jpg"
    bad_test.write_bytes(_truncated_jpeg())
    results = run(recipe_from_dict(recipe))
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["bad_images"] == {"data.train": [bad], "data.test": [str(bad_test)]}
    assert info["num_train"] + 3 == 12  # 12 good images minus a 25 % validation split
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "2 unreadable image(s) were left out" in card
    # The card is published: each file is named inside its dataset's folder, not by its path.
    assert "`ind/train/dog/cut.jpg`, `ind/test/cat/cut.jpg`" in card and bad not in card
    # Re-evaluation leaves the same test image out, so it reproduces the run's numbers.
    again = evaluate_run(tmp_path / "run", cpu=True)
    assert again["test"]["n"] == results["test"]["n"] == 4
    assert again["test"]["nll"] == pytest.approx(results["test"]["nll"], abs=1e-6)


def test_the_command_prints_one_line_for_bad_images(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, bad = _bad_run(tmp_path, "stop")
    folder = tmp_path / "data" / "ind"
    argv = [QUICKSTART, f"output.dir={tmp_path / 'run'}", "data.ood={}"]
    argv += [
        f"data.{s}={{source: imagefolder, path: '{folder}', split: {s}}}" for s in ("train", "test")
    ]
    line = _fails(argv, capsys, 1)
    assert line.startswith("fseb-ft: error: 1 image(s) cannot be read") and bad in line
