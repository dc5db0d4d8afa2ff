"""Reporting: the results dict (metrics) from predictions, ``results.json`` / ``results.md``,
and the figures drawn from the predictions.

Nothing here predicts or loads a model (that is :mod:`fseb_ft.evaluation.predictions`). The
Markdown of results is :mod:`fseb_ft.runs.tables`'.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fseb_ft.evaluation.bootstrap import Bootstrap, prediction_intervals
from fseb_ft.evaluation.conformal import ConformalTarget, conformal_coverage
from fseb_ft.evaluation.groups import Groups, group_metrics
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.ood import ood_metrics
from fseb_ft.evaluation.temperature import fit_temperature, temperature_identified
from fseb_ft.recipe import EvalConfig
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.posthoc import LAPLACE, TEMPERATURE, WISE
from fseb_ft.runs.rundir import (
    COMPARISON_PLOTS,
    CONFUSION_PLOT,
    CORRUPTION_PLOT,
    PLOTS,
    RESULTS_JSON,
    RESULTS_MD,
    RESULTS_SPLIT,
    results_split,
    write_json,
)
from fseb_ft.runs.tables import (
    clean_reference,
    corruption_markdown,
    corruption_summary,
    groups_markdown,
    markdown_table,
    split_note,
    split_suffix,
    warnings_markdown,
)

if TYPE_CHECKING:  # predict needs Accelerate; a report only reads the Predictions' tensors.
    from fseb_ft.evaluation.predictions import Predictions

__all__ = [
    "EvalResults",
    "eval_results",
    "evaluate_predictions",
    "group_results",
    "temperature_scaled_results",
    "write_comparison_plots",
    "write_confusion_plot",
    "write_corruption_plot",
    "write_plots",
    "write_results",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class EvalResults:
    """An evaluation: its results record and the predictions it was computed from.

    The commands and the Python API return ``results`` alone, a plain JSON-ready dict (what
    ``results.json`` holds); this record keeps the predictions beside it for the code that draws
    figures or averages an ensemble without predicting again.
    """

    results: dict[str, Any]
    """JSON-ready: ``split``, ``test``, ``ood``, ``corruptions``, ``groups``,
    ``temperature_scaled``, ``laplace``, ``wise_ft``, ``intervals`` (:func:`eval_results`), then
    what the evaluation's maker adds with :meth:`extended` (``training``; an ensemble's
    ``members`` and ``runs``)."""
    predictions: Predictions = dataclasses.field(repr=False)
    """The test (or validation), OOD and corruption predictions behind ``results``."""

    @classmethod
    def from_predictions(
        cls,
        predictions: Predictions,
        ood_scores: Sequence[str] = ("entropy",),
        task_metrics: Sequence[str] = (),
        bootstrap: Bootstrap | None = None,
        *,
        temperature_scaling: bool = True,
        conformal: ConformalTarget | None = None,
    ) -> EvalResults:
        """The metrics of ``predictions`` (:func:`eval_results`), with them."""
        found = eval_results(
            predictions,
            ood_scores,
            task_metrics,
            bootstrap,
            temperature_scaling=temperature_scaling,
            conformal=conformal,
        )
        return cls(found, predictions)

    @classmethod
    def of(
        cls, predictions: Predictions, cfg: EvalConfig, bootstrap: Bootstrap | None = None
    ) -> EvalResults:
        """:meth:`from_predictions` with the settings of the ``eval`` section ``cfg``."""
        return cls.from_predictions(
            predictions,
            cfg.ood_scores,
            cfg.metrics,
            bootstrap,
            temperature_scaling=cfg.temperature_scaling,
            conformal=ConformalTarget.of(cfg),
        )

    def extended(self, **entries: Any) -> EvalResults:
        """These results with ``entries`` after the record's own keys (``results.json``'s order)."""
        return dataclasses.replace(self, results={**self.results, **entries})


def evaluate_predictions(
    predictions: Predictions,
    ood_scores: Sequence[str] = ("entropy",),
    task_metrics: Sequence[str] = (),
) -> dict[str, Any]:
    """The metrics of the test predictions, each named OOD set and each corruption.

    The metrics are those docs/quickstart.md lists under "The demo" (accuracy, NLL, ECE, Brier,
    selective prediction, AURC; OOD detection by the scores of ``ood_scores``), and on the test
    split the task metrics of ``task_metrics`` that apply (``eval.metrics``; a per-class one as a
    list, index = label).

    Args:
        predictions: what is scored: ``test`` (log-probabilities (N, K), labels (N,)), ``ood``
            (name → log-probabilities (N_o, K)), ``corruptions`` (name → severity →
            log-probabilities (N_c, K) of the test images ``corruption_index`` names, ``None``:
            all), the logits behind ``test`` and ``ood`` (``None`` for an ensemble: its logit
            scores are then absent) and the feature scores' values (absent: those scores are
            too). Its validation, groups and post-hoc blocks are not read here.
        ood_scores: the OOD scores to report (``eval.ood_scores``).
        task_metrics: the task metrics to add to ``test`` (``eval.metrics``).

    Returns:
        ``{"test": {metric: float, "n": N}, "ood": {name: {metric: float, "n": N_o}}}``; with
        ``corruptions`` also ``"corruptions": {name: {"1": {metric: float, "n": N_c}, ...}}``
        (severities as strings, as JSON keys), ``"corruption_summary": {"1": {metric: mean
        over the corruptions}, ..., "all": {metric: mean over every corruption and severity}}``
        and ``"corruption_clean": {metric: float, "n": N_c}``, the metrics of the same N_c
        images uncorrupted: the baseline the corrupted rows are compared with.
        The metrics are those of ``test``
        (:func:`~fseb_ft.evaluation.metrics.classification_metrics`).
    """
    log_probs, labels = predictions.test
    found = classification_metrics(log_probs, labels, task_metrics)
    # tolist: a 0-dim tensor gives a float, a per-class (K,) one a list.
    out: dict[str, Any] = {"test": {k: v.tolist() for k, v in found.items()}}
    out["test"]["n"] = len(labels)
    probs_in = log_probs.exp()  # (N, K)
    out["ood"] = {}
    for name, lp in predictions.ood.items():
        found = ood_metrics(
            probs_in,
            lp.exp(),
            tuple(ood_scores),
            predictions.test_logits,
            predictions.ood_logits.get(name),  # (N_o, K) or None
            predictions.test_feature_scores,
            predictions.ood_feature_scores.get(name),
        )
        scores = {k: float(v) for k, v in found.items()}
        out["ood"][name] = scores | {"n": len(lp)}
    if predictions.corruptions:
        out |= _corruption_results(
            predictions.test, predictions.corruptions, predictions.corruption_index
        )
    return out


def _corruption_results(
    test: tuple[Tensor, Tensor],
    corruptions: Mapping[str, Mapping[int, Tensor]],
    corruption_index: Tensor | None,
) -> dict[str, Any]:
    """``corruptions``, ``corruption_summary`` and ``corruption_clean`` of
    :func:`evaluate_predictions`: every corruption and severity, and the same images clean."""
    log_probs, labels = test
    index = slice(None) if corruption_index is None else corruption_index
    c_labels = labels[index]  # (N_c,)
    by_name = {
        name: {
            str(sev): {k: float(v) for k, v in classification_metrics(lp, c_labels).items()}
            | {"n": len(lp)}
            for sev, lp in sorted(by_severity.items())
        }
        for name, by_severity in corruptions.items()
    }
    clean = classification_metrics(log_probs[index], c_labels)
    return {
        "corruptions": by_name,
        "corruption_summary": corruption_summary(by_name),
        "corruption_clean": {k: float(v) for k, v in clean.items()} | {"n": len(c_labels)},
    }


def write_results(
    run_dir: Path,
    results: Mapping[str, Any],
    title: str,
    predictions: Predictions | None = None,
) -> None:
    """Write ``results.json`` (machines), ``results.md`` (people) and the plots into ``run_dir``.

    ``predictions``, those behind ``results`` (an :class:`EvalResults`' own), are drawn with
    :func:`write_plots` and :func:`write_confusion_plot` (``strict=False``: a figure that fails
    is logged as a warning, after the results are written); their class names head the
    per-class table.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / RESULTS_JSON, dict(results))
    heading = f"{title}{split_suffix(results)}"  # figures and heading name a validation split
    md = f"# {heading}\n\n" + split_note(results) + warnings_markdown(results)
    class_names = predictions.class_names if predictions is not None else None
    md += markdown_table({title: results}, class_names)
    if results.get("groups"):
        md += "\n" + groups_markdown(results)
    if results.get("corruptions"):
        md += "\n" + corruption_markdown(results)
    write_text(run_dir / RESULTS_MD, md)
    if predictions is not None:
        write_plots(run_dir, predictions, heading, strict=False)
        write_confusion_plot(run_dir, predictions, heading)
    write_corruption_plot(run_dir, results, title)


