"""Hold-outs from one labelled file: ``data.test_fraction`` and ``data.val_fraction`` taken from
``data.train``, of whole groups when the train spec has a ``group_column``, and what run.json
records of every split."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fseb_ft.data.holdout import HoldOutError, group_split, hold_out, split_records
from fseb_ft.data.images import ArrayImages, IndexedImages
from fseb_ft.data.screening import screen_splits
from fseb_ft.data.sources import build_splits, hold_outs, load_spec
from fseb_ft.data.splits import Splits, stratified_split
from fseb_ft.errors import FsebError
from fseb_ft.recipe import DataConfig, DatasetSpec, ImageCacheConfig, recipe_from_dict
from fseb_ft.recipe.schema import ConfigError
from tests.helpers import tiny_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

PATIENTS = 24


def patient_table(root: Path, patients: int = PATIENTS) -> Path:
    """``root/train.csv`` (``image_name,patient_id,target``) of 2–4 tiny PNGs per patient in
    ``root/train_images``; a patient's images share a class, but every fourth has one other."""
    rng = np.random.default_rng(0)
    (root / "train_images").mkdir(parents=True)
    rows = ["image_name,patient_id,target"]
    for p in range(patients):
        for i in range(2 + p % 3):
            target = (p + 1) % 3 if i == 0 and p % 4 == 0 else p % 3
            pixels = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "train_images" / f"p{p:02d}_{i}.png")
            rows.append(f"p{p:02d}_{i},P{p:02d},{target}")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    return root / "train.csv"


