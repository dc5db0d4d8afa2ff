"""Per-group results (``eval.group_by``): every test metric on each group of a metadata column,
in results.json, results.md and the model card, and the checks of the column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from fseb_ft.data.images import ArrayImages
from fseb_ft.evaluation.groups import GroupColumnError, group_metrics, split_groups
from fseb_ft.evaluation.metrics import METRIC_REGISTRY, Metric, classification_metrics
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.recipe.schema import ConfigError
from fseb_ft.runs.tables import groups_markdown
from tests.data.sources.test_csv import write_table
from tests.helpers import skip_figures, tiny_recipe, write_image_folder


def _inputs(k: int, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random float64 log-probabilities (n, k) and labels (n,)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g, dtype=torch.float64) * 2  # (n, k)
    return torch.log_softmax(logits, -1), torch.randint(0, k, (n,), generator=g)


@pytest.mark.parametrize("k", [2, 4])
def test_each_group_gets_the_metrics_of_its_subset(k: int) -> None:
    log_probs, labels = _inputs(k, 120, seed=k)
    groups = np.array(["north", "south", "east"])[np.arange(120) % 3]  # (120,)
    found = group_metrics(log_probs, labels, groups)
    assert list(found) == ["east", "north", "south"]
    for name, record in found.items():
        mask = torch.as_tensor(groups == name)
        want = classification_metrics(log_probs[mask], labels[mask])
        assert record["n"] == 40 and record["classes"] == len(torch.unique(labels[mask]))
        assert "undefined" not in record
        assert {k: record[k] for k in want} == pytest.approx({k: float(v) for k, v in want.items()})


def test_a_group_of_one_class_has_a_null_auroc_with_its_reason() -> None:
    log_probs, labels = _inputs(2, 9, seed=0)
    labels[:3] = 1  # group "a": one class only
    labels[3:5] = torch.tensor([0, 1])
    found = group_metrics(log_probs, labels, ["a"] * 3 + ["b"] * 5 + ["c"])
    one_class = found["a"]
    assert one_class["classes"] == 1 and one_class["auroc_positive"] is None
    assert "1 class" in one_class["undefined"]["auroc_positive"]
    assert list(one_class["undefined"]) == ["auroc_positive"]
    assert one_class["accuracy"] is not None and found["b"]["auroc_positive"] is not None
    assert found["c"]["n"] == 1 and found["c"]["nll"] is not None  # one image: no crash


def test_a_metric_that_refuses_a_group_is_null_with_its_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuses(_: object) -> Tensor:
        raise ValueError("needs every class present")

    monkeypatch.setitem(METRIC_REGISTRY, "picky", Metric("picky", "Picky", 1.0, True, refuses))
    log_probs, labels = _inputs(3, 10, seed=1)
    found = group_metrics(log_probs, labels, ["x"] * 10, names=["accuracy", "picky"])
    assert set(found["x"]) == {"n", "classes", "accuracy", "picky", "undefined"}
    assert found["x"]["undefined"] == {"picky": "needs every class present"}
    with pytest.raises(ValueError, match=r"one value per sample, shape \(10,\)"):
        group_metrics(log_probs, labels, ["x"] * 9)


def test_the_table_marks_undefined_cells_and_names_empty_values() -> None:
    results = {
        "split": "test",
        "test": {"accuracy": 0.5, "n": 3},
        "groups": {
            "column": "site",
            "groups": {
                "": {
                    "n": 1,
                    "classes": 1,
                    "accuracy": 1.0,
                    "auroc_positive": None,
                    "undefined": {"auroc_positive": "one class"},
                },
                "b|c": {"n": 2, "classes": 2, "accuracy": 0.25, "auroc_positive": 0.5},
            },
        },
    }
    text = groups_markdown(results)
    assert "## Per group: `site` on the test split" in text
    assert "| (empty) | 1 | 100.00 | – |" in text and "| b\\|c | 2 | 25.00 | 50.00 |" in text
    assert "not defined for that group" in text
    assert "1 more group(s)" in groups_markdown(results, max_groups=1)
    assert groups_markdown({"test": {}}) == ""


def _csv_recipe(tmp_path: Path, **eval_keys: object) -> dict:
    """A tiny run's recipe on csv train and test files whose rows carry a ``site`` column."""
    kaggle = tmp_path / "kaggle"
    write_image_folder(kaggle, "images", {"a": 8, "b": 8})
    write_image_folder(tmp_path / "ood", "test", {"owl": 3})
    header = ["image", "label", "site"]
    train = [[f"{c}/{i:03d}.png", c, f"s{i % 2}"] for c in "ab" for i in range(5)]
    # Site s1 holds class a only: its AUROC is undefined.
    test = [["a/005.png", "a", "s0"], ["a/006.png", "a", "s1"], ["a/007.png", "a", "s1"]]
    test += [["b/005.png", "b", "s0"], ["b/006.png", "b", "s0"], ["b/007.png", "b", "s0"]]
    write_table(kaggle / "train.csv", [header, *train])
    write_table(kaggle / "test.csv", [header, *test])
    raw = tiny_recipe({"ind": kaggle, "ood": tmp_path / "ood"}, tmp_path / "run", epochs=1)
    for split in ("train", "test"):
        raw["data"][split] = {
            "source": "csv",
            "path": str(kaggle / f"{split}.csv"),
            "image_dir": "images",
            "metadata_columns": ["site"],
        }
    raw["eval"].update(eval_keys)
    return raw