def write_confusion_plot(directory: Path, predictions: Predictions, title: str) -> None:
    """:data:`CONFUSION_PLOT` of the reported split (``predictions.test``), its classes named
    by ``predictions.class_names``; a failure is logged."""
    from fseb_ft.runs.confusion import confusion_plot  # matplotlib only when drawing

    probs, labels = _probs_labels(predictions)
    path = Path(directory) / CONFUSION_PLOT
    names = predictions.class_names
    _draw([lambda: confusion_plot(probs, labels, path, names, title=title)], strict=False)


def write_corruption_plot(directory: Path, results: Mapping[str, Any], title: str) -> None:
    """:data:`CORRUPTION_PLOT` from ``results["corruptions"]`` (if any); a failure is logged."""
    if not results.get("corruptions"):
        return
    from fseb_ft.runs import plots

    path = Path(directory) / CORRUPTION_PLOT
    clean = clean_reference(results)
    caption = f"{title}: corrupted {results_split(results)} split"
    _draw(
        [lambda: plots.corruption_plot(results["corruptions"], path, clean=clean, title=caption)],
        strict=False,
    )


def write_plots(
    directory: Path,
    predictions: Predictions,
    title: str,
    others: Mapping[str, Predictions] | None = None,
    strict: bool = True,
) -> list[Path]:
    """Draw :data:`PLOTS` for ``predictions`` into ``directory``; return the files written.

    ``reliability.png``: reliability diagram of the reported split (``predictions.test``: the
    test split, or validation without one; 15 bins, as the ECE column).
    ``selective_prediction.png``: accuracy–coverage curve, plus one curve per entry of
    ``others`` (e.g. an ensemble's members), drawn first. ``entropy_ood.png``: predictive
    entropy of that split vs each OOD set (skipped when there is none). With
    ``strict=False`` a figure that fails is logged as a warning and skipped: figures are a
    by-product and must not fail a finished run.
    """
    from fseb_ft.runs import plots  # matplotlib only when drawing

    directory = Path(directory)
    probs, labels = _probs_labels(predictions)
    curves = {name: _probs_labels(p) for name, p in (others or {}).items()}
    curves[title] = (probs, labels)
    ood = {name: lp.exp() for name, lp in predictions.ood.items()}
    jobs = [
        lambda: plots.reliability_diagram(probs, labels, directory / PLOTS[0], title=title),
        lambda: plots.selective_prediction_plot(curves, directory / PLOTS[1], title=title),
    ]
    if ood:
        jobs.append(lambda: plots.entropy_histogram(probs, ood, directory / PLOTS[2], title=title))
    return _draw(jobs, strict)


