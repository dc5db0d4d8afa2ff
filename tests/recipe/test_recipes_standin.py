"""The real-world recipes run end to end on tiny stand-ins of their Hub datasets and Kaggle
downloads.

The Hub cannot be reached here, so each recipe's datasets are replaced by a few generated images
with the SAME schema — column names, feature types, ClassLabel class count and split names —
saved with ``save_to_disk``. Only ``source``/``path`` of each data spec are overridden; the
recipe's splits, columns and ``classes`` selections are exercised as written. A ``-kaggle``
sibling recipe reads its task's Kaggle download (a ``train.csv`` beside a folder of images): its
stand-in is such a folder, with the columns, file names, groups and metadata the recipe names,
and only the CSV's path is overridden; the sibling must keep the Hub recipe's other settings.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.finetune import run
from fseb_ft.recipe import DatasetSpec, Recipe, load_recipe
from tests.data.test_sources import CIFAR10_CLASSES
from tests.helpers import skip_figures

RECIPES = Path(__file__).parents[2] / "recipes"
KAGGLE_SUFFIX = "-kaggle"
TRAIN_PER_CLASS = 4  # enough for a stratified validation split of every class
OTHER_PER_CLASS = 2

# The documented schema of every Hub dataset a recipe names (see the recipes' comments).
SCHEMAS: dict[str, datasets.Features] = {
    "ava-space/BlindnessClassification": datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(
                names=["Mild", "Moderate", "No-DR", "Proliferative-DR", "Severe"]
            ),
        }
    ),
    "flwrlabs/fed-isic2019": datasets.Features(
        {
            "image": datasets.Image(),
            "center": datasets.Value("int64"),
            "label": datasets.ClassLabel(
                names=["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]
            ),
        }
    ),
    "dpdl-benchmark/cassava": datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["cbb", "cbsd", "cgm", "cmd", "healthy"]),
        }
    ),
    "uoft-cs/cifar10": datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=CIFAR10_CLASSES),
        }
    ),
    "uoft-cs/cifar100": datasets.Features(
        {
            "img": datasets.Image(),
            "fine_label": datasets.ClassLabel(names=[f"fine_{i}" for i in range(100)]),
            "coarse_label": datasets.ClassLabel(names=[f"coarse_{i}" for i in range(20)]),
        }
    ),
}
# Image size (width, height) of the stand-ins: CIFAR's 32x32, a small non-square one otherwise.
SIZES = {"uoft-cs/cifar10": (32, 32), "uoft-cs/cifar100": (32, 32)}

# recipe → (number of classes K, class names after the recipe's `classes`, or None for any).
EXPECTED = {
    "aptos": (5, ["No-DR", "Mild", "Moderate", "Severe", "Proliferative-DR"]),
    "melanoma": (2, ["NV", "MEL"]),
    "cassava": (5, ["cbb", "cbsd", "cgm", "cmd", "healthy"]),
    "cifar10": (10, None),
}
# Kaggle sibling → (K, class names: the CSV's labels as the recipe's `classes` give them).
KAGGLE_EXPECTED = {
    "aptos-kaggle": (5, ["0", "1", "2", "3", "4"]),
    "melanoma-kaggle": (2, ["benign", "malignant"]),
    "cassava-kaggle": (5, ["0", "1", "2", "3", "4"]),
}
KAGGLE_PER_CLASS = 10  # images per class: enough whole groups for a 20 % and a 10 % hold-out
# Data keys besides the datasets and their hold-outs: how images are fed, the same on both.
FEEDING = ("augment", "channels", "mean", "std", "batch_size", "num_workers", "bad_images")


def _specs(recipe: Recipe) -> dict[str, DatasetSpec]:
    """Every data spec of the recipe by its dotted override prefix."""
    specs = {"data.train": recipe.data.train}
    if recipe.data.val is not None:
        specs["data.val"] = recipe.data.val
    if recipe.data.test is not None:
        specs["data.test"] = recipe.data.test
    specs.update({f"data.ood.{name}": spec for name, spec in recipe.data.ood.items()})
    return specs


def _rows(features: datasets.Features, label_column: str, split: str, rng) -> dict[str, list]:
    """A few images per class (all classes; the CIFAR-100 OOD stand-in only needs a handful)."""
    names = features[label_column].names
    per_class = TRAIN_PER_CLASS if split == "train" else OTHER_PER_CLASS
    labels = list(range(len(names))) * per_class if len(names) <= 10 else list(range(0, 96, 12))
    columns: dict[str, list] = {name: [] for name in features}
    for i, label in enumerate(labels):
        for name, feature in features.items():
            if name == label_column:
                columns[name].append(label)
            elif isinstance(feature, datasets.ClassLabel):
                columns[name].append(int(rng.integers(feature.num_classes)))
            elif isinstance(feature, datasets.Image):
                columns[name].append(None)  # filled below, once the size is known
            else:
                columns[name].append(i % 6)  # e.g. fed-isic2019's `center`
    return columns


def _standin(root: Path, hub_id: str, specs: list[DatasetSpec]) -> Path:
    """A DatasetDict with the schema of ``hub_id`` and every split the recipe reads from it."""
    features = SCHEMAS[hub_id]
    rng = np.random.default_rng(len(hub_id))
    width, height = SIZES.get(hub_id, (24, 20))
    splits = {}
    for split in sorted({s.split for s in specs}):
        spec = next(s for s in specs if s.split == split)
        columns = _rows(features, spec.label_column, split, rng)
        for i, label in enumerate(columns[spec.label_column]):
            base = np.array([37 * label % 256, 91 * label % 256, 53 * label % 256])
            noise = rng.integers(-30, 30, size=(height, width, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            columns[spec.image_column][i] = Image.fromarray(pixels, mode="RGB")
        splits[split] = datasets.Dataset.from_dict(columns, features=features)
    path = root / hub_id.replace("/", "__")
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_runs_end_to_end_on_a_standin(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_figures(monkeypatch)
    recipe_path = RECIPES / f"{name}.yaml"
    recipe = load_recipe(recipe_path)
    specs = _specs(recipe)
    by_hub: dict[str, list[DatasetSpec]] = {}
    for spec in specs.values():
        # The recipes name public Hub datasets whose schema the stand-in reproduces.
        assert spec.source == "hub" and spec.path in SCHEMAS, spec
        assert spec.revision, f"{name}: {spec.path} has no pinned revision"
        features = SCHEMAS[spec.path]
        assert isinstance(features[spec.image_column], datasets.Image), spec
        assert isinstance(features[spec.label_column], datasets.ClassLabel), spec
        by_hub.setdefault(spec.path, []).append(spec)
    paths = {hub_id: _standin(tmp_path / "data", hub_id, group) for hub_id, group in by_hub.items()}

    out = tmp_path / "run"
    overrides = [
        f"{prefix}.{key}"
        for prefix, spec in specs.items()
        for key in ("source=disk", f"path={paths[spec.path]}")
    ]
    overrides += [
        "model.name=test_byobnet",
        "model.pretrained=false",
        "model.input_size=16",
        "train.epochs=1",
        "train.trackers=[]",
        "data.batch_size=4",
        "context.pool_size=8",
        "context.batch_size=4",
        "data.num_workers=0",
        "train.cpu=true",
        f"output.dir={out}",
    ]
    results = run(load_recipe(recipe_path, overrides))

    num_classes, class_names = EXPECTED[name]
    info = json.loads((out / "run.json").read_text())
    assert info["num_classes"] == num_classes
    if class_names is not None:
        assert info["class_names"] == class_names
    saved = json.loads((out / "results.json").read_text())
    test_spec = recipe.data.test
    kept = len(test_spec.classes) if test_spec.classes else num_classes
    assert saved["test"]["n"] == results["test"]["n"] == kept * OTHER_PER_CLASS
    assert set(saved["ood"]) == set(recipe.data.ood)
    for scores in saved["ood"].values():
        assert scores["n"] > 0 and 0.0 <= scores["entropy_auroc"] <= 1.0
    assert 0.0 <= saved["test"]["accuracy"] <= 1.0 and np.isfinite(saved["test"]["nll"])

    if num_classes == 2:
        # The binary headline metric, when metrics.py computes it for K = 2 tasks.
        probe = classification_metrics(torch.log(torch.full((2, 2), 0.5)), torch.tensor([0, 1]))
        if "auroc_positive" in probe:
            assert 0.0 <= saved["test"]["auroc_positive"] <= 1.0
        else:
            pytest.skip("metrics.classification_metrics has no auroc_positive yet")


def test_every_kaggle_recipe_has_a_standin_and_a_hub_sibling() -> None:
    found = {p.stem for p in RECIPES.glob(f"*{KAGGLE_SUFFIX}.yaml")}
    assert found == set(KAGGLE_EXPECTED)
    assert {name.removesuffix(KAGGLE_SUFFIX) for name in found} <= set(EXPECTED)


@pytest.mark.parametrize("name", sorted(KAGGLE_EXPECTED))
def test_kaggle_recipe_keeps_the_hub_recipes_settings(name: str) -> None:
    """Everything but where the images come from is the Hub recipe's, so the two cannot drift."""
    kaggle = load_recipe(RECIPES / f"{name}.yaml")
    hub = load_recipe(RECIPES / f"{name.removesuffix(KAGGLE_SUFFIX)}.yaml")
    for section in ("model", "context", "fseb", "optim", "train", "sweep"):
        assert getattr(kaggle, section) == getattr(hub, section), section
    # The Hub sources keep no metadata, so only a csv sibling can group its results.
    assert dataclasses.replace(kaggle.eval, group_by=None) == hub.eval
    for key in FEEDING:
        assert getattr(kaggle.data, key) == getattr(hub.data, key), f"data.{key}"
    assert kaggle.output.dir != hub.output.dir  # one run folder each: a rerun never mixes them
    train = kaggle.data.train
    assert train.source == "csv" and kaggle.data.test is None and kaggle.data.test_fraction


