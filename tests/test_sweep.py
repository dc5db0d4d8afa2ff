"""`fseb-ft sweep`: trials are run folders, a killed sweep continues, only the winner is tested."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

import fseb_ft.evaluate as evaluate_module
import fseb_ft.finetune as finetune_module
import fseb_ft.train as train_module
from fseb_ft.config import ConfigError, load_recipe, recipe_from_dict
from fseb_ft.sweep import main, sweep
from tests.test_pipeline import _recipe_dict, _write_folder

SPACE = {"optim.lr": {"low": 0.01, "high": 0.1, "log": True}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    _write_folder(root / "ind", "train", {"cat": 8, "dog": 8})
    _write_folder(root / "ind", "test", {"cat": 3, "dog": 3})
    _write_folder(root / "ood", "test", {"owl": 3})
    return {"ind": root / "ind", "ood": root / "ood"}


def _recipe_file(folders: dict[str, Path], out: Path) -> Path:
    raw = _recipe_dict(folders, out, epochs=1)
    raw["train"]["trackers"] = []
    raw["sweep"] = {"space": SPACE, "pruner": "none"}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=out.name, storage=f"sqlite:///{out / 'study.db'}")


def test_sweep_writes_every_output_and_tests_only_the_winner(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sweep"

    def no_test_in_trials(*args, **kwargs):
        raise AssertionError("a trial predicted the test split")

    tested = []
    original = evaluate_module.predict_splits

    def count(*args, **kwargs):
        tested.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(finetune_module, "predict_splits", no_test_in_trials)
    monkeypatch.setattr(evaluate_module, "predict_splits", count)
    board = main([str(_recipe_file(folders, out)), "--trials", "2"])

    assert len(tested) == 1  # the winner's test split, once
    for name in ("leaderboard.md", "leaderboard.json", "best_recipe.yaml", "sweep.png", "study.db"):
        assert (out / name).is_file(), name
    trials = sorted((out / "trials").iterdir())
    assert len(trials) == 2 and len(board["trials"]) == 2
    winner = Path(board["best"]["dir"])
    assert winner.parent == out / "trials"
    assert board["best"]["number"] == board["trials"][0]["number"]
    assert (winner / "results.json").is_file() and (winner / "model" / "README.md").is_file()
    assert board["best"]["results"]["test"]["n"] == 6
    assert json.loads((winner / "results.json").read_text())["training"]["epochs"] == 1
    for loser in (t for t in trials if t != winner):
        assert (loser / "model" / "model.safetensors").is_file()
        assert not (loser / "results.json").exists()
    best = load_recipe(out / "best_recipe.yaml")
    assert best.output.dir == str(winner)
    assert best.optim.lr == pytest.approx(board["best"]["params"]["optim.lr"])
    assert f"| 1 | #{board['best']['number']} | complete |" in (out / "leaderboard.md").read_text()


def test_a_killed_sweep_continues_and_resumes_the_killed_trial(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "killed"
    recipe = load_recipe(_recipe_file(folders, out))
    original_save = train_module._save_checkpoint
    saved = []

    def save_then_die(accelerator, run_dir, state) -> None:
        original_save(accelerator, run_dir, state)
        saved.append(run_dir)
        if len(saved) == 2:
            raise KeyboardInterrupt("simulated kill in the second trial")

    monkeypatch.setattr(train_module, "_save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        sweep(recipe, trials=3)
    monkeypatch.setattr(train_module, "_save_checkpoint", original_save)
    killed = saved[1]
    assert [t.state for t in _study(out).trials] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.FAIL,
    ]

    resumed = []
    original_fit = finetune_module.fit

    def record_fit(**kwargs):
        state = original_fit(**kwargs)
        resumed.append((kwargs["run_dir"], len(state.history)))
        return state

    monkeypatch.setattr(finetune_module, "fit", record_fit)
    board = sweep(recipe, trials=3)

    assert board["finished"] == 3
    # The killed trial ran again first, in its folder, from its saved epoch (nothing to train).
    assert resumed[0] == (killed, 1)
    retry = _study(out).trials[2]
    assert retry.user_attrs["retry_of"] == 1 and retry.params == _study(out).trials[1].params
    assert len(list((out / "trials").iterdir())) == 3


def test_search_space_names_a_bad_key(folders: dict[str, Path], tmp_path: Path) -> None:
    raw = _recipe_dict(folders, tmp_path / "run")
    raw["sweep"] = {"space": {"fseb.reg_scael": {"low": 0.1, "high": 1}}}
    with pytest.raises(ConfigError, match=r"sweep.space: 'fseb.reg_scael' is not a recipe key"):
        recipe_from_dict(raw)
    raw["sweep"] = {"space": {"context.kind": {"low": 0.1, "high": 1}}}
    with pytest.raises(ConfigError, match=r"sweep.space.context.kind=.*give choices"):
        recipe_from_dict(raw)
