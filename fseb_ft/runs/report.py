"""Reporting: the results dict (metrics) from predictions, its Markdown tables and warnings
block, ``results.json`` / ``results.md``, and the figures drawn from the predictions.

Nothing here predicts or loads a model (that is :mod:`fseb_ft.evaluation.predictions`), so the model card
(:mod:`fseb_ft.runs.model_card`) can build its tables without the training stack.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fseb_ft.runs.atomic import write_text
from fseb_ft.recipe import Recipe
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.ood import ood_metrics
from fseb_ft.recipe.options import OOD_SCORES
from fseb_ft.runs.published import model_label
from fseb_ft.runs.rundir import (
    COMPARISON_PLOTS,
    CORRUPTION_PLOT,
    PLOTS,
    RESULTS_JSON,
    RESULTS_MD,
    RESULTS_SPLIT,
    VALIDATION_SPLIT,
    results_split,
    write_json,
)
from fseb_ft.evaluation.temperature import fit_temperature, temperature_identified

if TYPE_CHECKING:  # predict needs Accelerate; a report only reads the Predictions' tensors.
    from fseb_ft.evaluation.predictions import Predictions

__all__ = [
    "OOD_SCORE_TITLES",
    "TS_SUFFIX",
    "EvalResults",
    "corruption_markdown",
    "eval_results",
    "evaluate_predictions",
    "markdown_table",
    "method_title",
    "ood_scores_in",
    "split_note",
    "split_suffix",
    "temperature_scaled_results",
    "warnings_markdown",
    "write_comparison_plots",
    "write_corruption_plot",
    "write_plots",
    "write_results",
]

logger = logging.getLogger(__name__)


class EvalResults(dict):
    """A results dict (JSON-ready, as :func:`evaluate_predictions` returns) that also carries the
    :class:`Predictions` it was computed from as ``.predictions``, so figures can be drawn
    without predicting again. The predictions are not part of the dict and never serialised.
    """

    def __init__(self, results: Mapping[str, Any], predictions: Predictions | None = None):
        """Copy ``results`` and attach ``predictions``."""
        super().__init__(results)
        self.predictions = predictions


# (results key, column title, scale) — percentages as in the paper's tables.
_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("accuracy", "Acc. (%)", 100.0),
    ("nll", "NLL", 1.0),
    ("ece", "ECE (%)", 100.0),
    ("ece_10bin", "ECE-10 (%)", 100.0),
    ("brier", "Brier", 1.0),
    ("sel_pred_auc", "Sel. Pred. (%)", 100.0),
    ("aurc", "AURC (%)", 100.0),
)
# Shown only when some result has it (binary tasks, see metrics.classification_metrics).
_OPTIONAL_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("auroc_positive", "AUROC pos. (%)", 100.0),
)
# (metric suffix, column title) of each OOD score's columns: key f"{score}_{suffix}".
_OOD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("auroc", "AUROC (%)"),
    ("aupr", "AUPR (%)"),
    ("fpr95", "FPR95 (%)"),
)
OOD_SCORE_TITLES = {
    "entropy": "predictive entropy",
    "msp": "negative maximum softmax probability (−MSP)",
    "max_logit": "negative maximum logit",
    "energy": "energy (−logsumexp of the logits)",
}
"""How tables and the model card name each score of ``eval.ood_scores``."""
TS_SUFFIX = " + TS"
"""Appended to a method's row title for its temperature-scaled results."""
VALIDATION_NOTE = (
    "no test split was given (`data.test`), so these are the validation split's numbers: model "
    "selection saw them, so they are optimistic"
)
"""Why results on the validation split are reported, and how far to trust them."""


