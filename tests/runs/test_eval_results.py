"""Results are plain dicts (JSON-ready, as results.json); EvalResults keeps the predictions beside.

``run``, ``compare``, ``evaluate_run`` and ``evaluate_ensemble`` return the record alone; the
``*_with_predictions`` functions return an :class:`EvalResults`, record and predictions typed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fseb_ft.engine.reevaluate import evaluate_run, evaluate_run_with_predictions
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.report import EvalResults, eval_results, write_results
from fseb_ft.runs.rundir import PLOTS, RESULTS_JSON
from tests.helpers import tiny_recipe, write_image_folder
from tests.runs.test_report_scores import _predictions


def test_the_record_is_a_plain_dict_and_the_predictions_stay_apart() -> None:
    predictions = _predictions()
    evaluated = EvalResults.from_predictions(predictions)

    assert evaluated.predictions is predictions
    assert type(evaluated.results) is dict and evaluated.results == eval_results(predictions)
    assert list(evaluated.results) == ["split", "test", "ood"]
    assert not isinstance(evaluated, Mapping)  # no record in disguise: .results is the record
    assert "Tensor" not in repr(evaluated)
    json.dumps(evaluated.results)
    with pytest.raises(dataclasses.FrozenInstanceError):
        evaluated.predictions = None  # type: ignore[misc]


def test_extended_adds_keys_after_the_records_own_and_leaves_it_as_it_was() -> None:
    evaluated = EvalResults.from_predictions(_predictions())
    trained = evaluated.extended(training={"epochs": 2}, runs=["a", "b"])

    assert list(trained.results) == ["split", "test", "ood", "training", "runs"]
    assert trained.predictions is evaluated.predictions
    assert "training" not in evaluated.results  # a new record; the first is unchanged


def test_results_json_is_the_record_and_the_figures_come_from_its_predictions(
    tmp_path: Path,
) -> None:
    evaluated = EvalResults.from_predictions(_predictions()).extended(training={"epochs": 1})
    write_results(tmp_path, evaluated.results, "FS-EB", evaluated.predictions)

    written = (tmp_path / RESULTS_JSON).read_text()
    assert written == json.dumps(evaluated.results, indent=2) + "\n"
    assert all((tmp_path / name).is_file() for name in PLOTS)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny finished run (one epoch) and what ``run`` returned."""
    root = tmp_path_factory.mktemp("results")
    write_image_folder(root / "ind", "train", {"cat": 6, "dog": 6})
    write_image_folder(root / "ind", "test", {"cat": 3, "dog": 3})
    write_image_folder(root / "ood", "test", {"owl": 3})
    out = root / "run"
    recipe = tiny_recipe({"ind": root / "ind", "ood": root / "ood"}, out, epochs=1)
    recipe["train"]["trackers"] = []
    return out, run(recipe_from_dict(recipe))


@pytest.mark.no_figures  # of the re-evaluations: the run's are drawn by the module's fixture
def test_run_and_evaluate_run_return_results_json_as_a_plain_dict(
    finished: tuple[Path, Any],
) -> None:
    out, results = finished
    assert type(results) is dict and list(results)[-1] == "training"
    assert json.loads(json.dumps(results)) == json.loads((out / RESULTS_JSON).read_text())

    again = evaluate_run(out, cpu=True)
    assert type(again) is dict
    assert json.loads(json.dumps(again)) == json.loads((out / RESULTS_JSON).read_text())

    evaluated = evaluate_run_with_predictions(out, cpu=True)
    assert evaluated.results == again
    assert len(evaluated.predictions.test[1]) == again["test"]["n"] == 6
