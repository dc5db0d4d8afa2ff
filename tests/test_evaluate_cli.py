"""`fseb-ft evaluate RUN_DIR ... eval.key=value`: overrides are positional, as for training."""

from __future__ import annotations

from pathlib import Path

import pytest

from fseb_ft import evaluate
from fseb_ft.evaluate import main as evaluate_main


def test_positional_eval_overrides_reach_the_evaluation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda *a: seen.append(a) or {"test": {}})
    evaluate_main(["run_a", "eval.corruption_cache=/tmp//c", "--cpu", "run_b", "eval.batch_size=8"])
    overrides = ["eval.corruption_cache=/tmp//c", "eval.batch_size=8"]  # verbatim, in order
    assert seen == [(Path("run_a"), True, overrides), (Path("run_b"), True, overrides)]
    assert "deprecated" not in capsys.readouterr().err

    seen.clear()
    evaluate_main(["run_a", "--set", "eval.batch_size=4", "eval.batch_size=8"])
    assert seen == [(Path("run_a"), False, ["eval.batch_size=4", "eval.batch_size=8"])]
    assert "--set is deprecated" in capsys.readouterr().err


def test_only_evaluation_settings_can_be_overridden(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        evaluate_main(["run_a", "train.epochs=3"])
    assert "overrides take eval.KEY=VALUE (evaluation settings only)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate_main(["eval.batch_size=8"])
    assert "the following arguments are required: RUN_DIR" in capsys.readouterr().err
