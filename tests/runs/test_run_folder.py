"""The run folder as the README describes it: re-evaluating --compare output, starting over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import fseb_ft.engine.run as run_module
import fseb_ft.finetune as finetune_module
from fseb_ft.evaluate import expand_run_dirs
from fseb_ft.evaluate import main as evaluate_main
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from tests.helpers import snapshot, tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def test_a_compare_output_folder_stands_for_its_runs(tmp_path: Path) -> None:
    for name in ("psmap", "fseb"):
        (tmp_path / "qs" / name).mkdir(parents=True)
        (tmp_path / "qs" / name / "recipe.yaml").write_text("{}")
    (tmp_path / "qs" / "comparison.md").write_text("")
    single = tmp_path / "qs" / "fseb"
    assert expand_run_dirs([tmp_path / "qs"]) == [
        tmp_path / "qs" / "fseb",
        tmp_path / "qs" / "psmap",
    ]
    assert expand_run_dirs([single]) == [single]
    assert expand_run_dirs([tmp_path / "nothing"]) == [tmp_path / "nothing"]


def test_evaluating_a_folder_that_holds_no_run_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        evaluate_main([str(tmp_path)], prog="fseb-ft evaluate")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"fseb-ft evaluate: error: {tmp_path} is not a finished run: recipe.yaml is missing"
    )


def _tiny_psmap_recipe(tmp_path: Path, out: Path) -> dict[str, Any]:
    """One epoch of PS-MAP on 16 two-class images, no OOD set."""
    write_image_folder(tmp_path / "data", "train", {"cat": 8, "dog": 8})
    write_image_folder(tmp_path / "data", "test", {"cat": 2, "dog": 2})
    recipe = tiny_recipe({"ind": tmp_path / "data", "ood": tmp_path / "data"}, out, epochs=1)
    recipe["data"]["ood"] = {}
    recipe["fseb"]["reg_scale"] = 0.0
    return recipe


def test_resume_never_says_it_starts_over_and_removes_the_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    recipe = _tiny_psmap_recipe(tmp_path, out)
    recipe["train"]["resume"] = "never"
    for stale in ("results.json", "corruptions.png", "checkpoints/epoch-0003/trainer_state.json"):
        (out / stale).parent.mkdir(parents=True, exist_ok=True)
        (out / stale).write_text("{}")
    run(recipe_from_dict(recipe))
    said = capsys.readouterr().out
    assert f"train.resume=never: starting over in {out}; removing the earlier run's" in said
    assert "checkpoints/, results.json, corruptions.png" in said
    assert not (out / "corruptions.png").exists()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["epoch-0001"]
    assert (out / "results.json").read_text() != "{}"


def test_a_run_killed_before_its_results_file_has_already_recorded_its_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # results.json marks a finished run; run.json must not lag behind it.
    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "write_results", killed)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(recipe_from_dict(_tiny_psmap_recipe(tmp_path, out)))
    assert not (out / "results.json").exists()
    training = json.loads((out / "run.json").read_text())["training"]
    assert (training["epochs"], training["best_epoch"]) == (1, 1)


def test_a_rerun_on_changed_data_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_image_folder(data, "train", {"airplane": 6, "cat": 6, "ship": 6})
    write_image_folder(data, "test", {"airplane": 2, "cat": 2, "ship": 2})
    out = tmp_path / "run"
    raw = tiny_recipe({"ind": data, "ood": data}, out, epochs=1)
    raw["data"]["ood"] = {}
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    run(recipe_from_dict(raw))
    finished = snapshot(out)

    def refused(match: str) -> str:
        with pytest.raises(finetune_module.RecipeMismatchError, match=match) as err:
            run(recipe_from_dict(raw))
        assert "\n" not in str(err.value) and "train.resume=never" in str(err.value)
        assert snapshot(out) == finished  # run.json, model/config.json: as trained
        return str(err.value)

    (data / "train" / "ship").rename(data / "train" / "deer")
    (data / "test" / "ship").rename(data / "test" / "deer")
    refused(r"class_names: \['airplane', 'cat', 'ship'\] → \['airplane', 'cat', 'deer'\]")
    (data / "train" / "deer").rename(data / "train" / "ship")
    (data / "test" / "deer").rename(data / "test" / "ship")
    run(recipe_from_dict(raw))  # the same data again: resumes (a finished run: nothing to train)

    write_image_folder(data, "train", {"dog": 6})
    write_image_folder(data, "test", {"dog": 2})
    refused(r"num_classes: 3 → 4")
    for split in ("train", "test"):
        for image in (data / split / "dog").iterdir():
            image.unlink()
        (data / split / "dog").rmdir()

    write_image_folder(tmp_path / "more", "train", {"cat": 3})
    for i, image in enumerate(sorted((tmp_path / "more" / "train" / "cat").iterdir())):
        image.rename(data / "train" / "cat" / f"new{i}.png")
    added = r"3 added \(cat/new0\.png, cat/new1\.png, cat/new2\.png\)"
    message = refused(rf"num_train: 14 → 16; data\.train: {added}")
    assert "imagefolder:" not in message and "#" not in message  # no identities, no hashes
    for image in (data / "train" / "cat").glob("new*.png"):
        image.unlink()
    cat = data / "train" / "cat"
    shutil.copyfile(cat / "002.png", cat / "000.png")
    (cat / "001.png").unlink()
    message = refused(r"data\.train: 1 rewritten \(cat/000\.png\), 1 removed \(cat/001\.png\)")
    assert "data.val changed" in message
