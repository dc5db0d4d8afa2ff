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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fseb_ft.cli import run_entry
from fseb_ft.engine.resume import RecipeMismatchError
from fseb_ft.engine.search import compare_sweeps, sweep
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import ConfigError, load_recipe
from fseb_ft.runs.atomic import DiskFullError

__all__ = ["main"]

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
    parser.add_argument("overrides", nargs="*", default=[], help="section.key=value overrides")
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
