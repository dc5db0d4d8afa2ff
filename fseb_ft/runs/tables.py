"""The Markdown of results: the results table of one or several runs, the corrupted-split
tables, the warnings block and the validation-split note, and the names they give methods and
OOD scores.

Tables read the results dict (:func:`fseb_ft.runs.report.evaluate_predictions`), never a model or
its predictions, so the model card (:mod:`fseb_ft.runs.model_card`) builds them without the
training stack.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from fseb_ft.data.splits import VALIDATION_SPLIT
from fseb_ft.evaluation.conformal import COVERAGE_KEY, SET_SIZE_KEY
from fseb_ft.evaluation.metrics import METRIC_REGISTRY, Metric
from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import Recipe
from fseb_ft.runs.posthoc import posthoc_blocks
from fseb_ft.runs.published import model_label
from fseb_ft.runs.rundir import results_split

__all__ = [
    "VALIDATION_NOTE",
    "clean_reference",
    "corruption_markdown",
    "corruption_summary",
    "groups_markdown",
    "interval_text",
    "intervals_markdown",
    "markdown_table",
    "method_title",
    "ood_score_titles",
    "ood_scores_in",
    "padded_class_names",
    "split_note",
    "split_suffix",
    "warnings_markdown",
]

_COLUMNS: tuple[Metric, ...] = tuple(
    METRIC_REGISTRY[name]
    for name in (
        "accuracy",
        "nll",
        "ece",
        "ece_10bin",
        "brier",
        "sel_pred_auc",
        "aurc",
        "auroc_positive",
    )
)
"""The results table's metric columns, in order; titles and scales are the registry's. A metric
defined for some tasks only (``applies``, e.g. ``auroc_positive`` for K = 2) shows only when some
result has it."""
_TASK_COLUMNS: tuple[Metric, ...] = tuple(
    m for m in METRIC_REGISTRY.values() if m.task and not m.per_class
)
"""The task metrics' columns (``eval.metrics``), after those, each shown when some result has
it; a per-class metric is a table of its own (:func:`_per_class_markdown`)."""
_CONFORMAL_COLUMNS: tuple[tuple[str, str, float], ...] = (
    (COVERAGE_KEY, "Cov. (%)", 100.0),
    (SET_SIZE_KEY, "Set size", 1.0),
)
"""(key, title, scale) of the conformal sets' columns (``eval.conformal``), after the metrics',
each shown when some result has it."""
_CORRUPTION_COLUMNS: tuple[Metric, ...] = tuple(
    METRIC_REGISTRY[name] for name in ("accuracy", "nll", "ece", "sel_pred_auc")
)
"""The columns of the corrupted split's summary table, per severity."""
# (metric suffix, column title) of each OOD score's columns: key f"{score}_{suffix}".
_OOD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("auroc", "AUROC (%)"),
    ("aupr", "AUPR (%)"),
    ("fpr95", "FPR95 (%)"),
)
VALIDATION_NOTE = (
    "no test split was given (`data.test`), so these are the validation split's numbers: model "
    "selection saw them, so they are optimistic"
)
"""Why results on the validation split are reported, and how far to trust them."""


