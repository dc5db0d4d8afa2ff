"""One training at a time in a run folder: a second is refused with one line; the lock a killed
run leaves holds nothing, so the next run takes it over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fseb_ft import cli
from fseb_ft.runs.lock import RunInUseError, run_lock
from fseb_ft.runs.rundir import LOCK_FILE
from tests.helpers import image_folders, tiny_recipe


def test_a_held_lock_refuses_a_second_holder_and_is_gone_after(tmp_path: Path) -> None:
    run_dir = tmp_path / "new" / "run"
    with run_lock(run_dir):
        assert (run_dir / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        refused = pytest.raises(RunInUseError, match=rf"process {os.getpid()} holds")
        with refused, run_lock(run_dir):
            pass
    assert not run_dir.exists()  # made for the lock, left empty: removed as it was not there
    run_dir.mkdir()
    (run_dir / "recipe.yaml").write_text("{}")
    with run_lock(run_dir):
        pass
    assert sorted(p.name for p in run_dir.iterdir()) == ["recipe.yaml"]


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_FILE
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid())\n"
            "print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        refused = pytest.raises(RunInUseError, match=rf"process {holder.pid} holds")
        with refused, run_lock(tmp_path):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert lock.read_text() == f"{holder.pid}\n"  # what the killed run left
    with run_lock(tmp_path):
        assert lock.read_text() == f"{os.getpid()}\n"


def test_a_second_training_into_a_folder_in_use_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = image_folders(tmp_path / "data", {"cat": 4, "dog": 4}, {"cat": 2, "dog": 2}, owls=2)
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(folders, run_dir, epochs=1)))
    with run_lock(run_dir):  # the first training, still running
        with pytest.raises(SystemExit) as stop:
            cli.main([str(recipe)])
        assert stop.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"fseb-ft: error: output.dir {run_dir} is in use by another ")
        assert err.count("\n") == 1
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written