def csv_spec(path: Path, grouped: bool = True) -> DatasetSpec:
    """The ``csv`` spec of :func:`patient_table`'s file, grouped by patient or not."""
    return DatasetSpec(
        source="csv",
        path=str(path),
        image_dir="train_images",
        image_column="image_name",
        image_pattern="{}.png",
        label_column="target",
        group_column="patient_id" if grouped else None,
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patient_table(tmp_path_factory.mktemp("patients"))


def parts(splits: Splits) -> dict[str, IndexedImages]:
    """train/val/test of held-out splits, each a subset of the one training file."""
    named = {"train": splits.train, "val": splits.val, "test": splits.test}
    assert all(isinstance(data, IndexedImages) for data in named.values())
    return named


def synthetic(n_groups: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels (20 % class 1) and groups of 1–5 images, a group's images of one class."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, size=n_groups)
    group_class = (rng.random(n_groups) < 0.2).astype(np.int64)
    return np.repeat(group_class, sizes), np.repeat(np.arange(n_groups), sizes).astype(str)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_patient_is_in_two_splits_and_the_splits_cover_the_file(table: Path, seed: int) -> None:
    cfg = DataConfig(train=csv_spec(table), val_fraction=0.2, test_fraction=0.25)
    named = parts(build_splits(cfg, seed))
    full = load_spec(csv_spec(table))
    indices = {key: data.indices for key, data in named.items()}
    assert np.array_equal(np.sort(np.concatenate(list(indices.values()))), np.arange(len(full)))
    patients = {key: set(full.groups[idx]) for key, idx in indices.items()}
    assert not patients["train"] & patients["val"]
    assert not patients["train"] & patients["test"]
    assert not patients["val"] & patients["test"]
    assert sum(map(len, patients.values())) == PATIENTS
    for key, data in named.items():  # the images carry their own patients
        assert data.groups.tolist() == full.groups[data.indices].tolist(), key


def test_grouped_hold_outs_keep_the_fractions_and_the_class_balance() -> None:
    labels, groups = synthetic()
    split = hold_out(labels, groups, 0.15, 0.2, seed=3)
    n, share = len(labels), labels.mean()
    for part, fraction in ((split.test, 0.2), (split.val, 0.15), (split.train, 0.65)):
        assert abs(len(part) / n - fraction) < 0.03
        assert abs(labels[part].mean() - share) < 0.05
    assert not set(groups[split.test]) & set(groups[split.train])
    assert not set(groups[split.val]) & (set(groups[split.train]) | set(groups[split.test]))


def test_a_grouped_hold_out_far_from_its_fraction_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    labels = np.arange(20) % 2  # (20,)
    with caplog.at_level(logging.WARNING, logger="fseb_ft"):
        hold_out(labels, np.repeat(np.arange(10), 2), None, 0.2, seed=0)  # 10 groups of 2
        assert caplog.text == ""  # 2 of 10 groups: 4 of 20 images, 20 % as asked
        lopsided = np.array(["big"] * 18 + ["small"] * 2)  # either group is far from 20 %
        split = hold_out(labels, lopsided, None, 0.2, seed=0)
    share = 100 * len(split.test) / 20
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert caplog.messages[0].startswith(
        f"data.test_fraction=0.2: the hold-out of whole groups (group_column) holds "
        f"{len(split.test)} of 20 images ({share:.1f} %, 1 of 2 groups), far from the 20.0 % asked"
    )


def test_hold_outs_are_fixed_by_the_seed() -> None:
    labels, groups = synthetic()
    for g in (groups, None):
        first, again = hold_out(labels, g, 0.1, 0.2, 5), hold_out(labels, g, 0.1, 0.2, 5)
        other = hold_out(labels, g, 0.1, 0.2, 6)
        assert np.array_equal(first.test, again.test) and np.array_equal(first.val, again.val)
        assert not np.array_equal(first.test, other.test)


def test_the_test_hold_out_does_not_depend_on_validation(table: Path) -> None:
    labels, groups = synthetic()
    for g in (groups, None):
        alone = hold_out(labels, g, None, 0.2, 0).test
        for val_fraction in (0.1, 0.3):
            assert np.array_equal(hold_out(labels, g, val_fraction, 0.2, 0).test, alone)
    held = build_splits(DataConfig(train=csv_spec(table), test_fraction=0.25), 0)
    given = build_splits(
        DataConfig(train=csv_spec(table), val=csv_spec(table), test_fraction=0.25), 0
    )
    assert held.test.identity == given.test.identity
    assert given.val.identity == load_spec(csv_spec(table)).identity  # data.val as given


def test_without_groups_or_test_fraction_the_split_is_as_before(table: Path) -> None:
    labels, _ = synthetic()
    before = stratified_split(labels, 0.1, 7)  # what build_splits always held out
    now = hold_out(labels, None, 0.1, None, 7)
    assert now.test is None
    assert np.array_equal(now.train, before[0]) and np.array_equal(now.val, before[1])
    assert now.train.dtype == before[0].dtype and now.val.dtype == before[1].dtype
    spec = csv_spec(table, grouped=False)
    full = load_spec(spec)
    train_idx, val_idx = stratified_split(full.labels, 0.2, 4)
    splits = build_splits(DataConfig(train=spec, val_fraction=0.2), 4)
    assert splits.train.identity == IndexedImages(full, train_idx).identity
    assert splits.val.identity == IndexedImages(full, val_idx).identity
    assert splits.test is None
    given = build_splits(DataConfig(train=spec, val=spec), 4)
    assert given.train.identity == full.identity  # data.val given: train is the whole file


def test_an_ungrouped_test_hold_out_is_stratified(table: Path) -> None:
    splits = build_splits(DataConfig(train=csv_spec(table, grouped=False), test_fraction=0.25), 0)
    full = load_spec(csv_spec(table, grouped=False))
    counts = np.bincount(full.labels)
    assert np.bincount(splits.test.labels).tolist() == np.round(counts * 0.25).tolist()
    assert len(splits.val) == round(0.1 * len(full))
    assert len(splits.train) + len(splits.val) + len(splits.test) == len(full)


def test_in_memory_data_gets_a_test_hold_out() -> None:
    from fseb_ft.engine.in_memory import in_memory_splits, resolve_recipe

    labels, _ = synthetic(60)
    images = ArrayImages(np.zeros((len(labels), 4, 4), np.uint8), labels)
    recipe = resolve_recipe(None, {"data.test_fraction": 0.3}, has_test=False)
    splits = in_memory_splits(recipe, images)
    held = hold_outs(images, recipe.data, recipe.train.seed)
    assert [len(s) for s in (splits.train, splits.val, splits.test)] == [len(s) for s in held]
    assert len(splits.test) == round(0.3 * len(labels))


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"test": {"source": "sklearn_digits", "split": "test"}, "test_fraction": 0.2},
         r"data.test_fraction=0.2: must be null when data.test is given"),
        ({"test": None, "test_fraction": 1.0}, r"data.test_fraction=1.0: must be in \(0, 1\)"),
        ({"test": None, "test_fraction": 0.0}, r"data.test_fraction=0.0: must be in \(0, 1\)"),
        ({"test": None, "test_fraction": 0.5, "val_fraction": 0.5},
         r"data.test_fraction=0.5: .*val_fraction \+ test_fraction must be below 1"),
    ],
)  # fmt: skip
def test_recipe_checks_test_fraction(tmp_path: Path, keys: dict, message: str) -> None:
    raw = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "run")
    raw["data"] |= keys
    with pytest.raises(ConfigError, match=message):
        recipe_from_dict(raw)


