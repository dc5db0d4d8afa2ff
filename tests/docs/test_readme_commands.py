"""The README's command blocks run as written, in order, after ``make demo``.

Every line of every ``bash`` block goes through the command it names, with its own argument
parser and recipe loading, in a folder laid out like a fresh clone; only the work itself
(training, evaluating, sweeping, predicting) is replaced by a stand-in that leaves the run folder
a real command would leave, checks a rerun into it as resuming does, and records what each
command reads. So a command that its parser or the recipe refuses, one that trains into another
run's folder, or one that reads a run no earlier command made, fails here. (Running them for
real takes minutes: see tests/docs/test_docs.py for the own-loop example, which runs.)
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import fseb_ft.engine.resume as resume_module
import fseb_ft.evaluate as evaluate_module
import fseb_ft.finetune as finetune_module
import fseb_ft.predict as predict_module
import fseb_ft.sweep as sweep_module
from fseb_ft import cli
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.recipe import dump_recipe
from fseb_ft.runs.report import EvalResults
from fseb_ft.runs.rundir import RECIPE_FILE, TRAINER_STATE, checkpoint_name

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

ROOT = Path(__file__).parents[2]
MODULE_COMMANDS = {command.module: name for name, command in cli.COMMANDS.items()}


def command_lines(markdown: str) -> list[str]:
    """The commands of every ``bash`` block, continuation lines joined, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(line)
    return lines


def _fake_run(recipe: Any, **_: Any) -> dict[str, Any]:
    """What a finished run leaves, after the same resume check as a real rerun."""
    run_dir = Path(recipe.output.dir)
    resume_module.check_resumable(recipe, run_dir)
    (run_dir / "checkpoints" / checkpoint_name(1)).mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints" / checkpoint_name(1) / TRAINER_STATE).write_text("{}")
    (run_dir / RECIPE_FILE).write_text(dump_recipe(recipe))
    (run_dir / "model").mkdir(exist_ok=True)
    return {"test": {"accuracy": 1.0}, "ood": {}, "training": {"seconds": 1.0}}


def _fake_evaluated(recipe: Any, **kwargs: Any) -> EvalResults:
    """:func:`_fake_run` with the predictions ``--compare`` draws its figures from."""
    uniform = torch.full((4, 3), 1 / 3).log()  # (4, 3)
    return EvalResults(_fake_run(recipe), Predictions(test=(uniform, torch.tensor([0, 1, 2, 0]))))


class Session:
    """A shell in a fresh clone: the commands a line runs, and what each read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
        self.activated = False
        self.read: list[Path] = []
        monkeypatch.chdir(folder)
        monkeypatch.setattr(finetune_module, "run", _fake_run)
        monkeypatch.setattr(finetune_module, "run_with_predictions", _fake_evaluated)
        monkeypatch.setattr(evaluate_module, "evaluate_run", self._evaluate)
        monkeypatch.setattr(evaluate_module, "evaluate_ensemble", self._ensemble)
        monkeypatch.setattr(sweep_module, "sweep", self._sweep)
        monkeypatch.setattr(predict_module, "predict_images", self._predict)
        monkeypatch.setattr(predict_module, "summary", lambda meta, out: "")

    def _needs_run(self, run_dir: str | Path) -> None:
        assert (Path(run_dir) / RECIPE_FILE).is_file(), f"{run_dir}: no earlier command made it"
        self.read.append(Path(run_dir))

    def _evaluate(self, run_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._needs_run(run_dir)
        return {"test": {"accuracy": 1.0}, "ood": {}}

    def _ensemble(self, run_dirs: list[Path], out: Path | None, **kwargs: Any) -> dict[str, Any]:
        for run_dir in run_dirs:
            self._needs_run(run_dir)
        assert out is None or not (Path(out) / RECIPE_FILE).exists()
        return {"test": {"accuracy": 1.0}, "ood": {}, "members": {}}

    def _sweep(self, recipe: Any, trials: int, *args: Any) -> dict[str, Any]:
        assert 0 < trials <= 8, f"--trials {trials}: a README sweep should take minutes, not hours"
        return _fake_run(recipe)

    def _predict(self, model: str, images: list[str], **kwargs: Any) -> Any:
        self._needs_run(model)
        for image in images:
            assert Path(image).exists(), f"{image} does not exist after the commands before it"
        return type("Predictions", (), {"meta": {}})()

    def run(self, line: str) -> None:
        """Run one command line as a shell in the clone would."""
        words = shlex.split(line, comments=True)
        program, args = words[0], words[1:]
        if program in (".", "source"):
            assert args == [".venv/bin/activate"], line  # the Makefile's VENV
            self.activated = True
        elif program == "make":
            targets = re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M)
            assert args and all(a in targets for a in args), line
            if "demo" in args:  # what the demo target runs, through the same dispatch
                demo = re.search(
                    r"^demo:.*\n\t\$\(PY\) (.*)$", (ROOT / "Makefile").read_text(), re.M
                )
                self._python(shlex.split(demo.group(1)))
        else:
            assert self.activated, f"{line!r} runs before .venv is activated (after make demo)"
            if program == "python":
                self._python(args)
            elif program == "fseb-ft":
                cli.main(args)
            elif program == "accelerate":
                self._accelerate(args)
            else:
                raise AssertionError(f"unknown program {program!r} in {line!r}")

    def _python(self, args: list[str]) -> None:
        if args[0] == "-m":
            cli.main([MODULE_COMMANDS[args[1]], *args[2:]])
        else:
            assert (ROOT / args[0]).is_file(), args

    def _accelerate(self, args: list[str]) -> None:
        from accelerate.commands.launch import launch_command_parser

        assert args[0] == "launch"
        parsed = launch_command_parser().parse_args(args[1:])
        assert parsed.module and parsed.training_script in MODULE_COMMANDS, args
        cli.main([MODULE_COMMANDS[parsed.training_script], *parsed.training_script_args])


def test_the_readme_commands_run_in_order_after_make_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kept in ("recipes", "Makefile", "docs"):
        source = ROOT / kept
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / kept)
    session = Session(monkeypatch, tmp_path)
    lines = command_lines((ROOT / "README.md").read_text(encoding="utf-8"))
    assert lines[0].startswith("make demo"), "the README starts with make demo"
    for line in lines:
        session.run(line)
    assert Path("runs/quickstart/fseb") in session.read  # the demo's runs are used
    assert len(lines) >= 10


def test_a_command_into_another_runs_folder_fails_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's old third line: bf16 into the folder of the first FS-EB run."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    session = Session(monkeypatch, tmp_path)
    session.activated = True
    session.run("python -m fseb_ft.finetune recipes/quickstart.yaml")
    with pytest.raises(SystemExit):
        session.run(
            "accelerate launch -m fseb_ft.finetune recipes/quickstart.yaml "
            "train.mixed_precision=bf16"
        )
    with pytest.raises(AssertionError, match="no earlier command made it"):
        session.run("fseb-ft evaluate runs/a runs/b runs/c --ensemble")
