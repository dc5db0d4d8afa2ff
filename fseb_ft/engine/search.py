"""The hyper-parameter search behind ``fseb-ft sweep``: its space, its trials, its winner.

Optuna's TPE sampler proposes values for the keys of the search space; each trial trains an
ordinary run folder ``OUTPUT/trials/<hash of its values>`` that selects on the sweep's metric
and reports it every epoch to the pruner. Only the winner is evaluated (on the test split, else
validation) and exported. :mod:`fseb_ft.engine.trials` keeps the study's budget among workers;
:mod:`fseb_ft.runs.leaderboard` writes what the sweep reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import optuna
from accelerate import PartialState
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from fseb_ft.engine.callbacks import PruningCallback, TrainingDivergedError
from fseb_ft.engine.loop import NonFiniteLossError
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.engine.run import run
from fseb_ft.engine.trials import (
    DIR_ATTR,
    EPOCHS_ATTR,
    ERROR_ATTR,
    HOST_ATTR,
    PID_ATTR,
    SURPLUS_ATTR,
    TRIALS_DIR,
    ahead_of,
    claimed,
    experimental_ok,
    finished,
    open_storage,
    open_study,
    reclaim,
    requeue_interrupted,
    stop_at_budget,
    tpe_sampler,
    trial_folder,
    trial_rows,
)
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import (
    ConfigError,
    ContextConfig,
    Recipe,
    SweepParam,
    dump_recipe,
    plain_tree,
    recipe_from_dict,
)
from fseb_ft.recipe.options import CONTEXT_KINDS, ContextKind
from fseb_ft.recipe.schema import set_key
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.export import export_run
from fseb_ft.runs.leaderboard import (
    BEST_RECIPE,
    LEADERBOARD_MD,
    comparison_table,
    format_params,
    write_leaderboard,
)
from fseb_ft.runs.rundir import (
    COMPARISON_JSON,
    COMPARISON_MD,
    RECIPE_FILE,
    RESULTS_JSON,
    check_output_dir,
    read_json,
    results_split,
    write_json,
)

__all__ = [
    "STUDY_DB",
    "TRIALS_DIR",
    "WAIT_S",
    "compare_sweeps",
    "default_space",
    "psmap_point",
    "search_space",
    "sweep",
]

STUDY_DB = "study.db"
"""The default storage: an SQLite file in the sweep folder."""
WAIT_S = 30
"""How often a worker with no budget left checks whether the others' trials finished or died."""

# Keys that only act through the function-space term: a PS-MAP sweep (--compare) drops them.
_FSEB_ONLY = (
    "fseb.reg_",
    "fseb.prior_cov_",
    "fseb.prior_std",
    "fseb.prior_feature_share",
    "fseb.forward_mode",
    "context.",
)
# The end of each FS-EB-only range where the function-space term is weakest: nearest PS-MAP.
_WEAKEST_PRIOR = {
    "fseb.reg_scale": "low",
    "fseb.prior_cov_scale": "high",
    "fseb.prior_cov_diag": "high",
    "fseb.prior_std": "high",
}
# Trial outcomes that are results (bad values diverge); anything else is an interruption.
_DIVERGED = (TrainingDivergedError, NonFiniteLossError)


