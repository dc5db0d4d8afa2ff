"""EvalResults: an evaluation's record (what results.json holds) and its predictions, typed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fseb_ft.runs.report import EvalResults, eval_results, write_results
from fseb_ft.runs.rundir import PLOTS, RESULTS_JSON
from tests.test_report_scores import _predictions


def test_the_record_reads_as_its_results_and_keeps_its_predictions_apart() -> None:
    predictions = _predictions()
    evaluated = eval_results(predictions)

    assert isinstance(evaluated, EvalResults) and evaluated.predictions is predictions
    assert list(evaluated) == list(evaluated.results) == ["split", "test", "ood"]
    assert evaluated["test"] is evaluated.results["test"] and len(evaluated) == 3
    assert evaluated == dict(evaluated) == evaluated.results  # compared as the record it reads as
    assert "predictions" not in json.dumps(dict(evaluated)) and "Tensor" not in repr(evaluated)
    with pytest.raises(dataclasses.FrozenInstanceError):
        evaluated.predictions = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        evaluated["training"] = {}  # type: ignore[index]


def test_extended_adds_keys_after_the_records_own_and_leaves_it_as_it_was() -> None:
    evaluated = eval_results(_predictions())
    trained = evaluated.extended(training={"epochs": 2}, runs=["a", "b"])

    assert list(trained) == ["split", "test", "ood", "training", "runs"]
    assert trained.predictions is evaluated.predictions
    assert "training" not in evaluated  # a new record; the first is unchanged


def test_results_json_is_the_record_and_the_figures_come_from_its_predictions(
    tmp_path: Path,
) -> None:
    evaluated = eval_results(_predictions()).extended(training={"epochs": 1})
    write_results(tmp_path, evaluated, title="FS-EB")

    written = (tmp_path / RESULTS_JSON).read_text()
    assert written == json.dumps(evaluated.results, indent=2) + "\n"
    assert all((tmp_path / name).is_file() for name in PLOTS)  # drawn from .predictions