def write_comparison_plots(
    directory: Path, methods: Mapping[str, Predictions], title: str, strict: bool = True
) -> list[Path]:
    """Draw :data:`COMPARISON_PLOTS` (methods side by side) into ``directory``.

    ``comparison_reliability.png``: one reliability diagram per method, in a row with shared
    axes. ``comparison_selective.png``: every method's accuracy–coverage curve on one axes.
    ``strict`` as in :func:`write_plots`.
    """
    from fseb_ft.runs import plots

    directory = Path(directory)
    data = {name: _probs_labels(p) for name, p in methods.items()}
    return _draw(
        [
            lambda: plots.reliability_comparison(
                data, directory / COMPARISON_PLOTS[0], title=title
            ),
            lambda: plots.selective_prediction_plot(
                data, directory / COMPARISON_PLOTS[1], title=title
            ),
        ],
        strict,
    )


def eval_results(
    predictions: Predictions,
    ood_scores: Sequence[str] = ("entropy",),
    task_metrics: Sequence[str] = (),
    bootstrap: Bootstrap | None = None,
    *,
    temperature_scaling: bool = True,
    conformal: ConformalTarget | None = None,
) -> dict[str, Any]:
    """The results record of ``predictions``: their metrics (:func:`evaluate_predictions`).

    With ``temperature_scaling`` (``eval.temperature_scaling``), predictions with validation
    logits also get ``temperature_scaled`` (:func:`temperature_scaled_results`); predictions
    with "+ LLLA" ones (``eval.laplace``) get ``laplace``: the fit's record (``hessian``,
    ``prior_method``, ``prior_precision``), then their metrics as here; predictions with "+ WiSE"
    ones (``eval.wise_ft``) get ``wise_ft``: the chosen ``alpha``, the grid ``alphas`` and each
    one's ``val_nll``, then their metrics. Predictions with groups
    (``eval.group_by``) get ``groups`` (:func:`group_results`), with ``bootstrap`` resamples
    ``intervals`` (:func:`~fseb_ft.evaluation.bootstrap.prediction_intervals`, after the
    others), and with ``conformal`` and validation logits the coverage and mean size of its
    sets in ``test`` (:func:`~fseb_ft.evaluation.conformal.conformal_coverage`, calibrated on
    each block's own validation logits), in every block. ``RESULTS_SPLIT`` (first) names the
    split the in-distribution metrics come from (``predictions.split``).
    """
    found = _metrics(predictions, ood_scores, task_metrics, bootstrap, conformal)
    intervals = found.pop("intervals", None)
    results = {RESULTS_SPLIT: predictions.split} | found
    if temperature_scaling and predictions.val is not None:
        results[TEMPERATURE.key] = temperature_scaled_results(
            predictions, ood_scores, task_metrics, bootstrap, conformal
        )
    if predictions.laplace is not None:
        laplace = predictions.laplace
        found = _metrics(laplace, ood_scores, task_metrics, bootstrap, conformal)
        results[LAPLACE.key] = laplace.fit | found
    if predictions.wise is not None:
        wise = predictions.wise
        found = _metrics(wise, ood_scores, task_metrics, bootstrap, conformal)
        results[WISE.key] = wise.fit | found
    if intervals is not None:
        results["intervals"] = intervals
    return results