def default_space(recipe: Recipe) -> dict[str, SweepParam]:
    """The search space when ``sweep.space`` is empty (docs/cli.md, "The default space").

    Every recipe: ``optim.lr`` from the recipe's ÷10 to ×3 and ``fseb.prior_var`` in
    [0.1, 10]. PS-MAP (``fseb.reg_scale = 0``) stops there. FS-EB adds its prior's strength and
    shape, in the units the recipe states it in, each range reaching a weak function-space term,
    the nearest FS-EB comes to PS-MAP (weak, not nothing: on CIFAR-10 it still lowered the
    validation NLL, docs/results.md):

    - ``fseb.prior_std`` given: ``fseb.prior_std`` in [0.1, 100] and ``fseb.prior_feature_share``
      in [0, 0.95]. ``reg_scale · R_f`` scales as ``reg_scale / prior_std²`` at a fixed share,
      so ``reg_scale`` is not searched beside it; 0.95 keeps d ≥ 5 % of the prior variance.
    - s and d given: ``fseb.reg_scale`` in [0.01, 10] and ``fseb.prior_cov_diag`` (d) in
      [1e-3, 10]; s stays the recipe's. The corner (0.01, 10) weakens the reference priors'
      term (reg_scale 1, d = 1e-2 or 1) at least 100-fold: a larger d never strengthens it.
    - ``context.kind`` over the kinds the recipe's ``context`` section supports when there are
      several (``dataset`` needs one of ``context.datasets``, ``mixture`` its ``weights``).

    Ranges are searched on a log scale, except the share.
    """
    lr = recipe.optim.lr
    space = {
        "optim.lr": SweepParam(low=lr / 10, high=lr * 3, log=True),
        "fseb.prior_var": SweepParam(low=0.1, high=10.0, log=True),
    }
    if recipe.fseb.is_ps_map:
        return space
    if recipe.fseb.prior_std is not None:
        space["fseb.prior_std"] = SweepParam(low=0.1, high=100.0, log=True)
        space["fseb.prior_feature_share"] = SweepParam(low=0.0, high=0.95)
    else:
        space["fseb.reg_scale"] = SweepParam(low=0.01, high=10.0, log=True)
        space["fseb.prior_cov_diag"] = SweepParam(low=1e-3, high=10.0, log=True)
    kinds = _context_kinds(recipe.context)
    if len(kinds) > 1:
        space["context.kind"] = SweepParam(choices=kinds)
    return space


def _context_kinds(context: ContextConfig) -> tuple[str, ...]:
    """The context kinds that ``context``'s datasets and weights make valid (its own included)."""
    kinds = []
    for kind in CONTEXT_KINDS:
        try:
            dataclasses.replace(context, kind=cast(ContextKind, kind))
        except ConfigError:
            continue
        kinds.append(kind)
    return tuple(kinds)


def search_space(recipe: Recipe) -> dict[str, SweepParam]:
    """The recipe's ``sweep.space``, or :func:`default_space` when it is empty."""
    return dict(recipe.sweep.space) or default_space(recipe)


