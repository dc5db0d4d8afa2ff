"""The resized-image cache (``data.cache``): built once, reused, rebuilt when an image changes,
atomic, aspect-keeping, the check before training in the same decode, ``fseb-ft cache``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import fseb_ft.data.image_cache as image_cache
from fseb_ft import api, cli
from fseb_ft.data.files import FileImages
from fseb_ft.data.image_cache import CachedImages, cache_images, resize_shorter
from fseb_ft.data.images import IndexedImages, content_hash
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.screening import BadImagesError, screen
from fseb_ft.data.sources import build_splits
from fseb_ft.data.transforms import (
    TransformedImages,
    eval_transform,
    train_transform,
)
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.finetune import run
from fseb_ft.prediction.validation import validation_split
from fseb_ft.recipe import ConfigError, ImageCacheConfig, recipe_from_dict
from fseb_ft.runs.rundir import RunInfo
from tests.helpers import tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every decode the cache makes, by name (small builds decode in this process)."""
    calls: list[str] = []
    original = image_cache.decode_image

    def counted(value: dict[str, Any], where: str) -> np.ndarray:
        calls.append(value["path"])
        return original(value, where)

    monkeypatch.setattr(image_cache, "decode_image", counted)
    return calls


def _folder(root: Path, size: int | tuple[int, int] = 16, count: int = 3) -> FileImages:
    write_image_folder(root, "train", {"cat": count, "dog": count}, size)
    return FileImages.from_folder(root, "train")


def _config(tmp_path: Path, size: int = 16, **kw: Any) -> ImageCacheConfig:
    return ImageCacheConfig(size=size, dir=str(tmp_path / "cache"), **kw)


def _pixels(data: Any) -> list[np.ndarray]:
    return [data[i][0] for i in range(len(data))]


def test_a_build_is_reused_and_decodes_nothing_the_second_time(
    tmp_path: Path, decodes: list[str]
) -> None:
    images = _folder(tmp_path / "data", size=(20, 30))
    config = _config(tmp_path, size=10)
    first = cache_images({"data.train": images}, config, progress=False)
    assert len(decodes) == 6 and not first.reports[0].reused
    again = cache_images({"data.train": FileImages.from_folder(tmp_path / "data")}, config, False)
    assert len(decodes) == 6  # nothing decoded: the entry on disk was found
    (report,) = again.reports
    assert report.reused and report.images == 6 and report.bytes == 6 * 10 * 15 * 3
    cached = again.sets["data.train"]
    assert isinstance(cached, CachedImages) and cached.identity.endswith("|cached:10px:bilinear")
    np.testing.assert_array_equal(cached.labels, images.labels)
    for mine, original in zip(_pixels(cached), _pixels(images), strict=True):
        np.testing.assert_array_equal(mine, resize_shorter(original, 10, "bilinear"))


def test_an_edited_image_makes_a_new_entry(tmp_path: Path, decodes: list[str]) -> None:
    config = _config(tmp_path, size=8)
    cache_images({"data.train": _folder(tmp_path / "data")}, config, False)
    edited = tmp_path / "data" / "train" / "dog" / "001.png"
    Image.fromarray(np.full((16, 16, 3), 7, np.uint8)).save(edited)
    os.utime(edited, ns=(1, 1))  # a new mtime even on a coarse clock
    changed = FileImages.from_folder(tmp_path / "data")
    rebuilt = cache_images({"data.train": changed}, config, False)
    assert len(decodes) == 12 and not rebuilt.reports[0].reused
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2  # the old entry is another key
    index = changed.files.index("dog/001.png")
    np.testing.assert_array_equal(rebuilt.sets["data.train"][index][0], np.full((8, 8, 3), 7))


def test_a_killed_build_leaves_no_entry_and_the_next_one_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images, config = _folder(tmp_path / "data"), _config(tmp_path, size=8)
    original = image_cache.decode_image
    calls = []

    def killed(value: dict[str, Any], where: str) -> np.ndarray:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt("simulated kill")
        return original(value, where)

    monkeypatch.setattr(image_cache, "decode_image", killed)
    with pytest.raises(KeyboardInterrupt):
        cache_images({"data.train": images}, config, False)
    assert list((tmp_path / "cache").iterdir()) == []  # no entry, no temporary file
    # A build killed outright (SIGKILL) leaves its temporary file; the next build removes it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stem = image_cache._entry_name(images, config)
    host = image_cache._owner().rpartition("-")[0]
    leftover = tmp_path / "cache" / f".{stem}.bin.{host}-{dead.pid}.tmp"
    leftover.write_bytes(b"half")
    monkeypatch.setattr(image_cache, "decode_image", original)
    built = cache_images({"data.train": images}, config, False)
    assert not built.reports[0].reused and not leftover.exists()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f"{stem}.bin", f"{stem}.npz"]


