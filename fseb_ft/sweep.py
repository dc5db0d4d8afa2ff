"""Search a recipe's hyper-parameters on validation data with Optuna: ``fseb-ft sweep``.

    fseb-ft sweep RECIPE.yaml [section.key=value ...] --trials N [--storage URL] [--compare]

Optuna's TPE sampler proposes values for the keys of ``sweep.space`` (a default space when it
is empty); each trial is an ordinary run folder ``OUTPUT/trials/<hash of its values>``, trained
with ``train.select_metric`` set to ``sweep.metric`` and reporting that validation metric every
epoch to a Hyperband or successive-halving pruner. Trials never predict the test split: only the
winner is evaluated (``results.json``; on the validation split when the recipe has no
``data.test``, which the leaderboard says) and exported (``model/``). The study lives in
``sqlite:///OUTPUT/study.db`` unless ``--storage`` names another Optuna RDB URL, so rerunning
the same command continues a killed sweep: finished trials count towards ``--trials``, and a
trial that was interrupted is run again with its values, resuming in its folder. Several workers
(processes, or machines sharing a database) may run the same command on one study: ``--trials``
is the study's budget, and a trial whose worker died (its heartbeat stopped) is run again by
another, resuming in the same folder when that worker sees it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from accelerate import PartialState
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from fseb_ft.cli import run_entry
from fseb_ft.engine.callbacks import PruningCallback
from fseb_ft.engine.loop import NonFiniteLossError, TrainingDivergedError
from fseb_ft.evaluate import evaluate_run
from fseb_ft.evaluation.metrics import higher_is_better
from fseb_ft.finetune import RecipeMismatchError, run
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import (
    ConfigError,
    ContextConfig,
    Recipe,
    SweepParam,
    dump_recipe,
    load_recipe,
    plain_tree,
    recipe_from_dict,
)
from fseb_ft.recipe.options import CONTEXT_KINDS
from fseb_ft.recipe.schema import set_key
from fseb_ft.runs.atomic import DiskFullError, write_text
from fseb_ft.runs.export import export_run
from fseb_ft.runs.plots import sweep_plot
from fseb_ft.runs.report import markdown_table, method_title, split_note
from fseb_ft.runs.rundir import (
    COMPARISON_JSON,
    COMPARISON_MD,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_MD,
    check_output_dir,
    read_json,
    results_split,
    write_json,
)

__all__ = ["compare_sweeps", "default_space", "main", "psmap_point", "search_space", "sweep"]

logger = logging.getLogger("fseb_ft")

STUDY_DB = "study.db"
"""The default storage: an SQLite file in the sweep folder."""
TRIALS_DIR = "trials"
"""The folder of the trials' run folders inside the sweep folder."""
LEADERBOARD_MD = "leaderboard.md"
LEADERBOARD_JSON = "leaderboard.json"
BEST_RECIPE = "best_recipe.yaml"
"""The winner's resolved recipe, its ``output.dir`` the winner's run folder."""
SWEEP_PLOT = "sweep.png"
HEARTBEAT_S = 60
"""How often a running trial's worker records in the study that it is alive (Optuna's heartbeat)."""
GRACE_S = 300
"""How long a trial's heartbeat may be silent before the other workers fail it and run it again."""
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
_ERROR, _HOST, _PID, _DIR, _EPOCHS = "error", "host", "pid", "dir", "epochs"
_RETRY_OF = "retry_of"  # how sweeps marked a retry before Optuna's retry callback did
# A trial asked for when the other workers' trials had taken the whole budget: never run.
_SURPLUS = "surplus"


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
            dataclasses.replace(context, kind=kind)
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
    study = _study(recipe, _storage(url), study_name)
    _requeue_interrupted(study)
    if first and not study.get_trials(deepcopy=False):
        study.enqueue_trial(dict(first))
    objective = _objective(study, recipe, space, trials)
    while len(_finished(study)) < trials:
        if len(_claimed(study.get_trials(deepcopy=False))) < trials:
            study.optimize(objective, catch=_DIVERGED, callbacks=[_stop_at_budget(trials)])
        else:  # the others' trials fill the budget: wait, to run again any whose worker dies
            time.sleep(WAIT_S)
            _reclaim(study)
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
        recipe.fseb.method_name: recipe,  # FS-EB, or FS-VI for fseb.method=fsvi
    }
    boards: dict[str, dict[str, Any]] = {}
    for label, arm in arms.items():
        slug = label.replace("-", "").lower()
        arm = dataclasses.replace(arm, output=dataclasses.replace(arm.output, dir=str(out / slug)))
        psmap = boards.get("PS-MAP", {}).get("best")
        first = psmap_point(search_space(arm), psmap["params"]) if psmap else None
        boards[label] = sweep(arm, trials, storage, f"{base}-{slug}", first)
    table = _comparison_table(boards, recipe.sweep.metric)
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


