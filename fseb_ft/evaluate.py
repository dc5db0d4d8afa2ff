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
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from torch import Tensor

from fseb_ft.cli import help_text, run_entry
from fseb_ft.data.screening import screen_splits
from fseb_ft.data.sources import build_splits
from fseb_ft.evaluation.metrics import ensemble_log_probs
from fseb_ft.evaluation.predictions import Predictions, predict_splits
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import Recipe
from fseb_ft.runs.atomic import is_not_writable, write_text
from fseb_ft.runs.loading import load_run_model, run_predictor
from fseb_ft.runs.report import (
    EvalResults,
    corruption_markdown,
    eval_results,
    markdown_table,
    method_title,
    split_note,
    split_suffix,
    write_corruption_plot,
    write_plots,
    write_results,
)
from fseb_ft.runs.rundir import (
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_MD,
    RUN_INFO_FILE,
    RunInfo,
    epochs_done,
    read_json,
    read_run,
    runs_in,
    write_json,
)

__all__ = [
    "default_ensemble_dir",
    "evaluate_ensemble",
    "evaluate_run",
    "expand_run_dirs",
    "main",
]

logger = logging.getLogger(__name__)


def evaluate_run(
    run_dir: str | Path, cpu: bool = False, overrides: Sequence[str] = ()
) -> EvalResults:
    """Re-evaluate a finished run from its ``recipe.yaml``, ``run.json`` and best weights.

    Rewrites the run's ``results.json``, ``results.md`` and plots (keeping the ``training``
    record of the original results); a run folder that cannot be written to (read-only) keeps
    its files, with a warning. ``overrides`` (``eval.key=value``, e.g.
    ``eval.corruptions=all``) change evaluation settings of the saved recipe for this
    evaluation only; ``recipe.yaml`` is left as it is.
    """
    run_dir = Path(run_dir)
    recipe, info = _read_run(run_dir, cpu, overrides)
    accelerator = Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision)
    predictions = _predict_run(run_dir, recipe, info, accelerator)
    results = eval_results(predictions, recipe.eval.ood_scores)
    previous = run_dir / RESULTS_JSON
    if previous.exists():
        results["training"] = read_json(previous).get("training")
    elif info.training is not None:  # trained without evaluation (a sweep's trial): in run.json
        results["training"] = info.training
    else:  # stopped before it finished: say so wherever these numbers are read
        results["training"] = _unfinished(run_dir, recipe.train.epochs)
        logger.warning("%s: %s", run_dir, results["training"]["warnings"][0])
    if accelerator.is_main_process:
        _rewrite_results(run_dir, results, method_title(recipe))
    return results


def _rewrite_results(run_dir: Path, results: EvalResults, title: str) -> None:
    """Write the results into the run; a folder the OS refuses to write to is left as it is."""
    try:
        write_results(run_dir, results, title=title)
    except OSError as err:
        if not is_not_writable(err):
            raise
        # Re-evaluating reads the run only: the numbers are still worth returning and printing.
        logger.warning(
            "could not write %s, %s and the plots into %s (%s): the run keeps its earlier "
            "results, and these are not saved",
            RESULTS_JSON, RESULTS_MD, run_dir, err.strerror,
        )  # fmt: skip


def _unfinished(run_dir: Path, epochs: int) -> dict[str, Any]:
    """The training record of a run stopped before its last epoch: epochs done, a warning."""
    done = epochs_done(run_dir)
    return {
        "unfinished": True,
        "epochs": done,
        "warnings": [
            f"unfinished: {done} of {epochs} epochs trained. These are the best weights of the "
            "epochs done, not of the run the recipe describes; rerun its training command to "
            "finish it"
        ],
    }


