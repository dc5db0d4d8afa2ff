"""The in-memory Python API's former home: :func:`fseb_ft.finetune.finetune` (kept importable),
and :func:`fseb_ft.prediction.pipeline.predict_images`.

``fseb_ft.finetune(recipe, train=..., test=...)``, ``fseb_ft.finetune.finetune`` and
``fseb_ft.api.finetune`` are the same function; so are ``fseb_ft.predict_images`` and
``fseb_ft.api.predict_images``.
"""

from fseb_ft.finetune import finetune, resolve_recipe
from fseb_ft.prediction import predict_images

__all__ = ["finetune", "predict_images", "resolve_recipe"]