def evaluate_predictions(
    test: tuple[Tensor, Tensor],
    ood: Mapping[str, Tensor] | None = None,
    corruptions: Mapping[str, Mapping[int, Tensor]] | None = None,
    corruption_labels: Tensor | None = None,
    *,
    ood_scores: Sequence[str] = ("entropy",),
    test_logits: Tensor | None = None,
    ood_logits: Mapping[str, Tensor] | None = None,
) -> dict[str, Any]:
    """The metrics of the test predictions, each named OOD set and each corruption.

    The metrics are those docs/quickstart.md lists under "The demo" (accuracy, NLL, ECE, Brier,
    selective prediction, AURC; OOD detection by the scores of ``ood_scores``).

    Args:
        test: (log-probabilities (N, K), labels (N,)) on the in-distribution test split.
        ood: name → log-probabilities (N_o, K) on that semantic-shift set.
        corruptions: corruption name → severity → log-probabilities (N_c, K) on the corrupted
            test split.
        corruption_labels: labels (N_c,) of the corrupted images; ``None``: ``test``'s.
        ood_scores: the OOD scores to report (``eval.ood_scores``).
        test_logits, ood_logits: the logits behind ``test`` and ``ood`` (``None`` for an
            ensemble: its logit scores are then absent).

    Returns:
        ``{"test": {metric: float, "n": N}, "ood": {name: {metric: float, "n": N_o}}}``; with
        ``corruptions`` also ``"corruptions": {name: {"1": {metric: float, "n": N}, ...}}``
        (severities as strings, as JSON keys) and ``"corruption_summary": {"1": {metric: mean
        over the corruptions}, ..., "all": {metric: mean over every corruption and severity}}``.
        The metrics are those of ``test`` (:func:`~fseb_ft.evaluation.metrics.classification_metrics`).
    """
    log_probs, labels = test
    out: dict[str, Any] = {
        "test": {k: float(v) for k, v in classification_metrics(log_probs, labels).items()}
    }
    out["test"]["n"] = len(labels)
    probs_in = log_probs.exp()  # (N, K)
    out["ood"] = {}
    for name, lp in (ood or {}).items():
        z_out = (ood_logits or {}).get(name)  # (N_o, K) or None
        found = ood_metrics(probs_in, lp.exp(), tuple(ood_scores), test_logits, z_out)
        scores = {k: float(v) for k, v in found.items()}
        out["ood"][name] = scores | {"n": len(lp)}
    if corruptions:
        c_labels = labels if corruption_labels is None else corruption_labels  # (N_c,)
        out["corruptions"] = {
            name: {
                str(sev): {k: float(v) for k, v in classification_metrics(lp, c_labels).items()}
                | {"n": len(lp)}
                for sev, lp in sorted(by_severity.items())
            }
            for name, by_severity in corruptions.items()
        }
        out["corruption_summary"] = _corruption_summary(out["corruptions"])
    return out


def _corruption_summary(
    corruptions: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, dict[str, float]]:
    """Per severity (and ``"all"``), the mean of every metric over the corruptions."""
    groups: dict[str, list[Mapping[str, float]]] = {}
    for by_severity in corruptions.values():
        for sev, metrics in by_severity.items():
            groups.setdefault(sev, []).append(metrics)
            groups.setdefault("all", []).append(metrics)
    order = [*sorted((k for k in groups if k != "all"), key=int), "all"]
    return {
        sev: {
            key: math.fsum(m[key] for m in groups[sev]) / len(groups[sev])
            for key in groups[sev][0]
            if key != "n"
        }
        | {"corruptions": len(groups[sev])}
        for sev in order
    }


