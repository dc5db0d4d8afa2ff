"""The ensemble of saved runs: their averaged probabilities, evaluated as one model.

Each member is read and predicts as a re-evaluated run does (:mod:`fseb_ft.engine.reevaluate`),
with its own input size and normalisation; the members must share classes and test and OOD
data (docs/cli.md, "Ensembles").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from accelerate import Accelerator
from torch import Tensor

from fseb_ft.engine.reevaluate import SavedRun, predict_run, read_saved_run
from fseb_ft.evaluation.bootstrap import Bootstrap
from fseb_ft.evaluation.metrics import ensemble_log_probs
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.report import (
    EvalResults,
    write_confusion_plot,
    write_corruption_plot,
    write_plots,
)
from fseb_ft.runs.rundir import (
    RESULTS_JSON,
    RESULTS_MD,
    RUN_INFO_FILE,
    RunInfo,
    check_output_dir,
    read_json,
    write_json,
)
from fseb_ft.runs.tables import (
    corruption_markdown,
    groups_markdown,
    markdown_table,
    method_title,
    split_note,
    split_suffix,
)

__all__ = ["default_ensemble_dir", "evaluate_ensemble"]

logger = logging.getLogger(__name__)


def evaluate_ensemble(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    cpu: bool = False,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Evaluate the ensemble of several finished runs: the average of their probabilities.

    Every run's best weights predict the test split and OOD sets (each member with its own input
    size and normalisation; docs/cli.md, "Ensembles"). The runs must share the class list and the
    identities of the test and OOD data recorded in their ``run.json`` (seeds, backbones and FS-EB
    settings may differ); otherwise a :class:`ValueError` names the runs and what differs. The
    ensemble's log-probabilities are :func:`~fseb_ft.evaluation.metrics.ensemble_log_probs` of the
    members' float64 log-probabilities, so its NLL is that of the averaged probabilities.

    Writes ``results.json`` (the ensemble's ``test``/``ood`` metrics at the top level, as for a
    run, plus ``members``: each member's metrics, and ``runs``), ``results.md`` (members and
    ensemble as rows) and :data:`~fseb_ft.runs.rundir.PLOTS` to ``out_dir`` (default:
    :func:`default_ensemble_dir`).

    Returns:
        What ``results.json`` holds, a JSON-ready dict.
    """
    dirs = [Path(d) for d in run_dirs]
    out = _ensemble_out(dirs, out_dir)
    runs = [read_saved_run(d, cpu, overrides) for d in dirs]
    _check_same_data(runs)
    # One accelerator for all members: their common precision, else full precision.
    precisions = {recipe.train.mixed_precision for _, recipe, _ in runs}
    precision = precisions.pop() if len(precisions) == 1 else "no"
    accelerator = Accelerator(cpu=cpu, mixed_precision=precision)

    members = _evaluate_members(runs, accelerator)
    ensemble = _ensemble_predictions(runs, [m.predictions for m in members.values()])
    cfg = runs[0].recipe.eval
    bootstrap = Bootstrap.of(runs[0].recipe)
    results = EvalResults.of(ensemble, cfg, bootstrap)
    results = results.extended(
        members={label: m.results for label, m in members.items()},
        runs=[str(d) for d in dirs],  # as given; compared resolved
    )
    if accelerator.is_main_process:
        _write_ensemble(out, results, members, dirs)
    return results.results


def _ensemble_out(run_dirs: Sequence[Path], out_dir: str | Path | None) -> Path:
    """Where the ensemble of ``run_dirs`` writes: ``out_dir`` or the default, checked."""
    if len(run_dirs) < 2:
        raise ValueError(f"an ensemble needs at least two run directories, got {len(run_dirs)}")
    resolved = [d.resolve() for d in run_dirs]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"a run directory is listed twice: {[str(d) for d in run_dirs]}")
    out = Path(out_dir) if out_dir is not None else default_ensemble_dir(run_dirs)
    if out.resolve() in resolved or (out / RUN_INFO_FILE).exists():
        raise ValueError(f"--out {out} is a run directory; its results would be overwritten")
    _check_ensemble_out(out, run_dirs)
    check_output_dir(out, "--out")  # a file, or a folder refusing writes: before any data loads
    return out


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


def _evaluate_members(runs: Sequence[SavedRun], accelerator: Accelerator) -> dict[str, EvalResults]:
    """Each member's results and predictions, by its row title (:func:`_member_labels`)."""
    members: dict[str, EvalResults] = {}
    for run, label in zip(runs, _member_labels(runs), strict=True):
        preds = predict_run(run, accelerator)
        if members:
            _check_same_predictions(next(iter(members.values())).predictions, preds, run.run_dir)
        cfg = run.recipe.eval
        members[label] = EvalResults.of(preds, cfg)
    return members


