"""What a sweep leaves beside its trials' run folders: the leaderboard and its comparison.

``leaderboard.json`` (the study, its space, one row per finished trial, the winner and its
results), ``leaderboard.md`` (the table of trials and the winner's results), ``sweep.png`` (the
metric against each searched value) and, for ``--compare``, the table of both sweeps' winners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from fseb_ft.recipe import Recipe, SweepParam
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.plots import sweep_plot
from fseb_ft.runs.rundir import RESULTS_MD, results_split, write_json
from fseb_ft.runs.tables import markdown_table, method_title, split_note

__all__ = [
    "BEST_RECIPE",
    "LEADERBOARD_JSON",
    "LEADERBOARD_MD",
    "SWEEP_PLOT",
    "comparison_table",
    "format_params",
    "write_leaderboard",
]

LEADERBOARD_MD = "leaderboard.md"
LEADERBOARD_JSON = "leaderboard.json"
BEST_RECIPE = "best_recipe.yaml"
"""The winner's resolved recipe, its ``output.dir`` the winner's run folder."""
SWEEP_PLOT = "sweep.png"


def write_leaderboard(
    out: Path, board: Mapping[str, Any], recipe: Recipe, space: Mapping[str, SweepParam]
) -> str:
    """Write ``leaderboard.json``, ``leaderboard.md`` and ``sweep.png`` into ``out``.

    ``board`` is the leaderboard as ``leaderboard.json`` holds it: ``study``, ``trials`` (rows,
    best first, with ``state``, ``value``, ``params`` …) and ``best`` (the winning row and its
    ``results``, or ``None``). Returns the table of trials.
    """
    metric, rows = recipe.sweep.metric, board["trials"]
    write_json(out / LEADERBOARD_JSON, board)
    table = _leaderboard_table(rows, metric)
    title = f"# Sweep {board['study']}: {method_title(recipe)}, validation {metric}\n\n"
    write_text(out / LEADERBOARD_MD, title + table + _winner_markdown(board["best"], recipe))
    scored = [r for r in rows if r["value"] is not None]
    if scored:
        # A parameter without choices is a range: its low and high are set.
        ranges = {
            k: (cast(float, p.low), cast(float, p.high), p.log)
            for k, p in space.items()
            if not p.choices
        }
        sweep_plot(scored, metric, out / SWEEP_PLOT, ranges, title=title[2:].strip())
    return table


def _leaderboard_table(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    keys = sorted({k for r in rows for k in r["params"]})
    head = ["rank", "trial", "state", f"val_{metric}", "epochs", *keys, "folder"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in enumerate(rows, 1):
        value = "–" if r["value"] is None else f"{r['value']:.4g}"
        params = [_format_value(r["params"].get(k, "–")) for k in keys]
        folder = Path(r["dir"]).name if r["dir"] else "–"
        cells = [str(rank), f"#{r['number']}", r["state"], value, str(r["epochs"] or "–")]
        lines.append("| " + " | ".join([*cells, *params, folder]) + " |")
    return "\n".join(lines) + "\n"


def _winner_markdown(best: Mapping[str, Any] | None, recipe: Recipe) -> str:
    """The leaderboard's section on the winner's results: the split they are on (validation
    without a test split, with why that is optimistic) and their table; empty without them."""
    if best is None or best["results"] is None:
        return ""
    results = best["results"]
    where = Path(best["dir"]) / RESULTS_MD
    return (
        f"\n## Winner: trial #{best['number']}, evaluated once on the "
        f"{results_split(results)} split\n\n{split_note(results)}"
        f"{markdown_table({method_title(recipe): results})}\nIn `{where}`.\n"
    )


def comparison_table(boards: Mapping[str, Mapping[str, Any]], metric: str) -> str:
    """Both winners: their validation metric and values, then their test results."""
    lines = [f"| sweep winner | val_{metric} | trial | values |", "|---|---|---|---|"]
    results = {}
    for label, board in boards.items():
        best = board["best"]
        if best is None:
            lines.append(f"| {label} | – | – | no trial completed |")
            continue
        value = f"{best['value']:.4g}"
        lines.append(f"| {label} | {value} | #{best['number']} | {format_params(best['params'])} |")
        if best["results"] is not None:
            results[label] = best["results"]
    test = f"\n{markdown_table(results)}" if results else ""
    return "\n".join(lines) + "\n" + test


def _format_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def format_params(params: Mapping[str, Any]) -> str:
    """A trial's values on one line: ``optim.lr=0.0123, context.kind=train``."""
    return ", ".join(f"{k}={_format_value(v)}" for k, v in params.items())
