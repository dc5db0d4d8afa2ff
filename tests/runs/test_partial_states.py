"""Unfinished or partial states look so: a killed run's evaluation, T left at 1, where a run
wrote, an ensemble's output folder, a run trained on in-memory data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fseb_ft.finetune as finetune_module
from fseb_ft import cli
from fseb_ft.data.sources import load_split
from fseb_ft.engine.ensemble import evaluate_ensemble
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.errors import FsebError
from fseb_ft.finetune import run
from fseb_ft.recipe import DatasetSpec, recipe_from_dict
from fseb_ft.runs.tables import markdown_table
from tests.helpers import kill_after_checkpoint, tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

QUICKSTART = Path(__file__).parents[2] / "recipes" / "quickstart.yaml"


def test_evaluating_a_killed_run_says_it_is_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    write_image_folder(data, "train", {"cat": 7, "dog": 7})  # 10 to train: batches of 8 and 2
    write_image_folder(data, "test", {"cat": 2, "dog": 2})
    raw = tiny_recipe({"ind": data, "ood": data}, tmp_path / "run", epochs=3)
    raw["data"]["ood"] = {}
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    kill_after_checkpoint(monkeypatch)  # the first epoch's
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(raw))
    results = evaluate_run(tmp_path / "run", cpu=True)
    assert results["training"]["unfinished"] is True and results["training"]["epochs"] == 1
    text = (tmp_path / "run" / "results.md").read_text()
    assert "unfinished: 1 of 3 epochs trained" in text
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["training"]["unfinished"] is True


def test_a_ts_row_left_at_t_1_carries_its_reason_under_the_table() -> None:
    test = {"accuracy": 1.0, "nll": 0.01, "ece": 0.0, "brier": 0.0, "sel_pred_auc": 1.0}
    note = "temperature scaling left off (T = 1): validation predicted perfectly"
    results = {
        "FS-EB": {"test": test, "ood": {}, "temperature_scaled": {"test": test, "note": note}},
        "PS-MAP": {"test": test, "ood": {}, "temperature_scaled": {"test": test}},
    }
    table = markdown_table(results)
    assert table.count("+ TS") == 3  # two rows and one note
    assert table.rstrip().endswith(f"*FS-EB + TS:* {note}.")


def test_a_plain_run_says_where_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_run(recipe: Any) -> dict[str, Any]:
        Path(recipe.output.dir).mkdir(parents=True)
        (Path(recipe.output.dir) / "reliability.png").write_bytes(b"")
        return {"test": {"accuracy": 1.0}, "ood": {}, "training": {"seconds": 1.0}}

    monkeypatch.setattr(finetune_module, "run", fake_run)
    cli.main([str(QUICKSTART), f"output.dir={tmp_path / 'qs'}"])
    out = capsys.readouterr().out
    assert f"written to {tmp_path / 'qs'}: results.md (this table), results.json, " in out
    assert "reliability.png, model/" in out


def test_an_ensemble_never_overwrites_the_ensemble_of_other_runs(tmp_path: Path) -> None:
    (tmp_path / "ensemble").mkdir()
    earlier = {"runs": [str(tmp_path / "x"), str(tmp_path / "y")]}
    (tmp_path / "ensemble" / "results.json").write_text(json.dumps(earlier))
    with pytest.raises(ValueError, match="holds the results of an ensemble of other runs"):
        evaluate_ensemble([tmp_path / "a", tmp_path / "b"], tmp_path / "ensemble")
    # The same runs again reach the runs themselves (which do not exist here).
    with pytest.raises(FileNotFoundError):
        evaluate_ensemble([tmp_path / "x", tmp_path / "y"], tmp_path / "ensemble")


def test_in_memory_data_names_the_way_to_evaluate_it() -> None:
    spec = DatasetSpec(source="arrays", path="in-memory:train", split="train")
    with pytest.raises(FsebError, match="save_to_disk") as err:
        load_split("data.train", spec)
    assert "No such file" not in str(err.value) and "recipe.yaml" in str(err.value)
