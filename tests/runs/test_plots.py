"""fseb_ft.runs.plots and evaluate.write_plots: valid, readable PNGs for multi-class and binary
tasks."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from PIL import Image

from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.runs import canvas, plots
from fseb_ft.runs.report import write_comparison_plots, write_corruption_plot, write_plots
from fseb_ft.runs.rundir import COMPARISON_PLOTS, PLOTS


def _predictions(n: int, k: int, seed: int, sharpness: float = 1.5) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, k, (n,), generator=gen)
    logits = torch.randn(n, k, generator=gen) + 3 * torch.nn.functional.one_hot(labels, k)
    return torch.softmax(sharpness * logits, -1), labels


def _check_png(path: Path, min_kb: float = 15) -> tuple[int, int]:
    assert path.is_file(), path
    assert path.stat().st_size > min_kb * 1024, (path, path.stat().st_size)
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
    assert 500 <= width <= 2500 and 500 <= height <= 2500, (width, height)
    assert not any(p.name.endswith(".tmp") for p in path.parent.iterdir())  # atomic writes
    return width, height


@pytest.mark.parametrize("k", [2, 10])
def test_each_plot_writes_a_valid_png(tmp_path: Path, k: int) -> None:
    probs, labels = _predictions(400, k, seed=k)
    sharp, _ = _predictions(400, k, seed=k, sharpness=4.0)
    ood, _ = _predictions(150, k, seed=k + 1, sharpness=0.3)

    path = plots.reliability_diagram(probs, labels, tmp_path / "a" / "rel.png", title="FS-EB")
    assert path == tmp_path / "a" / "rel.png"  # parent folders created
    _check_png(path)

    path = plots.selective_prediction_plot(
        {"PS-MAP": (sharp, labels), "FS-EB": (probs, labels)}, tmp_path / "sel.png"
    )
    _check_png(path)

    path = plots.entropy_histogram(probs, {"far": ood, "near": sharp[:50]}, tmp_path / "ent.png")
    _check_png(path)

    path = plots.reliability_comparison(
        {"PS-MAP": (sharp, labels), "FS-EB": (probs, labels)}, tmp_path / "cmp.png", title="x"
    )
    width, height = _check_png(path)
    assert width > height  # two panels side by side


def test_plots_accept_numpy_and_handle_empty_bins_and_certain_predictions(tmp_path: Path) -> None:
    # One-hot rows: every confidence is exactly 1.0 (last bin only, 14 empty bins), every
    # entropy is 0 and every confidence ties; one prediction is wrong.
    labels = np.array([0, 1, 2, 1, 0, 2])
    probs = np.eye(3)[[0, 1, 2, 1, 0, 0]]
    _check_png(plots.reliability_diagram(probs, labels, tmp_path / "rel.png"))
    _check_png(plots.selective_prediction_plot({"m": (probs, labels)}, tmp_path / "sel.png"))
    _check_png(plots.entropy_histogram(probs, {"ood": probs[:2]}, tmp_path / "ent.png"))
    # A single sample, and no OOD set at all.
    _check_png(plots.reliability_diagram(probs[:1], labels[:1], tmp_path / "one.png"))
    _check_png(plots.entropy_histogram(probs, {}, tmp_path / "no_ood.png"))


def test_plots_reject_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        plots.selective_prediction_plot({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"\(probs, labels\) pair"):
        plots.reliability_comparison({"m": torch.ones(3, 2)}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="`labels` must have length N=3"):
        plots.reliability_diagram(torch.full((3, 2), 0.5), torch.tensor([0, 1]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_write_plots_and_comparison_from_predictions(tmp_path: Path) -> None:
    probs, labels = _predictions(300, 5, seed=3)
    ood, _ = _predictions(100, 5, seed=4, sharpness=0.3)
    preds = Predictions(test=(probs.log(), labels), ood={"ood": ood.log()})
    written = write_plots(tmp_path / "run", preds, "FS-EB · test")
    assert [p.name for p in written] == list(PLOTS)
    for path in written:
        _check_png(path)
    # Without OOD sets there is no entropy figure.
    no_ood = write_plots(tmp_path / "plain", Predictions(test=(probs.log(), labels)), "t")
    assert [p.name for p in no_ood] == list(PLOTS[:2])
    written = write_comparison_plots(tmp_path / "cmp", {"PS-MAP": preds, "FS-EB": preds}, "t")
    assert [p.name for p in written] == list(COMPARISON_PLOTS)
    for path in written:
        _check_png(path)


def test_write_plots_non_strict_logs_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    probs, labels = _predictions(50, 3, seed=0)
    preds = Predictions(test=(probs.log(), labels))

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(plots, "reliability_diagram", broken)
    with pytest.raises(RuntimeError, match="no fonts"):
        write_plots(tmp_path, preds, "t")
    written = write_plots(tmp_path, preds, "t", strict=False)
    assert [p.name for p in written] == ["selective_prediction.png"]
    assert "no fonts" in caplog.text


def test_learning_curves_draw_each_method_and_reject_ragged_runs(tmp_path: Path) -> None:
    curves = {"PS-MAP": [[0.9, 0.5, 0.4], [1.0, 0.6, 0.45]], "FS-EB": [[0.8, 0.5, 0.35]]}
    path = plots.learning_curves(curves, "NLL", tmp_path / "curve.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 100
    with pytest.raises(ValueError, match="FS-EB"):
        plots.learning_curves({"FS-EB": [[0.8, 0.5], [0.7]]}, "NLL", tmp_path / "bad.png")
    with pytest.raises(ValueError, match="at least one method"):
        plots.learning_curves({}, "NLL", tmp_path / "none.png")


# A model in a deep local folder whose own name is long too: 120 characters, as users write
# them in `model.name`.
_FOLDER = "local-dir:/home/someone/experiments/2024-05/checkpoints/"
LONG_NAME = _FOLDER + ("efficientnet_lite0_ra_in1k_finetuned_" * 4)[: 120 - len(_FOLDER)]


def _figures(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """Every figure fseb_ft writes, drawn as its callers draw it, for a model called ``name``."""
    figures: dict[str, Figure] = {}
    save = plots.save_figure

    def keep(fig: Figure, path: str | Path) -> Path:
        figures[Path(path).relative_to(tmp_path).as_posix()] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(canvas, "_DPI", 30)  # the layout is in inches: small PNGs save time
    probs, labels = _predictions(300, 10, seed=1, sharpness=3.0)  # 100 % at low coverage
    ood, _ = _predictions(100, 10, seed=2, sharpness=0.3)
    preds = Predictions(test=(probs.log(), labels), ood={"far": ood.log(), "near": ood[:50].log()})
    title = f"FS-EB · {name}"
    write_plots(tmp_path / "run", preds, title)
    members = {f"{title} (seed-{i})": (probs, labels) for i in range(3)}  # evaluate's labels
    plots.selective_prediction_plot(
        {**members, "Ensemble of 3": (probs, labels)}, tmp_path / "ensemble.png", "Ensemble of 3"
    )
    write_comparison_plots(
        tmp_path / "cmp", {"PS-MAP": preds, "FS-EB": preds}, f"{name}: PS-MAP vs FS-EB"
    )
    perfect = {"accuracy": 1.0, "ece": 0.0}
    per = {c: {str(s): {"accuracy": 1 - 0.1 * s, "ece": 0.02 * s} for s in (1, 3, 5)}
           for c in ("contrast", "fog", "gaussian_noise")}  # fmt: skip
    write_corruption_plot(tmp_path / "run", {"test": perfect, "corruptions": per}, title)
    trials = [
        {"params": {"fseb.reg_scale": 10.0**-i, "optim.lr": 0.01 * i}, "value": 0.5 + 0.1 * i,
         "state": "complete" if i % 3 else "pruned"}
        for i in range(1, 7)
    ]  # fmt: skip
    plots.sweep_plot(trials, "nll", tmp_path / "sweep.png", {"fseb.reg_scale": (1e-7, 1, True)},
                     title=f"Sweep study: {title}, validation nll")  # fmt: skip
    curves = {f"PS-MAP · {name}": [[0.9, 0.5], [1.0, 0.6]], title: [[0.8, 0.5], [0.7, 0.4]]}
    plots.learning_curves(curves, "NLL", tmp_path / "curve.png", title=name)
    return figures


def _inside(box: Bbox, canvas: Bbox, slack: float) -> bool:
    return (
        box.x0 >= canvas.x0 - slack
        and box.y0 >= canvas.y0 - slack
        and box.x1 <= canvas.x1 + slack
        and box.y1 <= canvas.y1 + slack
    )


def _assert_on_canvas(fig: Figure, renderer: RendererBase, file: str) -> list[Text]:
    """Everything drawn, each text and each legend lies within the figure; return the texts."""
    assert _inside(fig.get_tightbbox(renderer), fig.bbox_inches, 0.01), file  # tick labels too
    # An axis keeps labels for ticks outside its view that it does not draw: leave them out.
    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for t in axis.get_ticklabels(which="both")}  # fmt: skip
    texts = [t for t in fig.findobj(Text)
             if t.get_visible() and t.get_text() and id(t) not in ticks]  # fmt: skip
    for text in texts:
        box = text.get_window_extent(renderer)
        assert _inside(box, fig.bbox, 1.0), (file, text.get_text(), box, fig.bbox)
    for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        assert _inside(legend.get_window_extent(renderer), fig.bbox, 1.0), file
        entries = [t.get_text() for t in legend.get_texts()]
        assert len(set(entries)) == len(entries), (file, entries)  # the curves told apart
    return texts


def _assert_labels_apart(fig: Figure, renderer: RendererBase, file: str) -> None:
    """Titles, axis labels and the texts in the axes (log K, bin counts) overlap no other."""
    labels = list(fig.texts)
    for ax in fig.axes:
        labels += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_text()]
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1 :]:
            assert not box_a.overlaps(box_b), (file, a, b)


def test_every_figure_keeps_a_long_model_name_on_the_canvas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = LONG_NAME
    assert len(name) == 120
    figures = _figures(tmp_path, name, monkeypatch)
    expected = [*(f"run/{p}" for p in PLOTS), "run/corruptions.png", "ensemble.png",
                *(f"cmp/{p}" for p in COMPARISON_PLOTS), "sweep.png", "curve.png"]  # fmt: skip
    assert sorted(figures) == sorted(expected)
    for file, fig in figures.items():
        fig.draw_without_rendering()  # lays the figure out at its own size and dpi
        renderer = fig.canvas.get_renderer()
        texts = _assert_on_canvas(fig, renderer, file)
        _assert_labels_apart(fig, renderer, file)
        for ax in fig.axes:  # a percentage axis stays within 0..100 %
            for label, lim in ((ax.get_xlabel(), ax.get_xlim()), (ax.get_ylabel(), ax.get_ylim())):
                if "%" in label:
                    assert min(lim) >= 0 and max(lim) <= 100, (file, label, lim)
        assert all(name not in t.get_text() for t in texts), file  # shortened everywhere


def test_short_name_keeps_the_model_name_and_both_ends_of_a_long_one() -> None:
    assert canvas.short_name("FS-EB · local-dir:/long/path/efficientnet_lite0.in1k") == (
        "FS-EB · efficientnet_lite0.in1k"
    )
    assert canvas.short_name("local-dir:runs/a/model/: PS-MAP vs FS-EB") == "model: PS-MAP vs FS-EB"
    assert canvas.short_name("Sweep s: hf-hub:org/name, val nll") == "Sweep s: org/name, val nll"
    assert canvas.short_name("local-dir: hf-hub: x") == "local-dir: hf-hub: x"  # no name follows
    # Over-long words lose their middle, so names that differ at the end stay apart; the
    # spaces and line breaks around them are kept.
    long = "a" * 30 + "b" * 30
    first, second = (canvas.short_name(f"FS-EB · {long}-{i}\nECE 1 %") for i in (0, 1))
    assert first != second and first.endswith("-0\nECE 1 %") and first.startswith("FS-EB · aaa")
    assert len(first.split()[2]) == 40 and "…" in first
    assert canvas.short_name(long, width=11) == "aaaaa…bbbbb"


def test_a_figure_that_fits_is_laid_out_once_and_drawn_once_more_to_save_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[Figure] = []
    draw = Figure.draw

    def counted(self: Figure, renderer: RendererBase) -> None:
        draws.append(self)
        draw(self, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    saved = []
    for autolayout in (False, True):  # a user's rcParams ask for tight layout: not applied
        monkeypatch.setitem(matplotlib.rcParams, "figure.autolayout", autolayout)
        fig = canvas.new_figure((5, 4))
        fig.add_subplot().plot([0, 1], [1, 0], label="a line")
        size = tuple(fig.get_size_inches())
        draws.clear()
        path = canvas.save_figure(fig, tmp_path / f"fits-{autolayout}.png")
        _check_png(path, min_kb=1)
        assert tuple(fig.get_size_inches()) == size  # it fitted at the first layout
        assert len(draws) == 2  # the fitting layout, then savefig's one draw: no dry run between
        saved.append(path.read_bytes())
    assert saved[0] == saved[1]