def clean_reference(results: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The clean row of the corruption table and figure: the metrics of the very images that were
    corrupted (``corruption_clean``; ``eval.corruption_limit``'s subset), so a change from clean
    to corrupted is the corruption's alone; ``test`` for results written before that key."""
    return results.get("corruption_clean") or results.get("test")


def corruption_summary(
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
    Sel. Pred. (first the clean images that were corrupted, :func:`clean_reference`), each row
    followed by its post-hoc ones ("<severity> + TS", "<severity> + LLLA") when ``results``
    has those blocks (:data:`~fseb_ft.runs.posthoc.POSTHOC_BLOCKS`); the second the accuracy
    and ECE of every corruption at every severity.
    """
    corruptions = results.get("corruptions") or {}
    if not corruptions:
        return ""
    split = results_split(results)
    summary = results.get("corruption_summary") or corruption_summary(corruptions)
    header = ["Severity", *(m.title for m in _CORRUPTION_COLUMNS)]
    lines = [
        f"## Covariate shift: corrupted {split} split\n\nMean over {len(corruptions)} "
        f"corruption(s): {', '.join(corruptions)}.\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    posthoc = [
        (block.suffix, found)
        for block, found in posthoc_blocks(results)
        if found.get("corruption_summary")
    ]
    rows = [("clean", clean_reference(results) or {})]
    # A post-hoc block with corruption results has its clean row (its test block at least).
    rows += [
        (f"clean{suffix}", cast(Mapping[str, Any], clean_reference(found)))
        for suffix, found in posthoc
    ]
    for sev, metrics in summary.items():
        label = sev if sev != "all" else "all severities"
        rows.append((label, metrics))
        rows += [
            (f"{label}{suffix}", found["corruption_summary"][sev])
            for suffix, found in posthoc
            if sev in found["corruption_summary"]
        ]
    for label, metrics in rows:
        cells = [_num(metrics.get(m.name), m.scale) for m in _CORRUPTION_COLUMNS]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    severities = sorted({sev for by_sev in corruptions.values() for sev in by_sev}, key=int)
    acc, ece = METRIC_REGISTRY["accuracy"], METRIC_REGISTRY["ece"]
    lines += [
        f"\n{acc.title} / {ece.title} per corruption and severity:\n",
        "| Corruption | " + " | ".join(severities) + " |",
        "|" + "---|" * (len(severities) + 1),
    ]
    for name, by_sev in corruptions.items():
        cells = [
            f"{_num(by_sev[s][acc.name], acc.scale)} / {_num(by_sev[s][ece.name], ece.scale)}"
            if s in by_sev
            else "–"
            for s in severities
        ]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


def groups_markdown(
    results: Mapping[str, Any],
    names: Sequence[str] | None = None,
    max_groups: int | None = None,
    level: int = 2,
) -> str:
    """A Markdown table of the per-group results (``results["groups"]``, ``eval.group_by``;
    empty without), under a heading of ``level``.

    One row per group: its value, ``n`` and the results table's metric columns that the groups
    have (only ``names`` when given), each followed by its post-hoc rows ("<value> + TS",
    "<value> + LLLA") when ``results`` has those blocks with groups. A metric a group cannot
    define shows "–", with a note; only the first ``max_groups`` groups are shown when given,
    with the count of the others.
    """
    found = results.get("groups") or {}
    groups: Mapping[str, Mapping[str, Any]] = found.get("groups") or {}
    if not groups:
        return ""
    posthoc = [
        (block.suffix, (found.get("groups") or {}).get("groups") or {})
        for block, found in posthoc_blocks(results)
    ]
    columns = [
        m
        for m in (*_COLUMNS, *_TASK_COLUMNS)
        if (names is None or m.name in names) and any(m.name in g for g in groups.values())
    ]
    header = [f"`{found['column']}`", "n", *(m.title for m in columns)]
    lines = [
        f"{'#' * level} Per group: `{found['column']}` on the {results_split(results)} split\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    shown = list(groups.items())[:max_groups]
    for value, record in shown:
        label = value.replace("|", "\\|") if value else "(empty)"
        rows = [(label, record)]
        rows += [(f"{label}{suffix}", found[value]) for suffix, found in posthoc if value in found]
        for title, metrics in rows:
            cells = [_num(metrics.get(m.name), m.scale) for m in columns]
            lines.append("| " + " | ".join([title, str(metrics["n"]), *cells]) + " |")
    text = "\n".join(lines) + "\n"
    if len(shown) < len(groups):
        text += f"\n{len(groups) - len(shown)} more group(s) in `results.json`.\n"
    others = [record for _, found in posthoc for record in found.values()]
    if any(record.get("undefined") for record in (*groups.values(), *others)):
        text += (
            "\n–: not defined for that group (e.g. an AUROC where one class is present); "
            "`results.json` gives the reason under `undefined`.\n"
        )
    return text


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


def markdown_table(
    results: Mapping[str, Mapping[str, Any]], class_names: Sequence[str] | None = None
) -> str:
    """A Markdown table of several runs' results, one row per method (e.g. PS-MAP, FS-EB).

    Binary tasks get an ``AUROC pos. (%)`` column (positive class = label 1), and the task
    metrics of ``eval.metrics`` a column each after the others (``roc_auc``'s replaces
    ``AUROC pos.``, the same number for K = 2); a per-class one
    (``per_class_recall``) gets a table of its own below, one row per class (``class_names``,
    index = label; the labels where not given) and a column per method. Each OOD set has
    AUROC, AUPR and FPR95 columns for every score found in the results (titles name the score
    unless entropy is the only one); a missing value (an ensemble's logit scores) shows "–". A
    result with post-hoc blocks (:data:`~fseb_ft.runs.posthoc.POSTHOC_BLOCKS`) gets a row for
    each below its own, "<method> + TS", "<method> + LLLA"; a block with a ``note`` (a
    temperature left at 1) also gets it under the table.
    Rows of results on the validation split (no test split) end in "(validation split)".
    Results with conformal sets (``eval.conformal``) get their "Cov. (%)" and "Set size"
    columns after the metrics'. Results with bootstrap ``intervals`` (``eval.bootstrap``) get a
    second table of them, with the same rows and columns but those two
    (:func:`intervals_markdown`).
    """
    notes = _posthoc_notes(results)
    results = _with_posthoc_rows(results)
    ood_names = sorted({n for r in results.values() for n in r.get("ood", {})})
    ood_scores = ood_scores_in(results.values())

    def shown(name: str) -> bool:
        return any(name in r["test"] for r in results.values())

    # A two-class task's roc_auc (eval.metrics) is auroc_positive's number: one column, the one
    # the recipe asked for (for K > 2 there is no auroc_positive).
    doubled = {"auroc_positive"} if shown("roc_auc") else set()
    metrics = [
        (m.name, m.title, m.scale)
        for m in (*_COLUMNS, *_TASK_COLUMNS)
        if ((m.applies is None and not m.task) or shown(m.name)) and m.name not in doubled
    ]
    metrics += [column for column in _CONFORMAL_COLUMNS if shown(column[0])]
    # Entropy alone keeps the titles tables had before other scores existed.
    named = ood_scores != ["entropy"]
    ood_columns = [
        (f"{name}/{score}_{key}", f"{name} {score + ' ' if named else ''}{title}", 100.0)
        for name in ood_names
        for score in ood_scores
        for key, title in _OOD_COLUMNS
    ]
    columns = metrics + ood_columns
    header = ["Method", *(title for _, title, _ in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, res in results.items():
        cells = [_num(_cell(res, key), scale) for key, _, scale in columns]
        lines.append("| " + " | ".join([method, *cells]) + " |")
    table = "\n".join(lines) + "\n" + notes
    # The conformal sets' columns have no bootstrap interval: the intervals table leaves them out.
    drawn = [c for c in columns if c not in _CONFORMAL_COLUMNS]
    return (
        table
        + intervals_markdown(
            results, ["Method", *(t for _, t, _ in drawn)], [(k, s) for k, _, s in drawn]
        )
        + _per_class_markdown(results, class_names)
    )


def _cell(record: Mapping[str, Any], key: str) -> Any:
    """A table cell's value in a results (or intervals) record: ``test``'s ``key``, or for
    ``set/name`` the OOD set's ``name``."""
    ood_set, _, name = key.rpartition("/")
    return (record.get("ood", {}).get(ood_set, {}) if ood_set else record["test"]).get(name)


def intervals_markdown(
    results: Mapping[str, Mapping[str, Any]],
    header: Sequence[str],
    cells: Sequence[tuple[str, float]],
) -> str:
    """The table of the rows of ``results`` that have bootstrap ``intervals``: under
    ``header``, ``[low, high]`` of each of ``cells`` (a test metric's name, or ``set/key`` of an
    OOD metric, and its scale); empty when no row has them."""
    rows = {method: res["intervals"] for method, res in results.items() if res.get("intervals")}
    if not rows:
        return ""
    how = next(iter(rows.values()))
    lines = [
        f"\n{how['confidence']:.0%} bootstrap intervals ({how['method']}, {how['resamples']} "
        "resamples of the evaluated images, within each class for the test metrics; the model "
        "held fixed: not seed-to-seed variation):\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for method, found in rows.items():
        row = [method, *(interval_text(_cell(found, key), scale) for key, scale in cells)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def interval_text(pair: Sequence[float | None] | None, scale: float) -> str:
    """``[low, high]`` in a table's units; "–" where there is none."""
    if not pair or any(v is None or not math.isfinite(v) for v in pair):
        return "–"
    return f"[{_num(pair[0], scale)}, {_num(pair[1], scale)}]"


def _per_class_markdown(
    results: Mapping[str, Mapping[str, Any]], class_names: Sequence[str] | None
) -> str:
    """For each per-class metric some row has, a table of it: a row per class, a column per
    method (classes may be many, methods are few); empty when there is none."""
    out = ""
    for m in METRIC_REGISTRY.values():
        rows = {
            method: res["test"][m.name] for method, res in results.items() if m.name in res["test"]
        }
        if not m.per_class or not rows:
            continue
        k = max(len(values) for values in rows.values())
        lines = [
            f"\n{m.title} per class:\n",
            "| Class | " + " | ".join(rows) + " |",
            "|" + "---|" * (len(rows) + 1),
        ]
        for label, name in enumerate(padded_class_names(class_names, k)):
            cells = [_num(v[label] if label < len(v) else None, m.scale) for v in rows.values()]
            lines.append("| " + " | ".join([name, *cells]) + " |")
        out += "\n".join(lines) + "\n"
    return out


def padded_class_names(class_names: Sequence[str] | None, k: int) -> list[str]:
    """``k`` names, index = label: ``class_names``, then the labels of the classes they miss (a
    head wider than the training set's classes, or no names at all)."""
    names = [str(n) for n in class_names or []][:k]
    return names + [str(i) for i in range(len(names), k)]


def _posthoc_notes(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Lines under a table for each post-hoc row whose block has a ``note`` (a temperature left
    at 1), saying why: otherwise the row repeats its method's numbers with no reason given."""
    notes = [
        f"\n*{method}{block.suffix}:* {found['note']}.\n"
        for method, res in results.items()
        for block, found in posthoc_blocks(res)
        if found.get("note")
    ]
    return "".join(notes)


def ood_scores_in(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The OOD scores some result reports, in the order of
    :data:`~fseb_ft.evaluation.ood.OOD_SCORE_REGISTRY` (that of
    :data:`~fseb_ft.recipe.options.OOD_SCORES`)."""
    found = {k for r in results for scores in r.get("ood", {}).values() for k in scores}
    return [s for s in OOD_SCORE_REGISTRY if f"{s}_auroc" in found]


def ood_score_titles(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The titles (:func:`~fseb_ft.evaluation.ood.register_ood_score`) of the OOD scores some
    result reports, in :func:`ood_scores_in` order."""
    return [OOD_SCORE_REGISTRY[name].title for name in ood_scores_in(results)]


def _with_posthoc_rows(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``results`` with each post-hoc block as a row "<method> + TS", "<method> + LLLA" after
    its own, each row labelled with its split when that is not the test split
    (:func:`split_suffix`)."""
    rows: dict[str, Mapping[str, Any]] = {}
    for method, res in results.items():
        suffix = split_suffix(res)
        rows[f"{method}{suffix}"] = res
        for block, found in posthoc_blocks(res):
            rows[f"{method}{block.suffix}{suffix}"] = found
    return rows


def method_title(recipe: Recipe) -> str:
    """The method's title and the model ("FS-EB · model", "PS-MAP · model", "FS-VI · model",
    …) for tables and titles.

    A ``local-dir:`` model shows as its folder's name: titles are drawn into the published plots.
    """
    title = find_method(recipe.fseb.method).title(recipe.fseb)
    return f"{title} · {model_label(recipe.model.name)}"


def _num(value: float | None, scale: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * scale:.2f}" if scale != 1.0 else f"{value:.4f}"
