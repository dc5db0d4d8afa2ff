"""fseb_ft.runs.rundir: run.json as RunInfo, read back exactly; a folder that is not a run says
so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fseb_ft.data.inputs import InputSpec
from fseb_ft.runs.rundir import RUN_INFO_FILE, RunInfo, read_run

RUN_JSON = {
    "num_classes": 3,
    "class_names": ["cat", "dog", "fox"],
    "input": {"size": [32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    "num_train": 27,
    "data": {"train": "imagefolder:a", "val": "split", "test": None, "ood": {}},
    "context": {"kind": "train", "fingerprint": "0" * 64},
    "num_processes": 1,
    "device": "cpu",
    "mixed_precision": "no",
    "warnings": ["a warning"],
}


def test_run_json_round_trips_exactly() -> None:
    prior = {"prior_std": 0.5, "feature_share": 0.5, "mean_sq_norm": 9.0, "prior_cov_scale": 0.0125}
    for saved in (
        RUN_JSON,
        {**RUN_JSON, "context": None, "training": {"best_epoch": 2}},
        {**RUN_JSON, "prior": {**prior, "prior_cov_diag": 0.125}},
    ):
        text = json.dumps(saved, indent=2)
        info = RunInfo.from_json(json.loads(text))
        assert info.input == InputSpec((32, 32), (0.5,) * 3, (0.25,) * 3)
        assert json.dumps(info.to_json(), indent=2) == text


def test_a_run_json_from_before_devices_were_recorded_loads() -> None:
    old = {k: v for k, v in RUN_JSON.items() if k not in ("device", "mixed_precision", "warnings")}
    info = RunInfo.from_json(old)
    assert info.device is None and info.mixed_precision is None and info.num_train == 27
    assert info.prior is None


def test_read_run_names_the_missing_file(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"not a finished run: {RUN_INFO_FILE} is missing"):
        read_run(tmp_path)