def test_images_of_any_aspect_keep_it_with_the_shorter_side_at_the_size(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "train" / "x"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, shape in {"wide": (40, 100, 3), "tall": (90, 30, 3), "small": (12, 20, 3)}.items():
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(folder / f"{name}.png")
    Image.fromarray(rng.integers(0, 256, (50, 60), dtype=np.uint8)).save(folder / "gray.png")
    images = FileImages.from_folder(tmp_path / "data")
    cached = cache_images({"k": images}, _config(tmp_path, size=20, resize="lanczos"), False)
    pixels = _pixels(cached.sets["k"])
    shapes = {file: image.shape for file, image in zip(images.files, pixels, strict=True)}
    assert shapes == {
        "x/gray.png": (20, 24, 3),  # grayscale expanded to the dataset's 3 channels
        "x/small.png": (12, 20, 3),  # already smaller: kept as it is
        "x/tall.png": (60, 20, 3),
        "x/wide.png": (20, 50, 3),
    }
    wide = Image.open(folder / "wide.png").resize((50, 20), Image.Resampling.LANCZOS)
    np.testing.assert_array_equal(cached.sets["k"][images.files.index("x/wide.png")][0], wide)


def test_a_pool_of_processes_builds_the_same_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = _folder(tmp_path / "data", size=(24, 18), count=4)
    monkeypatch.setattr(image_cache, "PARALLEL_FROM", 4)
    inline = cache_images({"k": images}, _config(tmp_path / "a", size=9), False, workers=1)
    pooled = cache_images({"k": images}, _config(tmp_path / "b", size=9), False, workers=2)
    assert inline.reports[0].path.read_bytes() == pooled.reports[0].path.read_bytes()


def _tiny(tmp_path: Path, size: int | tuple[int, int], cache: int | None) -> dict[str, Any]:
    root = tmp_path / "data"
    if not root.exists():
        write_image_folder(root / "ind", "train", {"cat": 6, "dog": 6}, size)
        write_image_folder(root / "ind", "test", {"cat": 2, "dog": 2}, size)
    recipe = tiny_recipe({"ind": root / "ind", "ood": root / "ind"}, tmp_path / "run", epochs=1)
    recipe["data"]["ood"] = {}
    if cache is not None:
        recipe["data"]["cache"] = {"size": cache, "dir": str(tmp_path / "cache")}
    return recipe


def _first_batch(recipe: dict[str, Any], cached: bool) -> torch.Tensor:
    """The first training batch the run would draw (crop_flip, seeded), with or without the
    cache."""
    loaded = recipe_from_dict(recipe)
    splits = build_splits(loaded.data, loaded.train.seed)
    train = splits.train
    if cached:
        train = screen({"data.train": train}, "stop", False, loaded.data.cache)[0]["data.train"]
        assert isinstance(train, IndexedImages) and isinstance(train.base, CachedImages)
    transform = train_transform((16, 16), MEAN, STD, "crop_flip", seed=0)
    loader = make_loader(TransformedImages(train, transform), 8, shuffle=True, seed=0)
    return next(iter(loader))[0]  # (8, 3, 16, 16)


def test_training_batches_equal_the_uncached_ones_up_to_the_second_resize(
    tmp_path: Path,
) -> None:
    # Images already at the cache's size are stored as they are: the batches are the same.
    same = _tiny(tmp_path / "a", 16, cache=16)
    assert torch.equal(_first_batch(same, cached=True), _first_batch(same, cached=False))
    # 48×64 noise shrunk to 24 px, then to 16 px for training, against 48×64 to 16 px once:
    # two resizes average pixel noise differently (docs/performance.md). In grey levels:
    larger = _tiny(tmp_path / "b", (48, 64), cache=24)
    diff = (_first_batch(larger, True) - _first_batch(larger, False)).abs() * STD[0] * 255
    assert 0 < diff.mean() < 6 and diff.max() < 40


def test_evaluation_of_square_images_cached_at_the_input_size_is_exact(tmp_path: Path) -> None:
    images = _folder(tmp_path / "data", size=40)
    cached = cache_images({"k": images}, _config(tmp_path, size=16), False).sets["k"]
    transform = eval_transform((16, 16), MEAN, STD)
    for (mine, _), (original, _) in zip(cached, images, strict=True):
        # timm resizes the original to 16×16 with PIL's bilinear filter once, as the cache did.
        assert torch.equal(transform(image=mine)["image"], transform(image=original)["image"])


def _truncated_png(tmp_path: Path) -> Path:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, "PNG")
    bad = tmp_path / "data" / "train" / "dog" / "cut.png"
    bad.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])  # cut inside its pixels
    return bad


def test_a_bad_image_found_by_the_build_is_reported_as_the_screen_reports_it(
    tmp_path: Path, decodes: list[str]
) -> None:
    _folder(tmp_path / "data")
    bad = _truncated_png(tmp_path)
    full = FileImages.from_folder(tmp_path / "data")
    assert full.files.index("dog/cut.png") == 6
    named = {"data.train": IndexedImages(full, [0, 1, 3]), "data.val": IndexedImages(full, [2, 6])}
    config = _config(tmp_path, size=8)
    with pytest.raises(BadImagesError) as screened:
        screen(named, "stop")
    for _ in range(2):  # the build, then the reused entry (no decoding)
        with pytest.raises(BadImagesError) as cached:
            screen(named, "stop", cache=config)
        assert [(b.key, b.index, b.name) for b in cached.value.bad] == [("data.val", 1, str(bad))]
        assert [(b.key, b.index, b.name) for b in screened.value.bad] == [("data.val", 1, str(bad))]
        assert (
            cached.value.bad[0].reason == screened.value.bad[0].reason == "image file is truncated"
        )
        assert len(decodes) == len(full)
    kept, dropped = screen(named, "skip", cache=config)
    assert dropped == {"data.val": [str(bad)]} and len(kept["data.val"]) == 1
    np.testing.assert_array_equal(kept["data.val"][0][0], resize_shorter(full[2][0], 8, "bilinear"))


