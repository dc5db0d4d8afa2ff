"""Re-evaluate saved runs, or evaluate their ensemble: the ``fseb-ft evaluate`` command.

    python -m fseb_ft.evaluate RUN_DIR [RUN_DIR ...] [eval.KEY=VALUE ...]  # fseb-ft evaluate
    python -m fseb_ft.evaluate runs/quickstart      # the psmap/ and fseb/ runs of --compare
    python -m fseb_ft.evaluate RUN_A RUN_B ... --ensemble [--out DIR]

The first form re-evaluates each saved run from its resolved recipe and best weights, and
rewrites its ``results.json``, ``results.md`` and plots (``reliability.png``,
``selective_prediction.png``, ``entropy_ood.png``; with ``eval.corruptions`` also the corrupted
test split's metrics and ``corruptions.png``); a run folder that cannot be written to keeps its
files, and the results are only printed. The second loads every run's best weights,
predicts the test split and OOD sets they share, averages the members' probabilities and writes
the ensemble's results and plots, with every member as a row of the table, to ``--out``
(default: ``ensemble/`` beside the runs when they share a parent folder, else ``./ensemble``).
A run without ``data.test`` is evaluated on its validation split instead, as it was trained.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelerate import PartialState

from fseb_ft.cli import device_argument, help_text, run_entry
from fseb_ft.engine.ensemble import evaluate_ensemble
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.logs import configure_logging
from fseb_ft.recipe.datasets import is_data_path_override
from fseb_ft.runs.rundir import RECIPE_FILE, read_class_names, runs_in
from fseb_ft.runs.tables import markdown_table

__all__ = ["expand_run_dirs", "main"]


def main(argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.evaluate") -> Any:
    """CLI: re-evaluate saved runs, or evaluate their ensemble; print the results table.

    Returns the results of one run, ``{row: results}`` for several, or the ensemble's results.
    """
    parser = _parser(prog)
    # Intermixed: overrides and options may come before, between or after the run directories.
    args = parser.parse_intermixed_args(argv)
    overrides = [a for a in args.run_dirs if isinstance(a, str)]
    args.run_dirs = expand_run_dirs([a for a in args.run_dirs if isinstance(a, Path)])
    if not args.run_dirs:
        parser.error("the following arguments are required: RUN_DIR")
    if args.set_overrides:
        print(f"{prog}: --set is deprecated: give eval.KEY=VALUE after the run directories",
              file=sys.stderr)  # fmt: skip
    if args.out is not None and not args.ensemble:
        parser.error("--out is only used with --ensemble (a re-evaluated run writes in place)")
    if args.ensemble and len(args.run_dirs) < 2:
        parser.error("--ensemble needs at least two run directories")
    bad = [o for o in args.set_overrides if not o.startswith("eval.") or "=" not in o]
    if bad:
        parser.error(f"--set takes eval.KEY=VALUE (evaluation settings only), got {bad}")
    bad = [o for o in overrides if not _evaluation_override(o)]
    if bad:
        parser.error(
            "overrides take eval.KEY=VALUE (evaluation settings only), data.cache=null to read "
            "the original images instead of the resized-image cache, data.cache.dir=DIR for "
            "a moved cache folder, or data.SPLIT.path=DIR (data.ood.NAME.path=DIR) for moved "
            f"data, got {bad}"
        )
    args.overrides = [*args.set_overrides, *overrides]
    if args.device is not None:
        if args.device.partition(":")[2] not in ("", "0"):
            parser.error(
                f"--device {args.device}: evaluation runs on the first GPU it sees; "
                f"CUDA_VISIBLE_DEVICES={args.device.partition(':')[2]} picks that one"
            )
        args.cpu = args.cpu or args.device == "cpu"
    configure_logging()
    try:
        if args.ensemble:
            results = evaluate_ensemble(
                args.run_dirs, args.out, cpu=args.cpu, overrides=args.overrides
            )
            rows = {**results["members"], f"Ensemble of {len(args.run_dirs)}": results}
        else:
            each = [(d, evaluate_run(d, args.cpu, args.overrides)) for d in args.run_dirs]
            rows = {str(d): r for d, r in each}
            results = each[0][1] if len(each) == 1 else rows
    except FileNotFoundError as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    if PartialState().is_main_process:
        # The runs share their classes (an ensemble checks it): the first one names them.
        print(markdown_table(rows, read_class_names(args.run_dirs[0])))
    return results


def _evaluation_override(override: str) -> bool:
    """Whether ``override`` changes only how a run is evaluated, not the pixels it was trained
    and validated on: ``eval.*``, ``data.cache=null`` (the originals, the preprocessing the model
    card documents), ``data.cache.dir=`` (the same entries, moved: they are keyed by the
    images, size and filter, not the folder) or a dataset's new place (``data.test.path=DIR``,
    moved data). Another cache size or filter would evaluate on other pixels than the run's."""
    if is_data_path_override(override):
        return True
    return override.startswith(("eval.", "data.cache.dir=")) or override == "data.cache=null"


def expand_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Each path as given when it is a run directory, else the run directories directly in it.

    ``fseb-ft RECIPE --compare`` writes ``OUTPUT/psmap`` and ``OUTPUT/fseb``, so ``OUTPUT`` stands
    for both. A path that is neither stays, for :func:`evaluate_run` to report.
    """
    out: list[Path] = []
    for path in map(Path, paths):
        inner = [] if (path / RECIPE_FILE).exists() else runs_in(path)
        out.extend(inner or [path])
    return out


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dirs",
        type=_run_dir_or_override,
        nargs="+",
        metavar="RUN_DIR",
        help="run directories written by fseb_ft.finetune; a folder holding runs (the "
        "OUTPUT of --compare) stands for the runs in it. An argument with '=' is an "
        "eval.KEY=VALUE override of the saved recipes for this evaluation, e.g. "
        "eval.corruptions=all eval.severities=[1,3,5]; data.cache=null reads the original "
        "images of a run trained with the resized-image cache; data.test.path=DIR (any "
        "data.SPLIT.path, data.ood.NAME.path) finds data moved since training",
    )
    parser.add_argument(
        "--ensemble",
        action="store_true",
        help="evaluate the ensemble of the runs (average of their probabilities) instead of "
        "re-evaluating each; the runs must share classes, test and OOD data",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --ensemble: where to write results.json, results.md and plots (default: "
        "'ensemble' beside the runs when they share a parent folder, else ./ensemble)",
    )
    parser.add_argument("--cpu", action="store_true", help="evaluate on CPU (--device cpu)")
    parser.add_argument(
        "--device",
        type=device_argument,
        help="cpu, cuda or mps (default: Accelerate's choice, the GPU when there is one)",
    )
    parser.add_argument(
        "--set",
        dest="set_overrides",
        action="append",
        default=[],
        metavar="eval.KEY=VALUE",
        help="deprecated: give eval.KEY=VALUE after the run directories (repeatable)",
    )
    return parser


def _run_dir_or_override(arg: str) -> Path | str:
    """An argument with ``=`` is a ``section.key=value`` override (kept verbatim), else a path."""
    return arg if "=" in arg else Path(arg)


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.evaluate")
