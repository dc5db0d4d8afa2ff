"""The post-hoc blocks of a run's results, written once: each post-hoc method evaluated on the
trained network (temperature scaling, the last-layer Laplace, WiSE-FT) has its key in
``results.json``, the suffix of its table rows and the suffix of its model-index metric names.
Tables, the model card, its model-index, the model folder's ``fseb.json`` and ``--compare`` read
this list, so a new post-hoc method is one line here (and its results block,
:mod:`fseb_ft.runs.report`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LAPLACE",
    "POSTHOC_BLOCKS",
    "TEMPERATURE",
    "WISE",
    "PostHocBlock",
    "posthoc_blocks",
]


@dataclass(frozen=True)
class PostHocBlock:
    """How one post-hoc method's results are named."""

    key: str
    """Its block in ``results.json``, shaped as the results themselves (``test``, ``ood``,
    ``corruptions``, ``groups``, ``intervals``) after what it records of its fit."""
    suffix: str
    """Appended to a method's row title for its rows ("FS-EB · model + TS")."""
    metric_suffix: str
    """Appended to the name of each of its model-index metrics."""


TEMPERATURE = PostHocBlock("temperature_scaled", " + TS", ", temperature-scaled")
"""Temperature scaling (``eval.temperature_scaling``)."""
LAPLACE = PostHocBlock("laplace", " + LLLA", ", last-layer Laplace")
"""The last-layer Laplace approximation (``eval.laplace``)."""
WISE = PostHocBlock("wise_ft", " + WiSE", ", WiSE-FT")
"""WiSE-FT, the weights interpolated with the starting ones (``eval.wise_ft``)."""
POSTHOC_BLOCKS = (TEMPERATURE, LAPLACE, WISE)
"""Every post-hoc block, in the order of their rows."""


def posthoc_blocks(results: Mapping[str, Any]) -> Iterator[tuple[PostHocBlock, Mapping[str, Any]]]:
    """The post-hoc blocks ``results`` has, each with its results, in row order."""
    for block in POSTHOC_BLOCKS:
        if results.get(block.key):
            yield block, results[block.key]
