"""The engine layer: a run's phases, the training loop and its callbacks, and the machinery the
commands share. Imports any layer below it; only the command modules import it.

Its public names, those the other folders and the commands import, are ``__all__``; each is
imported from its module on first use (PEP 562), so importing one module of the folder loads no
other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.engine.callbacks import Callback as Callback
    from fseb_ft.engine.callbacks import TrainingDivergedError as TrainingDivergedError
    from fseb_ft.engine.ensemble import evaluate_ensemble as evaluate_ensemble
    from fseb_ft.engine.in_memory import in_memory_splits as in_memory_splits
    from fseb_ft.engine.in_memory import resolve_recipe as resolve_recipe
    from fseb_ft.engine.loop import NonFiniteLossError as NonFiniteLossError
    from fseb_ft.engine.reevaluate import evaluate_run as evaluate_run
    from fseb_ft.engine.resume import RecipeMismatchError as RecipeMismatchError
    from fseb_ft.engine.run import run_with_predictions as run_with_predictions
    from fseb_ft.engine.search import compare_sweeps as compare_sweeps
    from fseb_ft.engine.search import sweep as sweep

_LAZY = {
    "Callback": "fseb_ft.engine.callbacks",
    "TrainingDivergedError": "fseb_ft.engine.callbacks",
    "evaluate_ensemble": "fseb_ft.engine.ensemble",
    "in_memory_splits": "fseb_ft.engine.in_memory",
    "resolve_recipe": "fseb_ft.engine.in_memory",
    "NonFiniteLossError": "fseb_ft.engine.loop",
    "evaluate_run": "fseb_ft.engine.reevaluate",
    "RecipeMismatchError": "fseb_ft.engine.resume",
    "run_with_predictions": "fseb_ft.engine.run",
    "compare_sweeps": "fseb_ft.engine.search",
    "sweep": "fseb_ft.engine.search",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
