"""Two-moons benchmark (Rudner et al. 2023, Figure 1): FS-EB is uncertain far from the data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from benchmarks.provenance import read_stamp
from benchmarks.two_moons import main, run

KEYS = {"far_entropy_psmap", "far_entropy_fseb", "train_acc_psmap", "train_acc_fseb"}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The CLI's thread count, restored afterwards so other tests keep theirs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_fseb_uncertain_far_from_data_psmap_not() -> None:
    # 200 steps already converge (full batch); over seeds 0-4 FS-EB gave 0.47-0.55 nats against
    # PS-MAP's 0.021-0.025 with both train accuracies ≥ 0.988, so these bounds have wide margin.
    results = run(steps=200, seed=0, out=None)
    assert set(results) == KEYS
    assert results["far_entropy_fseb"] >= 0.25
    assert results["far_entropy_fseb"] >= 5 * results["far_entropy_psmap"]
    assert results["train_acc_psmap"] >= 0.95
    assert results["train_acc_fseb"] >= 0.95


@pytest.mark.usefixtures("one_thread")
def test_cli_prints_json_last_and_writes_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures" / "moons.png"  # parent missing: the CLI must create it
    main(["--steps", "3", "--out", str(out)])
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(results) == KEYS
    assert all(isinstance(v, float) for v in results.values())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("one_thread")
def test_cli_writes_its_table_stamped_with_this_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "results.md"
    page.write_text("# Results\n\n<!-- two-moons:begin -->\nold\n<!-- two-moons:end -->\n")
    main(["--steps", "3", "--no-plot", "--results", str(page)])
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    text = page.read_text()
    assert "old" not in text
    assert "`python -m benchmarks.two_moons --steps 3 --results docs/results.md`" in text
    far, acc = results["far_entropy_fseb"], results["train_acc_fseb"]
    assert f"| FS-EB | {far:.3f} | {acc:.3f} |" in text
    stamp = read_stamp(text)
    assert stamp is not None and stamp["runs"] == 1  # this process's code, as one record
