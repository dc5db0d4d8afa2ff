"""Figures of a classifier's predictions and results: reliability diagram, selective prediction,
OOD entropy, corruptions, sweep and learning curves.

The prediction figures take ``(N, K)`` class probabilities and ``(N,)`` integer labels, as torch
tensors or numpy arrays; every function takes a path, writes one PNG there
(:func:`fseb_ft.runs.canvas.save_figure`: texts shortened, figure fitted, atomic) and returns the
path. Every number drawn comes from :mod:`fseb_ft.evaluation.metrics` (the same bins, curves and
areas as the results tables); nothing is re-derived here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, NullFormatter
from torch import Tensor

from fseb_ft.evaluation import metrics as M
from fseb_ft.evaluation.ood import ood_metrics
from fseb_ft.runs.canvas import (
    ArrayLike,
    ProbsLabels,
    as_probs,
    as_probs_labels,
    new_figure,
    save_figure,
)

__all__ = [
    "corruption_plot",
    "entropy_histogram",
    "learning_curves",
    "reliability_comparison",
    "reliability_diagram",
    "selective_prediction_plot",
    "sweep_plot",
]

_ACC_COLOR = "#3b6fb6"
_GAP_COLOR = "#d62728"
_GAP_FACE = (0.84, 0.15, 0.16, 0.12)  # _GAP_COLOR, faint
_COUNT_COLOR = "#7f7f7f"
# Coverage below which accuracy rests on a handful of samples; the y-axis ignores it.
_MIN_COVERAGE_FOR_YLIM = 0.05


def reliability_diagram(
    probs: ArrayLike,
    labels: ArrayLike,
    path: str | Path,
    n_bins: int = 15,
    title: str = "Reliability diagram",
) -> Path:
    """Top-label reliability diagram with a bin-count histogram underneath.

    Upper panel: for each non-empty confidence bin of
    :func:`fseb_ft.evaluation.metrics.calibration_bins` (the bins of
    :func:`~fseb_ft.evaluation.metrics.ece`), a bar up to the bin's accuracy and a hatched red
    bar from there to its mean confidence (the gap: above the accuracy bar means
    over-confident, inside it under-confident), with the diagonal of perfect calibration. The
    panel title gives the ECE (:func:`~fseb_ft.evaluation.metrics.ece`, same ``n_bins``), the
    overall accuracy and the mean confidence. Lower panel: samples per bin on a log scale. The
    confidence axis starts at the bin holding ``1/K``, below which no top-label confidence can
    fall.

    Args:
        probs: ``(N, K)`` class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.
        path: where to write the PNG (parent folders are created).
        n_bins: number of equal-width confidence bins (15, like the reported ECE).
        title: first line of the panel title, e.g. the method.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    return reliability_comparison({title: (probs, labels)}, path, n_bins=n_bins)