def _kaggle_download(root: Path, spec: DatasetSpec) -> Path:
    """A Kaggle-style download in miniature for the csv spec ``spec``: ``train.csv`` with the
    columns it names, one small image per row in its ``image_dir``; two images per group (of one
    class, as a patient's lesions), metadata cycling through a few values and an empty cell."""
    rng = np.random.default_rng(0)
    folder = root / (spec.image_dir or "")
    folder.mkdir(parents=True)
    columns = [spec.image_column, spec.label_column, spec.group_column, *spec.metadata_columns]
    rows = [[c for c in columns if c is not None]]
    for i in range(KAGGLE_PER_CLASS * len(spec.classes)):
        k = i % len(spec.classes)
        image_id = f"img{i:03d}"
        # An id without a pattern is a file name (Cassava's ids include .jpg).
        file_name = (
            spec.image_pattern.replace("{}", image_id) if spec.image_pattern else f"{image_id}.jpg"
        )
        base = np.array([37 * k % 256, 91 * k % 256, 53 * k % 256])
        pixels = np.clip(base + rng.integers(-30, 30, size=(20, 24, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / file_name)
        row = [image_id if spec.image_pattern else file_name, str(spec.classes[k])]
        if spec.group_column is not None:
            row.append(f"patient{k}_{i // (2 * len(spec.classes))}")
        row += [("", "torso", "head/neck")[i % 3] for _ in spec.metadata_columns]
        rows.append(row)
    with (root / "train.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return root / "train.csv"


@pytest.mark.parametrize("name", sorted(KAGGLE_EXPECTED))
def test_kaggle_recipe_runs_end_to_end_on_a_standin(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_figures(monkeypatch)
    recipe_path = RECIPES / f"{name}.yaml"
    recipe = load_recipe(recipe_path)
    spec = recipe.data.train
    table = _kaggle_download(tmp_path / "download", spec)
    out = tmp_path / "run"
    overrides = [
        f"data.train.path={table}",
        "model.name=test_byobnet",
        "model.pretrained=false",
        "model.input_size=16",
        "train.epochs=1",
        "data.batch_size=4",
        "context.pool_size=8",
        "context.batch_size=4",
        "data.num_workers=0",
        "train.cpu=true",
        f"output.dir={out}",
    ]
    if recipe.data.cache is not None:  # the recipe's cache, in the test's folder
        overrides.append(f"data.cache.dir={tmp_path / 'cache'}")
    results = run(load_recipe(recipe_path, overrides))

    num_classes, class_names = KAGGLE_EXPECTED[name]
    info = json.loads((out / "run.json").read_text())
    assert (info["num_classes"], info["class_names"]) == (num_classes, class_names)
    splits, n = info["splits"], KAGGLE_PER_CLASS * num_classes
    assert sum(splits[k]["size"] for k in ("train", "validation", "test")) == n
    assert results["split"] == "test" and results["test"]["n"] == splits["test"]["size"] > 0
    if spec.group_column is not None:  # whole patients: none is counted in two splits
        assert sum(splits[k]["groups"] for k in ("train", "validation", "test")) == n // 2
    for metric in recipe.eval.metrics:
        assert metric in results["test"], metric
    if recipe.eval.group_by is not None:
        assert set(results["groups"]["groups"]) <= {"", "torso", "head/neck"}
    if recipe.data.cache is not None:
        assert list((tmp_path / "cache").glob("*.bin"))