def _ensemble_predictions(
    runs: Sequence[SavedRun], member_preds: Sequence[Predictions]
) -> Predictions:
    """The ensemble's predictions: the members' averaged probabilities on every set they share."""
    return Predictions(
        test=(_average([p.test[0] for p in member_preds]), member_preds[0].test[1]),
        ood={name: _average([p.ood[name] for p in member_preds]) for name in member_preds[0].ood},
        corruptions={
            name: {sev: _average([p.corruptions[name][sev] for p in member_preds]) for sev in sevs}
            for name, sevs in _shared_corruptions(runs, member_preds).items()
        },
        corruption_index=member_preds[0].corruption_index,
        val=_ensemble_val(runs, member_preds),
        split=member_preds[0].split,
        groups=member_preds[0].groups,
        class_names=member_preds[0].class_names,
    )


def _write_ensemble(
    out: Path, results: EvalResults, members: dict[str, EvalResults], run_dirs: Sequence[Path]
) -> None:
    """``results.json``, ``results.md`` (members and ensemble as rows) and the plots."""
    title = f"Ensemble of {len(run_dirs)}"
    record = results.results
    heading = f"{title}{split_suffix(record)}"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RESULTS_JSON, record)
    rows = {**{label: m.results for label, m in members.items()}, title: record}
    table = markdown_table(rows, results.predictions.class_names)
    listing = "".join(f"- {label}: `{d}`\n" for label, d in zip(members, run_dirs, strict=True))
    shift = "\n" + corruption_markdown(record) if record.get("corruptions") else ""
    shift = ("\n" + groups_markdown(record) if record.get("groups") else "") + shift
    md = f"# {heading}\n\n{split_note(record)}{table}\nMembers:\n\n{listing}{shift}"
    write_text(out / RESULTS_MD, md)
    others = {label: m.predictions for label, m in members.items()}
    write_plots(out, results.predictions, heading, others, strict=False)
    write_confusion_plot(out, results.predictions, heading)
    write_corruption_plot(out, record, title)


def _average(log_probs: Sequence[Tensor]) -> Tensor:
    """The log of the members' mean probabilities (N, K), in float64."""
    return ensemble_log_probs(torch.stack([lp.double() for lp in log_probs]))  # (N, K)


def _ensemble_val(
    runs: Sequence[SavedRun], member_preds: Sequence[Predictions]
) -> tuple[Tensor, Tensor] | None:
    """The ensemble's validation log-probabilities and labels, to fit its temperature and
    calibrate its conformal sets; ``None`` without ``eval.temperature_scaling`` and
    ``eval.conformal``, or when the members validated on different images.

    Members trained at different seeds hold out different validation images, each of them
    training data of another member: a temperature or a conformal quantile fitted on their
    average would be fitted partly on training images, so both are left off, with a warning.
    """
    cfg = runs[0].recipe.eval
    vals = [p.val for p in member_preds]
    if any(v is None for v in vals) or not (cfg.temperature_scaling or cfg.conformal is not None):
        return None
    identities = {(info.data or {}).get("val") for _, _, info in runs}
    if len(identities) > 1 or None in identities:
        logger.warning(
            "temperature scaling and conformal coverage are left off for the ensemble: its "
            "members hold out different validation images (run.json data.val differs, e.g. "
            "other seeds), each another member's training data; train every member with one "
            "data.seed (or the same data.val) to calibrate the ensemble"
        )
        return None
    given = cast(list[tuple[Tensor, Tensor]], vals)  # every member's (checked above)
    log_probs = [torch.log_softmax(z.double(), -1) for z, _ in given]  # (N_v, K) each
    return _average(log_probs), given[0][1]


def default_ensemble_dir(run_dirs: Sequence[str | Path]) -> Path:
    """``ensemble/`` beside the runs when they share a parent folder, else ``./ensemble``."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    return Path(run_dirs[0]).parent / "ensemble" if len(parents) == 1 else Path("ensemble")


def _check_same_data(runs: Sequence[SavedRun]) -> None:
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
    runs: Sequence[SavedRun], member_preds: Sequence[Predictions]
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


def _member_labels(runs: Sequence[SavedRun]) -> list[str]:
    """Table rows "FS-EB · model (dir name)", with the whole path when names collide."""
    labels = [f"{method_title(recipe)} ({d.name})" for d, recipe, _ in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{method_title(recipe)} ({d})" for d, recipe, _ in runs]
    return labels
