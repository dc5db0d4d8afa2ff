"""What ``fseb-ft monitor`` leaves for people and programs: the table it prints, the JSON file
(every check, the estimates and each image's re-weighted prediction) and the figure (the batch's
confidence against validation's, and its class proportions against validation's), both written
atomically into the ``--out`` folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fseb_ft.prediction.shift_report import ShiftCheck, ShiftReport
from fseb_ft.runs.canvas import new_figure, save_figure
from fseb_ft.runs.rundir import write_json

__all__ = ["MONITOR_JSON", "MONITOR_PLOT", "format_table", "reweighted_rows", "write_monitor"]

MONITOR_JSON = "monitor.json"
"""The report's file name in ``--out``."""
MONITOR_PLOT = "monitor.png"
"""The figure's file name in ``--out``."""


def format_table(report: ShiftReport, class_names: Sequence[str]) -> str:
    """The report as a person reads it: one row per check, then the verdict and the estimated
    class proportions."""
    header = (
        f"{'check':<26} {'statistic':>10} {'p-value':>8} {'validation':>10} {'batch':>8}  alarm"
    )
    lines = [header, "-" * len(header)]
    lines += [_row(check) for check in report.checks]
    verdict = "ALARM: the batch is not like the validation split" if report.alarm else "no alarm"
    lines.append(
        f"{verdict} (level {report.level:g}; each test at {report.each_level:g}, Bonferroni "
        f"over {sum(c.alarms for c in report.checks)} tests)"
    )
    shift = report.label_shift
    pairs = ", ".join(
        f"{name} {100 * q:.1f}% ({100 * p:.1f}%)"
        for name, q, p in zip(class_names, shift.proportions, shift.reference, strict=True)
    )
    note = "" if shift.identifiable else " [not identifiable: the confusion matrix is singular]"
    lines.append(f"class proportions, BBSE estimate (validation): {pairs}{note}")
    return "\n".join(lines)


def _row(check: ShiftCheck) -> str:
    def number(x: float | None, width: int, percent: bool = False) -> str:
        if x is None:
            return f"{'-':>{width}}"
        return f"{100 * x:>{width - 1}.1f}%" if percent else f"{x:>{width}.4g}"

    flag = "ALARM" if check.alarm else ("no" if check.alarms else "(reports)")
    return (
        f"{check.title:<26} {number(check.statistic, 10)} {number(check.p_value, 8)} "
        f"{number(check.expected, 10, True)} {number(check.observed, 8, True)}  {flag}"
    )


def reweighted_rows(
    report: ShiftReport, names: Sequence[str], class_names: Sequence[str]
) -> list[dict[str, Any]]:
    """Each image's prediction, and its prediction re-weighted for the estimated label shift."""
    rows = []
    for i, name in enumerate(names):
        p, q = report.probabilities[i], report.reweighted[i]
        rows.append({
            "image": name,
            "prediction": class_names[int(p.argmax())],
            "probability": float(p.max()),
            "reweighted_prediction": class_names[int(q.argmax())],
            "reweighted_probabilities": [round(float(x), 6) for x in q],
        })  # fmt: skip
    return rows


def write_monitor(
    out: Path, record: dict[str, Any], report: ShiftReport, class_names: Sequence[str]
) -> tuple[Path, Path]:
    """Write ``record`` as :data:`MONITOR_JSON` and the figure as :data:`MONITOR_PLOT` into
    ``out`` (created); return both paths."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MONITOR_JSON, record)
    return out / MONITOR_JSON, monitor_plot(report, class_names, out / MONITOR_PLOT)


def monitor_plot(report: ShiftReport, class_names: Sequence[str], path: Path) -> Path:
    """Two panels: the top-class probability of validation's and the batch's images (fractions
    of each), and the class proportions: validation's labels, the batch's predictions and
    BBSE's estimate."""
    fig = new_figure(figsize=(11.0, 4.2))
    left, right = fig.subplots(1, 2)
    edges = list(np.linspace(0.0, 1.0, 21))
    for label, conf, color in (("validation", report.confidence[0], "C0"),
                               ("batch", report.confidence[1], "C1")):  # fmt: skip
        weights = np.full(len(conf), 1.0 / len(conf))
        left.hist(conf, bins=edges, weights=weights, color=color, alpha=0.3)
        left.hist(conf, bins=edges, weights=weights, color=color, histtype="step", lw=1.6,
                  label=f"{label} (n = {len(conf)})")  # fmt: skip
    left.set_xlabel("Top-class probability")
    left.set_ylabel("Fraction of images")
    left.set_title("Confidence")
    left.legend(loc="upper left")
    k = len(class_names)
    x = np.arange(k)
    predicted = np.bincount(report.probabilities.argmax(axis=1), minlength=k)[:k]
    bars = (("validation (labels)", report.label_shift.reference),
            ("batch (predicted)", predicted / max(predicted.sum(), 1)),
            ("batch (BBSE estimate)", report.label_shift.proportions))  # fmt: skip
    for j, (label, values) in enumerate(bars):
        right.bar(x + (j - 1) * 0.27, values, width=0.27, label=label, color=f"C{j}")
    right.set_xticks(x, [str(n) for n in class_names], rotation=45 if k > 6 else 0, ha="right"
                     if k > 6 else "center")  # fmt: skip
    right.set_ylabel("Share of images")
    right.set_title("Class proportions")
    # Room above the tallest bar for the legend, which would cover bars anywhere else.
    right.set_ylim(0, 1.6 * max(float(np.max(values)) for _, values in bars))
    right.legend(loc="upper left", ncol=2, fontsize="small")
    verdict = "ALARM" if report.alarm else "no alarm"
    fig.suptitle(f"Batch against validation: {verdict} at level {report.level:g}")
    return save_figure(fig, path)
