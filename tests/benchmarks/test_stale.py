"""Tables name the code that made them; benchmarks.stale lists those today's code would not give."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import provenance, stale
from benchmarks.provenance import fingerprint_id, made_by, read_stamp, run_codes, stamp

REPO = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
PARTS = {"pixels": "aa", "loss": "bb"}


def git(root: Path, *args: str) -> str:
    command = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def commit_fingerprint(root: Path, parts: dict[str, str] | None) -> str:
    """Commit a ``benchmarks/fingerprint.json`` with these part hashes (none: no file)."""
    path = root / "benchmarks" / "fingerprint.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if parts is None:
        path.unlink(missing_ok=True)
        (root / "other.txt").write_text(str(len(git(root, "log", "--oneline", "--all") or "")))
    else:
        path.write_text(json.dumps({"parts": {k: {"hash": v} for k, v in parts.items()}}))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c", "--allow-empty")
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    return root


def code(commit: str, dirty: bool = False, kernels: str = "AVX2") -> dict:
    machine = {"cpu": "x", "cpu_capability": kernels, "threads": 1, "gpu": None}
    git_state = {"commit": commit, "dirty": dirty}
    return {"fseb_ft": "0.1.0", "git": git_state, "libraries": {}, "machine": machine}


@needs_git
def test_runs_of_commits_with_one_fingerprint_share_it(repo: Path) -> None:
    first = commit_fingerprint(repo, PARTS)
    second = commit_fingerprint(repo, PARTS)  # a refactor: same behaviour
    record = made_by([code(first), code(second, kernels="AVX512"), code(second)], repo)
    assert record["commits"] == [first[:7], second[:7]]
    assert record["kernels"] == ["AVX2", "AVX512"]
    assert "kernels: AVX2, AVX512)" in stamp(record)
    assert record["fingerprint"] == PARTS and record["runs"] == 3 and not record["dirty"]
    assert "mixed" not in record


@needs_git
def test_runs_of_different_fingerprints_make_a_mixed_table(repo: Path) -> None:
    first = commit_fingerprint(repo, PARTS)
    second = commit_fingerprint(repo, PARTS | {"loss": "cc"})
    record = made_by([code(first), code(second, dirty=True)], repo)
    assert record["fingerprint"] is None and record["mixed"] is True and record["dirty"]
    assert "several behaviour fingerprints" in stamp(record)


@needs_git
def test_a_run_without_code_or_a_commit_before_the_fingerprint_has_none(repo: Path) -> None:
    old = commit_fingerprint(repo, None)
    new = commit_fingerprint(repo, PARTS)
    assert made_by([code(new), None], repo)["fingerprint"] is None
    assert made_by([code(old)], repo)["fingerprint"] is None
    assert "mixed" not in made_by([code(old), code(new)], repo)


def test_stamp_round_trips_and_names_the_commit_and_fingerprint() -> None:
    record = {"date": "2026-11-27", "commits": ["abc1234"], "dirty": False, "runs": 2,
              "kernels": ["AVX512"], "fingerprint": PARTS}  # fmt: skip
    text = stamp(record)
    assert read_stamp(f"table\n\n{text}") == record
    made = "commit `abc1234` (2026-11-27; kernels: AVX512), behaviour fingerprint"
    assert f"{made} `{fingerprint_id(PARTS)}`" in text
    assert read_stamp("a table without one\n") is None


def test_run_codes_reads_every_run_json_under_the_folders(tmp_path: Path) -> None:
    for name, record in (("a/seed0", code("1" * 40)), ("b/seed1", None)):
        (tmp_path / name).mkdir(parents=True)
        info = {"num_classes": 2} | ({} if record is None else {"code": record})
        (tmp_path / name / "run.json").write_text(json.dumps(info))
    assert run_codes([tmp_path]) == [code("1" * 40), None]


def page(tmp_path: Path, stamps: dict[str, dict | None]) -> Path:
    """A page with one generated section per name, stamped as given (None: no stamp)."""
    text = "# Results\n"
    for name, record in stamps.items():
        made = "" if record is None else stamp(record)
        text += f"\n<!-- {name}:begin -->\n| a |\n|---|\n\n{made}<!-- {name}:end -->\n"
    text += "\n<!-- paper-claims:begin -->\nthe paper's numbers\n<!-- paper-claims:end -->\n"
    path = tmp_path / "results.md"
    path.write_text(text)
    return path


def record(parts: dict[str, str] | None, **extra: object) -> dict:
    return {"date": "2026-11-27", "commits": ["abc1234"], "fingerprint": parts} | extra


def test_state_names_the_parts_that_changed() -> None:
    today = {"pixels": "aa", "loss": "zz"}
    assert stale.state(stale.Table(Path("p"), "t", record(today)), today)[0] is False
    changed = stale.state(stale.Table(Path("p"), "t", record(PARTS)), today)
    assert changed == (True, "changed since: loss")
    assert stale.state(stale.Table(Path("p"), "t", None), today) == (True, "no stamp")
    old = stale.state(stale.Table(Path("p"), "t", record(None)), today)
    assert old == (True, "made before the fingerprint")


def test_stale_fails_on_a_stale_table_that_says_not_why_it_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    today = {
        k: v["hash"] for k, v in json.loads(stale.FINGERPRINT_FILE.read_text())["parts"].items()
    }
    path = page(tmp_path, {"fresh": record(today), "old": record(None), "bare": None})
    assert stale.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "results.md:fresh  [2026-11-27 abc1234]  current" in out
    assert out.count("STALE, and says not why it waits") == 2 and "paper-claims" not in out
    path = page(tmp_path, {"fresh": record(today), "old": record(None, waits="queued: 3 h")})
    assert stale.main([str(path)]) == 0
    assert "waits: queued: 3 h" in capsys.readouterr().out


def test_every_stale_table_of_the_docs_says_why_it_waits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A change that moves the fingerprint makes the tables it touches stale: rerun them or say
    in their stamp why they wait (``python -m benchmarks.stale`` lists them)."""
    assert stale.main([]) == 0, capsys.readouterr()


@needs_git
def test_write_section_stamps_the_code_of_its_runs(tmp_path: Path) -> None:
    """A table written today from runs of this checkout's HEAD is current."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    run = tmp_path / "runs" / "seed0"
    run.mkdir(parents=True)
    head = git(REPO, "rev-parse", "HEAD")
    (run / "run.json").write_text(json.dumps({"code": code(head)}))
    path = tmp_path / "results.md"
    provenance.write_section(path, "| a |\n", ("<!-- t:begin -->", "<!-- t:end -->"),
                               runs=[tmp_path / "runs"])  # fmt: skip
    [table] = stale.tables([path])
    assert table.made_by["commits"] == [head[:7]]
    committed = json.loads(git(REPO, "show", "HEAD:benchmarks/fingerprint.json"))["parts"]
    assert table.made_by["fingerprint"] == {k: v["hash"] for k, v in committed.items()}