def evaluate_ensemble(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    cpu: bool = False,
    overrides: Sequence[str] = (),
) -> EvalResults:
    """Evaluate the ensemble of several finished runs: the average of their probabilities.

    Every run's best weights predict the test split and OOD sets (each member with its own input
    size and normalisation; docs/cli.md, "Ensembles"). The runs must share the class list and the
    identities of the test and OOD data recorded in their ``run.json`` (seeds, backbones and FS-EB
    settings may differ); otherwise a :class:`ValueError` names the runs and what differs. The
    ensemble's log-probabilities are :func:`~fseb_ft.evaluation.metrics.ensemble_log_probs` of the
    members'
    float64 log-probabilities, so its NLL is that of the averaged probabilities.

    Writes ``results.json`` (the ensemble's ``test``/``ood`` metrics at the top level, as for a
    run, plus ``members``: each member's metrics, and ``runs``), ``results.md`` (members and
    ensemble as rows) and :data:`PLOTS` to ``out_dir`` (default: :func:`default_ensemble_dir`).

    Returns:
        The ensemble's :class:`EvalResults` (``.predictions``: the ensemble's).
    """
    run_dirs = [Path(d) for d in run_dirs]
    if len(run_dirs) < 2:
        raise ValueError(f"an ensemble needs at least two run directories, got {len(run_dirs)}")
    resolved = [d.resolve() for d in run_dirs]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"a run directory is listed twice: {[str(d) for d in run_dirs]}")
    out = Path(out_dir) if out_dir is not None else default_ensemble_dir(run_dirs)
    if out.resolve() in resolved or (out / RUN_INFO_FILE).exists():
        raise ValueError(f"--out {out} is a run directory; its results would be overwritten")
    _check_ensemble_out(out, run_dirs)
    runs = [(d, *_read_run(d, cpu, overrides)) for d in run_dirs]
    _check_same_data(runs)
    # One accelerator for all members: their common precision, else full precision.
    precisions = {recipe.train.mixed_precision for _, recipe, _ in runs}
    precision = precisions.pop() if len(precisions) == 1 else "no"
    accelerator = Accelerator(cpu=cpu, mixed_precision=precision)

    labels = _member_labels(runs)
    members: dict[str, EvalResults] = {}
    for (run_dir, recipe, info), label in zip(runs, labels, strict=True):
        preds = _predict_run(run_dir, recipe, info, accelerator)
        if members:
            _check_same_predictions(next(iter(members.values())).predictions, preds, run_dir)
        members[label] = eval_results(preds, recipe.eval.ood_scores)

    member_preds = [m.predictions for m in members.values()]
    ensemble = Predictions(
        test=(_average([p.test[0] for p in member_preds]), member_preds[0].test[1]),
        ood={name: _average([p.ood[name] for p in member_preds]) for name in member_preds[0].ood},
        corruptions={
            name: {sev: _average([p.corruptions[name][sev] for p in member_preds]) for sev in sevs}
            for name, sevs in _shared_corruptions(runs, member_preds).items()
        },
        corruption_labels=member_preds[0].corruption_labels,
        val=_ensemble_val(runs, member_preds),
        split=member_preds[0].split,
    )
    results = eval_results(ensemble, runs[0][1].eval.ood_scores)
    results["members"] = {label: dict(m) for label, m in members.items()}
    results["runs"] = [str(d) for d in run_dirs]  # as given; compared resolved
    if accelerator.is_main_process:
        title = f"Ensemble of {len(runs)}"
        heading = f"{title}{split_suffix(results)}"
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / RESULTS_JSON, results)
        table = markdown_table({**members, title: results})
        listing = "".join(f"- {label}: `{d}`\n" for label, d in zip(labels, run_dirs, strict=True))
        shift = "\n" + corruption_markdown(results) if results.get("corruptions") else ""
        md = f"# {heading}\n\n{split_note(results)}{table}\nMembers:\n\n{listing}{shift}"
        write_text(out / RESULTS_MD, md)
        others = {label: m.predictions for label, m in members.items()}
        write_plots(out, ensemble, heading, others, strict=False)
        write_corruption_plot(out, results, title)
    return results


def _check_ensemble_out(out: Path, run_dirs: Sequence[Path]) -> None:
    """Refuse an ``--out`` that holds the results of an ensemble of other runs (the same runs
    evaluated again may overwrite their own)."""
    previous = out / RESULTS_JSON
    if not previous.is_file():
        return
    before = {str(Path(d).resolve()) for d in read_json(previous).get("runs") or []}
    if before != {str(d.resolve()) for d in run_dirs}:
        raise ValueError(
            f"--out {out} holds the results of an ensemble of other runs ({len(before)} runs: "
            f"{previous}); give another --out, or remove it to overwrite"
        )


def _average(log_probs: Sequence[Tensor]) -> Tensor:
    """The log of the members' mean probabilities (N, K), in float64."""
    return ensemble_log_probs(torch.stack([lp.double() for lp in log_probs]))  # (N, K)


def _ensemble_val(
    runs: Sequence[tuple[Path, Recipe, RunInfo]], member_preds: Sequence[Predictions]
) -> tuple[Tensor, Tensor] | None:
    """The ensemble's validation log-probabilities and labels, to fit its temperature; ``None``
    without ``eval.temperature_scaling``, or when the members validated on different images.

    Members trained at different seeds hold out different validation images, each of them
    training data of another member: a temperature fitted on their average would be fitted
    partly on training images, so it is left off, with a warning.
    """
    vals = [p.val for p in member_preds]
    if any(v is None for v in vals):
        return None
    identities = {(info.data or {}).get("val") for _, _, info in runs}
    if len(identities) > 1 or None in identities:
        logger.warning(
            "temperature scaling is left off for the ensemble: its members hold out different "
            "validation images (run.json data.val differs, e.g. other seeds), each another "
            "member's training data; give every member the same data.val to scale the ensemble"
        )
        return None
    log_probs = [torch.log_softmax(z.double(), -1) for z, _ in vals]  # (N_v, K) each
    return _average(log_probs), vals[0][1]


