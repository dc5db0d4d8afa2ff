"""The in-memory Python API's former home: :func:`fseb_ft.finetune.finetune` (kept importable).

``fseb_ft.finetune(recipe, train=..., test=...)``, ``fseb_ft.finetune.finetune`` and
``fseb_ft.api.finetune`` are the same function.
"""

from fseb_ft.finetune import finetune, resolve_recipe

__all__ = ["finetune", "resolve_recipe"]