def reliability_comparison(
    methods: Mapping[str, ProbsLabels],
    path: str | Path,
    n_bins: int = 15,
    title: str | None = None,
) -> Path:
    """Reliability diagrams of several methods side by side (one column each, shared axes).

    Each column is drawn as in :func:`reliability_diagram`; the legend is shared below.

    Args:
        methods: method name → ``(probs (N, K), labels (N,))``, in column order.
        path: where to write the PNG.
        n_bins: number of equal-width confidence bins.
        title: optional figure title above the columns.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if not methods:
        raise ValueError("`methods` must name at least one (probs, labels) pair, got none")
    data = {name: as_probs_labels(pair, name) for name, pair in methods.items()}
    n = len(data)
    fig = new_figure(figsize=(4.6 * n + 0.4, 6.0))
    axes = fig.subplots(
        2, n, sharex="col", sharey="row", squeeze=False, gridspec_kw={"height_ratios": [3, 1]}
    )
    x_lo = min(_lowest_bin_edge(p.shape[1], n_bins) for p, _ in data.values())
    for col, (name, (probs, labels)) in enumerate(data.items()):
        _draw_reliability(axes[0, col], axes[1, col], probs, labels, n_bins, name, x_lo)
        if col > 0:
            axes[0, col].tick_params(labelleft=False)
            axes[1, col].tick_params(labelleft=False)
            axes[0, col].set_ylabel("")
            axes[1, col].set_ylabel("")
    # Shared log count axis, from below 1 sample to above the fullest bin (and its label).
    axes[1, 0].set_ylim(0.5, 8.0 * max(len(labels) for _, labels in data.values()))
    handles = [
        Patch(facecolor=_ACC_COLOR, edgecolor="black", label="Accuracy in bin"),
        Line2D([], [], color=_GAP_COLOR, lw=2.2, label="Mean confidence in bin"),
        Patch(facecolor=_GAP_FACE, hatch="//", edgecolor=_GAP_COLOR, label="Calibration gap"),
        axes[0, 0].lines[0],
        Patch(facecolor=_COUNT_COLOR, label="Samples in bin"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2 if n == 1 else 5)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def selective_prediction_plot(
    methods: Mapping[str, ProbsLabels],
    path: str | Path,
    title: str = "Selective prediction",
) -> Path:
    """Accuracy–coverage curves of one or several methods, Sel. Pred. AUC in the legend.

    Samples are admitted in decreasing order of confidence (max probability); each curve is
    :func:`fseb_ft.evaluation.metrics.selective_prediction` (tied confidences grouped) and its
    legend entry gives the area under it, the "Sel. Pred." column of the results table. The
    y-axis is fitted to coverages of at least 5 % (below that the accuracy rests on a handful of
    samples and may leave the axes) and ends at 100 %.

    Args:
        methods: method name → ``(probs (N, K), labels (N,))``; N may differ between methods.
        path: where to write the PNG.
        title: axes title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if not methods:
        raise ValueError("`methods` must name at least one (probs, labels) pair, got none")
    fig = new_figure(figsize=(6.0, 5.0))
    ax = fig.subplots()
    y_lo = 1.0
    for name, pair in methods.items():
        probs, labels = as_probs_labels(pair, name)
        correct = probs.argmax(dim=-1) == labels  # (N,)
        curve = M.selective_prediction(M.confidence_scores(probs)["max_prob"], correct)
        coverage = curve["coverage"].cpu().numpy()  # (G,)
        acc = curve["accuracy"].cpu().numpy()  # (G,)
        # Prepend coverage 0 at the first group's accuracy so the curve spans the axis.
        ax.plot(
            np.r_[0.0, coverage] * 100,
            np.r_[acc[0], acc] * 100,
            lw=1.8,
            label=f"{name} (Sel. Pred. {100 * float(curve['sel_pred_auc']):.2f} %, "
            f"acc. {100 * acc[-1]:.2f} %)",
        )
        settled = coverage >= min(_MIN_COVERAGE_FOR_YLIM, coverage[-1])
        y_lo = min(y_lo, float(acc[settled].min()))
    pad = max(0.01, 0.05 * (1.0 - y_lo))
    ax.set_xlim(0, 100)
    ax.set_ylim(100 * max(0.0, y_lo - pad), 100)  # a percentage: never past 100
    ax.set_xlabel("Coverage (%): most confident fraction of the images kept")
    ax.set_ylabel("Accuracy on kept samples (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=1)
    return save_figure(fig, path)


def entropy_histogram(
    probs_in: ArrayLike,
    ood: Mapping[str, ArrayLike],
    path: str | Path,
    title: str = "Predictive entropy",
    n_bins: int = 30,
) -> Path:
    """Histograms of predictive entropy in distribution and on each OOD set.

    Entropies are :func:`fseb_ft.evaluation.metrics.predictive_entropy` (nats) on a shared axis
    from 0 to ``log K`` (the uniform distribution); each bar height is the fraction of that
    set's samples, so sets of different sizes compare. Each OOD legend entry gives the entropy
    AUROC of :func:`fseb_ft.evaluation.ood.ood_metrics` (OOD = positive), the "AUROC" column of
    the results table; a dotted line marks ``log K``, named in the legend.

    Args:
        probs_in: ``(N_in, K)`` class probabilities on in-distribution data.
        ood: OOD set name → ``(N_o, K)`` class probabilities (same K); may be empty.
        path: where to write the PNG.
        title: axes title.
        n_bins: number of histogram bins between 0 and ``log K``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    p_in = as_probs(probs_in, "probs_in")
    k = p_in.shape[1]
    top = math.log(k) if k > 1 else 1.0
    edges = np.linspace(0.0, top, n_bins + 1)
    fig = new_figure(figsize=(6.0, 4.6))
    ax = fig.subplots()
    sets: list[tuple[str, Tensor, float | None]] = [
        (f"In-distribution (n = {p_in.shape[0]})", p_in, None)
    ]
    for name, probs in ood.items():
        p_out = as_probs(probs, f"ood[{name!r}]")
        auroc = float(ood_metrics(p_in, p_out)["entropy_auroc"])
        sets.append((f"{name} (n = {p_out.shape[0]}, AUROC {100 * auroc:.2f} %)", p_out, auroc))
    for i, (label, probs, _) in enumerate(sets):
        h = np.clip(M.predictive_entropy(probs).cpu().numpy(), 0.0, top)  # (N,)
        weights = np.full_like(h, 1.0 / len(h))
        color = f"C{i}"
        bins = cast(Sequence[float], edges)  # an array, which matplotlib's annotation omits
        ax.hist(h, bins=bins, weights=weights, color=color, alpha=0.3)
        ax.hist(h, bins=bins, weights=weights, color=color, histtype="step", lw=1.6, label=label)
    # In the legend, not beside the line, where it would meet the title or the bars.
    ax.axvline(top, color="black", ls=":", lw=1, label=f"log K = {top:.2f} (uniform prediction)")
    ax.set_xlim(0, top * 1.01)
    ax.set_xlabel("Predictive entropy (nats)")
    ax.set_ylabel("Fraction of samples")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=1)
    return save_figure(fig, path)


def corruption_plot(
    corruptions: Mapping[str, Mapping[Any, Mapping[str, float]]],
    path: str | Path,
    clean: Mapping[str, float] | None = None,
    title: str = "Covariate shift: corrupted test split",
) -> Path:
    """Accuracy and ECE against corruption severity: a thin line per corruption, a bold mean.

    Unlike the other figures this one takes metrics, not predictions: the ``corruptions``
    entry of ``results.json``, whose numbers
    :func:`fseb_ft.evaluation.metrics.classification_metrics` computed. The bold line at each
    severity is the mean over the corruptions evaluated at it (``corruption_summary`` in
    ``results.json``). With ``clean`` (the metrics of the same images uncorrupted,
    ``corruption_clean``) every line starts from them at severity 0. Both axes stay within 0..100 %.

    Args:
        corruptions: corruption name → severity (``"1"``..``"5"`` or int) → metrics with at
            least ``accuracy`` and ``ece``.
        path: where to write the PNG.
        clean: metrics of the corrupted images uncorrupted, drawn at severity 0.
        title: figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if not corruptions:
        raise ValueError("`corruptions` must hold at least one corruption, got none")
    series = {
        name: sorted((int(sev), metrics) for sev, metrics in by_severity.items())
        for name, by_severity in corruptions.items()
    }
    severities = sorted({sev for points in series.values() for sev, _ in points})
    fig = new_figure(figsize=(10.0, 4.8))
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "accuracy", "Accuracy (%)"), (axes[1], "ece", "ECE (%)")):
        start = [(0, 100 * float(clean[key]))] if clean is not None else []
        for i, (name, points) in enumerate(series.items()):
            xy = start + [(sev, 100 * float(m[key])) for sev, m in points]
            ax.plot(*zip(*xy, strict=True), lw=1.0, alpha=0.7, marker=".", ms=4,
                    color=f"C{i % 10}", ls="-" if i < 10 else "--", label=name)  # fmt: skip
        means = [
            (sev, 100 * float(np.mean([m[key] for points in series.values()
                                       for s, m in points if s == sev])))
            for sev in severities
        ]  # fmt: skip
        ax.plot(*zip(*(start + means), strict=True), lw=3.0, color="black", marker="o",
                label=f"Mean of {len(series)}")  # fmt: skip
        ticks = ([0] if clean is not None else []) + severities
        ax.set_xticks(ticks, ["clean" if t == 0 else str(t) for t in ticks])
        ax.set_xlabel("Corruption severity")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, 0.0), min(high, 100.0))  # the margins stop at 0 and 100 %
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(5, len(labels)))
    fig.suptitle(title)
    return save_figure(fig, path)