def default_ensemble_dir(run_dirs: Sequence[str | Path]) -> Path:
    """``ensemble/`` beside the runs when they share a parent folder, else ``./ensemble``."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    return Path(run_dirs[0]).parent / "ensemble" if len(parents) == 1 else Path("ensemble")


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
    bad = [o for o in overrides if not o.startswith("eval.")]
    if bad:
        parser.error(f"overrides take eval.KEY=VALUE (evaluation settings only), got {bad}")
    args.overrides = [*args.set_overrides, *overrides]
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
        print(markdown_table(rows))
    return results


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
        "eval.corruptions=all eval.severities=[1,3,5]",
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
    parser.add_argument("--cpu", action="store_true", help="evaluate on CPU")
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


# --------------------------------------------------------------------------------------------
# Loading runs
# --------------------------------------------------------------------------------------------


def _read_run(run_dir: Path, cpu: bool, overrides: Sequence[str] = ()) -> tuple[Recipe, RunInfo]:
    """A finished run's resolved recipe and ``run.json``; a clear error if it is not one."""
    needed = (RECIPE_FILE, RUN_INFO_FILE, MODEL_WEIGHTS)
    return read_run(run_dir, [f"train.cpu={str(cpu).lower()}", *overrides], needed)


def _predict_run(
    run_dir: Path, recipe: Recipe, info: RunInfo, accelerator: Accelerator
) -> Predictions:
    """Load the run's best weights and predict its test split and OOD sets (FS-VI: with the
    Monte-Carlo predictive of its saved q(θ), :func:`~fseb_ft.runs.loading.run_predictor`)."""
    # The images training left out (data.bad_images: skip) are left out again, so the numbers
    # are the run's; with ``stop``, an image damaged since is one clear error, not a traceback.
    splits, _, _ = screen_splits(
        build_splits(recipe.data, recipe.train.seed),
        [],
        recipe.data.bad_images,
        progress=accelerator.is_main_process,
        train=False,
    )
    model = accelerator.prepare(load_run_model(run_dir, recipe, info))
    predictor = run_predictor(run_dir, recipe, accelerator.unwrap_model(model))
    loader_kw = {"num_workers": recipe.data.num_workers, "seed": recipe.train.seed}
    predictions = predict_splits(
        predictor, splits, info.input, recipe.eval, accelerator, **loader_kw
    )
    accelerator.free_memory(model)
    return predictions


def _check_same_data(runs: Sequence[tuple[Path, Recipe, RunInfo]]) -> None:
    """Members of an ensemble must agree on classes and on test and OOD data identities (on
    validation data too when they have no test split: that is the split they report on)."""
    first_dir, _, first = runs[0]
    for run_dir, _, info in runs[1:]:
        for what, get in (
            ("classes", lambda i: i.class_names or i.num_classes),
            ("test data", lambda i: (i.data or {}).get("test")),
            ("OOD sets", lambda i: (i.data or {}).get("ood") or {}),
            ("validation data (reported on without a test split)", _reported_val),
        ):
            a, b = get(first), get(info)
            if a != b:
                raise ValueError(
                    f"cannot ensemble {first_dir} and {run_dir}: their {what} differ "
                    f"(run.json: {a!r} vs {b!r}); ensemble members must be trained on the same "
                    "classes and evaluated on the same test and OOD data"
                )


def _reported_val(info: RunInfo) -> Any:
    """The validation data's identity when a run reports on it (no test split), else ``None``."""
    data = info.data or {}
    return data.get("val") if data.get("test") is None else None


def _check_same_predictions(first: Predictions, other: Predictions, run_dir: Path) -> None:
    labels_a, labels_b = first.test[1], other.test[1]
    if labels_a.shape != labels_b.shape or not torch.equal(labels_a, labels_b):
        raise ValueError(
            f"{run_dir} loads a different {first.split} split ({len(labels_b)} samples) from the "
            f"first member ({len(labels_a)} samples, or other labels): the data changed since "
            "training"
        )
    for name, lp in first.ood.items():
        if other.ood[name].shape != lp.shape:
            raise ValueError(
                f"{run_dir} predicts OOD set {name!r} with shape {tuple(other.ood[name].shape)}, "
                f"the first member with {tuple(lp.shape)}"
            )


def _shared_corruptions(
    runs: Sequence[tuple[Path, Recipe, RunInfo]], member_preds: Sequence[Predictions]
) -> dict[str, list[int]]:
    """(corruption, severities) every member predicted with the same corrupted images."""
    subsets = {(r.eval.corruption_seed, r.eval.corruption_limit) for _, r, _ in runs}
    if len(subsets) > 1:
        logger.warning(
            "members differ in (eval.corruption_seed, eval.corruption_limit) %s: no corruption "
            "results",
            subsets,
        )
        return {}
    shared = {
        name: [s for s in by_sev if all(s in p.corruptions.get(name, {}) for p in member_preds)]
        for name, by_sev in member_preds[0].corruptions.items()
    }
    return {name: sevs for name, sevs in shared.items() if sevs}


def _member_labels(runs: Sequence[tuple[Path, Recipe, RunInfo]]) -> list[str]:
    """Table rows "FS-EB · model (dir name)", with the whole path when names collide."""
    labels = [f"{method_title(recipe)} ({d.name})" for d, recipe, _ in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{method_title(recipe)} ({d})" for d, recipe, _ in runs]
    return labels


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.evaluate")
