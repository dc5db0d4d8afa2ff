"""The prediction layer: what a trained model does at prediction time, outside training and
evaluation; today the ONNX export of a model that abstains by itself. Imports only the layers
below it (runs, evaluation, method, data, recipe).

Its public names, those the commands import, are ``__all__``; each is imported from its module on
first use (PEP 562), so importing one module of the folder loads no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.prediction.onnx_export import OPSETS as OPSETS
    from fseb_ft.prediction.onnx_export import ExportedGraph as ExportedGraph
    from fseb_ft.prediction.onnx_export import OnnxExport as OnnxExport
    from fseb_ft.prediction.onnx_export import export_onnx as export_onnx

_LAZY = {
    "OPSETS": "fseb_ft.prediction.onnx_export",
    "ExportedGraph": "fseb_ft.prediction.onnx_export",
    "OnnxExport": "fseb_ft.prediction.onnx_export",
    "export_onnx": "fseb_ft.prediction.onnx_export",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
