"""What ``fseb-ft RECIPE --compare`` leaves beside its two runs: ``comparison.md`` / ``.json``
and the side-by-side figures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.report import EvalResults, write_comparison_plots
from fseb_ft.runs.rundir import COMPARISON_JSON, COMPARISON_MD, write_json
from fseb_ft.runs.tables import markdown_table, split_note

__all__ = ["write_comparison"]


def write_comparison(out: Path, evaluated: Mapping[str, EvalResults], title: str) -> str:
    """Write the comparison of ``evaluated`` (method title → its run's results and predictions)
    into ``out`` under ``title``; return its table.

    ``comparison.md`` is the table after the split note (both runs report on the same split,
    with the same classes),
    ``comparison.json`` the results; :data:`~fseb_ft.runs.rundir.COMPARISON_PLOTS` are drawn
    from the runs' predictions (a figure that fails is logged and skipped).
    """
    results = {label: e.results for label, e in evaluated.items()}
    table = markdown_table(results, next(iter(evaluated.values())).predictions.class_names)
    note = split_note(next(iter(results.values())))
    write_text(out / COMPARISON_MD, f"# {title}\n\n{note}{table}")
    write_json(out / COMPARISON_JSON, results)
    predictions = {label: e.predictions for label, e in evaluated.items()}
    write_comparison_plots(out, predictions, title, strict=False)
    return table
