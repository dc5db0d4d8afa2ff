"""Sweep workers sharing one PostgreSQL study, one of them killed mid-trial.

    python -m benchmarks.sweep_workers [--storage URL] [--trials 6] [--workers 3] [--kill-after 3]

Starts ``--workers`` ``fseb-ft sweep recipes/quickstart.yaml --trials N --storage URL``
processes on this machine, all on one study, with tiny settings so that a trial takes seconds
(``train.epochs=2 data.train.limit=300 context.pool_size=200 sweep.pruner=none``). The first
worker is killed with ``SIGKILL`` ``--kill-after`` seconds after it prints its first ``trial``
line, while that trial trains; the others run to the end. The study is then read back from the
storage, and one Markdown row is printed: the trials that are COMPLETE, FAIL by diverging
(finished trials too: with them, COMPLETE makes the budget when no trial is lost), FAIL by
interruption (the killed one), the killed trial's number, the number of the trial
that ran it again (Optuna's ``RetryHeartbeatStaleTrialCallback.retried_trial_number``), whether
that retry trained in the killed trial's folder, and the wall time from start to the last exit.

The storage URL defaults to the environment variable ``FSEB_PG_URL``, e.g.
``postgresql+psycopg2://USER:PASSWORD@127.0.0.1:5432/fseb_sweeps`` (``pip install
fseb_ft[postgres]``); it is never printed. The study (named after the output folder, unique per
run) is deleted from the storage afterwards unless ``--keep``; the workers' logs are in
``OUT/worker-<i>.log``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "quickstart.yaml"
TINY = ("train.epochs=2", "data.train.limit=300", "context.pool_size=200", "sweep.pruner=none")
_TRIAL_LINE = re.compile(r"^trial \d+/\d+ \(#(\d+)")


def start_worker(index: int, out: Path, storage: str, trials: int) -> subprocess.Popen[str]:
    """One ``fseb-ft sweep`` process of this checkout, its output (stderr too) piped."""
    command = [sys.executable, "-m", "fseb_ft", "sweep", str(RECIPE), *TINY]
    command += [f"output.dir={out}", "--trials", str(trials), "--storage", storage]
    # Several workers share the cores: one thread each keeps them from fighting over them.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def follow(proc: subprocess.Popen[str], log: Path, first_trial: threading.Event) -> list[int]:
    """Copy ``proc``'s output to ``log``; set ``first_trial`` at its first trial line.

    Returns (filled while it runs) the trial numbers it started, in order.
    """
    numbers: list[int] = []

    def read() -> None:
        assert proc.stdout is not None
        with log.open("w") as file:
            for line in proc.stdout:
                file.write(line)
                file.flush()
                if match := _TRIAL_LINE.match(line):
                    numbers.append(int(match.group(1)))
                    first_trial.set()

    threading.Thread(target=read, daemon=True).start()
    return numbers


def run_workers(args: argparse.Namespace, out: Path) -> tuple[int, float]:
    """Start the workers, kill the first mid-trial, wait for the rest; its trial and the wall s."""
    start = time.perf_counter()
    procs, started, events = [], [], []
    for i in range(args.workers):
        events.append(threading.Event())
        procs.append(start_worker(i, out, args.storage, args.trials))
        started.append(follow(procs[-1], out / f"worker-{i}.log", events[-1]))
    if not events[0].wait(timeout=args.timeout):
        raise SystemExit("the first worker started no trial: see its log")
    time.sleep(args.kill_after)
    procs[0].send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=args.timeout)
    wall = time.perf_counter() - start
    codes = [p.returncode for p in procs[1:]]
    if any(codes):
        raise SystemExit(f"surviving workers exited with {codes}: see {out}/worker-*.log")
    return started[0][-1], wall


def study_row(args: argparse.Namespace, name: str, killed: int, wall: float) -> str:
    """The Markdown row of the study ``name`` as the storage holds it after the run."""
    study = optuna.load_study(study_name=name, storage=args.storage)
    trials = study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    diverged = sum("error" in t.user_attrs for t in failed)  # fseb_ft counts these as finished
    retry = retry_of(trials, killed)
    same = retry is not None and retry.user_attrs.get("dir") == trials[killed].user_attrs.get("dir")
    cells = [
        args.workers,
        args.trials,
        sum(t.state == TrialState.COMPLETE for t in trials),
        diverged,
        len(failed) - diverged,
        f"#{killed}",
        "none" if retry is None else f"#{retry.number}",
        "yes" if same else "no",
        f"{wall:.0f}",
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def retry_of(trials: list[FrozenTrial], number: int) -> FrozenTrial | None:
    """The trial that ran trial ``number`` again, if any."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        for t in trials:
            if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == number:
                return t
    return None


def main() -> None:
    """Run the workers once and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", default=os.environ.get("FSEB_PG_URL"))
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-after", type=float, default=3.0, help="seconds into its trial")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per wait, seconds")
    parser.add_argument("--out", type=Path, help="the sweep folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the study in the storage")
    args = parser.parse_args()
    if not args.storage:
        parser.error("give --storage URL or set FSEB_PG_URL")
    out = (args.out or Path(tempfile.mkdtemp(prefix="fseb-sweep-workers-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    killed, wall = run_workers(args, out)
    print(
        "| workers | budget | COMPLETE | FAIL: diverged | FAIL: interrupted | killed | retried by "
        "| same folder | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(study_row(args, out.name, killed, wall))
    print(f"logs: {out}/worker-*.log")
    if not args.keep:
        optuna.delete_study(study_name=out.name, storage=args.storage)


if __name__ == "__main__":
    main()
