"""`fseb-ft sweep`: trials are run folders, a killed sweep continues, only the winner is tested."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

import fseb_ft.engine.reevaluate as reevaluate_module
import fseb_ft.engine.run as run_module
import fseb_ft.engine.search as search_module
import fseb_ft.finetune as finetune_module
import fseb_ft.runs.leaderboard as leaderboard_module
from fseb_ft.engine.loop import Trainer
from fseb_ft.engine.search import compare_sweeps, default_space, psmap_point, search_space, sweep
from fseb_ft.engine.trials import PRUNERS, experimental_ok, open_storage, open_study
from fseb_ft.finetune import resolve_recipe
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import (
    ConfigError,
    Recipe,
    SweepParam,
    load_recipe,
    options,
    recipe_from_dict,
)
from fseb_ft.runs.plots import sweep_plot
from fseb_ft.sweep import main
from tests.helpers import kill_after_checkpoint, tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

SPACE = {"optim.lr": {"low": 0.01, "high": 0.1, "log": True}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "ind", "train", {"cat": 8, "dog": 8})
    write_image_folder(root / "ind", "test", {"cat": 3, "dog": 3})
    write_image_folder(root / "ood", "test", {"owl": 3})
    write_image_folder(root / "ood", "val", {"owl": 3})
    return {"ind": root / "ind", "ood": root / "ood"}


def _recipe_file(folders: dict[str, Path], out: Path) -> Path:
    raw = tiny_recipe(folders, out, epochs=1)
    raw["train"]["trackers"] = []
    raw["sweep"] = {"space": SPACE, "pruner": "none"}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=out.name, storage=f"sqlite:///{out / 'study.db'}")


def _retry_of(trial: optuna.trial.FrozenTrial) -> int | None:
    with experimental_ok():
        return RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)


def test_sweep_writes_every_output_and_tests_only_the_winner(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sweep"

    def no_test_in_trials(*args, **kwargs):
        raise AssertionError("a trial predicted the test split")

    tested = []
    original = reevaluate_module.predict_splits

    def count(*args, **kwargs):
        tested.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(run_module, "predict_splits", no_test_in_trials)
    monkeypatch.setattr(reevaluate_module, "predict_splits", count)
    monkeypatch.setattr(leaderboard_module, "sweep_plot", sweep_plot)  # sweep.png is checked
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
    saved = kill_after_checkpoint(monkeypatch, 2)  # in the second trial
    with pytest.raises(KeyboardInterrupt):
        sweep(recipe, trials=3)
    killed = saved[1]
    assert [t.state for t in _study(out).trials] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.FAIL,
    ]

    resumed = []
    original_fit = Trainer.fit

    def record_fit(trainer: Trainer):
        state = original_fit(trainer)
        resumed.append((trainer.run_dir, len(state.history)))
        return state

    monkeypatch.setattr(Trainer, "fit", record_fit)
    board = sweep(recipe, trials=3)

    assert board["finished"] == 3
    # The killed trial ran again first, in its folder, from its saved epoch (nothing to train).
    assert resumed[0] == (killed, 1)
    retry = _study(out).trials[2]
    assert _retry_of(retry) == 1 and retry.params == _study(out).trials[1].params
    assert len(list((out / "trials").iterdir())) == 3


def test_a_sweep_continued_from_another_directory_finds_its_winner(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study stores trial folders relative to the sweep folder; older studies stored them
    relative to the working directory, and their folder is found by its name."""
    first, other = tmp_path / "a", tmp_path / "b"
    first.mkdir(), other.mkdir()
    out = first / "moved"
    recipe_file = _recipe_file(folders, out)
    monkeypatch.chdir(first)
    main([str(recipe_file), "--trials", "1", "output.dir=moved"])
    (trial,) = _study(out).trials
    assert trial.user_attrs["dir"] == f"trials/{sorted((out / 'trials').iterdir())[0].name}"

    monkeypatch.chdir(other)
    board = main([str(recipe_file), "--trials", "1", f"output.dir={out}"])
    assert board["best"]["results"]["test"]["n"] == 6
    assert Path(board["best"]["dir"]) == out / trial.user_attrs["dir"]

    old = json.dumps(f"moved/{trial.user_attrs['dir']}")  # as sweeps stored it before
    with closing(sqlite3.connect(out / "study.db")) as db, db:
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE key = 'dir'", (old,))
    board = main([str(recipe_file), "--trials", "1", f"output.dir={out}"])
    assert board["best"]["results"]["test"]["n"] == 6
    assert Path(board["best"]["dir"]) == out / trial.user_attrs["dir"]


