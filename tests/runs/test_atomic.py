"""A full disk or a kill never leaves partial files, and a full disk says so in one line; a
write the OS refuses is an OSError whichever library wrote."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

import fseb_ft.engine.run as run_module
import fseb_ft.engine.run_data as run_data_module
import fseb_ft.finetune as finetune_module
import fseb_ft.runs.atomic as atomic
import fseb_ft.runs.rundir as rundir
from fseb_ft.engine.callbacks import TrainState
from fseb_ft.engine.loop import _save_checkpoint
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.atomic import (
    DiskFullError,
    cleaned_on_failure,
    default_file_mode,
    is_not_writable,
)
from fseb_ft.runs.report import write_results
from fseb_ft.runs.rundir import latest_checkpoint

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

# What each writer raises when the disk fills up (torch's text is from a real full tmpfs).
DISK_FULL = {
    "torch": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
    "torch-write": RuntimeError(
        "[enforce fail at inline_container.cc:453] . PytorchStreamWriter failed writing file "
        "data/0: file write failed"
    ),
    "safetensors": SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
    "os": OSError(errno.ENOSPC, "No space left on device"),
}


def _fill_then_fail(error: Exception):
    """A writer that leaves a partial file at its target, then fails as a full disk does."""

    def write(_obj: object, target: str, *args: object, **kwargs: object) -> None:
        path = Path(target)
        if path.suffix == "":  # a checkpoint folder
            path.mkdir(parents=True)
            path = path / "optimizer.bin"
        path.write_bytes(b"partial")
        raise error

    return write


@pytest.mark.parametrize("kind", ["torch", "torch-write", "os"])
def test_a_checkpoint_on_a_full_disk_says_so_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(3, 2))
    _save_checkpoint(accelerator, tmp_path, TrainState(epoch=1, step=4))
    saved = load_file(tmp_path / "checkpoints" / "epoch-0001" / "model.safetensors")

    fail = _fill_then_fail(DISK_FULL[kind])
    monkeypatch.setattr(accelerator, "save_state", lambda target: fail(None, target))
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(DiskFullError, match="no space left on device") as err:
        _save_checkpoint(accelerator, tmp_path, TrainState(epoch=2, step=8))
    message = str(err.value)
    assert str(tmp_path / "checkpoints") in message and "epoch-0002" in message
    assert "epoch-0001 is intact" in message and "\n" not in message
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch-0001"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "epoch-0001"
    kept = load_file(tmp_path / "checkpoints" / "epoch-0001" / "model.safetensors")
    assert all(torch.equal(saved[k], kept[k]) for k in saved)


@pytest.mark.parametrize("kind", ["safetensors", "os", "torch"])
def test_best_weights_on_a_full_disk_say_so_and_keep_the_previous_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / "model" / "model.safetensors"
    model = nn.Linear(3, 2)
    rundir.write_best_weights(model, path)
    before = path.read_bytes()

    monkeypatch.setattr(rundir, "save_model", _fill_then_fail(DISK_FULL[kind]))
    with pytest.raises(DiskFullError, match="no space left on device") as err:
        rundir.write_best_weights(model, path)
    assert f"in {path.parent}:" in str(err.value) and "best weights" in str(err.value)
    assert [p.name for p in path.parent.iterdir()] == ["model.safetensors"]
    assert path.read_bytes() == before


def test_results_on_a_full_disk_keep_the_previous_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {"test": {"n": 3, "accuracy": 0.5}}
    write_results(tmp_path, old, title="old")
    original = Path.write_text

    def half_then_full(self: Path, text: str, *args: object, **kwargs: object) -> int:
        original(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(DiskFullError, match=f"no space left on device in {tmp_path}"):
        write_results(tmp_path, {"test": {"n": 3, "accuracy": 0.9}}, title="new")
    monkeypatch.undo()
    assert json.loads((tmp_path / "results.json").read_text()) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]


def test_cli_reports_a_full_disk_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"data: {{train: {{source: imagefolder, path: {tmp_path}}}}}\n")

    def full(_recipe: object) -> None:
        raise DiskFullError(f"no space left on device in {tmp_path}: could not write X. Free.")

    monkeypatch.setattr(finetune_module, "run", full)
    with pytest.raises(SystemExit) as exit_info:
        finetune_module.main([str(recipe)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        f"fseb-ft: error: no space left on device in {tmp_path}: could not write X. Free.\n"
    )


class _StopError(Exception):
    pass


def test_a_run_removes_the_temporary_files_a_killed_run_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    done = run_dir / "checkpoints" / "epoch-0001"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text("{}")
    (run_dir / "model").mkdir()
    (run_dir / "model" / "model.safetensors").write_bytes(b"best")
    orphans = [
        run_dir / "checkpoints" / ".tmp-epoch-0002" / "optimizer.bin",  # killed in save_state
        run_dir / "model" / ".tmpA1b2C3",  # safetensors' own temporary file
        run_dir / "model" / "model.tmp",
        run_dir / ".model-export-x7y8" / "model.safetensors",
        run_dir / ".results.json.tmp",
    ]
    for path in orphans:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")

    def stop(*args: object, **kwargs: object) -> None:
        raise _StopError  # everything the test needs happened before the images are read

    monkeypatch.setattr(run_module, "build_splits", lambda *args: SimpleNamespace(train=None))
    monkeypatch.setattr(run_module, "check_data", lambda *args: None)
    monkeypatch.setattr(run_data_module, "screen_splits", stop)  # the data phase's first step
    recipe = recipe_from_dict(
        {
            "model": {"name": "test_byobnet", "pretrained": False},
            "data": {"train": {"source": "imagefolder", "path": str(tmp_path)}},
            "train": {"cpu": True, "trackers": []},
            "output": {"dir": str(run_dir)},
        }
    )
    with pytest.raises(_StopError):
        finetune_module.run(recipe)
    left = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    assert left == [
        "checkpoints",
        "checkpoints/epoch-0001",
        "checkpoints/epoch-0001/trainer_state.json",
        "model",
        "model/model.safetensors",
    ]


def test_published_files_get_the_mode_a_plain_open_gives(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert default_file_mode() == plain.stat().st_mode & 0o777
    path = tmp_path / "model" / "model.safetensors"
    rundir.write_best_weights(nn.Linear(3, 2), path)
    assert oct(path.stat().st_mode & 0o777) == oct(default_file_mode())
    assert os.listdir(path.parent) == ["model.safetensors"]


@pytest.mark.parametrize(
    "error",
    [
        SafetensorError(  # as safetensors raises it in a folder without write permission
            'Error while serializing: I/O error: Permission denied (os error 13) at path "/r/.tmpX"'
        ),
        PermissionError(errno.EACCES, "Permission denied"),
    ],
    ids=["safetensors", "os"],
)
def test_a_refused_write_is_a_permission_error_whichever_library_wrote(
    tmp_path: Path, error: Exception
) -> None:
    temp = tmp_path / ".tmpX"
    with (
        pytest.raises(PermissionError) as raised,
        cleaned_on_failure(temp, what="the validation logits"),
    ):
        temp.write_bytes(b"partial")
        raise error
    assert is_not_writable(raised.value) and raised.value.errno == errno.EACCES
    assert not temp.exists()
    assert not is_not_writable(DISK_FULL["safetensors"]) and not is_not_writable(ValueError("x"))


def test_two_writers_of_one_file_at_once_both_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of a sweep write the leaderboard at once: the other's whole write falls
    between this one's write and its rename. With one temporary name for both, the other's
    rename took this one's file, and this rename failed (FileNotFoundError)."""
    target = tmp_path / "leaderboard.json"
    real = atomic.publish

    def interleaved(temp: Path, final: Path) -> None:
        monkeypatch.setattr(atomic, "publish", real)
        atomic.write_text(target, "B")
        real(temp, final)

    monkeypatch.setattr(atomic, "publish", interleaved)
    atomic.write_text(target, "A")
    assert target.read_text() == "A"
    assert [p.name for p in tmp_path.iterdir()] == ["leaderboard.json"]
