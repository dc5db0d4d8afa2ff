"""A sweep's Optuna study and its trials' bookkeeping, shared by every worker running it.

Which trials count towards the budget (``--trials``), which are over it, which worker died and
whose trial is run again: each worker decides alone, from the study, the same way. The study
lives in an RDB storage whose heartbeat fails a trial that stops reporting; a trial failed by a
dead worker or an interruption is queued again with its values, to resume in its folder.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePath
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from fseb_ft.evaluation.metrics import higher_is_better
from fseb_ft.recipe import ConfigError, Recipe

__all__ = [
    "DIR_ATTR",
    "EPOCHS_ATTR",
    "ERROR_ATTR",
    "GRACE_S",
    "HEARTBEAT_S",
    "HOST_ATTR",
    "PID_ATTR",
    "PRUNERS",
    "SURPLUS_ATTR",
    "TRIALS_DIR",
    "ahead_of",
    "claimed",
    "experimental_ok",
    "finished",
    "open_storage",
    "open_study",
    "reclaim",
    "requeue_interrupted",
    "stop_at_budget",
    "tpe_sampler",
    "trial_folder",
    "trial_rows",
]

HEARTBEAT_S = 60
"""How often a running trial's worker records in the study that it is alive (Optuna's heartbeat)."""
GRACE_S = 300
"""How long a trial's heartbeat may be silent before the other workers fail it and run it again."""

# The trial's user attributes a sweep records.
ERROR_ATTR = "error"
"""Why the trial diverged: a failed trial with it is a result, one without it an interruption."""
HOST_ATTR = "host"
"""The machine of the trial's worker."""
PID_ATTR = "pid"
"""The process of the trial's worker, to tell at once that a worker on this machine died."""
DIR_ATTR = "dir"
"""The trial's run folder relative to the sweep folder, ``trials/<name>``
(:func:`trial_folder`)."""
EPOCHS_ATTR = "epochs"
"""The epochs a completed trial trained."""
SURPLUS_ATTR = "surplus"
"""A trial asked for when the other workers' trials had taken the whole budget: never run."""
TRIALS_DIR = "trials"
"""The folder of the trials' run folders inside the sweep folder."""
_RETRY_OF = "retry_of"  # how sweeps marked a retry before Optuna's retry callback did


@contextlib.contextmanager
def experimental_ok() -> Iterator[None]:
    """Silence Optuna's warning that its heartbeat and retries are experimental (since 2.8)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


def open_storage(url: str, tries: int = 4) -> RDBStorage:
    """``url``'s storage, where a running trial whose heartbeat stops is failed and queued again.

    Workers started together on a new database race to create its tables: a loser tries again.
    """
    try:
        with experimental_ok():
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
        return open_storage(url, tries - 1)


def tpe_sampler(seed: int) -> optuna.samplers.TPESampler:
    """TPE, its proposals kept away from the values other workers are training (constant liar)."""
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


PRUNERS: dict[str, Callable[[int], optuna.pruners.BasePruner]] = {
    "hyperband": lambda epochs: optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs),
    "successive_halving": lambda epochs: optuna.pruners.SuccessiveHalvingPruner(min_resource=1),
    "none": lambda epochs: optuna.pruners.NopPruner(),
}
"""``sweep.pruner``'s builders, by name, from a trial's epochs (its largest resource): the names
must equal :data:`fseb_ft.recipe.options.PRUNERS` (a test checks)."""


def open_study(recipe: Recipe, storage: RDBStorage, study_name: str | None) -> optuna.Study:
    """Create the study, or load it when it exists (a continued sweep, another worker).

    Raises:
        ConfigError: the stored study optimises another metric than ``sweep.metric``.
    """
    metric = recipe.sweep.metric
    name = study_name or Path(recipe.output.dir).resolve().name
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize" if higher_is_better(metric) else "minimize",
        pruner=PRUNERS[recipe.sweep.pruner](recipe.train.epochs),
        sampler=tpe_sampler(recipe.sweep.seed),  # reseeded for each trial by its number
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
        return SURPLUS_ATTR not in t.user_attrs
    return t.state == TrialState.COMPLETE or (
        t.state == TrialState.FAIL and ERROR_ATTR in t.user_attrs
    )


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that count towards ``--trials``: complete, pruned, or failed by diverging."""
    return [t for t in study.get_trials(deepcopy=False) if _counts(t)]