def sweep(
    recipe: Recipe,
    trials: int,
    storage: str | None = None,
    study_name: str | None = None,
    first: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or continue) the study until ``trials`` trials have finished; report the winner.

    Finished means complete, pruned or diverged; an interrupted trial is run again with the same
    values in the same folder. ``trials`` is the study's budget, shared by every worker running
    it: a worker asks for a trial only while the finished and running ones leave room, then
    waits while the others' trials finish, and runs again any whose worker died. ``first``
    gives values of the study's first trial (queued only while the study has no trial; keys it
    lacks are sampled). Writes ``leaderboard.md`` / ``.json``, ``best_recipe.yaml`` and
    ``sweep.png`` to ``recipe.output.dir``, evaluates the winner's test split once and exports
    its model folder. Returns the leaderboard (as in ``leaderboard.json``), with the winner's
    results under ``best.results``.

    Raises:
        ConfigError: ``trials`` < 1, or the stored study optimises another metric.
    """
    if trials < 1:
        raise ConfigError(f"--trials={trials}: must be ≥ 1")
    # The sweep prints a line per trial; Optuna's warnings for failed trials add tracebacks.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = Path(recipe.output.dir)
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    space = search_space(recipe)
    url = storage or f"sqlite:///{(out / STUDY_DB).resolve()}"
    study = open_study(recipe, open_storage(url), study_name)
    requeue_interrupted(study)
    if first and not study.get_trials(deepcopy=False):
        study.enqueue_trial(dict(first))
    objective = _objective(study, recipe, space, trials)
    while len(finished(study)) < trials:
        if len(claimed(study.get_trials(deepcopy=False))) < trials:
            study.optimize(objective, catch=_DIVERGED, callbacks=[stop_at_budget(trials)])
        else:  # the others' trials fill the budget: wait, to run again any whose worker dies
            time.sleep(WAIT_S)
            reclaim(study)
    return _report(study, recipe, space)


def compare_sweeps(
    recipe: Recipe, trials: int, storage: str | None = None, study_name: str | None = None
) -> dict[str, dict[str, Any]]:
    """Sweep PS-MAP (over its own space) and the recipe's FS-EB, with the same trial budget.

    The sweeps go to ``output.dir``/psmap and /fseb (studies ``NAME-psmap`` and ``NAME-fseb``;
    /fsvi and ``NAME-fsvi``, labelled FS-VI, for ``fseb.method=fsvi``); their winners are
    printed side by side and written to ``comparison.md`` / ``.json``. FS-EB's first trial is
    the point of its space nearest PS-MAP's winner (:func:`psmap_point`), so its winner is no
    worse on validation than that point, whatever the budget: with few trials, a sampler alone
    may never reach the weak-prior corner nearest PS-MAP.

    Raises:
        ConfigError: the recipe's ``fseb.reg_scale`` is 0, so it has no FS-EB setting.
    """
    if recipe.fseb.is_ps_map:
        raise ConfigError(
            "fseb.reg_scale=0: --compare sweeps PS-MAP beside the recipe's FS-EB, so the recipe "
            "must set fseb.reg_scale > 0"
        )
    out = Path(recipe.output.dir)
    base = study_name or out.name
    psmap_space = {k: v for k, v in recipe.sweep.space.items() if not k.startswith(_FSEB_ONLY)}
    arms = {
        "PS-MAP": dataclasses.replace(
            recipe,
            fseb=dataclasses.replace(recipe.fseb, method="fseb", reg_scale=0.0),
            sweep=dataclasses.replace(recipe.sweep, space=psmap_space),
        ),
        find_method(recipe.fseb.method).title(recipe.fseb): recipe,  # FS-EB, FS-VI, L2-SP
    }
    boards: dict[str, dict[str, Any]] = {}
    for label, arm in arms.items():
        slug = label.replace("-", "").lower()
        arm = dataclasses.replace(arm, output=dataclasses.replace(arm.output, dir=str(out / slug)))
        psmap = boards.get("PS-MAP", {}).get("best")
        first = psmap_point(search_space(arm), psmap["params"]) if psmap else None
        boards[label] = sweep(arm, trials, storage, f"{base}-{slug}", first)
    table = comparison_table(boards, recipe.sweep.metric)
    if PartialState().is_main_process:
        write_text(out / COMPARISON_MD, f"# {recipe.model.name}: sweeps compared\n\n{table}")
        write_json(out / COMPARISON_JSON, boards)
        print(f"\n{table}written to {out}")
    return boards


def psmap_point(space: Mapping[str, SweepParam], psmap: Mapping[str, Any]) -> dict[str, Any]:
    """The point of FS-EB's ``space`` nearest PS-MAP's winning values ``psmap``.

    The keys both search take PS-MAP's values; each FS-EB range that sets the prior's strength
    takes the end where the function-space term is weakest (the smallest ``reg_scale``, the
    largest ``prior_std``, s or d). Other keys (``prior_feature_share``, ``context.kind``) are
    left out, for the sampler to choose.
    """
    point = {key: value for key, value in psmap.items() if key in space}
    for key, end in _WEAKEST_PRIOR.items():
        param = space.get(key)
        if param is not None and not param.choices:
            point[key] = param.low if end == "low" else param.high
    return point


def _suggest(trial: optuna.Trial, key: str, param: SweepParam) -> Any:
    if param.choices:
        return trial.suggest_categorical(key, list(param.choices))
    # Without choices a parameter is a range: its low and high are set.
    return trial.suggest_float(key, cast(float, param.low), cast(float, param.high), log=param.log)


def _objective(
    study: optuna.Study, recipe: Recipe, space: Mapping[str, SweepParam], trials: int
) -> Callable[[optuna.Trial], float]:
    """Train one trial's run folder and return its best validation metric.

    Raises ``optuna.TrialPruned`` for a trial over the budget (before any value is drawn) or one
    the pruner stops, and the divergence errors for a trial whose training diverged.
    """
    out, metric = Path(recipe.output.dir), recipe.sweep.metric

    def objective(trial: optuna.Trial) -> float:
        trials_now = study.get_trials(deepcopy=False)
        position = len(ahead_of(trials_now, trial.number)) + 1
        if position > trials:
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise optuna.TrialPruned("the other workers' trials took the budget")
        # Seeded by its number: a continued sweep draws new values, and so does each worker.
        study.sampler = tpe_sampler(recipe.sweep.seed + trial.number)
        # The process before the host: a worker that sees this host also sees a process to ask.
        trial.set_user_attr(PID_ATTR, os.getpid())
        trial.set_user_attr(HOST_ATTR, socket.gethostname())
        params = {key: _suggest(trial, key, param) for key, param in space.items()}
        stored = f"{TRIALS_DIR}/{_folder_name(params)}"  # a retry's values: the same folder
        trial.set_user_attr(DIR_ATTR, stored)  # relative to the sweep folder, wherever it is
        folder = trial_folder(out, stored)
        with experimental_ok():
            retried = RetryHeartbeatStaleTrialCallback.retried_trial_number(
                next(t for t in trials_now if t.number == trial.number)
            )
        again = "" if retried is None else f", #{retried} again, resuming in {folder.name}"
        print(
            f"trial {position}/{trials} (#{trial.number}{again}) {format_params(params)}",
            flush=True,
        )
        try:
            training = run(
                _trial_recipe(recipe, params, folder),
                callbacks=[PruningCallback(trial, metric, recipe.train.epochs)],
                evaluate_test=False,
            )["training"]
        except optuna.TrialPruned as pruned:
            print(f"  pruned: {pruned}", flush=True)
            raise
        except _DIVERGED as err:
            trial.set_user_attr(ERROR_ATTR, str(err))
            print(f"  diverged ({type(err).__name__}); counted as finished", flush=True)
            raise
        value = training[f"best_val_{metric}"]
        trial.set_user_attr(EPOCHS_ATTR, training["epochs"])
        best = _best(study, value)
        print(f"  val_{metric}={value:.4g} (best so far {best:.4g})", flush=True)
        return value

    return objective


def _best(study: optuna.Study, value: float) -> float:
    """The best of ``value`` and the study's completed trials' values."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    done = [cast(float, t.value) for t in complete]  # a completed trial has its value
    pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    return pick([value, *done])


