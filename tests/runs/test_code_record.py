"""run.json's ``code``: the commit, whether tracked files differed from it, library versions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fseb_ft.runs.code_record import RESULT_LIBRARIES, code_record, git_state
from fseb_ft.runs.rundir import RunInfo

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    """One git command in ``root`` with a fixed identity (CI has none configured)."""
    command = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    """git_state is read once per process; each test reads its own checkout afresh."""
    git_state.cache_clear()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout holding a package folder ``fseb_ft`` and a README, one commit."""
    root = tmp_path / "repo"
    (root / "fseb_ft").mkdir(parents=True)
    (root / "fseb_ft" / "loss.py").write_text("SCALE = 1\n")
    (root / "README.md").write_text("notes\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_clean_checkout_names_its_commit(checkout: Path) -> None:
    state = git_state(checkout / "fseb_ft")
    assert state == {"commit": git(checkout, "rev-parse", "HEAD"), "dirty": False}


def test_an_edited_package_file_is_dirty(checkout: Path) -> None:
    (checkout / "fseb_ft" / "loss.py").write_text("SCALE = 2\n")
    assert git_state(checkout / "fseb_ft")["dirty"] is True


def test_the_state_is_that_of_the_first_read_in_a_process(checkout: Path) -> None:
    """A later commit does not change the code the process already imported."""
    first = git_state(checkout / "fseb_ft")
    (checkout / "fseb_ft" / "loss.py").write_text("SCALE = 2\n")
    git(checkout, "commit", "-qam", "second")
    assert git_state(checkout / "fseb_ft") == first


def test_untracked_files_and_edits_outside_the_code_are_not_dirty(checkout: Path) -> None:
    """A new untracked module was not imported by the run; a README edit shapes no result."""
    (checkout / "fseb_ft" / "scratch.py").write_text("x = 1\n")
    (checkout / "README.md").write_text("more notes\n")
    assert git_state(checkout / "fseb_ft")["dirty"] is False


def test_outside_a_checkout_there_is_no_git_state(tmp_path: Path) -> None:
    (tmp_path / "site" / "fseb_ft").mkdir(parents=True)
    assert git_state(tmp_path / "site" / "fseb_ft") is None


def test_a_copy_vendored_inside_another_repository_has_no_git_state(checkout: Path) -> None:
    """The enclosing repository's commit is not the package's."""
    (checkout / "vendor" / "fseb_ft").mkdir(parents=True)
    assert git_state(checkout / "vendor" / "fseb_ft") is None


def test_code_record_lists_every_result_library_and_round_trips_in_run_json() -> None:
    record = code_record()
    assert set(record["libraries"]) == set(RESULT_LIBRARIES)
    assert record["libraries"]["torch"].startswith("2.")
    machine = record["machine"]
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["threads"] == torch.get_num_threads() and machine["cpu"]
    spec = {"size": [8, 8], "mean": [0.5], "std": [0.25]}
    info = RunInfo.from_json({"num_classes": 2, "input": spec, "code": record})
    assert info.to_json()["code"] == record
    assert "code" not in RunInfo.from_json({"num_classes": 2, "input": spec}).to_json()


def test_this_checkout_is_recorded() -> None:
    """The suite runs from a git checkout of fseb_ft (CI clones one): its HEAD is recorded."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    assert code_record()["git"]["commit"] == git(repo, "rev-parse", "HEAD")