# --------------------------------------------------------------------------------------------
# Trials
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _experimental_ok() -> Iterator[None]:
    """Silence Optuna's warning that its heartbeat and retries are experimental (since 2.8)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


def _storage(url: str, tries: int = 4) -> RDBStorage:
    """``url``'s storage, where a running trial whose heartbeat stops is failed and queued again.

    Workers started together on a new database race to create its tables: a loser tries again.
    """
    try:
        with _experimental_ok():
            return RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
            )
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):
        if tries == 1:
            raise
        time.sleep(0.1)
        return _storage(url, tries - 1)


def _sampler(seed: int) -> optuna.samplers.TPESampler:
    """TPE, its proposals kept away from the values other workers are training (constant liar)."""
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _study(recipe: Recipe, storage: RDBStorage, study_name: str | None) -> optuna.Study:
    """Create the study, or load it when it exists (a continued sweep, another worker)."""
    metric = recipe.sweep.metric
    pruners: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
        "hyperband": lambda: optuna.pruners.HyperbandPruner(
            min_resource=1, max_resource=recipe.train.epochs
        ),
        "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1),
        "none": optuna.pruners.NopPruner,
    }
    name = study_name or Path(recipe.output.dir).resolve().name
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize" if higher_is_better(metric) else "minimize",
        pruner=pruners[recipe.sweep.pruner](),
        sampler=_sampler(recipe.sweep.seed),  # reseeded for each trial by its number
        load_if_exists=True,
    )
    stored = study.user_attrs.get("metric")
    if stored is None:
        study.set_user_attr("metric", metric)
    elif stored != metric:
        raise ConfigError(
            f"sweep.metric={metric!r}: study {name!r} already optimises validation {stored!r}; "
            "give another --study-name or output.dir to start a new sweep"
        )
    return study


def _counts(t: FrozenTrial) -> bool:
    """``t`` counts towards ``--trials``: complete, pruned, or failed by diverging."""
    if t.state == TrialState.PRUNED:
        return _SURPLUS not in t.user_attrs
    return t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and _ERROR in t.user_attrs)


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that count towards ``--trials``: complete, pruned, or failed by diverging."""
    return [t for t in study.get_trials(deepcopy=False) if _counts(t)]


