"""What ``fseb-ft RECIPE --compare`` leaves beside its two runs: ``comparison.md`` / ``.json``
and the side-by-side figures."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fseb_ft.evaluation.bootstrap import Bootstrap, difference_intervals, same_images
from fseb_ft.evaluation.metrics import METRIC_REGISTRY
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.report import EvalResults, write_comparison_plots
from fseb_ft.runs.rundir import COMPARISON_JSON, COMPARISON_MD, write_json
from fseb_ft.runs.tables import interval_text, markdown_table, split_note

__all__ = ["paired_difference", "write_comparison"]

DIFFERENCE_KEY = "paired_difference"
"""``comparison.json``'s key of the paired difference, beside the runs' titles."""


def write_comparison(out: Path, evaluated: Mapping[str, EvalResults], title: str) -> str:
    """Write the comparison of ``evaluated`` (method title → its run's results and predictions)
    into ``out`` under ``title``; return its table.

    ``comparison.md`` is the table after the split note (both runs report on the same split,
    with the same classes), then the paired difference of the last run minus the first
    (:func:`paired_difference`) when the runs have bootstrap intervals;
    ``comparison.json`` the results, and the difference under ``paired_difference``;
    :data:`~fseb_ft.runs.rundir.COMPARISON_PLOTS` are drawn from the runs' predictions (a
    figure that fails is logged and skipped).
    """
    results: dict[str, Any] = {label: e.results for label, e in evaluated.items()}
    table = markdown_table(results, next(iter(evaluated.values())).predictions.class_names)
    note = split_note(next(iter(results.values())))
    difference = paired_difference(evaluated)
    text = table + (_difference_markdown(difference) if difference else "")
    write_text(out / COMPARISON_MD, f"# {title}\n\n{note}{text}")
    write_json(
        out / COMPARISON_JSON, results | ({DIFFERENCE_KEY: difference} if difference else {})
    )
    predictions = {label: e.predictions for label, e in evaluated.items()}
    write_comparison_plots(out, predictions, title, strict=False)
    return text


def paired_difference(evaluated: Mapping[str, EvalResults]) -> dict[str, Any] | None:
    """The last run's metrics minus the first's (FS-EB − PS-MAP), each with its bootstrap
    interval on the same resamples of the same images for both runs; ``None`` without the
    first run's ``intervals`` (``eval.bootstrap: 0``) or two runs. Runs scored on different
    images get ``{"of": …, "unpaired": why}`` and no numbers.
    """
    if len(evaluated) != 2:
        return None
    (label_b, b), (label_a, a) = evaluated.items()
    drawn = b.results.get("intervals")
    if not drawn:
        return None
    record: dict[str, Any] = {"of": [label_a, label_b]}
    if not same_images(a.predictions, b.predictions):
        return record | {"unpaired": "the runs were scored on different images: not paired"}
    names = [n for n in drawn["test"] if n in a.results["intervals"]["test"]]
    scores = sorted({k.rsplit("_", 1)[0] for s in drawn["ood"].values() for k in s})
    found = difference_intervals(
        a.predictions, b.predictions, names, scores, Bootstrap.of_record(drawn)
    )
    record["test"] = {
        n: {"value": a.results["test"][n] - b.results["test"][n], "interval": found["test"][n]}
        for n in names
    }
    record["ood"] = {
        name: {
            key: {
                "value": a.results["ood"][name][key] - b.results["ood"][name][key],
                "interval": pair,
            }
            for key, pair in by_key.items()
        }
        for name, by_key in found["ood"].items()
    }
    return record | {k: v for k, v in found.items() if k not in ("test", "ood")}


def _difference_markdown(record: Mapping[str, Any]) -> str:
    """The paired difference as a table: a row per metric, its difference and interval."""
    a, b = record["of"]
    if "unpaired" in record:
        return f"\n{a} − {b}: {record['unpaired']}, so no paired difference.\n"
    lines = [
        f"\n{a} − {b}, paired ({record['confidence']:.0%} bootstrap interval, the same "
        f"{record['resamples']} resamples of the images for both runs):\n",
        "| Metric | Difference | Interval |",
        "|---|---|---|",
    ]
    rows = [
        (METRIC_REGISTRY[n].title, METRIC_REGISTRY[n].scale, d) for n, d in record["test"].items()
    ]
    rows += [
        (f"{name} {key}", 100.0, d)
        for name, by_key in record["ood"].items()
        for key, d in by_key.items()
    ]
    for title, scale, d in rows:
        value = d["value"]
        digits = 2 if scale != 1.0 else 4  # as the results table shows each metric
        shown = f"{value * scale:+.{digits}f}" if math.isfinite(value) else "–"
        lines.append(f"| {title} | {shown} | {interval_text(d['interval'], scale)} |")
    return "\n".join(lines) + "\n"
