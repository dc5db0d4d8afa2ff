"""The prediction layer: what a trained model does with new images, between the run folder
(``runs``) and the commands: the shift monitor's checks of a batch against the run's validation
split. Imports only the layers below it (runs, evaluation, method, data, recipe).

Its public names, those the commands import, are ``__all__``; each is imported from its module
on first use (PEP 562), so importing one module of the folder loads no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.prediction.monitor_data import Batch as Batch
    from fseb_ft.prediction.monitor_data import batch_outputs as batch_outputs
    from fseb_ft.prediction.monitor_data import check_has_validation as check_has_validation
    from fseb_ft.prediction.monitor_data import validation_outputs as validation_outputs
    from fseb_ft.prediction.monitor_files import MONITOR_JSON as MONITOR_JSON
    from fseb_ft.prediction.monitor_files import MONITOR_PLOT as MONITOR_PLOT
    from fseb_ft.prediction.monitor_files import format_table as format_table
    from fseb_ft.prediction.monitor_files import image_rows as image_rows
    from fseb_ft.prediction.monitor_files import write_monitor as write_monitor
    from fseb_ft.prediction.shift_report import DEFAULT_LEVEL as DEFAULT_LEVEL
    from fseb_ft.prediction.shift_report import MonitorSettings as MonitorSettings
    from fseb_ft.prediction.shift_report import Outputs as Outputs
    from fseb_ft.prediction.shift_report import ShiftCheck as ShiftCheck
    from fseb_ft.prediction.shift_report import ShiftReport as ShiftReport
    from fseb_ft.prediction.shift_report import shift_report as shift_report

_LAZY = {
    "Batch": "fseb_ft.prediction.monitor_data",
    "batch_outputs": "fseb_ft.prediction.monitor_data",
    "check_has_validation": "fseb_ft.prediction.monitor_data",
    "validation_outputs": "fseb_ft.prediction.monitor_data",
    "MONITOR_JSON": "fseb_ft.prediction.monitor_files",
    "MONITOR_PLOT": "fseb_ft.prediction.monitor_files",
    "format_table": "fseb_ft.prediction.monitor_files",
    "image_rows": "fseb_ft.prediction.monitor_files",
    "write_monitor": "fseb_ft.prediction.monitor_files",
    "DEFAULT_LEVEL": "fseb_ft.prediction.shift_report",
    "MonitorSettings": "fseb_ft.prediction.shift_report",
    "Outputs": "fseb_ft.prediction.shift_report",
    "ShiftCheck": "fseb_ft.prediction.shift_report",
    "ShiftReport": "fseb_ft.prediction.shift_report",
    "shift_report": "fseb_ft.prediction.shift_report",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
