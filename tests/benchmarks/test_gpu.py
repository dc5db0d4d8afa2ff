"""The GPU script's dry run (``bash benchmarks/gpu/run.sh --dry-run``): every benchmark part runs
small on the CPU and leaves its figures, so the script cannot rot while no GPU machine is lent.
Its ``tests`` part (``pytest -m cuda``) is left out here: a suite inside the suite."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from benchmarks.gpu.__main__ import commands, environment, parse
from benchmarks.gpu.__main__ import summary as gpu_summary
from benchmarks.gpu.finetune import StepTimer
from benchmarks.gpu.throughput import METHODS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.no_figures


def test_the_script_runs_a_part_in_its_own_process_and_writes_its_figures(
    tmp_path: Path,
) -> None:
    """``run.sh`` end to end on its cheapest part; the others run in-process below, with the
    same command lines (a process each would add ~15 s of imports to the suite)."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = os.environ | {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    cmd = ["bash", "benchmarks/gpu/run.sh", "--dry-run", "--out", str(out), "--work", str(work),
           "--parts", "profile"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "gpu.json").read_text())
    assert json.loads(done.stdout.splitlines()[-1]) == results
    assert results["profile"]["status"] == "ok", (out / "profile.log").read_text()
    profiled = results["profile"]["figures"]["eager"]
    assert profiled["timm"]["wall_ms"] > 0 and profiled["PS-MAP"]["wall_ms"] > 0
    # R_θ's own autograd function is among what PS-MAP runs and timm's step does not.
    assert any(row[0] == "_SquaredDistance" and row[3] == 0 for row in profiled["differences"])
    summary = (out / "summary.md").read_text()
    assert "| `_SquaredDistance` |" in summary
    assert "- profile: ok" in summary and "- tests:" not in summary  # not asked for


def _in_process(cmd: list[str]) -> dict[str, object]:
    """A part's command line (``python -m MODULE ARGS``) run in this process: its figures."""
    assert cmd[1] == "-m"
    return importlib.import_module(cmd[2]).main(cmd[3:])


def test_the_benchmark_parts_leave_every_figure(tmp_path: Path) -> None:
    cmds = commands(parse(["--dry-run", "--work", str(tmp_path)]))
    results: dict[str, dict[str, object]] = {"environment": environment()}
    for part in ("eager", "finetune", "firststep", "compile"):
        results[part] = {"status": "ok", "seconds": 0, "figures": _in_process(cmds[part])}
    for variant, models in (("eager", ("test_resnet", "test_vit")), ("compile", ("test_resnet",))):
        figures = cast(dict[str, Any], results[variant]["figures"])
        rows = figures["rows"]
        assert [(r["model"], r["method"]) for r in rows] == [
            (model, method) for model in models for method in METHODS
        ]
        assert all(r["variant"] == variant and r["ms"] > 0 for r in rows)
        assert figures["ratios"]["test_resnet/" + variant + "/FS-EB M=B floor"] == 2.0
    for method in ("PS-MAP", "FS-EB"):
        found = cast(dict[str, Any], results["finetune"]["figures"])[method]
        assert found["steps"] == 3 and found["bound_by"] in ("input pipeline", "accelerator")
        assert 0 <= found["wait_fraction"] <= 1
    first = cast(dict[str, Any], results["firststep"]["figures"])["test_resnet"]
    assert [(c["case"], c["batch"], c["cudnn"]) for c in first["cases"]] == [
        ("first", 8, True), ("new shape", 2, True), ("seen shape", 8, True),
        ("new shape, cuDNN off", 4, False), ("seen shape, cuDNN off", 8, False),
        ("new shape, profiled", 6, True),
    ]  # fmt: skip
    assert all(c["first_s"] > 0 and c["steady_ms"] > 0 for c in first["cases"])
    assert torch.backends.cudnn.enabled  # the cuDNN-off case turned it back on
    ops = [name for name, _, _ in first["profiled_top"]]
    assert "aten::convolution_backward" in ops and len(ops) == 10
    summary = gpu_summary(json.loads(json.dumps(results)))  # as gpu.json gives it back
    assert "| new shape, cuDNN off | 4 | off |" in summary
    assert "| test_vit | eager | FS-EB M=B | 8 |" in summary
    assert "| test_resnet | compile | PS-MAP | 0 |" in summary
    assert "- fine-tune FS-EB: {" in summary and "- compile: ok" in summary


def test_the_gpu_run_selects_the_cuda_tests_and_carried_inputs() -> None:
    cmds = commands(parse([]))
    assert cmds["tests"][-5:] == ["-m", "cuda", "-p", "no:cacheprovider", "tests"]
    assert any(a.startswith("local-dir:") and a.endswith(".gpu-carry/efficientnet_lite0.in1k")
               for a in cmds["finetune"])  # fmt: skip


def test_the_fine_tunes_verdict_leaves_out_one_time_work_and_the_loaders_start() -> None:
    """A 5 s wait for the first batch (workers starting) and a 10 s first step (a new shape's
    first use) do not make a run whose other waits are under a quarter of its steps input-bound."""
    timer = StepTimer()
    timer.starts, timer.waits, timer.steps = [5.0], [0.1, 0.1], [10.0, 0.3, 0.3]
    timer.sizes = [3, 3, 3]
    figures = timer.figures(batch=3, images=9, epochs=1)
    assert figures["bound_by"] == "accelerator"
    assert figures["loader_start_s"] == 5.0 and figures["one_time_s"] == 9.7
    assert figures["slow_steps"] == [[0, 3, 10.0]]
    assert figures["wait_fraction"] == round(0.2 / (0.2 + 3 * 0.3), 3)  # three steps at the median
    assert figures["train_images_per_s"] == round(9 / 15.8, 1)
    timer.waits = [0.5, 0.5]  # over the 0.9 s of steps at the median
    assert timer.figures(batch=3, images=9, epochs=1)["bound_by"] == "input pipeline"


def test_the_profiles_table_keeps_every_operator_one_step_alone_calls() -> None:
    """Noise in the times of operators both steps call (a busy machine) pushes none of those
    only one step calls out of the table, however small its time."""
    from benchmarks.gpu.profile import Profile, differences

    noisy = {f"op{i}": (1.0 + i, 1.0) for i in range(30)}
    a = Profile(10.0, 0.0, 0.0, noisy)
    b = Profile(11.0, 0.0, 0.0, {**{k: (t * 1.5, c) for k, (t, c) in noisy.items()},
                                 "_SquaredDistance": (0.001, 1.0)})  # fmt: skip
    rows = differences(a, b, shown=3)
    assert [r[0] for r in rows] == ["op29", "op28", "op27", "_SquaredDistance"]
    assert rows[-1] == ("_SquaredDistance", 0.0, 0.001, 0.0, 1.0)