def claimed(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials of ``trials`` that use the budget: finished ones and running ones."""
    return [t for t in trials if _counts(t) or t.state == TrialState.RUNNING]


def ahead_of(trials: Sequence[FrozenTrial], number: int) -> list[FrozenTrial]:
    """The trials numbered below ``number`` that use the budget, queued ones included.

    Numbers follow creation and Optuna runs a queued trial before it creates one, so a trial
    still queued below ``number`` will run too. Counting them, each worker decides alone, and
    the same way, which trials are over the budget.
    """
    ahead = [t for t in trials if t.number < number]
    return [*claimed(ahead), *(t for t in ahead if t.state == TrialState.WAITING)]


def stop_at_budget(trials: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    """A callback that stops ``study.optimize`` when finished and running trials fill the budget.

    Trials of dead workers are failed first, to leave room for their retries. Optuna's
    ``MaxTrialsCallback`` counts trials by state; here a failed trial counts only when it
    diverged (an interrupted one is run again) and a surplus (pruned) trial not at all.
    """

    def stop(study: optuna.Study, _trial: FrozenTrial) -> None:
        reclaim(study)
        if len(claimed(study.get_trials(deepcopy=False))) >= trials:
            study.stop()

    return stop


def reclaim(study: optuna.Study) -> None:
    """Fail the running trials whose worker is gone and queue them again, values and all.

    Gone: its heartbeat stopped (another machine, RDBStorage's callback queues it), or its
    process on this machine is dead, seen at once. Trials of live workers are left alone.
    """
    with experimental_ok():
        optuna.storages.fail_stale_trials(study)
        host = socket.gethostname()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get(HOST_ATTR) != host or _alive(t.user_attrs.get(PID_ATTR)):
                continue
            try:
                failed = study.tell(t.number, state=TrialState.FAIL)
            except (ValueError, UpdateFinishedTrialError):  # failed meanwhile by another worker
                continue
            RetryHeartbeatStaleTrialCallback()(study, failed)


def requeue_interrupted(study: optuna.Study) -> None:
    """Queue again each trial that was killed or interrupted (Ctrl-C), so it resumes in its folder.

    Each is queued once: a trial in the history of a retry (one that was not surplus) is not.
    """
    reclaim(study)
    trials = study.get_trials(deepcopy=False)
    with experimental_ok():
        retries = [t for t in trials if SURPLUS_ATTR not in t.user_attrs]
        retried: set[int | None] = {
            n for t in retries for n in RetryHeartbeatStaleTrialCallback.retry_history(t)
        }
        retried |= {t.user_attrs.get(_RETRY_OF) for t in trials}  # sweeps before heartbeats
        for t in trials:
            interrupted = t.state == TrialState.FAIL and ERROR_ATTR not in t.user_attrs
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


def trial_folder(out: Path, stored: str) -> Path:
    """The run folder of a trial whose :data:`DIR_ATTR` is ``stored``, in the sweep folder ``out``.

    A trial's folder is always ``out/trials/<name>``, so only its name is read: the study stores
    ``trials/<name>``, and studies from before stored the path as the sweep saw it (relative to
    its working directory, or absolute), which ends in that name too. A sweep continued from
    another working directory, or on another machine sharing the study, finds each trial in its
    own sweep folder.
    """
    return out / TRIALS_DIR / PurePath(stored).name


def trial_rows(study: optuna.Study, metric: str, out: Path) -> list[dict[str, Any]]:
    """One row per finished trial, best first: complete ones, then pruned, then diverged; its
    ``dir`` is the trial's run folder in the sweep folder ``out``."""
    sign = -1.0 if higher_is_better(metric) else 1.0
    order = {"complete": 0, "pruned": 1, "diverged": 2}
    rows: list[dict[str, Any]] = []
    for t in finished(study):
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(
            t.state, "diverged"
        )
        stored = t.user_attrs.get(DIR_ATTR)
        rows.append(
            {
                "number": t.number,
                "state": state,
                "value": t.value if state != "diverged" else None,
                "epochs": t.user_attrs.get(EPOCHS_ATTR, t.last_step),
                "params": t.params,
                "dir": None if stored is None else str(trial_folder(out, stored)),
            }
        )
    rows.sort(key=lambda r: (order[r["state"]], sign * (r["value"] or 0.0), r["number"]))
    return rows
