"""The model card's machine-readable ``model-index``: written through ``huggingface_hub``'s card
classes and read back by them, with the values the card's table shows and the datasets they were
measured on. Built from a results dict: no run, no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import ModelCard, ModelCardData, metadata_load

from fseb_ft.data.inputs import InputSpec
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.model_card import model_card
from fseb_ft.runs.rundir import RunInfo
from fseb_ft.runs.tables import markdown_table

CIFAR10 = "uoft-cs/cifar10"
SOURCE = {
    "name": "resnet18",
    "pretrained": True,
    "hub_id": "timm/resnet18.a1_in1k",
    "architecture": "resnet18",
    "license": "apache-2.0",
}


def _recipe(tmp_path: Path, data: dict[str, Any]) -> Any:
    return recipe_from_dict(
        {
            "model": {"name": "resnet18"},
            "data": data,
            "eval": {"temperature_scaling": True, "metrics": ["qwk", "per_class_recall"]},
            "output": {"dir": str(tmp_path / "run")},
        }
    )


def _results(ood: tuple[str, ...]) -> dict[str, Any]:
    test = {
        "accuracy": 0.912345,
        "nll": 0.312345,
        "ece": 0.041234,
        "sel_pred_auc": 0.981234,
        "brier": 0.1,
        "qwk": 0.87654321,
        "per_class_recall": [0.9, 0.8],
        "n": 200,
    }
    scores = {"entropy_auroc": 0.771234, "energy_auroc": float("nan"), "n": 50}
    scaled_test = test | {"nll": 0.251234, "ece": 0.012345}
    return {
        "split": "test",
        "test": test,
        "ood": {name: dict(scores) for name in ood},
        "temperature_scaled": {
            "temperature": 1.5,
            "test": scaled_test,
            "ood": {name: scores | {"entropy_auroc": 0.781234} for name in ood},
        },
    }


def _write_card(path: Path, recipe: Any, results: dict[str, Any]) -> ModelCard:
    info = RunInfo(
        num_classes=2, class_names=["a", "b"], input=InputSpec((32, 32), (0.5,) * 3, (0.5,) * 3)
    )
    text = model_card(recipe, info, results, source=SOURCE, repo_id="user/my-model")
    path.write_text(text)
    return ModelCard.load(path)


def _by_name(card: ModelCard) -> dict[str, Any]:
    return {(r.dataset_name, r.metric_name): r for r in card.data.eval_results}


def test_card_front_matter_holds_a_model_index_of_the_tables_values(tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        {
            "train": {"source": "hub", "path": CIFAR10, "split": "train", "revision": "abc"},
            "test": {"source": "hub", "path": CIFAR10, "split": "test", "revision": "abc"},
            "ood": {
                "cifar100": {"source": "hub", "path": "uoft-cs/cifar100", "split": "test"},
                "owls": {"source": "imagefolder", "path": "/home/alice/data/owls", "split": "x"},
            },
        },
    )
    results = _results(("cifar100", "owls"))
    card = _write_card(tmp_path / "README.md", recipe, results)

    assert card.data.model_name == "my-model"
    assert card.data.library_name == "timm" and card.data.license == "apache-2.0"
    assert (
        card.data.base_model == SOURCE["hub_id"]
        and card.data.pipeline_tag == "image-classification"
    )
    assert card.data.datasets == [CIFAR10, "uoft-cs/cifar100"]
    found = _by_name(card)
    assert {r.task_type for r in found.values()} == {"image-classification"}
    # In-distribution: the table's numbers, percentages where its title says so.
    expected = {
        ("Acc. (%)", "accuracy", 91.23),
        ("NLL", "nll", 0.3123),
        ("ECE (%)", "ece", 4.12),
        ("Sel. Pred. (%)", "sel_pred_auc", 98.12),
        ("QWK", "qwk", 0.8765),
        ("NLL, temperature-scaled", "nll", 0.2512),
        ("ECE (%), temperature-scaled", "ece", 1.23),
    }
    for name, kind, value in expected:
        result = found[CIFAR10, name]
        assert (result.metric_type, result.metric_value) == (kind, value)
        assert (result.dataset_type, result.dataset_split) == (CIFAR10, "test")
        assert result.dataset_revision == "abc"
    table = markdown_table({"FS-EB · resnet18": results})
    assert "| 91.23 | 0.3123 | 4.12 |" in table  # the same numbers as the card's table
    assert not any(r.metric_type in ("brier", "per_class_recall") for r in found.values())
    # Each OOD set's AUROC, on that set's dataset (a local folder by its name); NaN left out.
    entropy = "OOD AUROC (%), predictive entropy"
    hub_ood = found["cifar100", entropy]
    assert (hub_ood.dataset_type, hub_ood.dataset_split) == ("uoft-cs/cifar100", "test")
    assert (hub_ood.metric_type, hub_ood.metric_config, hub_ood.metric_value) == (
        "auroc",
        "entropy",
        77.12,
    )
    assert found["owls", f"{entropy}, temperature-scaled"].metric_value == 78.12
    assert found["owls", entropy].dataset_type == "local:owls"  # no Hub id has a colon
    assert not any(r.metric_config == "energy" for r in found.values())
    text = (tmp_path / "README.md").read_text()
    assert "/home/alice" not in text
    # What the Hub's loader reads back: the metadata parses into valid card data.
    metadata = metadata_load(tmp_path / "README.md")
    assert metadata is not None and metadata["model-index"][0]["name"] == "my-model"
    assert len(ModelCardData(**metadata).eval_results) == len(card.data.eval_results) == 14


def test_an_ood_set_from_the_test_sets_own_dataset_keeps_its_name(tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        {
            "train": {"source": "sklearn_digits", "split": "train", "classes": [0, 1]},
            "test": {"source": "sklearn_digits", "split": "test", "classes": [0, 1]},
            "ood": {"digits_5_9": {"source": "sklearn_digits", "split": "test", "classes": [5]}},
        },
    )
    card = _write_card(tmp_path / "README.md", recipe, _results(("digits_5_9",)))
    found = _by_name(card)
    ood = found["digits_5_9", "OOD AUROC (%), predictive entropy"]
    assert (ood.dataset_type, ood.dataset_split, ood.dataset_config) == (
        "local:sklearn_digits",
        "test",
        "digits_5_9",
    )
    assert found["sklearn_digits", "Acc. (%)"].dataset_config is None
    assert card.data.datasets is None  # no Hub dataset


def test_ood_sets_of_one_dataset_keep_their_own_names_and_values(tmp_path: Path) -> None:
    cifar100 = {"source": "hub", "path": "uoft-cs/cifar100", "split": "test"}
    recipe = _recipe(
        tmp_path,
        {
            "train": {"source": "hub", "path": CIFAR10, "split": "train"},
            "test": {"source": "hub", "path": CIFAR10, "split": "test"},
            "ood": {
                "near": cifar100 | {"classes": [0, 1]},
                "far": cifar100 | {"classes": [2, 3]},
                "svhn": {"source": "hub", "path": "ufldl-stanford/svhn", "split": "test"},
            },
        },
    )
    results = _results(("near", "far", "svhn"))
    results["ood"]["far"]["entropy_auroc"] = 0.6
    card = _write_card(tmp_path / "README.md", recipe, results)
    found = _by_name(card)
    entropy = "OOD AUROC (%), predictive entropy"
    near, far, svhn = (found[name, entropy] for name in ("near", "far", "svhn"))
    assert (near.metric_value, far.metric_value) == (77.12, 60.0)
    assert (near.dataset_config, far.dataset_config) == ("near", "far")
    assert near.dataset_type == far.dataset_type == "uoft-cs/cifar100"
    assert svhn.dataset_config is None  # shares its dataset with nothing
    assert found[CIFAR10, "Acc. (%)"].dataset_config is None
    assert len({r.unique_identifier for r in card.data.eval_results}) == 4


def test_a_hold_out_is_named_as_the_part_of_its_source_split(tmp_path: Path) -> None:
    train = {"source": "hub", "path": CIFAR10, "split": "train", "revision": "abc"}
    data = {"train": train, "test_fraction": 0.2, "val_fraction": 0.1, "seed": 7}
    data["ood"] = {"train_ood": train | {"classes": [5]}}
    card = _write_card(tmp_path / "README.md", _recipe(tmp_path, data), _results(("train_ood",)))
    found = _by_name(card)
    accuracy = found[f"{CIFAR10}, held-out test part", "Acc. (%)"]
    assert (accuracy.dataset_type, accuracy.dataset_split) == (CIFAR10, "train")
    assert accuracy.dataset_config is None and accuracy.dataset_revision == "abc"
    assert accuracy.dataset_args == {"held_out": "test", "fraction": 0.2, "seed": 7}
    # An OOD set from the training split's other classes is told apart from the hold-out.
    assert found["train_ood", "OOD AUROC (%), predictive entropy"].dataset_config == "train_ood"


@pytest.mark.parametrize("split", ["validation", "test"])
def test_results_without_a_test_split_name_the_validation_split(tmp_path: Path, split: str) -> None:
    data = {"train": {"source": "csv", "path": "/home/alice/aptos/train.csv"}}
    if split == "validation":
        data["val_fraction"] = 0.2
    else:
        data["test_fraction"] = 0.2
    results = _results(()) | {"split": split}
    card = _write_card(tmp_path / "README.md", _recipe(tmp_path, data), results)
    accuracy = _by_name(card)[f"aptos, held-out {split} part", "Acc. (%)"]
    assert (accuracy.dataset_type, accuracy.dataset_split) == ("local:aptos", None)
    assert accuracy.dataset_args == {"held_out": split, "fraction": 0.2, "seed": 0}
