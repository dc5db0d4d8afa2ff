"""The training methods a recipe's ``fseb.method`` names, one module each, registering its
:class:`~.registry.TrainingMethod` by name (:func:`~.registry.register_method`): FS-EB with
PS-MAP as its ``reg_scale = 0`` (:mod:`.fseb`), FS-VI (:mod:`.fsvi`), L2-SP (:mod:`.l2sp`) and
Feature-SP (:mod:`.feature`).
Importing a method's module registers it: a new method is its module, its name in the one
import line of method modules below, and its name in :data:`fseb_ft.recipe.options.METHODS`,
which a test holds equal to the registry (docs/architecture.md, "Where new things go").
"""

from __future__ import annotations

from fseb_ft.method.methods import feature, fseb, fsvi, l2sp  # noqa: F401
from fseb_ft.method.methods.registry import TrainingMethod, find_method

__all__ = ["TrainingMethod", "find_method"]
