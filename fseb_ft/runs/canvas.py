"""The canvas every figure is drawn on: a figure without pyplot, its texts shortened and fitted,
written atomically; and the predictions a figure takes, as CPU tensors.

Figures are drawn on matplotlib's Agg canvas without pyplot, so they need no display, leave any
interactive backend alone and can be drawn from several threads. Every text drawn passes
through :func:`short_name`, so a model named by a long path or Hub id reads as its short name,
and a figure grows until its titles and legends fit on it. Files are written atomically
(temporary file, then rename).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from torch import Tensor

from fseb_ft.runs.atomic import temp_beside

__all__ = [
    "ArrayLike",
    "ProbsLabels",
    "as_probs",
    "as_probs_labels",
    "new_figure",
    "save_figure",
    "short_name",
]

ArrayLike = Any  # torch.Tensor, numpy array or nested lists
ProbsLabels = tuple[ArrayLike, ArrayLike]  # (probs (N, K), labels (N,))

_DPI = 150
# A `local-dir:` model is named by its folder, without the trailing slashes or the punctuation
# that follows it in a title ("local-dir:/a/b/name: PS-MAP vs FS-EB").
_LOCAL_DIR = re.compile(r"local-dir:(\S*?)[/\\]*(?=[,:;)]*(?:\s|$))")
_HF_HUB = re.compile(r"hf-hub:(?=\S)")
_NAME_WIDTH = 40  # characters of a name kept in a plot; longer ones lose their middle
_MAX_FIT_PASSES = 3  # layouts tried while growing a figure to hold its texts


def short_name(text: str, width: int = _NAME_WIDTH) -> str:
    """``text`` as a plot shows it: model names shortened, over-long names cut in the middle.

    ``local-dir:/long/path/efficientnet_lite0.in1k`` becomes ``efficientnet_lite0.in1k`` and
    ``hf-hub:org/name`` becomes ``org/name``, wherever they occur in ``text``; then every word
    (a run of non-space characters, such as a model name) longer than ``width`` characters
    keeps its start and its end around "…", so long names that differ only at their ends
    (``runs/…/seed-0``, ``runs/…/seed-1``) stay apart. Spaces and line breaks are kept.

    Args:
        text: a title, label or legend entry.
        width: the longest word kept whole (at least 3).

    Returns:
        The shortened text.
    """
    text = _LOCAL_DIR.sub(lambda m: re.split(r"[/\\]", m[1])[-1] or m[0], text)
    text = _HF_HUB.sub("", text)
    head = (width - 1) // 2  # the end keeps the extra character: it tells names apart
    tail = width - 1 - head
    return re.sub(rf"\S{{{width + 1},}}", lambda m: f"{m[0][:head]}…{m[0][-tail:]}", text)


def as_probs(x: ArrayLike, name: str) -> Tensor:
    """``x`` (a tensor, array or nested lists of probabilities) as a floating CPU tensor."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x).detach()
    if not t.is_floating_point():
        raise ValueError(f"`{name}` must hold floating-point probabilities, got dtype {t.dtype}")
    return t.cpu()


def as_probs_labels(pair: ProbsLabels, name: str) -> tuple[Tensor, Tensor]:
    """The ``(probs, labels)`` pair that ``name`` maps to, as CPU tensors."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise ValueError(f"{name!r} must map to a (probs, labels) pair, got {type(pair).__name__}")
    probs = as_probs(pair[0], f"probs of {name!r}")
    labels = torch.as_tensor(np.asarray(pair[1]) if not isinstance(pair[1], Tensor) else pair[1])
    return probs, labels.detach().cpu()


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure of ``figsize`` inches on its own Agg canvas, with constrained layout."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _fit_canvas(fig: Figure) -> None:
    """Widen (or heighten) ``fig`` until everything it draws lies on it.

    Constrained layout shrinks the axes to make room for their labels and for legends placed
    outside, but never grows the figure: a title or legend wider than the figure would be cut
    off on both sides. Growing the figure by twice the overhang re-centres it; a few layouts
    settle it, as the axes widen with the figure too.
    """
    for _ in range(_MAX_FIT_PASSES):
        fig.draw_without_rendering()
        renderer = cast(Any, fig.canvas).get_renderer()  # Agg's canvas (FigureCanvasBase has none)
        box = fig.get_tightbbox(renderer)  # inches
        width, height = fig.get_size_inches()
        over_x = max(-box.x0, box.x1 - width, 0.0)
        over_y = max(-box.y0, box.y1 - height, 0.0)
        if over_x < 0.01 and over_y < 0.01:
            # This layout fits: freeze it. No engine at all (None, not "none"'s placeholder),
            # so that savefig draws once instead of laying out again in a dry run first; None
            # reads rcParams, which must not swap in another engine.
            with rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
                fig.set_layout_engine(None)
            return
        fig.set_size_inches(width + 2 * over_x + 0.05, height + 2 * over_y + 0.05)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Shorten every text (:func:`short_name`), fit the figure to them, write ``path``."""
    for text in fig.findobj(Text):
        text.set_text(short_name(text.get_text()))
    _fit_canvas(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    fig.savefig(tmp, format="png", dpi=_DPI)
    os.replace(tmp, path)
    return path
