"""Mean ± standard error over seeds, as every results table of the benchmarks prints it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error over seeds; the error is NaN for one seed (it is unknown)."""
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, se


def cell(values: Sequence[float], digits: int, signed: bool = False) -> str:
    """``mean ± standard error`` over seeds at ``digits`` decimals; ``signed`` (a difference)
    always shows its sign. With one seed there is no standard error, so no ``±`` is printed."""
    mean, se = mean_se(values)
    text = f"{mean:{'+' if signed else ''}.{digits}f}"
    return text if math.isnan(se) else f"{text} ± {se:.{digits}f}"


def row(label: str, seeds: Sequence[int], cells: Sequence[str]) -> str:
    """A table row: ``label``, the seeds it averages, then ``cells``, each hyphen a minus sign."""
    numbers = [c.replace("-", "−") for c in cells]
    return "| " + " | ".join([label, ", ".join(map(str, seeds)), *numbers]) + " |"


def value_at(record: Mapping[str, Any], path: Sequence[str]) -> float:
    """The number at ``path`` (keys, outermost first) of a ``results.json`` record."""
    found: Any = record
    for key in path:
        found = found[key]
    return float(found)
