"""The prediction layer: what happens to a trained model's inputs after training — the demo page
of ``fseb-ft demo`` and the Hugging Face Space it can be written as. Imports only the layers below
it (runs, evaluation, method, data, recipe).

Its public names, those the commands import, are ``__all__``; each is imported from its module on
first use (PEP 562), so importing one module of the folder loads no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.prediction.demo_page import HOST as HOST
    from fseb_ft.prediction.demo_page import build_page as build_page
    from fseb_ft.prediction.demo_page import check_port as check_port
    from fseb_ft.prediction.demo_page import import_gradio as import_gradio
    from fseb_ft.prediction.demo_page import reliability_of as reliability_of
    from fseb_ft.prediction.page_decisions import PageDecision as PageDecision
    from fseb_ft.prediction.page_decisions import PagePredictor as PagePredictor
    from fseb_ft.prediction.page_decisions import PageSettings as PageSettings
    from fseb_ft.prediction.page_decisions import decision_markdown as decision_markdown
    from fseb_ft.prediction.space import write_space as write_space

_LAZY = {
    "HOST": "fseb_ft.prediction.demo_page",
    "build_page": "fseb_ft.prediction.demo_page",
    "check_port": "fseb_ft.prediction.demo_page",
    "import_gradio": "fseb_ft.prediction.demo_page",
    "reliability_of": "fseb_ft.prediction.demo_page",
    "PageDecision": "fseb_ft.prediction.page_decisions",
    "PagePredictor": "fseb_ft.prediction.page_decisions",
    "PageSettings": "fseb_ft.prediction.page_decisions",
    "decision_markdown": "fseb_ft.prediction.page_decisions",
    "write_space": "fseb_ft.prediction.space",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