def sweep_plot(
    trials: Sequence[Mapping[str, Any]],
    metric: str,
    path: str | Path,
    ranges: Mapping[str, tuple[float, float, bool]] | None = None,
    title: str = "Sweep",
) -> Path:
    """The validation metric against each hyper-parameter of a sweep: one panel per parameter.

    Args:
        trials: one mapping per scored trial: ``params`` (key → value), ``value`` (its
            validation metric) and ``state`` (``complete`` drawn filled, others hollow).
        metric: the metric's name, for the y axis.
        path: where to write the PNG.
        ranges: parameter → (low, high, log) of its searched range: the x axis spans it, on a
            log scale when ``log``; parameters without one (choices) are drawn as they come.
        title: figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    keys = sorted({k for t in trials for k in t["params"]})
    if not keys:
        raise ValueError("`trials` must hold at least one trial with parameters, got none")
    fig = new_figure(figsize=(3.6 * len(keys) + 0.4, 3.6))
    axes = np.atleast_1d(fig.subplots(1, len(keys), sharey=True))
    for ax, key in zip(axes, keys, strict=True):
        for done, face in ((True, _ACC_COLOR), (False, "none")):
            points = [
                (t["params"][key], t["value"])
                for t in trials
                if key in t["params"] and (t["state"] == "complete") == done
            ]
            label = "complete" if done else "pruned"
            if points:
                ax.scatter(*zip(*points, strict=True), s=28, facecolors=face,
                           edgecolors=_ACC_COLOR, label=label)  # fmt: skip
        if ranges is not None and key in ranges:
            low, high, log = ranges[key]
            if log:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())  # labels at decades only
            ax.set_xlim(low, high)
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"val {metric}")
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle(title)
    return save_figure(fig, path)


def learning_curves(
    curves: Mapping[str, Sequence[Sequence[float]]],
    metric: str,
    path: str | Path,
    title: str = "Learning curves",
) -> Path:
    """A per-epoch validation metric, one line per method: the mean over runs ± standard error.

    Args:
        curves: method → one sequence per run (seed) of the metric after each epoch; runs of a
            method must have the same length.
        metric: the metric's name, for the y axis.
        path: where to write the PNG.
        title: figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if not curves:
        raise ValueError("`curves` must hold at least one method, got none")
    fig = new_figure(figsize=(5.2, 3.6))
    ax = fig.subplots()
    for name, runs in curves.items():
        lengths = sorted({len(run) for run in runs})
        if len(lengths) != 1 or lengths[0] == 0:
            raise ValueError(f"`curves[{name!r}]` must be non-empty runs of equal length, got "
                             f"lengths {lengths}")  # fmt: skip
        values = np.asarray(runs, dtype=np.float64)  # (R, E)
        epochs = np.arange(1, values.shape[1] + 1)  # (E,)
        mean = values.mean(axis=0)  # (E,)
        se = values.std(axis=0, ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0 * mean
        (line,) = ax.plot(epochs, mean, marker="o", ms=3, label=f"{name} ({len(values)} runs)")
        ax.fill_between(epochs, mean - se, mean + se, color=line.get_color(), alpha=0.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"val {metric}")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncol=1, fontsize="small")  # long names: below
    return save_figure(fig, path)


