"""Python API: ``fseb_ft.finetune(...)`` / ``fseb_ft.api.finetune(...)`` on in-memory datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset

import fseb_ft
import fseb_ft.api
from fseb_ft.data.images import HFImages
from fseb_ft.data.splits import TooFewClassesError
from fseb_ft.data.user_datasets import TorchImages, as_labeled_images
from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.recipe import ConfigError, load_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

REPO = Path(__file__).parents[2]
CLASSES = ["cat", "dog", "fox"]
TINY = {  # keeps every run to a second or two on a CPU
    "model": {"name": "test_byobnet", "pretrained": False, "input_size": 16},
    "data": {"batch_size": 4, "num_workers": 0, "val_fraction": 0.25, "augment": "flip"},
    "context": {"pool_size": 8, "batch_size": 4},
    "fseb": {"prior_cov_scale": 0.01, "prior_cov_diag": 1.0},
    "train": {"epochs": 1, "cpu": True, "trackers": []},
}


def _pixels(label: int, rng: np.random.Generator, size: int = 12) -> np.ndarray:
    base = np.array([80 * label, 255 - 60 * label, 40 + 50 * label])
    return np.clip(base + rng.integers(-25, 25, size=(size, size, 3)), 0, 255).astype(np.uint8)


def _hf(n_per_class: int, seed: int, num_classes: int = 3) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    labels = [k for k in range(num_classes) for _ in range(n_per_class)]
    features = datasets.Features(
        {"picture": datasets.Image(), "kind": datasets.ClassLabel(names=CLASSES[:num_classes])}
    )
    images = [Image.fromarray(_pixels(k, rng)) for k in labels]
    return datasets.Dataset.from_dict({"picture": images, "kind": labels}, features=features)


class PairDataset(Dataset):
    """A plain torch Dataset of (CHW float tensor in [0, 1], int label), no ``targets``."""

    def __init__(self, n_per_class: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.items = [
            (torch.from_numpy(_pixels(k, rng)).permute(2, 0, 1).float() / 255.0, k)
            for k in range(3)
            for _ in range(n_per_class)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.items[index]


ENTRIES = {
    "fseb_ft.finetune": lambda: fseb_ft.finetune,
    "fseb_ft.api.finetune": lambda: fseb_ft.api.finetune,
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_hf_datasets_with_recipe_file_and_overrides(entry: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = ENTRIES[entry]()(
        REPO / "recipes" / "quickstart.yaml",
        train=_hf(8, seed=0),
        test=_hf(3, seed=1),
        ood={"odd": _hf(2, seed=2, num_classes=2)},
        model=TINY["model"],
        data=TINY["data"],
        context=TINY["context"],
        train__epochs=1,
        train__cpu=True,
        **{"train.trackers": [], "output.dir": str(out)},
    )
    assert {"test", "ood", "training"} <= set(results)
    assert results["test"]["n"] == 9 and results["ood"]["odd"]["n"] == 4
    assert (out / "results.json").is_file()
    assert json.loads((out / "results.json").read_text())["test"] == results["test"]
    info = json.loads((out / "run.json").read_text())
    assert info["class_names"] == CLASSES  # from the ClassLabel feature
    assert info["num_train"] == 18  # 24 minus a stratified 25 % validation split
    saved = load_recipe(out / "recipe.yaml")
    assert saved.data.train.path == "in-memory:train" and saved.model.name == "test_byobnet"
    assert saved.data.ood["odd"].path == "in-memory:ood/odd"


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_torch_datasets_with_recipe_dict_and_val(entry: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    recipe = TINY | {"output": {"dir": str(out)}}
    results = ENTRIES[entry]()(
        recipe,
        train=PairDataset(6, seed=0),
        val=PairDataset(2, seed=1),
        test=PairDataset(3, seed=2),
        fseb__reg_scale=0.0,  # PS-MAP
    )
    assert {"test", "ood", "training"} <= set(results)
    assert results["test"]["n"] == 9 and results["ood"] == {}
    assert (out / "results.json").is_file()
    info = json.loads((out / "run.json").read_text())
    assert info["num_train"] == 18 and info["class_names"] == ["0", "1", "2"]
    assert info["context"] is None  # reg_scale=0: no context set
    assert load_recipe(out / "recipe.yaml").fseb.reg_scale == 0.0


def test_module_is_callable_and_still_runs_as_a_script() -> None:
    import fseb_ft.finetune as module

    assert callable(module) and module is fseb_ft.finetune and callable(module.run)
    done = subprocess.run(
        [sys.executable, "-m", "fseb_ft.finetune", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "RECIPE" in done.stdout.upper() and "--compare" in done.stdout


def test_without_test_data_the_results_are_the_validation_splits(tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = fseb_ft.finetune(
        TINY | {"output": {"dir": str(out)}}, train=PairDataset(8, seed=0), fseb__reg_scale=0.0
    )
    assert results["split"] == "validation" and results["test"]["n"] == 6  # 25 % of 24
    assert json.loads((out / "results.json").read_text())["split"] == "validation"
    assert load_recipe(out / "recipe.yaml").data.test is None
    assert (out / "model" / "README.md").is_file()


def test_missing_train_and_bad_overrides_fail_clearly() -> None:
    with pytest.raises(TypeError, match="needs train="):
        fseb_ft.api.finetune(TINY, test=PairDataset(2, 0))
    with pytest.raises(ConfigError, match="unknown override 'epochs'"):
        fseb_ft.api.resolve_recipe(TINY, {"epochs": 3})
    with pytest.raises(ConfigError, match=r"unknown key 'fseb\.reg_scal'"):
        fseb_ft.api.resolve_recipe(TINY, {"fseb__reg_scal": 0})


def test_training_images_of_one_class_stop_before_anything_is_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    one_class = [(_pixels(0, rng), 0) for _ in range(8)]  # label 0 only: a constant classifier
    with pytest.raises(
        TooFewClassesError, match=r"^train= \(torch:list:n=8#.*\) has 1 class \('0'\)"
    ):
        fseb_ft.api.finetune(
            TINY, train=one_class, test=one_class, output__dir=str(tmp_path / "run")
        )
    assert not (tmp_path / "run").exists()


def test_override_spellings_agree() -> None:
    resolve = fseb_ft.api.resolve_recipe
    a = resolve(TINY, {"fseb": {"reg_scale": 0.5}, "optim": {"lr": 0.1}})
    b = resolve(TINY, {"fseb__reg_scale": 0.5, "optim__lr": 0.1})
    c = resolve(TINY, {"fseb.reg_scale": 0.5, "optim.lr": 0.1})
    assert a == b == c
    assert a.fseb.reg_scale == 0.5 and a.fseb.prior_cov_diag == 1.0  # merged, not replaced
    assert a.data.batch_size == 4 and a.data.val is None and a.data.test.path == "in-memory:test"
    assert resolve(None).model.name == "resnet18"  # defaults need no recipe at all


@pytest.mark.parametrize(
    "image",
    [
        Image.fromarray(np.full((5, 7, 3), 200, np.uint8)),
        Image.fromarray(np.full((5, 7), 200, np.uint8)),  # grayscale PIL
        np.full((5, 7, 3), 200, np.uint8),  # HWC
        np.full((5, 7), 200, np.uint8),  # HW
        np.full((3, 5, 7), 200, np.uint8),  # CHW numpy
        torch.full((3, 5, 7), 200, dtype=torch.uint8),  # CHW uint8 tensor
        torch.full((3, 5, 7), 200 / 255),  # CHW float tensor in [0, 1]
        torch.full((5, 7), 200 / 255),  # HW float tensor
    ],
    ids=["pil", "pil-gray", "hwc", "hw", "chw-np", "chw-u8", "chw-float", "hw-float"],
)
def test_torch_adapter_image_formats(image) -> None:
    data = as_labeled_images([(image, 1), (image, 0)])
    array, label = data[0]
    assert array.shape == (5, 7, 3) and array.dtype == np.uint8 and label == 1
    assert np.all(array == 200)
    assert data.class_names == ["0", "1"] and data.labels.tolist() == [1, 0]


def test_torch_adapter_refuses_normalised_tensors_and_bad_labels() -> None:
    with pytest.raises(ValueError, match="expected values in \\[0, 1\\]"):
        as_labeled_images([(torch.full((3, 4, 4), -1.5), 0)])[0]
    with pytest.raises(ValueError, match="expected one integer class id"):
        as_labeled_images([(np.zeros((4, 4), np.uint8), 0.5)])
    with pytest.raises(TypeError, match="pass one split"):
        as_labeled_images(datasets.DatasetDict({"train": _hf(1, 0)}))


def test_torch_adapter_uses_targets_and_classes_without_reading_images() -> None:
    class Folder(Dataset):
        def __init__(self) -> None:
            self.classes = ["a", "b", "c"]
            self.targets = [2, 0, 1, 2]

        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int):
            raise AssertionError("labels must come from .targets, not from the items")

    data = TorchImages(Subset(Folder(), [3, 1]))
    assert data.labels.tolist() == [2, 0] and data.class_names == ["a", "b", "c"]


def test_hf_adapter_finds_columns_from_features() -> None:
    data = as_labeled_images(_hf(1, 0))
    assert isinstance(data, HFImages) and data.class_names == CLASSES
    assert data.image_column == "picture" and data.labels.tolist() == [0, 1, 2]


def test_a_callback_passed_to_finetune_runs_in_the_loop(tmp_path: Path) -> None:
    class StopAtAccuracy(Callback):
        """The user's early stop: training ends once validation accuracy reaches ``target``."""

        def __init__(self, target: float) -> None:
            self.target, self.seen = target, []

        def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
            self.seen.append(record["epoch"])
            if record["val_accuracy"] >= self.target:
                trainer.should_stop = True

    stop = StopAtAccuracy(0.0)  # reached after the first epoch
    results = fseb_ft.finetune(
        TINY | {"output": {"dir": str(tmp_path / "run")}},
        train=PairDataset(8, seed=0),
        callbacks=[stop],
        fseb__reg_scale=0.0,
        train__epochs=3,
    )
    assert stop.seen == [1] and results["training"]["epochs"] == 1
