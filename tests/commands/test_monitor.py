"""`fseb-ft monitor`: a tiny trained run checks held-out images of its classes (no alarm, exit 0)
and clearly shifted ones (alarm, exit 3); its JSON file and figure; the errors a user makes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fseb_ft import cli
from fseb_ft.data.sources.sklearn_digits import load_sklearn_digits
from fseb_ft.finetune import run
from fseb_ft.monitor import ALARM_EXIT
from fseb_ft.prediction import monitor_data
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.rundir import VAL_LOGITS, read_val_features, read_val_logits
from tests.helpers import digits_recipe

pytestmark = pytest.mark.no_figures  # the figure is written, not checked pixel by pixel

HELD_OUT = "{source: sklearn_digits, split: test, classes: [0, 1, 2]}"
FAST = ["--permutations", "400", "--no-progress"]  # 400: the least that reaches 0.01 / 4
N_SHIFTED = 60


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-epoch PS-MAP run of the paper's CNN on digits 0-2."""
    out = tmp_path_factory.mktemp("run") / "digits"
    run(recipe_from_dict(digits_recipe(out)))
    return out


@pytest.fixture(scope="module")
def inverted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits 0-2 as 8×8 PNGs with their grey levels inverted, and one broken PNG."""
    root = tmp_path_factory.mktemp("inverted")
    digits = load_sklearn_digits([0, 1, 2], channels=1)
    for i in range(N_SHIFTED):
        Image.fromarray(255 - digits[i][0][:, :, 0]).save(root / f"{i:02d}.png")
    (root / "broken.png").write_bytes(b"\x89PNG truncated")
    return root


def monitor(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the command; its exit status (0 when it returns) and what it printed."""
    try:
        cli.main(["monitor", *argv, *FAST])
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, printed = monitor(argv, capsys)
    lines = [line for line in printed.splitlines() if line.startswith("fseb-ft")]
    assert code in (1, 2) and "Traceback" not in printed and len(lines) == 1, printed
    return lines[0]


def test_held_out_images_of_the_same_classes_raise_no_alarm(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed = monitor([str(run_dir), "--dataset", HELD_OUT, "--out", str(tmp_path)], capsys)
    assert code == 0, printed
    assert "no alarm" in printed and "features (MMD²)" in printed
    record = json.loads((tmp_path / "monitor.json").read_text())
    assert set(record) >= {"alarm", "level", "each_level", "checks", "label_shift", "rows",
                           "images", "validation_images", "abstention", "unreadable"}  # fmt: skip
    assert record["alarm"] is False and record["level"] == 0.01 and record["each_level"] == 0.0025
    checks = record["checks"]
    assert list(checks) == ["features", "abstention", "ood", "classes", "accuracy"]
    assert [c["alarms"] for c in checks.values()] == [True, True, True, True, False]
    assert all(c["p_value"] >= 0.0025 for c in checks.values() if c["alarms"])
    shift = record["label_shift"]
    assert shift["classes"] == ["0", "1", "2"]
    assert sum(shift["estimated_proportions"]) == pytest.approx(1.0)
    assert len(record["rows"]) == record["images"] > 50
    row = record["rows"][0]
    assert sum(row["reweighted_probabilities"]) == pytest.approx(1.0, abs=1e-5)
    assert (tmp_path / "monitor.png").stat().st_size > 10_000


def test_inverted_images_raise_the_alarm_and_the_unreadable_one_is_left_out(
    run_dir: Path, inverted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, printed = monitor([str(run_dir), str(inverted), "--out", str(tmp_path)], capsys)
    assert code == ALARM_EXIT, printed
    assert "ALARM" in printed and "1 unreadable image(s) left out" in printed
    record = json.loads((tmp_path / "monitor.json").read_text())
    assert record["alarm"] is True and record["images"] == N_SHIFTED
    assert record["checks"]["features"]["alarm"] is True
    assert record["unreadable"][0].startswith(str(inverted / "broken.png"))


def test_a_second_monitor_reads_validation_from_the_run_and_reports_the_same(
    run_dir: Path,
    inverted: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (run_dir / VAL_LOGITS).unlink(missing_ok=True)  # the first monitor of this run
    argv = [str(run_dir), str(inverted), "--out"]
    code, _ = monitor([*argv, str(tmp_path / "first")], capsys)
    features = read_val_features(run_dir)
    logits, labels = read_val_logits(run_dir) or (None, None)
    assert features is not None and logits is not None and labels is not None
    assert features.ndim == 2 and len(features) == len(logits) == len(labels)

    def no_pass(*args: object, **kwargs: object) -> None:
        raise AssertionError("the validation split was rebuilt")

    monkeypatch.setattr(monitor_data, "validation_split", no_pass)
    again, _ = monitor([*argv, str(tmp_path / "second")], capsys)
    first, second = (json.loads((tmp_path / d / "monitor.json").read_text())
                     for d in ("first", "second"))  # fmt: skip
    assert again == code == ALARM_EXIT and first == second


def test_a_batch_below_the_minimum_is_one_error_that_says_why(
    run_dir: Path, inverted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_line([str(run_dir), str(inverted), "--min-batch", "61"], capsys)
    assert f"{N_SHIFTED} readable image(s), fewer than --min-batch 61" in line
    assert "too little power" in line


def test_a_model_without_a_validation_split_is_one_error(
    run_dir: Path, inverted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = shutil.copytree(run_dir / "model", tmp_path / "model")  # outside its run
    line = error_line([str(folder), str(inverted)], capsys)
    assert "validation split" in line and "give the run folder" in line


def test_only_unreadable_images_is_one_error(
    run_dir: Path, inverted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_line([str(run_dir), str(inverted / "broken.png")], capsys)
    assert "none of the 1 images could be read" in line


def test_too_few_permutations_for_the_level_is_a_usage_error(
    run_dir: Path, inverted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_line([str(run_dir), str(inverted), "--level", "0.001"], capsys)
    assert "permutations 400 cannot give a p-value below level / 4" in line
    assert "at least 4000" in line


def test_constant_images_raise_the_alarm(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(N_SHIFTED):
        Image.fromarray(np.full((8, 8), 128, np.uint8)).save(tmp_path / f"{i:02d}.png")
    code, printed = monitor([str(run_dir), str(tmp_path)], capsys)
    assert code == ALARM_EXIT, printed
