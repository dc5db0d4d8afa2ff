"""`fseb-ft evaluate RUN_DIR ... eval.key=value`: overrides are positional, as for training; a
read-only run is evaluated and printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fseb_ft import cli, evaluate
from fseb_ft.evaluate import main as evaluate_main
from fseb_ft.runs.rundir import read_json
from tests.commands.test_predict import read_only, snapshot, train_tiny_run

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


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
    # Another cache size or filter would evaluate on other pixels than the run trained on.
    for other in ("data.cache.size=512", "data.cache.resize=box", "data.cache={size: 64}"):
        with pytest.raises(SystemExit):
            evaluate_main(["run_a", other])
        err = capsys.readouterr().err
        assert "data.cache.dir=DIR for a moved cache folder" in err and f"got ['{other}']" in err


def test_the_cache_can_be_left_or_moved(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda *a: seen.append(a) or {"test": {}})
    evaluate_main(["run_a", "data.cache=null", "data.cache.dir=/elsewhere"])
    assert seen == [(Path("run_a"), False, ["data.cache=null", "data.cache.dir=/elsewhere"])]


def test_a_read_only_run_is_evaluated_and_printed_and_left_as_it_was(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_dir = train_tiny_run(tmp_path / "run")
    accuracy = read_json(run_dir / "results.json")["test"]["accuracy"]
    before = snapshot(run_dir)
    read_only(run_dir, monkeypatch)
    cli.main(["evaluate", str(run_dir), "--cpu"])  # returns: exit status 0
    table = capsys.readouterr().out
    assert f"| {run_dir} |" in table and f"{100 * accuracy:.2f}" in table
    assert (
        f"could not write results.json, results.md and the plots into {run_dir} (Permission "
        "denied): the run keeps its earlier results, and these are not saved" in caplog.text
    )
    assert snapshot(run_dir) == before
