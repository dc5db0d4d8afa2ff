"""A recipe without ``data.test`` (no test labels, as on Kaggle) finishes and reports its
validation split, labelled as such in results.json, results.md, the model card, --compare,
re-evaluation, ensembles and predictions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fseb_ft.engine.ensemble as ensemble_module
import fseb_ft.runs.report as report_module
from fseb_ft import api
from fseb_ft.engine.ensemble import evaluate_ensemble
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.finetune import compare
from fseb_ft.recipe import recipe_from_dict
from tests.helpers import N_OOD, tiny_recipe, write_image_folder

N_VAL = 9  # the stratified 25 % of 36 training images held out for validation
NOTE = "no test split was given (`data.test`)"


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--compare`` of a one-epoch recipe with OOD set, temperature scaling and a corruption,
    but no ``data.test``: OUTPUT/psmap and OUTPUT/fseb."""
    root = tmp_path_factory.mktemp("no-test")
    write_image_folder(root / "ind", "train", {"cat": 12, "dog": 12, "fox": 12})
    write_image_folder(root / "ood", "test", {"owl": N_OOD})
    raw = tiny_recipe({"ind": root / "ind", "ood": root / "ood"}, root / "out", epochs=1)
    del raw["data"]["test"]
    raw["train"]["trackers"] = []
    raw["eval"] |= {
        "temperature_scaling": True,
        "corruptions": ["gaussian_noise"],
        "severities": [1],
        "corruption_cache": str(root / "cache"),
    }
    compare(recipe_from_dict(raw))
    return root / "out"


@pytest.mark.parametrize("method", ["psmap", "fseb"])
def test_results_and_model_folder_report_the_validation_split(compared: Path, method: str) -> None:
    run_dir = compared / method
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["split"] == "validation"
    assert saved["test"]["n"] == N_VAL and saved["ood"]["owls"]["n"] == N_OOD
    assert saved["corruptions"]["gaussian_noise"]["1"]["n"] == N_VAL  # the validation images
    assert "temperature_scaled" in saved

    title = f"{'FS-EB' if method == 'fseb' else 'PS-MAP'} · test_byobnet"
    md = (run_dir / "results.md").read_text()
    assert md.startswith(f"# {title} (validation split)\n") and NOTE in md
    assert f"| {title} (validation split) |" in md and f"| {title} + TS (validation split) |" in md
    assert "## Covariate shift: corrupted validation split" in md

    folder = run_dir / "model"
    for name in ("config.json", "model.safetensors", "fseb.json", "README.md", "reliability.png"):
        assert (folder / name).is_file(), name
    assert json.loads((folder / "fseb.json").read_text())["results"]["split"] == "validation"
    card = (folder / "README.md").read_text()
    assert "Validation split `imagefolder:" in card and NOTE in card and "optimistic" in card
    assert "Test split" not in card and "the test split is never used" not in card
    assert "![Reliability diagram (validation split)](reliability.png)" in card


def test_compare_labels_both_rows_validation(compared: Path) -> None:
    md = (compared / "comparison.md").read_text()
    assert NOTE in md
    assert "| PS-MAP (validation split) |" in md and "| FS-EB (validation split) |" in md


def test_reevaluation_ensemble_and_predict_work_on_the_validation_split(
    compared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's figures are checked above; drawing them twice more costs seconds, not behaviour.
    for module in (report_module, ensemble_module):
        monkeypatch.setattr(module, "write_plots", lambda *args, **kwargs: [])
    saved = json.loads((compared / "fseb" / "results.json").read_text())
    again = evaluate_run(compared / "fseb", cpu=True)
    assert again["split"] == "validation" and again["test"]["n"] == N_VAL
    assert again["test"]["nll"] == pytest.approx(saved["test"]["nll"], rel=1e-6)

    ensemble = evaluate_ensemble([compared / "psmap", compared / "fseb"], tmp_path / "ens", True)
    assert ensemble["split"] == "validation" and ensemble["test"]["n"] == N_VAL
    assert NOTE in (tmp_path / "ens" / "results.md").read_text()

    owls = sorted((compared.parent / "ood" / "test" / "owl").glob("*.png"))
    predicted = api.predict_images(compared / "fseb", owls, coverage=0.9, progress=False)
    assert len(predicted.rows) == N_OOD


def test_an_ensemble_of_runs_validated_on_other_images_is_refused(
    compared: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-seed"
    shutil.copytree(compared / "fseb", other, ignore=shutil.ignore_patterns("checkpoints"))
    info = json.loads((other / "run.json").read_text())
    info["data"]["val"] += "|subset:other"  # as a member trained at another seed
    (other / "run.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"their validation data \(reported on without a test"):
        evaluate_ensemble([compared / "psmap", other], tmp_path / "ens", cpu=True)
