"""The confusion-matrix figure of a classifier's predictions: counts, and rows normalised.

Like :mod:`fseb_ft.runs.plots` (whose style it follows: its own canvas, no pyplot, written
atomically by :func:`~fseb_ft.runs.canvas.save_figure`), it takes ``(N, K)`` class
probabilities and ``(N,)`` labels; the matrices are scikit-learn's ``confusion_matrix``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from fseb_ft.runs.canvas import ArrayLike, as_probs_labels, new_figure, save_figure
from fseb_ft.runs.tables import padded_class_names

__all__ = ["MAX_ANNOTATED_CLASSES", "MAX_NAMED_CLASSES", "confusion_plot"]

MAX_ANNOTATED_CLASSES = 20
"""Up to this many classes, each cell shows its number."""
MAX_NAMED_CLASSES = 40
"""Up to this many classes, the axes name every class; beyond, they number a few."""


def confusion_plot(
    probs: ArrayLike,
    labels: ArrayLike,
    path: str | Path,
    class_names: Sequence[str] | None = None,
    title: str = "Confusion matrix",
) -> Path:
    """The confusion matrix, true class by row and predicted class by column, twice: the image
    counts, and each row divided by its count (the diagonal is then each class's recall,
    ``per_class_recall``; a class without images shows a row of 0).

    The predicted class is the arg-max of ``probs`` (ties to the lowest index, as accuracy); the
    matrices are ``sklearn.metrics.confusion_matrix(labels=range(K))`` and its
    ``normalize="true"``. Cells show their numbers for up to :data:`MAX_ANNOTATED_CLASSES`
    classes, the axes every class name for up to :data:`MAX_NAMED_CLASSES`.

    Args:
        probs: ``(N, K)`` class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.
        path: where to write the PNG.
        class_names: the classes' names, index = label (missing ones: their index).
        title: figure title, e.g. the method and split.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    p, y = as_probs_labels((probs, labels), "confusion")
    k = p.shape[1]
    truth, predicted = y.numpy(), p.argmax(dim=-1).numpy()
    from sklearn.metrics import confusion_matrix  # 2 s to import: not on every run's start

    counts = confusion_matrix(truth, predicted, labels=np.arange(k))  # (K, K)
    rates = confusion_matrix(truth, predicted, labels=np.arange(k), normalize="true")  # (K, K)
    names = padded_class_names(class_names, k)
    side = min(8.0, 2.4 + 0.35 * k)
    fig = new_figure(figsize=(2 * side + 1.2, side + 0.6))
    left, right = fig.subplots(1, 2)
    _panel(fig, left, counts, names, f"Images (n = {len(truth)})", "d")
    _panel(fig, right, rates, names, "Fraction of the true class (rows sum to 1)", ".2f")
    fig.suptitle(title)
    return save_figure(fig, path)


def _panel(
    fig: Figure, ax: Axes, matrix: np.ndarray, names: list[str], heading: str, fmt: str
) -> None:
    """One matrix as a heat map with a colour bar, its cells numbered if few enough."""
    k = len(names)
    image = ax.imshow(matrix, cmap="Blues", vmin=0, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if k <= MAX_ANNOTATED_CLASSES:
        # Dark cells get white numbers: blue-on-blue would not read.
        dark = matrix.max() / 2 if matrix.max() > 0 else 1
        for (i, j), value in np.ndenumerate(matrix):
            color = "white" if value > dark else "black"
            ax.text(j, i, format(value, fmt), ha="center", va="center", color=color,
                    fontsize="small" if k <= 10 else "x-small")  # fmt: skip
    ticks = np.arange(k) if k <= MAX_NAMED_CLASSES else np.linspace(0, k - 1, 9).round()
    shown = [names[int(t)] for t in ticks]
    ax.set_xticks(ticks, shown, rotation=45 if k > 2 else 0, ha="right" if k > 2 else "center")
    ax.set_yticks(ticks, shown)
    ax.set_xlabel("Predicted class")
    ax.set_ylabel("True class")
    ax.set_title(heading, fontsize="medium")