def _claimed(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials of ``trials`` that use the budget: finished ones and running ones."""
    return [t for t in trials if _counts(t) or t.state == TrialState.RUNNING]


def _ahead_of(trials: Sequence[FrozenTrial], number: int) -> list[FrozenTrial]:
    """The trials numbered below ``number`` that use the budget, queued ones included.

    Numbers follow creation and Optuna runs a queued trial before it creates one, so a trial
    still queued below ``number`` will run too. Counting them, each worker decides alone, and
    the same way, which trials are over the budget.
    """
    ahead = [t for t in trials if t.number < number]
    return [*_claimed(ahead), *(t for t in ahead if t.state == TrialState.WAITING)]


def _stop_at_budget(trials: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    """A callback that stops ``study.optimize`` when finished and running trials fill the budget.

    Trials of dead workers are failed first, to leave room for their retries. Optuna's
    ``MaxTrialsCallback`` counts trials by state; here a failed trial counts only when it
    diverged (an interrupted one is run again) and a surplus (pruned) trial not at all.
    """

    def stop(study: optuna.Study, _trial: FrozenTrial) -> None:
        _reclaim(study)
        if len(_claimed(study.get_trials(deepcopy=False))) >= trials:
            study.stop()

    return stop


def _reclaim(study: optuna.Study) -> None:
    """Fail the running trials whose worker is gone and queue them again, values and all.

    Gone: its heartbeat stopped (another machine, RDBStorage's callback queues it), or its
    process on this machine is dead, seen at once. Trials of live workers are left alone.
    """
    with _experimental_ok():
        optuna.storages.fail_stale_trials(study)
        host = socket.gethostname()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get(_HOST) != host or _alive(t.user_attrs.get(_PID)):
                continue
            try:
                failed = study.tell(t.number, state=TrialState.FAIL)
            except (ValueError, UpdateFinishedTrialError):  # failed meanwhile by another worker
                continue
            RetryHeartbeatStaleTrialCallback()(study, failed)


def _requeue_interrupted(study: optuna.Study) -> None:
    """Queue again each trial that was killed or interrupted (Ctrl-C), so it resumes in its folder.

    Each is queued once: a trial in the history of a retry (one that was not surplus) is not.
    """
    _reclaim(study)
    trials = study.get_trials(deepcopy=False)
    with _experimental_ok():
        retries = [t for t in trials if _SURPLUS not in t.user_attrs]
        retried = {n for t in retries for n in RetryHeartbeatStaleTrialCallback.retry_history(t)}
        retried |= {t.user_attrs.get(_RETRY_OF) for t in trials}  # sweeps before heartbeats
        for t in trials:
            interrupted = t.state == TrialState.FAIL and _ERROR not in t.user_attrs
            if interrupted and t.number not in retried and t.params:
                RetryHeartbeatStaleTrialCallback()(study, t)


def _alive(pid: int | None) -> bool:
    """Whether the process ``pid`` of this machine runs; unknown (``None``) counts as alive, for
    the heartbeat to settle."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _suggest(trial: optuna.Trial, key: str, param: SweepParam) -> Any:
    if param.choices:
        return trial.suggest_categorical(key, list(param.choices))
    return trial.suggest_float(key, param.low, param.high, log=param.log)


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
        position = len(_ahead_of(trials_now, trial.number)) + 1
        if position > trials:
            trial.set_user_attr(_SURPLUS, True)
            raise optuna.TrialPruned("the other workers' trials took the budget")
        # Seeded by its number: a continued sweep draws new values, and so does each worker.
        study.sampler = _sampler(recipe.sweep.seed + trial.number)
        # The process before the host: a worker that sees this host also sees a process to ask.
        trial.set_user_attr(_PID, os.getpid())
        trial.set_user_attr(_HOST, socket.gethostname())
        params = {key: _suggest(trial, key, param) for key, param in space.items()}
        folder = out / TRIALS_DIR / _folder_name(params)  # a retry's values: the same folder
        trial.set_user_attr(_DIR, str(folder))
        with _experimental_ok():
            retried = RetryHeartbeatStaleTrialCallback.retried_trial_number(
                next(t for t in trials_now if t.number == trial.number)
            )
        again = "" if retried is None else f", #{retried} again, resuming in {folder.name}"
        print(
            f"trial {position}/{trials} (#{trial.number}{again}) {_fmt_params(params)}", flush=True
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
            trial.set_user_attr(_ERROR, str(err))
            print(f"  diverged ({type(err).__name__}); counted as finished", flush=True)
            raise
        value = training[f"best_val_{metric}"]
        trial.set_user_attr(_EPOCHS, training["epochs"])
        best = _best(study, value)
        print(f"  val_{metric}={value:.4g} (best so far {best:.4g})", flush=True)
        return value

    return objective


def _best(study: optuna.Study, value: float) -> float:
    """The best of ``value`` and the study's completed trials' values."""
    done = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
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


# --------------------------------------------------------------------------------------------
# The report: leaderboard, winner, plot
# --------------------------------------------------------------------------------------------


def _report(study: optuna.Study, recipe: Recipe, space: Mapping[str, SweepParam]) -> dict[str, Any]:
    """Write the leaderboard, the winning recipe and the plot; evaluate the winner once."""
    out = Path(recipe.output.dir)
    metric = recipe.sweep.metric
    rows = _rows(study, metric)
    board: dict[str, Any] = {
        "study": study.study_name,
        "metric": f"val_{metric}",
        "direction": study.direction.name.lower(),
        "space": {k: dataclasses.asdict(v) for k, v in space.items()},
        "finished": len(_finished(study)),
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
    write_json(out / LEADERBOARD_JSON, board)
    table = _leaderboard_table(rows, metric)
    title = f"# Sweep {study.study_name}: {method_title(recipe)}, validation {metric}\n\n"
    write_text(out / LEADERBOARD_MD, title + table + _winner_markdown(board["best"], recipe))
    scored = [r for r in rows if r["value"] is not None]
    if scored:
        ranges = {k: (p.low, p.high, p.log) for k, p in space.items() if not p.choices}
        sweep_plot(scored, metric, out / SWEEP_PLOT, ranges, title=title[2:].strip())
    print(f"\n{table}")
    if board["best"] is None:
        print(f"no trial completed yet; written to {out}")
    else:
        results = board["best"]["results"]
        split = f", evaluated on the {results_split(results)} split" if results else ""
        print(f"winner: trial #{board['best']['number']} in {board['best']['dir']}{split}")
        print(f"its recipe: {out / BEST_RECIPE}; leaderboard: {out / LEADERBOARD_MD}")
    return board


def _rows(study: optuna.Study, metric: str) -> list[dict[str, Any]]:
    """One row per finished trial, best first: complete ones, then pruned, then diverged."""
    sign = -1.0 if higher_is_better(metric) else 1.0
    order = {"complete": 0, "pruned": 1, "diverged": 2}
    rows = []
    for t in _finished(study):
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(
            t.state, "diverged"
        )
        rows.append(
            {
                "number": t.number,
                "state": state,
                "value": t.value if state != "diverged" else None,
                "epochs": t.user_attrs.get(_EPOCHS, t.last_step),
                "params": t.params,
                "dir": t.user_attrs.get(_DIR),
            }
        )
    rows.sort(key=lambda r: (order[r["state"]], sign * (r["value"] or 0.0), r["number"]))
    return rows


def _leaderboard_table(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    keys = sorted({k for r in rows for k in r["params"]})
    head = ["rank", "trial", "state", f"val_{metric}", "epochs", *keys, "folder"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in enumerate(rows, 1):
        value = "–" if r["value"] is None else f"{r['value']:.4g}"
        params = [_fmt_value(r["params"].get(k, "–")) for k in keys]
        folder = Path(r["dir"]).name if r["dir"] else "–"
        cells = [str(rank), f"#{r['number']}", r["state"], value, str(r["epochs"] or "–")]
        lines.append("| " + " | ".join([*cells, *params, folder]) + " |")
    return "\n".join(lines) + "\n"


def _winner_markdown(best: Mapping[str, Any] | None, recipe: Recipe) -> str:
    """The leaderboard's section on the winner's results: the split they are on (validation
    without a test split, with why that is optimistic) and their table; empty without them."""
    if best is None or best["results"] is None:
        return ""
    results = best["results"]
    where = Path(best["dir"]) / RESULTS_MD
    return (
        f"\n## Winner: trial #{best['number']}, evaluated once on the "
        f"{results_split(results)} split\n\n{split_note(results)}"
        f"{markdown_table({method_title(recipe): results})}\nIn `{where}`.\n"
    )


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
    results = dict(evaluate_run(folder, cpu=cpu))
    export_run(folder)
    return results


def _comparison_table(boards: Mapping[str, Mapping[str, Any]], metric: str) -> str:
    """Both winners: their validation metric and values, then their test results."""
    lines = [f"| sweep winner | val_{metric} | trial | values |", "|---|---|---|---|"]
    results = {}
    for label, board in boards.items():
        best = board["best"]
        if best is None:
            lines.append(f"| {label} | – | – | no trial completed |")
            continue
        value = f"{best['value']:.4g}"
        lines.append(f"| {label} | {value} | #{best['number']} | {_fmt_params(best['params'])} |")
        if best["results"] is not None:
            results[label] = best["results"]
    test = f"\n{markdown_table(results)}" if results else ""
    return "\n".join(lines) + "\n" + test


def _fmt_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _fmt_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt_value(v)}" for k, v in params.items())


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------

_CLI_USAGE = """Search a recipe's hyper-parameters on a validation metric with Optuna.

Each trial is a run folder OUTPUT/trials/<hash>; only the winner's test split is evaluated.
Writes OUTPUT/leaderboard.md and .json, best_recipe.yaml and sweep.png. The search space is the
recipe's sweep section (docs/recipes.md). Rerunning the same command continues the sweep; running
it several times at once runs trials in parallel, sharing the --trials budget (docs/cli.md)."""


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft sweep") -> dict[str, Any]:
    """Parse ``RECIPE [key=value ...] --trials N [--storage URL] [--study-name NAME]``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=_CLI_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", type=Path, help="YAML recipe (see recipes/)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    parser.add_argument(
        "--trials",
        type=int,
        default=20,
        help="finished trials to reach, all workers of the study together (default 20)",
    )
    parser.add_argument(
        "--storage",
        help="Optuna storage URL, e.g. postgresql+psycopg2://user:pass@host/db to share one study "
        "between machines (default: sqlite:///OUTPUT/study.db)",
    )
    parser.add_argument("--study-name", help="study name (default: the output folder's name)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also sweep PS-MAP (fseb.reg_scale=0, over lr and prior_var) with the same budget "
        "into OUTPUT/psmap, the recipe's FS-EB into OUTPUT/fseb, and print both winners",
    )
    args = parser.parse_intermixed_args(argv)
    configure_logging()
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.compare:
            return compare_sweeps(recipe, args.trials, args.storage, args.study_name)
        return sweep(recipe, args.trials, args.storage, args.study_name)
    except (ConfigError, RecipeMismatchError) as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    except DiskFullError as err:
        parser.exit(1, f"{prog}: error: {err}\n")


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.sweep")
