"""The runs layer: the run folder and its files, written atomically; a run's network rebuilt from
it; results, figures, the model card and the exported model folder. Imports only the
layers below it (evaluation, method, data, recipe).

Its public names, those the other folders and the commands import, are ``__all__``; each is
imported from its module on first use (PEP 562), so importing one module of the folder loads no
other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.runs.atomic import DiskFullError as DiskFullError
    from fseb_ft.runs.atomic import cleaned_on_failure as cleaned_on_failure
    from fseb_ft.runs.atomic import is_not_writable as is_not_writable
    from fseb_ft.runs.atomic import publish as publish
    from fseb_ft.runs.atomic import remove as remove
    from fseb_ft.runs.atomic import remove_orphans as remove_orphans
    from fseb_ft.runs.atomic import temp_beside as temp_beside
    from fseb_ft.runs.atomic import write_bytes as write_bytes
    from fseb_ft.runs.atomic import write_text as write_text
    from fseb_ft.runs.canvas import new_figure as new_figure
    from fseb_ft.runs.canvas import save_figure as save_figure
    from fseb_ft.runs.comparison import write_comparison as write_comparison
    from fseb_ft.runs.export import export_run as export_run
    from fseb_ft.runs.export import is_exported as is_exported
    from fseb_ft.runs.export import write_model_card as write_model_card
    from fseb_ft.runs.feature_fit import read_feature_fit as read_feature_fit
    from fseb_ft.runs.feature_fit import write_feature_fit as write_feature_fit
    from fseb_ft.runs.leaderboard import BEST_RECIPE as BEST_RECIPE
    from fseb_ft.runs.leaderboard import LEADERBOARD_MD as LEADERBOARD_MD
    from fseb_ft.runs.leaderboard import comparison_table as comparison_table
    from fseb_ft.runs.leaderboard import format_params as format_params
    from fseb_ft.runs.leaderboard import write_leaderboard as write_leaderboard
    from fseb_ft.runs.loading import load_run_model as load_run_model
    from fseb_ft.runs.loading import run_predictor as run_predictor
    from fseb_ft.runs.lock import run_lock as run_lock
    from fseb_ft.runs.published import scrub as scrub
    from fseb_ft.runs.report import EvalResults as EvalResults
    from fseb_ft.runs.report import write_confusion_plot as write_confusion_plot
    from fseb_ft.runs.report import write_corruption_plot as write_corruption_plot
    from fseb_ft.runs.report import write_plots as write_plots
    from fseb_ft.runs.report import write_results as write_results
    from fseb_ft.runs.rundir import ABSTENTION_FILE as ABSTENTION_FILE
    from fseb_ft.runs.rundir import CHECKPOINT_PREFIX as CHECKPOINT_PREFIX
    from fseb_ft.runs.rundir import CHECKPOINTS as CHECKPOINTS
    from fseb_ft.runs.rundir import COMPARISON_JSON as COMPARISON_JSON
    from fseb_ft.runs.rundir import COMPARISON_MD as COMPARISON_MD
    from fseb_ft.runs.rundir import DATA_FILES as DATA_FILES
    from fseb_ft.runs.rundir import FEATURE_OOD_FIT as FEATURE_OOD_FIT
    from fseb_ft.runs.rundir import MODEL_DIR as MODEL_DIR
    from fseb_ft.runs.rundir import MODEL_WEIGHTS as MODEL_WEIGHTS
    from fseb_ft.runs.rundir import PLOTS as PLOTS
    from fseb_ft.runs.rundir import RECIPE_FILE as RECIPE_FILE
    from fseb_ft.runs.rundir import RESULTS_JSON as RESULTS_JSON
    from fseb_ft.runs.rundir import RESULTS_MD as RESULTS_MD
    from fseb_ft.runs.rundir import RUN_INFO_FILE as RUN_INFO_FILE
    from fseb_ft.runs.rundir import TRAINER_STATE as TRAINER_STATE
    from fseb_ft.runs.rundir import RunInfo as RunInfo
    from fseb_ft.runs.rundir import check_output_dir as check_output_dir
    from fseb_ft.runs.rundir import checkpoint_name as checkpoint_name
    from fseb_ft.runs.rundir import clear_run as clear_run
    from fseb_ft.runs.rundir import epochs_done as epochs_done
    from fseb_ft.runs.rundir import latest_checkpoint as latest_checkpoint
    from fseb_ft.runs.rundir import read_abstention as read_abstention
    from fseb_ft.runs.rundir import read_class_names as read_class_names
    from fseb_ft.runs.rundir import read_json as read_json
    from fseb_ft.runs.rundir import read_method_state as read_method_state
    from fseb_ft.runs.rundir import read_run as read_run
    from fseb_ft.runs.rundir import read_val_features as read_val_features
    from fseb_ft.runs.rundir import read_val_logits as read_val_logits
    from fseb_ft.runs.rundir import results_split as results_split
    from fseb_ft.runs.rundir import runs_in as runs_in
    from fseb_ft.runs.rundir import write_best_weights as write_best_weights
    from fseb_ft.runs.rundir import write_json as write_json
    from fseb_ft.runs.rundir import write_method_state as write_method_state
    from fseb_ft.runs.rundir import write_val_logits as write_val_logits
    from fseb_ft.runs.rundir import write_wise_weights as write_wise_weights
    from fseb_ft.runs.tables import corruption_markdown as corruption_markdown
    from fseb_ft.runs.tables import groups_markdown as groups_markdown
    from fseb_ft.runs.tables import markdown_table as markdown_table
    from fseb_ft.runs.tables import method_title as method_title
    from fseb_ft.runs.tables import split_note as split_note
    from fseb_ft.runs.tables import split_suffix as split_suffix
    from fseb_ft.runs.upload import HubPushError as HubPushError
    from fseb_ft.runs.upload import push_run as push_run
    from fseb_ft.runs.upload import retry_command as retry_command
    from fseb_ft.runs.upload import share_run as share_run

_LAZY = {
    "DiskFullError": "fseb_ft.runs.atomic",
    "cleaned_on_failure": "fseb_ft.runs.atomic",
    "is_not_writable": "fseb_ft.runs.atomic",
    "publish": "fseb_ft.runs.atomic",
    "remove": "fseb_ft.runs.atomic",
    "remove_orphans": "fseb_ft.runs.atomic",
    "write_bytes": "fseb_ft.runs.atomic",
    "temp_beside": "fseb_ft.runs.atomic",
    "write_text": "fseb_ft.runs.atomic",
    "save_figure": "fseb_ft.runs.canvas",
    "new_figure": "fseb_ft.runs.canvas",
    "write_comparison": "fseb_ft.runs.comparison",
    "export_run": "fseb_ft.runs.export",
    "is_exported": "fseb_ft.runs.export",
    "write_model_card": "fseb_ft.runs.export",
    "read_feature_fit": "fseb_ft.runs.feature_fit",
    "write_feature_fit": "fseb_ft.runs.feature_fit",
    "BEST_RECIPE": "fseb_ft.runs.leaderboard",
    "LEADERBOARD_MD": "fseb_ft.runs.leaderboard",
    "comparison_table": "fseb_ft.runs.leaderboard",
    "format_params": "fseb_ft.runs.leaderboard",
    "write_leaderboard": "fseb_ft.runs.leaderboard",
    "load_run_model": "fseb_ft.runs.loading",
    "run_predictor": "fseb_ft.runs.loading",
    "run_lock": "fseb_ft.runs.lock",
    "scrub": "fseb_ft.runs.published",
    "EvalResults": "fseb_ft.runs.report",
    "write_confusion_plot": "fseb_ft.runs.report",
    "write_corruption_plot": "fseb_ft.runs.report",
    "write_plots": "fseb_ft.runs.report",
    "write_results": "fseb_ft.runs.report",
    "write_val_logits": "fseb_ft.runs.rundir",
    "read_val_logits": "fseb_ft.runs.rundir",
    "read_val_features": "fseb_ft.runs.rundir",
    "ABSTENTION_FILE": "fseb_ft.runs.rundir",
    "CHECKPOINTS": "fseb_ft.runs.rundir",
    "CHECKPOINT_PREFIX": "fseb_ft.runs.rundir",
    "COMPARISON_JSON": "fseb_ft.runs.rundir",
    "COMPARISON_MD": "fseb_ft.runs.rundir",
    "DATA_FILES": "fseb_ft.runs.rundir",
    "FEATURE_OOD_FIT": "fseb_ft.runs.rundir",
    "MODEL_DIR": "fseb_ft.runs.rundir",
    "MODEL_WEIGHTS": "fseb_ft.runs.rundir",
    "PLOTS": "fseb_ft.runs.rundir",
    "RECIPE_FILE": "fseb_ft.runs.rundir",
    "RESULTS_JSON": "fseb_ft.runs.rundir",
    "RESULTS_MD": "fseb_ft.runs.rundir",
    "RUN_INFO_FILE": "fseb_ft.runs.rundir",
    "RunInfo": "fseb_ft.runs.rundir",
    "TRAINER_STATE": "fseb_ft.runs.rundir",
    "check_output_dir": "fseb_ft.runs.rundir",
    "checkpoint_name": "fseb_ft.runs.rundir",
    "clear_run": "fseb_ft.runs.rundir",
    "epochs_done": "fseb_ft.runs.rundir",
    "latest_checkpoint": "fseb_ft.runs.rundir",
    "read_abstention": "fseb_ft.runs.rundir",
    "read_class_names": "fseb_ft.runs.rundir",
    "read_json": "fseb_ft.runs.rundir",
    "read_method_state": "fseb_ft.runs.rundir",
    "read_run": "fseb_ft.runs.rundir",
    "results_split": "fseb_ft.runs.rundir",
    "runs_in": "fseb_ft.runs.rundir",
    "write_json": "fseb_ft.runs.rundir",
    "write_best_weights": "fseb_ft.runs.rundir",
    "write_method_state": "fseb_ft.runs.rundir",
    "write_wise_weights": "fseb_ft.runs.rundir",
    "corruption_markdown": "fseb_ft.runs.tables",
    "groups_markdown": "fseb_ft.runs.tables",
    "markdown_table": "fseb_ft.runs.tables",
    "method_title": "fseb_ft.runs.tables",
    "split_note": "fseb_ft.runs.tables",
    "split_suffix": "fseb_ft.runs.tables",
    "HubPushError": "fseb_ft.runs.upload",
    "push_run": "fseb_ft.runs.upload",
    "retry_command": "fseb_ft.runs.upload",
    "share_run": "fseb_ft.runs.upload",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