def _folder_name(params: Mapping[str, Any]) -> str:
    """A short hash of the trial's values: the same values always train in the same folder."""
    text = json.dumps(params, sort_keys=True)
    return f"t-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def _trial_recipe(recipe: Recipe, params: Mapping[str, Any], folder: Path) -> Recipe:
    """``recipe`` with the trial's values, selecting on the sweep's metric, in ``folder``."""
    raw = plain_tree(dataclasses.asdict(recipe))
    for key, value in params.items():
        set_key(raw, key.split("."), value)
    set_key(raw, ["train", "select_metric"], recipe.sweep.metric)
    set_key(raw, ["output", "dir"], str(folder))
    return recipe_from_dict(raw)


def _report(study: optuna.Study, recipe: Recipe, space: Mapping[str, SweepParam]) -> dict[str, Any]:
    """Write the leaderboard, the winning recipe and the plot; evaluate the winner once."""
    out = Path(recipe.output.dir)
    rows = trial_rows(study, recipe.sweep.metric, out)
    board: dict[str, Any] = {
        "study": study.study_name,
        "metric": f"val_{recipe.sweep.metric}",
        "direction": study.direction.name.lower(),
        "space": {k: dataclasses.asdict(v) for k, v in space.items()},
        "finished": len(finished(study)),
        "best": None,
        "trials": rows,
    }
    complete = [r for r in rows if r["state"] == "complete"]
    if complete:
        winner = complete[0]
        folder = Path(winner["dir"])
        best_recipe = _trial_recipe(recipe, winner["params"], folder)
        write_text(out / BEST_RECIPE, dump_recipe(best_recipe))
        board["best"] = {**winner, "results": _evaluate_winner(folder, recipe.train.cpu)}
    table = write_leaderboard(out, board, recipe, space)
    print(f"\n{table}")
    if board["best"] is None:
        print(f"no trial completed yet; written to {out}")
    else:
        results = board["best"]["results"]
        split = f", evaluated on the {results_split(results)} split" if results else ""
        print(f"winner: trial #{board['best']['number']} in {board['best']['dir']}{split}")
        print(f"its recipe: {out / BEST_RECIPE}; leaderboard: {out / LEADERBOARD_MD}")
    return board


def _evaluate_winner(folder: Path, cpu: bool) -> dict[str, Any] | None:
    """The winner's test (and OOD) results, predicted once (on the validation split when the
    recipe has no ``data.test``); its model folder exported.

    ``None`` when the winner's run folder is not on this machine (a study shared by several).
    """
    if not (folder / RECIPE_FILE).is_file():
        print(f"the winner's run folder {folder} is not on this machine: evaluate it where it is")
        return None
    if (folder / RESULTS_JSON).is_file():  # evaluated by an earlier invocation of the sweep
        return read_json(folder / RESULTS_JSON)
    results = evaluate_run(folder, cpu=cpu)
    export_run(folder)
    return results
