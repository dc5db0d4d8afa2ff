"""The method layer: the training methods (one module each in :mod:`.methods`), the FS-EB and
FS-VI maths, the objective, its predictor, the timm models and the context points. Imports only
:mod:`fseb_ft.data` and :mod:`fseb_ft.recipe` (and ``errors``, ``logs``).

Its public names, those the other folders and the commands import, are ``__all__``; each is
imported from its module on first use (PEP 562), so importing one module of the folder loads no
other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.method.context import ContextStream as ContextStream
    from fseb_ft.method.context import context_sets as context_sets
    from fseb_ft.method.context import context_stream as context_stream
    from fseb_ft.method.context import resolve_prior_on_pool as resolve_prior_on_pool
    from fseb_ft.method.devices import DeviceError as DeviceError
    from fseb_ft.method.devices import resolve_device as resolve_device
    from fseb_ft.method.likelihood import check_class_weights as check_class_weights
    from fseb_ft.method.likelihood import class_weights as class_weights
    from fseb_ft.method.methods import TrainingMethod as TrainingMethod
    from fseb_ft.method.methods import find_method as find_method
    from fseb_ft.method.models import create_model as create_model
    from fseb_ft.method.models import head_init as head_init
    from fseb_ft.method.models import input_spec as input_spec
    from fseb_ft.method.models import planned_input_size as planned_input_size
    from fseb_ft.method.objective import FSEBObjective as FSEBObjective
    from fseb_ft.method.parts import ModelPartsError as ModelPartsError
    from fseb_ft.method.parts import frozen_names as frozen_names
    from fseb_ft.method.parts import head_names as head_names
    from fseb_ft.method.parts import layer_decay_groups as layer_decay_groups
    from fseb_ft.method.parts import unwrap_model as unwrap_model
    from fseb_ft.method.posterior import posterior as posterior

_LAZY = {
    "ContextStream": "fseb_ft.method.context",
    "context_sets": "fseb_ft.method.context",
    "context_stream": "fseb_ft.method.context",
    "resolve_prior_on_pool": "fseb_ft.method.context",
    "DeviceError": "fseb_ft.method.devices",
    "resolve_device": "fseb_ft.method.devices",
    "check_class_weights": "fseb_ft.method.likelihood",
    "class_weights": "fseb_ft.method.likelihood",
    "create_model": "fseb_ft.method.models",
    "head_init": "fseb_ft.method.models",
    "input_spec": "fseb_ft.method.models",
    "TrainingMethod": "fseb_ft.method.methods",
    "find_method": "fseb_ft.method.methods",
    "planned_input_size": "fseb_ft.method.models",
    "FSEBObjective": "fseb_ft.method.objective",
    "ModelPartsError": "fseb_ft.method.parts",
    "frozen_names": "fseb_ft.method.parts",
    "head_names": "fseb_ft.method.parts",
    "layer_decay_groups": "fseb_ft.method.parts",
    "unwrap_model": "fseb_ft.method.parts",
    "posterior": "fseb_ft.method.posterior",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