def test_a_run_reports_its_groups_in_results_and_card(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fseb_ft.engine.reevaluate import evaluate_run
    from fseb_ft.engine.run import run

    skip_figures(monkeypatch)
    raw = _csv_recipe(tmp_path, group_by="site", temperature_scaling=True)
    results = run(recipe_from_dict(raw))
    out = tmp_path / "run"
    saved = json.loads((out / "results.json").read_text())
    groups = saved["groups"]
    assert groups["column"] == "site" and list(groups["groups"]) == ["s0", "s1"]
    assert [g["n"] for g in groups["groups"].values()] == [4, 2]
    assert set(groups["groups"]["s0"]) >= set(saved["test"]) - {"n"}
    assert groups["groups"]["s1"]["auroc_positive"] is None
    assert "auroc_positive" in groups["groups"]["s1"]["undefined"]
    scaled = saved["temperature_scaled"]["groups"]["groups"]
    assert scaled["s0"]["accuracy"] == groups["groups"]["s0"]["accuracy"]  # T keeps the arg-max
    assert results["groups"] == groups
    md = (out / "results.md").read_text()
    assert "Per group: `site` on the test split" in md and "| s1 + TS | 2 |" in md
    card = (out / "model" / "README.md").read_text()
    assert "### Per group: `site`" in card and "| s0 | 4 |" in card
    (out / "results.json").unlink()
    assert evaluate_run(out, cpu=True)["groups"] == groups  # fseb-ft evaluate: the same groups


def test_group_by_must_be_a_metadata_column_of_the_reported_split(tmp_path: Path) -> None:
    raw = _csv_recipe(tmp_path, group_by="hospital")
    with pytest.raises(ConfigError) as err:
        recipe_from_dict(raw)
    assert str(err.value) == (
        "eval.group_by='hospital': must be one of data.test.metadata_columns ['site'] (the "
        "split the results are on)"
    )
    raw["eval"]["group_by"] = "site"
    raw["data"]["test"] = {"source": "imagefolder", "path": str(tmp_path), "split": "test"}
    with pytest.raises(ConfigError, match=r"data.test \(source imagefolder\) keeps no metadata"):
        recipe_from_dict(raw)
    del raw["data"]["test"]  # reported on the validation split, held out of data.train
    assert recipe_from_dict(raw).eval.group_by == "site"
    raw["data"]["val"] = {"source": "imagefolder", "path": str(tmp_path), "split": "train"}
    with pytest.raises(ConfigError, match=r"data.val \(source imagefolder\) keeps no metadata"):
        recipe_from_dict(raw)
    raw["data"]["test_fraction"] = 0.2  # the test hold-out comes from data.train, not data.val
    assert recipe_from_dict(raw).eval.group_by == "site"


def test_images_without_the_column_stop_with_one_line() -> None:
    images = ArrayImages(np.zeros((2, 4, 4), np.uint8), np.array([0, 1]), identity="arrays#x")
    with pytest.raises(GroupColumnError) as err:
        split_groups(images, "site", "test")
    message = str(err.value)
    assert "\n" not in message and "eval.group_by='site'" in message and "arrays#x" in message
    images.metadata = {"site": np.array(["u", "v"])}
    assert split_groups(images, "site", "test").values.tolist() == ["u", "v"]


def test_in_memory_data_without_the_column_stop_before_anything_is_written(
    tmp_path: Path,
) -> None:
    import fseb_ft

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(8, 12, 12, 3), dtype=np.uint8)
    data = ArrayImages(pixels, np.arange(8) % 2, identity="arrays#tiny")
    raw = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "run")
    del raw["data"]["train"], raw["data"]["test"], raw["data"]["ood"]
    with pytest.raises(GroupColumnError, match=r"^eval.group_by='site': the test split's"):
        fseb_ft.finetune(raw, train=data, test=data, eval__group_by="site")
    assert not (tmp_path / "run").exists()
