"""One ``fseb-ft`` command: its table, its errors, and the recipe read once."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

import fseb_ft
from fseb_ft import cli
from fseb_ft import finetune as finetune_module
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.recipe import options
from fseb_ft.runs.report import EvalResults

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

QUICKSTART = Path(__file__).parents[2] / "recipes" / "quickstart.yaml"


def test_help_lists_every_command_of_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["--help"])
    out = capsys.readouterr().out
    for name, command in cli.COMMANDS.items():
        assert f"  {name}" in out and command.summary in out


def test_help_lists_every_method_a_recipe_can_name(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["--help"])
    methods = capsys.readouterr().out.split("methods (fseb.method=NAME")[1].split("\n\n")[0]
    assert [line.split()[0] for line in methods.splitlines()[1:]] == list(options.METHODS)


@pytest.mark.parametrize("command", [[], *([name] for name in cli.COMMANDS)], ids=str)
def test_no_help_shows_rest_markup(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # predict --help showed its docstring's :func:`predict_images` and ``fseb-ft predict``.
    try:
        cli.main([*command, "--help"])
    except SystemExit as stop:  # argparse exits 0 after the help of a command
        assert stop.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    for markup in (":func:", ":class:", ":data:", ":mod:", ":meth:", "``"):
        assert markup not in out, markup


def test_help_text_turns_rest_into_plain_text_filled_to_80_columns() -> None:
    doc = (
        "The ``fseb-ft x`` command and :func:`predict_images` "
        "(:data:`~fseb_ft.recipe.options.OOD_SCORES`, :mod:`fseb_ft.evaluation.ood`) "
        "with some more words to fill the first line past eighty columns.\n\n"
        "    fseb-ft x ``kept`` as written, however long the example line is, past eighty columns\n"
    )
    paragraph, example = cli.help_text(doc).split("\n\n")
    assert " ".join(paragraph.splitlines()) == (
        "The fseb-ft x command and predict_images (OOD_SCORES, fseb_ft.evaluation.ood) "
        "with some more words to fill the first line past eighty columns."
    )
    assert [len(line) < 80 for line in paragraph.splitlines()] == [True, True]
    assert (
        example
        == "    fseb-ft x kept as written, however long the example line is, past eighty columns"
    )


def test_an_unknown_command_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["evalute", "runs/x"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "fseb-ft: error: unknown command or recipe 'evalute'; commands are train, evaluate, "
        "push, sweep, predict, export, demo, monitor, cache, or give a recipe file "
        "(fseb-ft RECIPE.yaml ...)\n"
    )


def test_compare_without_fseb_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(QUICKSTART), "--compare", "fseb.reg_scale=0", f"output.dir={tmp_path}"]
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fseb-ft: error: fseb.reg_scale=0: --compare trains PS-MAP")
    assert "Traceback" not in err and not any(tmp_path.iterdir())


def test_compare_reads_the_recipe_once_and_differs_only_in_reg_scale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, runs = [], []
    load = finetune_module.load_recipe
    monkeypatch.setattr(
        finetune_module, "load_recipe", lambda *a, **k: reads.append(a) or load(*a, **k)
    )

    def fake_run(recipe: Any) -> EvalResults:
        runs.append(recipe)
        Path(recipe.output.dir).mkdir(parents=True)
        results = {"test": {"accuracy": 1.0}, "ood": {}, "training": {"seconds": 1.0}}
        uniform = torch.full((4, 3), 1 / 3).log()  # (4, 3)
        return EvalResults(results, Predictions(test=(uniform, torch.tensor([0, 1, 2, 0]))))

    monkeypatch.setattr(finetune_module, "run_with_predictions", fake_run)
    # None: the console-script wrapper hands the return value to sys.exit (a dict exits 1).
    assert (
        cli.main([str(QUICKSTART), "--compare", f"output.dir={tmp_path}", "train.epochs=1"]) is None
    )
    assert len(reads) == 1
    psmap, fseb = runs
    assert (psmap.fseb.reg_scale, fseb.fseb.reg_scale) == (0.0, 0.1)
    assert (psmap.output.dir, fseb.output.dir) == (str(tmp_path / "psmap"), str(tmp_path / "fseb"))
    assert psmap.train == fseb.train and psmap.train.epochs == 1 and psmap.data == fseb.data
    assert (tmp_path / "comparison.md").is_file()


def test_the_callable_module_shows_the_real_signature() -> None:
    params = inspect.signature(fseb_ft.finetune).parameters
    assert list(params)[:5] == ["recipe", "train", "val", "test", "ood"]
    assert fseb_ft.api.finetune is finetune_module.finetune