def _draw_reliability(
    ax: Axes,
    ax_count: Axes,
    probs: Tensor,
    labels: Tensor,
    n_bins: int,
    name: str,
    x_lo: float,
) -> None:
    stats = {k: v.cpu().numpy() for k, v in M.calibration_bins(probs, labels, n_bins).items()}
    ece = float(M.ece(probs, labels, n_bins=n_bins))
    acc_all = float(M.accuracy(probs, labels))
    conf_all = float(M.confidence_scores(probs)["max_prob"].mean())
    left, width = stats["edges"][:-1], 1.0 / n_bins  # (n_bins,)
    full = stats["count"] > 0  # (n_bins,) empty bins have NaN statistics: draw nothing
    acc, conf = stats["accuracy"][full], stats["confidence"][full]
    ax.bar(left[full], acc, width, align="edge", color=_ACC_COLOR, edgecolor="black", lw=0.6)
    # The gap is hatched over a faint tint, so where it overlaps the accuracy bar (an
    # under-confident bin) that bar still reads as blue up to its top.
    ax.bar(
        left[full], conf - acc, width, bottom=acc, align="edge", facecolor=_GAP_FACE,
        hatch="//", edgecolor=_GAP_COLOR, lw=0.8,
    )  # fmt: skip
    ax.hlines(conf, left[full], left[full] + width, colors=_GAP_COLOR, lw=2.2)
    ax.plot([0, 1], [0, 1], ls="--", color="black", lw=1, label="Perfect calibration")
    ax.set_xlim(x_lo, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("Accuracy")
    ax.grid(alpha=0.3)
    ax.set_title(
        f"{name}\nECE {100 * ece:.2f} % ({n_bins} bins) · acc. {100 * acc_all:.1f} % · "
        f"conf. {100 * conf_all:.1f} %",
        fontsize="medium",
    )
    counts = stats["count"][full]
    ax_count.bar(left[full], counts, width, align="edge", color=_COUNT_COLOR)
    for x, c in zip(left[full] + width / 2, counts, strict=True):
        ax_count.text(x, c * 1.2, f"{int(c)}", ha="center", va="bottom", fontsize="x-small")
    ax_count.set_yscale("log")
    ax_count.set_ylabel("Samples")
    ax_count.set_xlabel("Confidence (max probability)")
    ax_count.grid(alpha=0.3)


def _lowest_bin_edge(k: int, n_bins: int) -> float:
    """Lower edge of the bin holding confidence 1/K (the smallest possible top-label one)."""
    return math.floor(n_bins / k) / n_bins if k > 1 else 0.0
