"""A finished run whose data folder moved: `fseb-ft evaluate` and `predict` take the data's new
place as overrides (``data.test.path=DIR``), and the run's recipe.yaml stays as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fseb_ft import cli
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.rundir import read_json
from tests.helpers import image_folders, tiny_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code in (1, 2)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_evaluate_and_predict_find_moved_data_by_path_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = image_folders(tmp_path / "data", {"cat": 8, "dog": 8}, {"cat": 3, "dog": 3}, 3)
    run_dir = tmp_path / "run"
    run(recipe_from_dict(tiny_recipe(folders, run_dir, epochs=1)))
    recipe_text = (run_dir / "recipe.yaml").read_text()
    tested = read_json(run_dir / "results.json")["test"]
    shutil.move(tmp_path / "data", tmp_path / "moved")  # a move keeps the files' times
    ind, ood = tmp_path / "moved" / "ind", tmp_path / "moved" / "ood"
    capsys.readouterr()

    assert "does not exist" in _one_line(["evaluate", str(run_dir), "--cpu"], capsys)
    moved = [f"data.train.path={ind}", f"data.test.path={ind}", f"data.ood.owls.path={ood}"]
    cli.main(["evaluate", str(run_dir), "--cpu", *moved])
    again = read_json(run_dir / "results.json")["test"]
    assert again["n"] == tested["n"] and again["accuracy"] == tested["accuracy"]

    predict = ["predict", str(run_dir), str(ind / "test"), "--coverage", "0.9", "--no-progress"]
    out = tmp_path / "p.csv"
    assert "does not exist" in _one_line([*predict, "--out", str(out)], capsys)
    cli.main([*predict, f"data.train.path={ind}", "--out", str(out)])
    meta = read_json(tmp_path / "p.meta.json")
    assert meta["images"] == 6 and meta["abstention"]["chosen_on"] == "validation"
    assert (run_dir / "recipe.yaml").read_text() == recipe_text

    line = _one_line([*predict, "data.batch_size=4"], capsys)
    assert "overrides take data.SPLIT.path=DIR" in line
    line = _one_line(["evaluate", str(run_dir), "data.train.split=other"], capsys)
    assert "or data.SPLIT.path=DIR (data.ood.NAME.path=DIR) for moved data" in line
