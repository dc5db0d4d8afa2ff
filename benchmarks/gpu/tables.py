"""The GPU script's tables: the rows its parts print, and their Markdown. Torch-free, so the
script's own process (``python -m benchmarks.gpu``) imports no more than it needs to start the
parts and write their summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

ROW_PREFIX = "row: "
"""Each row is printed as it is measured, so a part stopped at its time limit keeps its rows."""
PROFILED = ("timm", "PS-MAP")
"""The steps :mod:`benchmarks.gpu.profile` compares, in the order of its table."""


@dataclass(frozen=True)
class Row:
    """One (model, variant, method) measurement."""

    model: str
    variant: str
    method: str
    batch: int
    """B, training images per step."""
    M: int
    ms: float
    """Median step time, milliseconds."""
    images_per_s: float
    """B / median step time (the context points are not counted)."""
    peak_mib: float | None
    """Peak allocated device memory from the method's build on; ``None`` on CPU."""
    first_s: float
    """The first step's seconds (under ``compile``, compilation included)."""


def ratios(rows: Sequence[Row]) -> dict[str, float]:
    """PS-MAP / timm and FS-EB / PS-MAP step-time ratios, and each FS-EB ratio's floor
    ``(B + M) / B``, keyed ``"<model>/<variant>/<what>"``."""
    by = {(r.model, r.variant, r.method): r for r in rows}
    out: dict[str, float] = {}
    for model, variant, method in by:
        row = by[model, variant, method]
        base = by.get((model, variant, "PS-MAP"))
        key = f"{model}/{variant}"
        if method == "PS-MAP" and (ref := by.get((model, variant, "timm"))):
            out[f"{key}/PS-MAP÷timm"] = round(row.ms / ref.ms, 3)
        if method.startswith("FS-EB") and base:
            out[f"{key}/{method}÷PS-MAP"] = round(row.ms / base.ms, 3)
            out[f"{key}/{method} floor"] = round((row.batch + row.M) / row.batch, 3)
    return out


def table(rows: Sequence[Row], found: dict[str, float]) -> str:
    """The Markdown table of the rows, with each row's ratio and its goal."""
    lines = [
        "| model | variant | method | M | step ms | img/s | peak MiB | first step s | ratio "
        "| goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        key = f"{r.model}/{r.variant}"
        if r.method == "PS-MAP":
            ratio, goal = found.get(f"{key}/PS-MAP÷timm"), 1.05
            ratio_cell = "—" if ratio is None else f"{ratio:.2f} × timm"
        elif r.method.startswith("FS-EB"):
            ratio = found.get(f"{key}/{r.method}÷PS-MAP")
            goal = 1.1 * found[f"{key}/{r.method} floor"] if ratio is not None else None
            ratio_cell = "—" if ratio is None else f"{ratio:.2f} × PS-MAP"
        else:
            ratio_cell, goal = "1 (reference)", None
        peak = "n/a" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        goal_cell = "" if goal is None else f"≤ {goal:.2f}"
        lines.append(
            f"| {r.model} | {r.variant} | {r.method} | {r.M} | {r.ms:.1f} | "
            f"{r.images_per_s:.0f} | {peak} | {r.first_s:.1f} | {ratio_cell} | {goal_cell} |"
        )
    return "\n".join(lines)


def report(result: dict[str, object]) -> str:
    """The Markdown of one variant's profile (``benchmarks.gpu.profile.figures``): the per-step
    totals and the difference table."""
    lines = ["| method | wall ms | kernel ms | kernels |", "|---|---|---|---|"]
    for method in PROFILED:
        p = cast(dict[str, float], result[method])
        lines.append(
            f"| {method} | {p['wall_ms']:.1f} | {p['kernel_ms']:.1f} | {p['kernels']:.0f} |"
        )
    lines += ["", f"| operator | {PROFILED[0]} ms | {PROFILED[1]} ms | calls | calls |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name, ta, tb, ca, cb in cast(list[tuple[str, float, float, float, float]],
                                     result["differences"]):  # fmt: skip
        lines.append(f"| `{name}` | {ta:.3f} | {tb:.3f} | {ca:.0f} | {cb:.0f} |")
    return "\n".join(lines)


def reports(result: dict[str, object]) -> str:
    """The Markdown of every variant's profile, each under its name."""
    return "\n\n".join(
        f"Profile, {variant}:\n\n{report(cast(dict[str, object], found))}"
        for variant, found in result.items()
    )


def first_steps(result: dict[str, object]) -> str:
    """The Markdown of :mod:`benchmarks.gpu.firststep`'s figures: per model, one row per case,
    then the operators of its profiled first step."""
    out = []
    for model, found in result.items():
        if not isinstance(found, dict):
            continue  # cuDNN's version
        lines = [f"{model}:", "", "| case | batch | cuDNN | first step s | steady ms "
                 "| one-time s |", "|---|---|---|---|---|---|"]  # fmt: skip
        for c in found["cases"]:
            cudnn = "on" if c["cudnn"] else "off"
            lines.append(f"| {c['case']} | {c['batch']} | {cudnn} | {c['first_s']:.2f} | "
                         f"{c['steady_ms']:.1f} | {c['one_time_s']:.2f} |")  # fmt: skip
        lines += ["", "| operator (profiled first step) | own host ms | calls |", "|---|---|---|"]
        lines += [f"| `{name}` | {ms:.1f} | {calls} |" for name, ms, calls in found["profiled_top"]]
        out.append("\n".join(lines))
    return "\n\n".join(out)