def test_two_workers_on_one_study_run_its_budget_of_trials_together(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "workers"
    recipe = load_recipe(_recipe_file(folders, out))
    both_busy = threading.Barrier(2, timeout=120)  # generous: a loaded machine is slow
    trained: list[str] = []

    def train(trial_recipe: Recipe, callbacks, evaluate_test: bool) -> dict:
        trained.append(trial_recipe.output.dir)
        if len(trained) <= 2:
            both_busy.wait()  # each worker holds a trial while the other does
        time.sleep(0.2)
        value = trial_recipe.optim.lr
        callbacks[0].on_epoch_end(None, {"epoch": 1, "val_nll": value})
        return {"training": {"best_val_nll": value, "epochs": 1}}

    monkeypatch.setattr(search_module, "run", train)
    monkeypatch.setattr(search_module, "WAIT_S", 0.05)
    with ThreadPoolExecutor(2) as workers:
        boards = list(workers.map(lambda _: sweep(recipe, trials=3), range(2)))

    assert [board["finished"] for board in boards] == [3, 3]  # each waited for the other's trial
    assert len(trained) == 3 and len(set(trained)) == 3  # different values, different folders
    states = [t.state for t in _study(out).trials]
    assert states.count(TrialState.COMPLETE) == 3 and TrialState.RUNNING not in states


def test_a_dead_workers_trial_is_retried_by_another_in_its_folder(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "dead"
    recipe = load_recipe(_recipe_file(folders, out))
    # A worker on a machine since lost: its trial #0 is left running, its epoch saved.
    url = f"sqlite:///{out / 'study.db'}"
    out.mkdir()
    study = optuna.create_study(storage=url, study_name=out.name)
    trial = study.ask()
    params = {"optim.lr": trial.suggest_float("optim.lr", 0.01, 0.1, log=True)}
    folder = out / "trials" / search_module._folder_name(params)
    trial.set_user_attr("host", "lost-machine")  # not this one: only its heartbeat tells
    saves = kill_after_checkpoint(monkeypatch)  # the machine is lost after its checkpoint
    with pytest.raises(KeyboardInterrupt):
        finetune_module.run(
            search_module._trial_recipe(recipe, params, folder), evaluate_test=False
        )
    open_storage(url).record_heartbeat(trial._trial_id)
    with closing(sqlite3.connect(out / "study.db")) as db, db:  # its last heartbeat: an hour ago
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')")

    board = sweep(recipe, trials=1)

    assert board["finished"] == 1
    dead, retry = _study(out).trials
    assert dead.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    assert _retry_of(retry) == 0
    assert retry.params == params and retry.user_attrs["dir"] == f"trials/{folder.name}"
    assert saves == [folder]  # the retry resumed from the saved epoch: nothing left to train


def test_every_pruner_of_the_recipe_has_a_builder_and_the_study_gets_it(tmp_path: Path) -> None:
    """A name in ``options.PRUNERS`` without its builder fails here, not in a sweep."""
    assert tuple(PRUNERS) == options.PRUNERS
    expected = {
        "hyperband": optuna.pruners.HyperbandPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "none": optuna.pruners.NopPruner,
    }
    for name in options.PRUNERS:
        raw = {
            "data": {"train": {"source": "sklearn_digits"}},
            "train": {"epochs": 7},
            "output": {"dir": str(tmp_path / name)},
            "sweep": {"space": SPACE, "pruner": name},
        }
        storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
        pruner = open_study(recipe_from_dict(raw), storage, None).pruner
        assert type(pruner) is expected[name]
    assert PRUNERS["hyperband"](7)._max_resource == 7  # type: ignore[attr-defined]


def test_search_space_names_a_bad_key(folders: dict[str, Path], tmp_path: Path) -> None:
    raw = tiny_recipe(folders, tmp_path / "run")
    raw["sweep"] = {"space": {"fseb.reg_scael": {"low": 0.1, "high": 1}}}
    with pytest.raises(ConfigError, match=r"sweep.space: 'fseb.reg_scael' is not a recipe key"):
        recipe_from_dict(raw)
    raw["sweep"] = {"space": {"context.kind": {"low": 0.1, "high": 1}}}
    with pytest.raises(ConfigError, match=r"sweep.space.context.kind=.*give choices"):
        recipe_from_dict(raw)


def test_a_sweep_on_a_validation_ood_sets_auroc_maximises_it(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "ood-sweep"
    owls = {"source": "imagefolder", "path": str(folders["ood"]), "split": "validation", "limit": 2}
    board = main(
        [
            str(_recipe_file(folders, out)),
            "--trials",
            "1",
            f"data.val_ood={{owls_val: {json.dumps(owls)}}}",
            "sweep.metric=ood_owls_val_auroc",
        ]
    )

    assert board["metric"] == "val_ood_owls_val_auroc" and board["direction"] == "maximize"
    assert 0 <= board["best"]["value"] <= 1
    info = json.loads((Path(board["best"]["dir"]) / "run.json").read_text())
    (record,) = info["training"]["history"]
    assert record["val_ood_owls_val_auroc"] == pytest.approx(board["best"]["value"])
    assert info["data"]["val_ood"]["owls_val"]  # its provenance
    assert load_recipe(out / "best_recipe.yaml").train.select_metric == "ood_owls_val_auroc"


def test_a_sweep_without_a_test_split_reports_its_winner_on_validation(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "no-test"
    board = main([str(_recipe_file(folders, out)), "--trials", "1", "data.test=null"])

    results = board["best"]["results"]
    assert results["split"] == "validation" and results["test"]["n"] == 4  # 25 % of 16
    winner = Path(board["best"]["dir"])
    assert (winner / "model" / "README.md").is_file()
    saved = json.loads((out / "leaderboard.json").read_text())
    assert saved["best"]["results"]["split"] == "validation"
    board_md = (out / "leaderboard.md").read_text()
    assert "evaluated once on the validation split" in board_md and "optimistic" in board_md
    assert "| FS-EB · test_byobnet (validation split) |" in board_md


MIXTURE = {
    "kind": "mixture",
    "datasets": [{"source": "sklearn_digits", "split": "test"}],
    "weights": [1, 1],
}


@pytest.mark.parametrize(
    ("sections", "searched"),
    [
        ({"fseb": {"reg_scale": 0}}, ["optim.lr", "fseb.prior_var"]),
        ({}, ["optim.lr", "fseb.prior_var", "fseb.reg_scale", "fseb.prior_cov_diag"]),
        (
            {"fseb": {"prior_std": 0.5}},
            ["optim.lr", "fseb.prior_var", "fseb.prior_std", "fseb.prior_feature_share"],
        ),
        ({"fseb": {"reg_scale": 0, "prior_std": 0.5}, "context": MIXTURE}, None),
        ({"context": MIXTURE}, ["train", "dataset", "mixture"]),
        ({"context": {**MIXTURE, "kind": "dataset", "weights": []}}, ["train", "dataset"]),
        ({"context": {**MIXTURE, "datasets": [*MIXTURE["datasets"]] * 2, "weights": [1, 1, 1]}},
         ["train", "mixture"]),
    ],
)  # fmt: skip
def test_default_space_follows_the_recipes_prior_and_context(
    sections: dict, searched: list[str] | None
) -> None:
    recipe = recipe_from_dict({"data": {"train": {"source": "sklearn_digits"}}, **sections})
    space = default_space(recipe)
    assert search_space(recipe) == space
    if searched is None:  # PS-MAP searches neither its prior's form nor its unused context
        assert list(space) == ["optim.lr", "fseb.prior_var"]
    elif "optim.lr" in searched:
        assert list(space) == searched
    else:
        assert space["context.kind"] == SweepParam(choices=tuple(searched))
    assert space["optim.lr"] == SweepParam(low=5e-4, high=0.015, log=True)  # default lr 0.005
    if "fseb.prior_std" in space:
        # Up to a prior ~700× wider than the pretrained reference's 0.14: PS-MAP in effect.
        assert space["fseb.prior_std"] == SweepParam(low=0.1, high=100.0, log=True)
        assert space["fseb.prior_feature_share"] == SweepParam(low=0.0, high=0.95)
    if "fseb.reg_scale" in space:
        assert space["fseb.reg_scale"].low == 0.01 and space["fseb.prior_cov_diag"].high == 10


def test_a_space_key_is_one_override_its_dotted_key_whole(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"data": {"train": {"source": "sklearn_digits"}}}))
    recipe = load_recipe(
        path,
        [
            "sweep.space.fseb.reg_scale={low: 0.1, high: 1, log: true}",
            "sweep.space.optim.lr={low: 1e-3, high: 0.1}",
            "sweep.space.optim.lr.log=true",
            "sweep.space.context.kind={choices: [train, dataset]}",
        ],
    )
    assert recipe.sweep.space == {
        "fseb.reg_scale": SweepParam(low=0.1, high=1.0, log=True),
        "optim.lr": SweepParam(low=1e-3, high=0.1, log=True),
        "context.kind": SweepParam(choices=("train", "dataset")),
    }
    # The in-memory API reads dotted keys the same way.
    api = resolve_recipe(None, {"sweep.space.fseb.reg_scale": {"low": 0.1, "high": 1, "log": True}})
    assert api.sweep.space == {"fseb.reg_scale": SweepParam(low=0.1, high=1.0, log=True)}
    with pytest.raises(ConfigError) as err:
        load_recipe(path, ["sweep.space.optim.lr.high=0.3"])
    assert str(err.value) == "sweep.space.optim.lr.low=None: give either low and high, or choices"
    with pytest.raises(ConfigError, match=r"^sweep.space: 'optim.lrr' is not a recipe key"):
        load_recipe(path, ["sweep.space.optim.lrr={low: 0.1, high: 1}"])


def test_fsebs_first_point_is_psmaps_winner_with_the_weakest_prior_in_the_space() -> None:
    space = {
        "optim.lr": SweepParam(low=1e-3, high=0.1, log=True),
        "fseb.prior_var": SweepParam(low=0.1, high=10.0, log=True),
        "fseb.reg_scale": SweepParam(low=0.01, high=10.0, log=True),
        "fseb.prior_cov_diag": SweepParam(low=1e-3, high=10.0, log=True),
        "fseb.prior_feature_share": SweepParam(low=0.0, high=0.95),
        "context.kind": SweepParam(choices=("train", "dataset")),
    }
    psmap = {"optim.lr": 0.013, "fseb.prior_var": 2.7}
    assert psmap_point(space, psmap) == {
        "optim.lr": 0.013,
        "fseb.prior_var": 2.7,
        "fseb.reg_scale": 0.01,  # the smallest term
        "fseb.prior_cov_diag": 10.0,  # the loosest prior
    }  # the share and the context kind are the sampler's to choose
    scale_free = {"fseb.prior_std": SweepParam(low=0.1, high=100.0, log=True)}
    assert psmap_point(scale_free, psmap) == {"fseb.prior_std": 100.0}  # lr is not searched


def test_compare_starts_fseb_from_psmaps_winner(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    raw = yaml.safe_load(_recipe_file(folders, out).read_text())
    raw["sweep"]["space"]["fseb.reg_scale"] = {"low": 0.01, "high": 1.0, "log": True}
    recipe = out.parent / "cmp-fseb.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    boards = main([str(recipe), "--trials", "1", "--compare"])
    psmap, fseb = boards["PS-MAP"]["best"]["params"], boards["FS-EB"]["best"]["params"]
    assert set(psmap) == {"optim.lr"}  # PS-MAP does not search the FS-EB-only key
    assert fseb == {"optim.lr": psmap["optim.lr"], "fseb.reg_scale": 0.01}
    assert (out / "comparison.md").is_file()


def test_compare_names_an_fsvi_recipes_arm_fsvi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swept = []

    def fake_sweep(arm: Recipe, trials: int, storage: object, name: str, first: object) -> dict:
        title = find_method(arm.fseb.method).title(arm.fseb)
        swept.append((title, Path(arm.output.dir).name, name, first))
        Path(arm.output.dir).mkdir(parents=True)
        params = {"optim.lr": 0.01}
        return {"best": {"value": 0.5, "number": 0, "params": params, "results": None}}

    monkeypatch.setattr(search_module, "sweep", fake_sweep)
    raw = {
        "data": {"train": {"source": "sklearn_digits"}},
        "fseb": {"method": "fsvi", "reg_scale": 1.0},
        "output": {"dir": str(tmp_path / "cmp")},
        "sweep": {"space": {"optim.lr": {"low": 0.001, "high": 0.1, "log": True}}},
    }
    boards = compare_sweeps(recipe_from_dict(raw), trials=1)
    assert list(boards) == ["PS-MAP", "FS-VI"]
    assert [s[:3] for s in swept] == [
        ("PS-MAP", "psmap", "cmp-psmap"),
        ("FS-VI", "fsvi", "cmp-fsvi"),
    ]
    assert swept[1][3] == {"optim.lr": 0.01}  # FS-VI starts from PS-MAP's winner too
    table = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| FS-VI | 0.5 | #0 | optim.lr=0.01 |" in table
