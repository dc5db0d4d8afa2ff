"""Issue 24's end-to-end check: a Kaggle-style folder (``train.csv`` + ``train_images/``, a
patient column, test labels kept private) trains, evaluates and predicts through ``fseb-ft``, and
its broken variants (a missing image, a bad label) stop at load with one line naming the row."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from fseb_ft import cli
from tests.helpers import snapshot

PATIENTS = 18


def kaggle_folder(root: Path) -> Path:
    """SIIM-ISIC's layout in miniature: ``train.csv`` (``image_name,patient_id,site,target``)
    and 2–3 PNGs per patient in ``train_images/``; a third of the patients are positive, and the
    two classes differ in brightness so one epoch learns something."""
    rng = np.random.default_rng(0)
    (root / "train_images").mkdir(parents=True)
    rows = [("image_name", "patient_id", "site", "target")]
    for p in range(PATIENTS):
        target = int(p % 3 == 0)
        for i in range(2 + p % 2):
            name = f"ISIC_{p:02d}{i}"
            pixels = rng.integers(0, 128, size=(20, 24, 3)) + 100 * target
            Image.fromarray(pixels.astype(np.uint8)).save(root / "train_images" / f"{name}.png")
            rows.append((name, f"IP_{p:02d}", f"site{p % 2}", str(target)))
    with (root / "train.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return root / "train.csv"


def kaggle_recipe(root: Path, out: Path) -> Path:
    """A recipe for :func:`kaggle_folder`: patient-grouped test and validation hold-outs, the
    melanoma metrics, results per site."""
    recipe = {
        "model": {"name": "test_byobnet", "pretrained": False, "input_size": 16},
        "data": {
            "train": {
                "source": "csv",
                "path": str(root / "train.csv"),
                "image_dir": "train_images",
                "image_column": "image_name",
                "image_pattern": "{}.png",
                "label_column": "target",
                "classes": [0, 1],  # a label outside these is a bad row, not a third class
                "group_column": "patient_id",
                "metadata_columns": ["site"],
            },
            "test_fraction": 0.25,
            "val_fraction": 0.2,
            "batch_size": 8,
            "num_workers": 0,
        },
        "context": {"kind": "train", "pool_size": 20, "batch_size": 4},
        "fseb": {"prior_var": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0},
        "optim": {"lr": 0.05},
        "train": {"epochs": 1, "cpu": True, "log_every": 2, "class_weights": "balanced"},
        "eval": {
            "batch_size": 8,
            "group_by": "site",
            "temperature_scaling": True,
            "metrics": ["roc_auc", "balanced_accuracy", "sensitivity_at_95_specificity"],
        },
        "output": {"dir": str(out)},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_a_kaggle_folder_trains_evaluates_and_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kaggle_folder(tmp_path / "isic")
    out = tmp_path / "run"
    recipe = kaggle_recipe(tmp_path / "isic", out)
    cli.main([str(recipe)])
    results = json.loads((out / "results.json").read_text())
    splits = json.loads((out / "run.json").read_text())["splits"]
    assert results["split"] == "test" and results["test"]["n"] == splits["test"]["size"]
    assert sum(splits[k]["groups"] for k in ("train", "validation", "test")) == PATIENTS
    assert set(results["groups"]["groups"]) <= {"site0", "site1"}
    for name in ("roc_auc", "balanced_accuracy", "sensitivity_at_95_specificity"):
        assert name in results["test"] and name in results["groups"]["groups"]["site0"]
    assert "Bal. acc. (%)" in (out / "results.md").read_text()
    assert (out / "confusion.png").is_file()

    (out / "results.json").unlink()
    cli.main(["evaluate", str(out)])
    again = json.loads((out / "results.json").read_text())
    assert again["test"]["nll"] == pytest.approx(results["test"]["nll"], rel=1e-4)

    predictions = tmp_path / "predictions.csv"
    images = str(tmp_path / "isic" / "train_images")
    cli.main(["predict", str(out), images, "--out", str(predictions), "--coverage", "0.5"])
    with predictions.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(list((tmp_path / "isic" / "train_images").iterdir()))
    assert {row["prediction"] for row in rows} <= {"0", "1"}
    assert any(row["abstain"] == "True" for row in rows)
    capsys.readouterr()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("missing", r"1 image\(s\) cannot be read: data\.\w+: .*ISIC_011.png \(no such file\)"),
        ("label", r"train.csv: data row 4 \(line 5\): .*'maybe'"),
    ],
)
def test_a_broken_kaggle_folder_stops_before_training_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, expected: str
) -> None:
    root = tmp_path / "isic"
    table = kaggle_folder(root)
    if damage == "missing":
        (root / "train_images" / "ISIC_011.png").unlink()
    else:
        rows = table.read_text().splitlines()
        rows[4] = rows[4].rsplit(",", 1)[0] + ",maybe"
        table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    recipe = kaggle_recipe(root, out)
    before = snapshot(root)
    line = _fails([str(recipe)], capsys)
    assert line.startswith("fseb-ft: error: ") and re.search(expected, line), line
    assert not out.exists() and snapshot(root) == before  # nothing written, nothing lost