def test_the_command_builds_then_reuses_and_prints_each_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_tiny(tmp_path, (20, 24), cache=None)))
    argv = ["cache", str(path), f"data.cache.dir={tmp_path / 'cache'}", "data.cache.size=16"]
    cli.main(argv)
    built = capsys.readouterr().out.splitlines()
    assert built[0] == f"image cache {tmp_path / 'cache'} (16 px, bilinear):"
    assert built[1].startswith("  data.train, data.val: 12 images, 0.0 MB, ")
    assert built[2].startswith("  data.test: 4 images, 0.0 MB, ")
    assert all(line.endswith(".bin)") and ", built (16px-bilinear-" in line for line in built[1:])
    cli.main(argv)
    again = capsys.readouterr().out.splitlines()
    assert len(again) == 3 and all(", reused (16px-bilinear-" in line for line in again[1:])


def test_a_cache_smaller_than_the_input_stops_before_it_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _tiny(tmp_path, 16, cache=12)
    too_small = (
        r"^data.cache.size=12: must be ≥ 16, the input size of model.name='test_byobnet' \(16×16\)"
    )
    with pytest.raises(ConfigError, match=too_small):
        recipe_from_dict(recipe)
    # Without model.input_size, the input is timm's config of the model (160 px here).
    del recipe["model"]["input_size"]
    recipe["data"]["cache"]["size"] = 64
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as stop:
        cli.main([str(path)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.startswith(
        "fseb-ft: error: data.cache.size=64: must be ≥ 160, the input size of "
        "model.name='test_byobnet' (160×160)"
    )
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run" / "run.json").exists()
    with pytest.raises(SystemExit) as stop:
        cli.main(["cache", str(path)])
    assert stop.value.code == 2 and "data.cache.size=64: must be ≥ 160" in capsys.readouterr().err


def test_a_run_and_its_evaluation_read_the_cache_without_decoding(
    tmp_path: Path, decodes: list[str]
) -> None:
    recipe = _tiny(tmp_path, (20, 24), cache=16)
    cli.main(["cache", str(_written(tmp_path, recipe))])
    assert len(decodes) == 16
    results = run(recipe_from_dict(recipe))
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    data = info["data"]
    assert all(data[key].endswith("|cached:16px:bilinear") for key in ("train", "val", "test"))
    # The splits' fingerprints name the hold-outs as built, the same as an uncached run's.
    built = build_splits(recipe_from_dict(recipe).data, 0)
    named = {"train": built.train, "validation": built.val, "test": built.test}
    assert {name: record["fingerprint"] for name, record in info["splits"].items()} == {
        name: content_hash(np.frombuffer(split.identity.encode(), dtype=np.uint8))
        for name, split in named.items()
    }
    again = evaluate_run(tmp_path / "run", cpu=True)
    assert len(decodes) == 16  # the run and the evaluation found every image cached
    assert again["test"]["nll"] == pytest.approx(results["test"]["nll"], abs=1e-6)
    # data.cache=null: the originals, resized once as the model card documents.
    cli.main(["evaluate", str(tmp_path / "run"), "--cpu", "data.cache=null"])
    original = json.loads((tmp_path / "run" / "results.json").read_text())
    assert len(decodes) == 16 and original["test"]["n"] == again["test"]["n"] == 4
    assert original["test"]["nll"] != pytest.approx(again["test"]["nll"], rel=1e-9)
    # A threshold chosen on the validation split: the cached one the run validated on.
    chosen = api.predict_images(tmp_path / "run", tmp_path / "data", coverage=0.5, progress=False)
    assert chosen.meta["abstention"]["validation"]["n"] == 3 and len(decodes) == 16


def test_the_validation_split_of_a_cached_run_is_rebuilt_from_the_cache(tmp_path: Path) -> None:
    recipe = recipe_from_dict(_tiny(tmp_path, (20, 24), cache=16))
    splits = build_splits(recipe.data, recipe.train.seed)
    recorded = screen({"data.val": splits.val}, "stop", False, recipe.data.cache)[0]["data.val"]
    info = RunInfo(num_classes=2, input=InputSpec((16, 16), MEAN, STD), data={
        "val": recorded.identity})  # fmt: skip
    val = validation_split(recipe, info)
    assert val.identity == recorded.identity and val.identity.endswith("|cached:16px:bilinear")
    assert [image.shape for image in _pixels(val)] == [(16, 19, 3)] * len(val)


def _written(tmp_path: Path, recipe: dict[str, Any]) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path
