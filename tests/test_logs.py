"""Log lines and warnings of the training loop go above its progress bars, not into them."""

from __future__ import annotations

import logging
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fseb_ft.finetune import run
from fseb_ft.logs import above_progress_bars, progress_bar
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.regularizer import CholeskyJitterWarning
from fseb_ft.recipe import recipe_from_dict
from tests.helpers import tiny_recipe, write_image_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "ind", "train", {"cat": 8, "dog": 8})
    write_image_folder(root / "ind", "test", {"cat": 2, "dog": 2})
    return {"ind": root / "ind", "ood": root / "ind"}


@contextmanager
def _console() -> Iterator[None]:
    """A console handler on stderr as ``configure_logging`` sets up (pytest's root has none);
    made in the test, where ``capsys`` has replaced ``sys.stderr``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.root.addHandler(handler)
    try:
        yield
    finally:
        logging.root.removeHandler(handler)


def _starts_a_line(err: str, text: str) -> bool:
    """Every ``text`` in ``err`` begins a line: after a newline, or after the ``\\r`` with which
    ``tqdm.write`` clears a bar, never after a bar's own text."""
    found = [m.start() for m in re.finditer(re.escape(text), err)]
    return bool(found) and all(i == 0 or err[i - 1] in "\r\n" for i in found)


def test_lines_and_warnings_of_the_training_loop_go_above_its_bars(
    folders: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    original = FSEBObjective.forward

    def noisy(self, *args, **kwargs):
        logging.getLogger("fseb_ft").warning("a line from the loop")
        warnings.warn("a warning from the loop", UserWarning, stacklevel=1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FSEBObjective, "forward", noisy)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: bars are drawn
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    with _console():
        run(recipe_from_dict(recipe), evaluate_test=False)
    err = capsys.readouterr().err
    assert "epoch 1/1: " in err  # the bar was drawn
    assert _starts_a_line(err, "WARNING fseb_ft: a line from the loop")
    assert _starts_a_line(err, "WARNING py.warnings: ")
    assert "UserWarning: a warning from the loop" in err


def test_above_progress_bars_undoes_what_it_changed() -> None:
    with _console():
        handlers, shown = list(logging.root.handlers), warnings.showwarning
        with above_progress_bars():
            assert logging.root.handlers != handlers and warnings.showwarning is not shown
        assert logging.root.handlers == handlers and warnings.showwarning is shown
    logging.captureWarnings(True)  # already captured (the commands): it stays captured
    try:
        captured = warnings.showwarning
        with above_progress_bars():
            pass
        assert warnings.showwarning is captured
    finally:
        logging.captureWarnings(False)


def test_progress_bars_are_drawn_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert list(progress_bar(range(3), desc="counting")) == [0, 1, 2]
    assert capsys.readouterr().err == ""  # pytest's stderr is no terminal: a log file's case
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert list(progress_bar(range(3), desc="counting")) == [0, 1, 2]
    assert "counting: 100%" in capsys.readouterr().err
    assert list(progress_bar(range(3), desc="counting", show=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_a_run_logged_to_a_file_has_its_epoch_lines_and_no_bar_frames(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=2)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    run(recipe_from_dict(recipe), evaluate_test=False)
    out, err = capsys.readouterr()
    assert "epoch 1/2: train loss" in out and "epoch 2/2: train loss" in out
    assert "\r" not in out + err and "it/s" not in err


def _jitter_warnings(count: int) -> None:
    for step in range(count):  # one place, the numbers of each step in the text
        warnings.warn(f"Cholesky of Kc failed at step {step}", CholeskyJitterWarning, stacklevel=1)


def test_a_repeated_warning_of_fseb_ft_is_logged_once_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="py.warnings"):
        warnings.simplefilter("default")
        with above_progress_bars():
            _jitter_warnings(4)
            warnings.warn("a library's warning, step 1", UserWarning, stacklevel=1)
            warnings.warn("a library's warning, step 2", UserWarning, stacklevel=1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages
    assert "CholeskyJitterWarning: Cholesky of Kc failed at step 0" in messages[0]
    assert messages[1:3] == [m for m in messages if "a library's warning" in m]
    assert messages[3].startswith("CholeskyJitterWarning (")
    assert messages[3].endswith("repeated 3 more times; python -W always shows each")


def test_python_w_always_shows_every_repeat(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="py.warnings"):
        warnings.simplefilter("always")
        with above_progress_bars():
            _jitter_warnings(3)
    assert len(caplog.records) == 3