def temperature_scaled_results(
    predictions: Predictions,
    ood_scores: Sequence[str] = ("entropy",),
    task_metrics: Sequence[str] = (),
    bootstrap: Bootstrap | None = None,
    conformal: ConformalTarget | None = None,
) -> dict[str, Any]:
    """``{"temperature": T, "test": ..., "ood": ...}``: ``T`` fitted on ``predictions.val`` by
    NLL (:func:`~fseb_ft.evaluation.temperature.fit_temperature`), then the metrics of
    ``logits / T`` on the test split, the OOD sets, the corruptions (as
    :func:`evaluate_predictions`) and the groups, and with ``conformal`` the sets' coverage
    calibrated on the validation logits over ``T``.
    A fit that ran into an end of the searched range is not used: ``T`` = 1, with the fitted
    value and a ``note`` saying why.
    """
    if predictions.val is None:
        raise ValueError("temperature scaling needs the validation split's logits")
    fitted = float(fit_temperature(*predictions.val))
    temperature = fitted if temperature_identified(fitted) else 1.0
    scaled = predictions.scaled(temperature)
    metrics = _metrics(scaled, ood_scores, task_metrics, bootstrap, conformal)
    if temperature == fitted:
        return {"temperature": temperature, **metrics}
    note = (
        f"temperature scaling left off (T = 1): the validation NLL has no minimum in the "
        f"searched range, it is lowest at T = {fitted:.3g} (validation predicted perfectly), "
        "so validation cannot set the model's confidence"
    )
    return {"temperature": temperature, "fitted_temperature": fitted, "note": note, **metrics}


def _metrics(
    predictions: Predictions,
    ood_scores: Sequence[str],
    task_metrics: Sequence[str],
    bootstrap: Bootstrap | None = None,
    conformal: ConformalTarget | None = None,
) -> dict[str, Any]:
    """:func:`evaluate_predictions` of every set ``predictions`` holds, the test metrics per
    group (``groups``: :func:`group_results`) when they carry groups, with ``bootstrap``
    resamples the ``intervals`` of every scalar test and OOD metric, and with ``conformal`` and
    validation logits the sets' ``conformal_coverage`` and ``conformal_set_size`` in ``test``."""
    out = evaluate_predictions(predictions, ood_scores, task_metrics)
    if predictions.groups is not None:
        out["groups"] = group_results(predictions.test, predictions.groups, list(out["test"]))
    if bootstrap is not None and bootstrap.resamples:
        names = [k for k, v in out["test"].items() if k != "n" and isinstance(v, float)]
        out["intervals"] = prediction_intervals(predictions, names, ood_scores, bootstrap)
    if conformal is not None and predictions.val is not None:
        val_logits, val_labels = predictions.val
        log_probs, labels = predictions.test
        test_logits = log_probs if predictions.test_logits is None else predictions.test_logits
        out["test"] |= conformal_coverage(
            torch.softmax(val_logits.double(), -1),  # (N_v, K)
            val_labels,
            torch.softmax(test_logits.double(), -1),  # (N, K)
            labels,
            conformal,
        )
    return out


def group_results(
    test: tuple[Tensor, Tensor], groups: Groups, names: Sequence[str]
) -> dict[str, Any]:
    """``{"column": eval.group_by, "groups": {value: {"n": …, metric: …}}}``: the metrics
    ``names`` (those of the whole split's results) of the predictions ``test`` (log-probabilities,
    labels) on each group of ``groups`` (:func:`~fseb_ft.evaluation.groups.group_metrics`)."""
    found = group_metrics(*test, groups.values, names=names)
    return {"column": groups.column, "groups": found}


def _probs_labels(predictions: Predictions) -> tuple[Tensor, Tensor]:
    log_probs, labels = predictions.test
    return log_probs.exp(), labels


def _draw(jobs: Sequence[Callable[[], Path]], strict: bool) -> list[Path]:
    written = []
    for job in jobs:
        try:
            written.append(job())
        except Exception as exc:
            if strict:
                raise
            logger.warning("could not draw a figure: %r", exc)
    return written
