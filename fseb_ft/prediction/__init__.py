"""The prediction layer: a trained model at work on new images. Loading it from a run, a model
folder or ``hf-hub:``; its inputs and passes; the abstention rule it predicts with (kept, given,
or chosen on its run's validation split); conformal sets; the rows, their files and summary;
:func:`predict_images`, the phases in order, asked with a
:class:`~fseb_ft.prediction.requests.PredictRequest`; the ONNX export that abstains by itself;
the demo page and the Hugging Face Space it can be written as; the drift monitor's checks
of a batch against the validation split. Imports only the layers below it
(runs, evaluation, method, data, recipe); the engine and the commands import it.

Its public names are ``__all__``; each is imported from its module on first use (PEP 562), so
importing one module of the folder loads no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.prediction.conformal_sets import add_conformal_arguments as add_conformal_arguments
    from fseb_ft.prediction.conformal_sets import add_set_columns as add_set_columns
    from fseb_ft.prediction.conformal_sets import calibrate_on_run as calibrate_on_run
    from fseb_ft.prediction.conformal_sets import check_conformal as check_conformal
    from fseb_ft.prediction.conformal_sets import conformal_record as conformal_record
    from fseb_ft.prediction.demo_page import HOST as HOST
    from fseb_ft.prediction.demo_page import build_page as build_page
    from fseb_ft.prediction.demo_page import check_port as check_port
    from fseb_ft.prediction.demo_page import import_gradio as import_gradio
    from fseb_ft.prediction.demo_page import reliability_of as reliability_of
    from fseb_ft.prediction.feature_fit import load_feature_fit as load_feature_fit
    from fseb_ft.prediction.inputs import ImageInputs as ImageInputs
    from fseb_ft.prediction.inputs import gather_inputs as gather_inputs
    from fseb_ft.prediction.inputs import logits_and_read_errors as logits_and_read_errors
    from fseb_ft.prediction.inputs import outputs_and_read_errors as outputs_and_read_errors
    from fseb_ft.prediction.loading import LoadedModel as LoadedModel
    from fseb_ft.prediction.loading import ModelLoadError as ModelLoadError
    from fseb_ft.prediction.loading import load_model as load_model
    from fseb_ft.prediction.monitor_data import Batch as Batch
    from fseb_ft.prediction.monitor_data import batch_outputs as batch_outputs
    from fseb_ft.prediction.monitor_data import check_has_validation as check_has_validation
    from fseb_ft.prediction.monitor_data import validation_outputs as validation_outputs
    from fseb_ft.prediction.monitor_files import MONITOR_JSON as MONITOR_JSON
    from fseb_ft.prediction.monitor_files import MONITOR_PLOT as MONITOR_PLOT
    from fseb_ft.prediction.monitor_files import format_table as format_table
    from fseb_ft.prediction.monitor_files import reweighted_rows as reweighted_rows
    from fseb_ft.prediction.monitor_files import write_monitor as write_monitor
    from fseb_ft.prediction.onnx_export import OPSETS as OPSETS
    from fseb_ft.prediction.onnx_export import ExportedGraph as ExportedGraph
    from fseb_ft.prediction.onnx_export import OnnxExport as OnnxExport
    from fseb_ft.prediction.onnx_export import export_onnx as export_onnx
    from fseb_ft.prediction.page_decisions import PageDecision as PageDecision
    from fseb_ft.prediction.page_decisions import PagePredictor as PagePredictor
    from fseb_ft.prediction.page_decisions import PageSettings as PageSettings
    from fseb_ft.prediction.page_decisions import decision_markdown as decision_markdown
    from fseb_ft.prediction.pipeline import predict as predict
    from fseb_ft.prediction.pipeline import predict_images as predict_images
    from fseb_ft.prediction.requests import LoadRequest as LoadRequest
    from fseb_ft.prediction.requests import OutputRequest as OutputRequest
    from fseb_ft.prediction.requests import PredictRequest as PredictRequest
    from fseb_ft.prediction.requests import RowRequest as RowRequest
    from fseb_ft.prediction.requests import RuleRequest as RuleRequest
    from fseb_ft.prediction.rows import ImagePredictions as ImagePredictions
    from fseb_ft.prediction.rows import accuracy_record as accuracy_record
    from fseb_ft.prediction.rows import check_out_file as check_out_file
    from fseb_ft.prediction.rows import format_rows as format_rows
    from fseb_ft.prediction.rows import image_rows as image_rows
    from fseb_ft.prediction.rows import output_format as output_format
    from fseb_ft.prediction.rows import write_predictions as write_predictions
    from fseb_ft.prediction.shift_report import DEFAULT_LEVEL as DEFAULT_LEVEL
    from fseb_ft.prediction.shift_report import MonitorSettings as MonitorSettings
    from fseb_ft.prediction.shift_report import Outputs as Outputs
    from fseb_ft.prediction.shift_report import ShiftCheck as ShiftCheck
    from fseb_ft.prediction.shift_report import ShiftReport as ShiftReport
    from fseb_ft.prediction.shift_report import shift_report as shift_report
    from fseb_ft.prediction.space import write_space as write_space
    from fseb_ft.prediction.summaries import summary as summary
    from fseb_ft.prediction.thresholds import DEFAULT_COVERAGE as DEFAULT_COVERAGE
    from fseb_ft.prediction.thresholds import choose_rule as choose_rule
    from fseb_ft.prediction.thresholds import keep_rule as keep_rule
    from fseb_ft.prediction.validation import validation_fetch as validation_fetch
    from fseb_ft.prediction.validation import validation_logits as validation_logits
    from fseb_ft.prediction.validation import validation_split as validation_split

_LAZY = {
    "add_conformal_arguments": "fseb_ft.prediction.conformal_sets",
    "add_set_columns": "fseb_ft.prediction.conformal_sets",
    "calibrate_on_run": "fseb_ft.prediction.conformal_sets",
    "check_conformal": "fseb_ft.prediction.conformal_sets",
    "conformal_record": "fseb_ft.prediction.conformal_sets",
    "HOST": "fseb_ft.prediction.demo_page",
    "build_page": "fseb_ft.prediction.demo_page",
    "check_port": "fseb_ft.prediction.demo_page",
    "import_gradio": "fseb_ft.prediction.demo_page",
    "reliability_of": "fseb_ft.prediction.demo_page",
    "load_feature_fit": "fseb_ft.prediction.feature_fit",
    "ImageInputs": "fseb_ft.prediction.inputs",
    "gather_inputs": "fseb_ft.prediction.inputs",
    "logits_and_read_errors": "fseb_ft.prediction.inputs",
    "outputs_and_read_errors": "fseb_ft.prediction.inputs",
    "LoadedModel": "fseb_ft.prediction.loading",
    "ModelLoadError": "fseb_ft.prediction.loading",
    "load_model": "fseb_ft.prediction.loading",
    "Batch": "fseb_ft.prediction.monitor_data",
    "batch_outputs": "fseb_ft.prediction.monitor_data",
    "check_has_validation": "fseb_ft.prediction.monitor_data",
    "validation_outputs": "fseb_ft.prediction.monitor_data",
    "MONITOR_JSON": "fseb_ft.prediction.monitor_files",
    "MONITOR_PLOT": "fseb_ft.prediction.monitor_files",
    "format_table": "fseb_ft.prediction.monitor_files",
    "reweighted_rows": "fseb_ft.prediction.monitor_files",
    "write_monitor": "fseb_ft.prediction.monitor_files",
    "ExportedGraph": "fseb_ft.prediction.onnx_export",
    "OPSETS": "fseb_ft.prediction.onnx_export",
    "OnnxExport": "fseb_ft.prediction.onnx_export",
    "export_onnx": "fseb_ft.prediction.onnx_export",
    "PageDecision": "fseb_ft.prediction.page_decisions",
    "PagePredictor": "fseb_ft.prediction.page_decisions",
    "PageSettings": "fseb_ft.prediction.page_decisions",
    "decision_markdown": "fseb_ft.prediction.page_decisions",
    "predict": "fseb_ft.prediction.pipeline",
    "predict_images": "fseb_ft.prediction.pipeline",
    "LoadRequest": "fseb_ft.prediction.requests",
    "OutputRequest": "fseb_ft.prediction.requests",
    "PredictRequest": "fseb_ft.prediction.requests",
    "RowRequest": "fseb_ft.prediction.requests",
    "RuleRequest": "fseb_ft.prediction.requests",
    "ImagePredictions": "fseb_ft.prediction.rows",
    "accuracy_record": "fseb_ft.prediction.rows",
    "check_out_file": "fseb_ft.prediction.rows",
    "format_rows": "fseb_ft.prediction.rows",
    "image_rows": "fseb_ft.prediction.rows",
    "output_format": "fseb_ft.prediction.rows",
    "write_predictions": "fseb_ft.prediction.rows",
    "DEFAULT_LEVEL": "fseb_ft.prediction.shift_report",
    "MonitorSettings": "fseb_ft.prediction.shift_report",
    "Outputs": "fseb_ft.prediction.shift_report",
    "ShiftCheck": "fseb_ft.prediction.shift_report",
    "ShiftReport": "fseb_ft.prediction.shift_report",
    "shift_report": "fseb_ft.prediction.shift_report",
    "write_space": "fseb_ft.prediction.space",
    "summary": "fseb_ft.prediction.summaries",
    "DEFAULT_COVERAGE": "fseb_ft.prediction.thresholds",
    "choose_rule": "fseb_ft.prediction.thresholds",
    "keep_rule": "fseb_ft.prediction.thresholds",
    "validation_fetch": "fseb_ft.prediction.validation",
    "validation_logits": "fseb_ft.prediction.validation",
    "validation_split": "fseb_ft.prediction.validation",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
