"""fseb_ft.runs.rundir: run.json as RunInfo, read back exactly; a folder that is not a run says
so."""

from __future__ import annotations

import ast
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from fseb_ft.data.inputs import InputSpec
from fseb_ft.method.methods.fsvi import FSVI
from fseb_ft.runs import rundir
from fseb_ft.runs.rundir import (
    MODEL_DIR,
    RUN_INFO_FILE,
    RunInfo,
    method_state_file,
    read_method_state,
    read_run,
    write_method_state,
)

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

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


def test_the_method_state_is_written_only_when_there_is_one_and_reads_back(tmp_path: Path) -> None:
    (tmp_path / MODEL_DIR).mkdir()
    name = FSVI.state_file  # the method names its file
    assert name is not None and method_state_file(name) == Path(MODEL_DIR) / name
    write_method_state(tmp_path, {}, name)  # no state: nothing beside the weights
    assert list((tmp_path / MODEL_DIR).iterdir()) == []
    with pytest.raises(FileNotFoundError, match=rf"not a finished run: {MODEL_DIR}/{name}"):
        read_method_state(tmp_path, name)
    state = {"head.weight": torch.rand(3, 5), "head.bias": torch.rand(3)}
    write_method_state(tmp_path, state, name)
    assert (tmp_path / MODEL_DIR / "variational.safetensors").is_file()  # old FS-VI runs' name
    back = read_method_state(tmp_path, name)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], value) for name, value in state.items())


def test_the_run_folder_knows_no_method() -> None:
    """Storage names files; building models and predictors from them is runs.loading's."""
    tree = ast.parse(Path(rundir.__file__).read_text())
    imported = [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert [name for name in imported if name.startswith("fseb_ft.method")] == []


def test_the_writability_check_runs_from_many_threads_of_one_process_at_once(
    tmp_path: Path,
) -> None:
    """The workers of a sweep (threads of one process too) check the same folder at once: one
    check's probe file is never another's refusal. The probe was named by the process alone, so
    a second thread found it there and raised FileExistsError."""
    (tmp_path / f".fseb-ft-write-check-{os.getpid()}").touch()  # another thread's, mid-check
    rundir.check_output_dir(tmp_path / "run")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: rundir.check_output_dir(tmp_path / "run"), range(200)))
    assert [p.name for p in tmp_path.iterdir()] == [f".fseb-ft-write-check-{os.getpid()}"]