def test_too_few_groups_or_images_name_the_key(tmp_path: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    rows = ["image_name,patient_id,target"]
    for i in range(4):
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(lone / f"x{i}.png")
        rows.append(f"x{i}.png,P0,{i % 2}")
    (lone / "t.csv").write_text("\n".join(rows) + "\n")
    spec = DatasetSpec(source="csv", path=str(lone / "t.csv"), image_column="image_name",
                       label_column="target", group_column="patient_id")  # fmt: skip
    with pytest.raises(FsebError, match=r"^data.val_fraction=0.1: .*1 group\(s\).*at least 2"):
        build_splits(DataConfig(train=spec), 0)
    with pytest.raises(FsebError, match=r"^data.test_fraction=0.1: .*empty hold-out"):
        build_splits(DataConfig(train=DatasetSpec(**{**spec.__dict__, "group_column": None}),
                                test_fraction=0.1), 0)  # fmt: skip
    with pytest.raises(ValueError, match="at least 2 groups"):
        group_split(np.array([0, 1]), np.array(["a", "a"]), 0.5, 0)
    with pytest.raises(HoldOutError, match=r"^data.val_fraction=0.6: the test hold-out left"):
        labels, groups = synthetic(20)
        hold_out(labels, groups, 0.6, 0.35, 0)


def test_a_run_reports_on_its_test_hold_out_and_re_evaluates_it(
    table: Path, tmp_path: Path
) -> None:
    from fseb_ft.engine.reevaluate import evaluate_run
    from fseb_ft.engine.run import run
    from fseb_ft.prediction.validation import validation_split
    from fseb_ft.recipe import load_recipe
    from fseb_ft.runs.rundir import RunInfo

    out = tmp_path / "run"
    raw = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, out, epochs=1)
    raw["data"] |= {"test": None, "ood": {}, "test_fraction": 0.25, "val_fraction": 0.2}
    raw["data"]["train"] = {
        "source": "csv", "path": str(table), "image_dir": "train_images",
        "image_column": "image_name", "image_pattern": "{}.png", "label_column": "target",
        "group_column": "patient_id",
    }  # fmt: skip
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context to draw
    results = run(recipe_from_dict(raw))
    info = json.loads((out / "run.json").read_text())
    records = info["splits"]
    assert sum(records[k]["size"] for k in ("train", "validation", "test")) == len(
        load_spec(csv_spec(table))
    )
    assert sum(records[k]["groups"] for k in ("train", "validation", "test")) == PATIENTS
    assert all(len(records[k]["fingerprint"]) == 16 for k in records)
    assert results["split"] == "test" and results["test"]["n"] == records["test"]["size"]

    again = evaluate_run(out, cpu=True)
    assert again["split"] == "test" and again["test"]["n"] == records["test"]["size"]
    assert again["test"]["nll"] == pytest.approx(results["test"]["nll"], rel=1e-4)
    # A rerun (resume) compares run.json's identities with those its recipe rebuilds.
    rebuilt = build_splits(load_recipe(out / "recipe.yaml").data, 0)
    assert rebuilt.identities() == {k: v for k, v in info["data"].items() if k != "val_ood"}
    recipe = load_recipe(out / "recipe.yaml")
    assert validation_split(recipe, RunInfo.from_json(info)).identity == info["data"]["val"]


def test_a_hold_outs_fingerprint_is_the_same_with_or_without_the_cache(
    table: Path, tmp_path: Path
) -> None:
    built = build_splits(DataConfig(train=csv_spec(table), test_fraction=0.2), 0)
    cache = ImageCacheConfig(size=8, dir=str(tmp_path / "cache"))
    plain = screen_splits(built, [], "stop", progress=False)[0]
    cached = screen_splits(built, [], "stop", progress=False, cache=cache)[0]
    assert cached.val.identity.endswith("|cached:8px:bilinear")  # the cache served it
    assert split_records(cached, built) == split_records(plain, built)


def test_data_seed_fixes_every_draw_whatever_the_training_seed(table: Path) -> None:
    spec = dataclasses.replace(csv_spec(table, grouped=False), limit=40)
    cfg = DataConfig(train=spec, test_fraction=0.2)

    def drawn(cfg: DataConfig, train_seed: int) -> list[str]:
        named = parts(build_splits(cfg, train_seed))
        return [named[name].identity for name in ("train", "val", "test")]

    # Without data.seed each training seed draws its own subset and hold-outs ...
    assert drawn(cfg, 0) != drawn(cfg, 1)
    # ... with it, runs at every training seed share them: an ensemble's shared validation split.
    fixed = dataclasses.replace(cfg, seed=7)
    assert drawn(fixed, 0) == drawn(fixed, 1) == drawn(dataclasses.replace(cfg, seed=7), 5)
    assert drawn(fixed, 0) == drawn(cfg, 7)
    assert fixed.draw_seed(3) == 7 and cfg.draw_seed(3) == 3
    with pytest.raises(ConfigError, match=r"seed.*-1.*≥ 0"):
        DataConfig(train=spec, seed=-1)
