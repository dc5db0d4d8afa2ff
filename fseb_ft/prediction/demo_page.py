"""The demo page of ``fseb-ft demo``: a Gradio page where a user drops an image and sees the
calibrated top classes, the decision with its reasons and the conformal set
(:mod:`fseb_ft.prediction.page_decisions`), and the run's reliability diagram.

Gradio is an optional extra (``pip install 'fseb_ft[demo]'``), imported only when a page is built.
The page serves on this machine alone (``127.0.0.1``) unless ``share`` asks Gradio for a public
link.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

from fseb_ft.errors import FsebError
from fseb_ft.prediction.page_decisions import PagePredictor, decision_markdown
from fseb_ft.runs.rundir import PLOTS

__all__ = ["HOST", "RELIABILITY", "build_page", "check_port", "import_gradio", "reliability_of"]

HOST = "127.0.0.1"
"""Where the page serves: this machine only (``share`` adds Gradio's public link)."""
RELIABILITY = PLOTS[0]
"""The run's reliability diagram, in a run folder and in its exported model folder."""
DECISION_ID = "decision"
"""The HTML id of the decision's block (a browser test reads it)."""


def import_gradio() -> ModuleType:
    """The ``gradio`` module.

    Raises:
        FsebError: Gradio is not installed; the message says how to install it.
    """
    # Gradio reports usage to its makers unless told not to: a local page of a user's images
    # sends nothing anywhere it was not asked to (GRADIO_ANALYTICS_ENABLED=True turns it on).
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio
    except ImportError as err:
        raise FsebError(
            f"the demo page needs Gradio, which is not installed ({err.msg}): "
            "pip install 'fseb_ft[demo]'"
        ) from None
    return gradio


def check_port(port: int | None, host: str = HOST) -> None:
    """Refuse a ``port`` another program listens on, before the model loads (``None``: Gradio
    takes a free one).

    Raises:
        FsebError: the port is taken (or not this user's to take), naming it.
    """
    if port is None:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            why = "in use" if err.errno == errno.EADDRINUSE else (err.strerror or str(err))
            raise FsebError(
                f"--port {port} on {host} is {why}: give another --port, or leave it out to "
                "take a free one"
            ) from None


def reliability_of(model: str | Path) -> Path | None:
    """The reliability diagram beside ``model`` (a run or a model folder); ``None``: none
    there (a Hub model, a run evaluated without figures)."""
    path = Path(model) / RELIABILITY
    return path if not str(model).startswith("hf-hub:") and path.is_file() else None


def build_page(predictor: PagePredictor, reliability: Path | None, title: str) -> Any:
    """The Gradio page (a ``gradio.Blocks``) of ``predictor``, with ``reliability`` shown beside
    it; ``launch()`` serves it."""
    gr = import_gradio()
    with gr.Blocks(title=title) as page:
        gr.Markdown(f"# {title}\n{_intro(predictor)}")
        with gr.Row():
            with gr.Column():
                image = gr.Image(type="filepath", label="Image", sources=["upload"], height=280)
                classes = gr.Label(
                    num_top_classes=predictor.settings.top_k,
                    label="Top classes (temperature-scaled probabilities)",
                )
            with gr.Column():
                decision = gr.Markdown("Drop an image to see the decision.", elem_id=DECISION_ID)
                if reliability is not None:  # the figure has its title: no label over it
                    gr.Markdown("**The run's reliability diagram**")
                    gr.Image(str(reliability), show_label=False, interactive=False)
        image.change(_answer(predictor), inputs=image, outputs=[classes, decision])
    return page


def _answer(predictor: PagePredictor) -> Any:
    """The page's function: an uploaded file's path → (top classes, decision Markdown)."""

    def answer(path: str | None) -> tuple[dict[str, float] | None, str]:
        if path is None:  # the image was cleared
            return None, "Drop an image to see the decision."
        try:
            decision = predictor.decide(path)
        except ValueError as err:
            return None, f"### Cannot predict this file\n{err}"
        return decision.top_classes(), decision_markdown(decision)

    return answer


def _intro(predictor: PagePredictor) -> str:
    """What the page shows, in two sentences."""
    loaded = predictor.loaded
    scaled = (
        f"temperature-scaled (T = {loaded.temperature:.3f})"
        if loaded.temperature is not None
        else "not temperature-scaled (the run fitted no temperature)"
    )
    return (
        f"Model: {loaded.where}. Probabilities are {scaled}. The model abstains when its top "
        "probability is below `fseb-ft predict`'s threshold, or when its OOD score flags the "
        "image as unlike the run's validation split."
    )