def corruption_markdown(results: Mapping[str, Any]) -> str:
    """Markdown tables of the corrupted test (or validation) split (empty without
    ``corruptions``).

    The first gives, per severity, the mean over the corruptions of accuracy, NLL, ECE and
    Sel. Pred. (the clean split first, for reference), each row followed by its
    temperature-scaled one ("<severity> + TS") when ``results`` has a ``temperature_scaled``
    block; the second the accuracy and ECE of every corruption at every severity.
    """
    corruptions = results.get("corruptions") or {}
    if not corruptions:
        return ""
    split = results_split(results)
    summary = results.get("corruption_summary") or _corruption_summary(corruptions)
    columns = [c for c in _COLUMNS if c[0] in ("accuracy", "nll", "ece", "sel_pred_auc")]
    header = ["Severity", *(title for _, title, _ in columns)]
    lines = [
        f"## Covariate shift: corrupted {split} split\n\nMean over {len(corruptions)} "
        f"corruption(s): {', '.join(corruptions)}.\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    scaled = results.get("temperature_scaled") or {}
    scaled_summary = scaled.get("corruption_summary") or {}
    rows = [("clean", results.get("test", {}))]
    if scaled_summary:
        rows.append((f"clean{TS_SUFFIX}", scaled["test"]))
    for sev, metrics in summary.items():
        label = sev if sev != "all" else "all severities"
        rows.append((label, metrics))
        if sev in scaled_summary:
            rows.append((f"{label}{TS_SUFFIX}", scaled_summary[sev]))
    for label, metrics in rows:
        cells = [_num(metrics.get(key), scale) for key, _, scale in columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    severities = sorted({sev for by_sev in corruptions.values() for sev in by_sev}, key=int)
    lines += [
        "\nAcc. (%) / ECE (%) per corruption and severity:\n",
        "| Corruption | " + " | ".join(severities) + " |",
        "|" + "---|" * (len(severities) + 1),
    ]
    for name, by_sev in corruptions.items():
        cells = [
            f"{_num(by_sev[s]['accuracy'], 100.0)} / {_num(by_sev[s]['ece'], 100.0)}"
            if s in by_sev
            else "–"
            for s in severities
        ]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


def warnings_markdown(results: Mapping[str, Any]) -> str:
    """A Markdown warning block for the problems training recorded (empty when none)."""
    found = (results.get("training") or {}).get("warnings") or []
    if not found:
        return ""
    return "\n>\n".join(f"> **Warning:** {text}" for text in found) + "\n\n"


def split_note(results: Mapping[str, Any]) -> str:
    """A Markdown note for results on the validation split (empty for the test split)."""
    if results_split(results) != VALIDATION_SPLIT:
        return ""
    return f"> **Validation split:** {VALIDATION_NOTE}.\n\n"


def split_suffix(results: Mapping[str, Any]) -> str:
    """``" (validation split)"`` for a table row of results on the validation split, else ``""``."""
    return " (validation split)" if results_split(results) == VALIDATION_SPLIT else ""


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of several runs' results, one row per method (e.g. PS-MAP, FS-EB).

    Binary tasks get an ``AUROC pos. (%)`` column (positive class = label 1). Each OOD set has
    AUROC, AUPR and FPR95 columns for every score found in the results (titles name the score
    unless entropy is the only one); a missing value (an ensemble's logit scores) shows "–". A
    result with a ``temperature_scaled`` block gets a second row, "<method> + TS", below its own;
    one whose temperature was left at 1 also gets a note under the table saying why.
    Rows of results on the validation split (no test split) end in "(validation split)".
    """
    notes = _ts_notes(results)
    results = _with_ts_rows(results)
    ood_names = sorted({n for r in results.values() for n in r.get("ood", {})})
    ood_scores = ood_scores_in(results.values())
    columns = list(_COLUMNS)
    columns += [c for c in _OPTIONAL_COLUMNS if any(c[0] in r["test"] for r in results.values())]
    header = ["Method", *(title for _, title, _ in columns)]
    # Entropy alone keeps the titles tables had before other scores existed.
    named = ood_scores != ["entropy"]
    header += [
        f"{name} {score + ' ' if named else ''}{title}"
        for name in ood_names
        for score in ood_scores
        for _, title in _OOD_COLUMNS
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, res in results.items():
        row = [method]
        row += [_num(res["test"].get(key), scale) for key, _, scale in columns]
        for name in ood_names:
            scores = res.get("ood", {}).get(name, {})
            for score in ood_scores:
                row += [_num(scores.get(f"{score}_{key}"), 100.0) for key, _ in _OOD_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n" + notes


def _ts_notes(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Lines under a table for each "+ TS" row whose temperature was left at 1, saying why:
    otherwise the row repeats its method's numbers with no reason given."""
    notes = [
        f"\n*{method}{TS_SUFFIX}:* {res['temperature_scaled']['note']}.\n"
        for method, res in results.items()
        if (res.get("temperature_scaled") or {}).get("note")
    ]
    return "".join(notes)


def write_results(
    run_dir: Path,
    results: Mapping[str, Any],
    title: str,
    predictions: Predictions | None = None,
) -> None:
    """Write ``results.json`` (machines), ``results.md`` (people) and the plots into ``run_dir``.

    ``predictions`` (default: ``results.predictions`` when ``results`` is an
    :class:`EvalResults`) are drawn with :func:`write_plots` (``strict=False``: a figure that
    fails is logged as a warning, after the results are written).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / RESULTS_JSON, results)
    heading = f"{title}{split_suffix(results)}"  # figures and heading name a validation split
    md = f"# {heading}\n\n" + split_note(results) + warnings_markdown(results)
    md += markdown_table({title: results})
    if results.get("corruptions"):
        md += "\n" + corruption_markdown(results)
    write_text(run_dir / RESULTS_MD, md)
    if predictions is None:
        predictions = getattr(results, "predictions", None)
    if predictions is not None:
        write_plots(run_dir, predictions, heading, strict=False)
    write_corruption_plot(run_dir, results, title)


def write_corruption_plot(directory: Path, results: Mapping[str, Any], title: str) -> None:
    """:data:`CORRUPTION_PLOT` from ``results["corruptions"]`` (if any); a failure is logged."""
    if not results.get("corruptions"):
        return
    from fseb_ft.runs import plots

    path = Path(directory) / CORRUPTION_PLOT
    clean = results.get("test")
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


def eval_results(predictions: Predictions, ood_scores: Sequence[str] = ("entropy",)) -> EvalResults:
    """The metrics of ``predictions`` (:func:`evaluate_predictions`), carrying them.

    Predictions with validation logits (``eval.temperature_scaling``) also get
    ``temperature_scaled`` (:func:`temperature_scaled_results`). ``RESULTS_SPLIT`` (first) names
    the split the in-distribution metrics come from (``predictions.split``).
    """
    results = EvalResults(
        {RESULTS_SPLIT: predictions.split}
        | evaluate_predictions(
            predictions.test,
            predictions.ood,
            predictions.corruptions,
            predictions.corruption_labels,
            ood_scores=ood_scores,
            test_logits=predictions.test_logits,
            ood_logits=predictions.ood_logits,
        ),
        predictions,
    )
    if predictions.val is not None:
        results["temperature_scaled"] = temperature_scaled_results(predictions, ood_scores)
    return results


def temperature_scaled_results(
    predictions: Predictions, ood_scores: Sequence[str] = ("entropy",)
) -> dict[str, Any]:
    """``{"temperature": T, "test": ..., "ood": ...}``: ``T`` fitted on ``predictions.val`` by
    NLL (:func:`~fseb_ft.evaluation.temperature.fit_temperature`), then the metrics of ``logits / T`` on the
    test split, the OOD sets and the corruptions (as :func:`evaluate_predictions`).
    A fit that ran into an end of the searched range is not used: ``T`` = 1, with the fitted
    value and a ``note`` saying why.
    """
    if predictions.val is None:
        raise ValueError("temperature scaling needs the validation split's logits")
    fitted = float(fit_temperature(*predictions.val))
    temperature = fitted if temperature_identified(fitted) else 1.0
    scaled = predictions.scaled(temperature)
    metrics = evaluate_predictions(
        scaled.test,
        scaled.ood,
        scaled.corruptions,
        scaled.corruption_labels,
        ood_scores=ood_scores,
        test_logits=scaled.test_logits,
        ood_logits=scaled.ood_logits,
    )
    if temperature == fitted:
        return {"temperature": temperature, **metrics}
    note = (
        f"temperature scaling left off (T = 1): the validation NLL has no minimum in the "
        f"searched range, it is lowest at T = {fitted:.3g} (validation predicted perfectly), "
        "so validation cannot set the model's confidence"
    )
    return {"temperature": temperature, "fitted_temperature": fitted, "note": note, **metrics}


def ood_scores_in(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The OOD scores (in :data:`~fseb_ft.recipe.options.OOD_SCORES` order) some result reports."""
    found = {k for r in results for scores in r.get("ood", {}).values() for k in scores}
    return [s for s in OOD_SCORES if f"{s}_auroc" in found]


def _with_ts_rows(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``results`` with each temperature-scaled block as a row "<method> + TS" after its own,
    each row labelled with its split when that is not the test split (:func:`split_suffix`)."""
    rows: dict[str, Mapping[str, Any]] = {}
    for method, res in results.items():
        suffix = split_suffix(res)
        rows[f"{method}{suffix}"] = res
        if res.get("temperature_scaled"):
            rows[f"{method}{TS_SUFFIX}{suffix}"] = res["temperature_scaled"]
    return rows


def method_title(recipe: Recipe) -> str:
    """ "FS-EB · model", "PS-MAP · model" or "FS-VI · model" for tables and titles.

    A ``local-dir:`` model shows as its folder's name: titles are drawn into the published plots.
    """
    return f"{recipe.fseb.method_name} · {model_label(recipe.model.name)}"


def _num(value: float | None, scale: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * scale:.2f}" if scale != 1.0 else f"{value:.4f}"


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
