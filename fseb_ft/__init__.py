"""fseb_ft: function-space empirical Bayes (FS-EB) fine-tuning for timm vision models.

The regulariser and objective are importable without the training stack::

    from fseb_ft import FSEBObjective, function_space_term

Fine-tuning from Python (imports the training stack on first use)::

    import fseb_ft
    results = fseb_ft.finetune("recipes/cifar10.yaml", train=train_ds, test=test_ds)

Predicting new images with abstention (``fseb-ft predict``; ``fseb_ft.predict`` is the command's
module, so the function has its own name)::

    out = fseb_ft.predict_images("runs/quickstart/fseb", ["photos/"], coverage=0.9)

Every name here is imported on first use (PEP 562), so ``import fseb_ft`` loads nothing but
this file and ``python -m fseb_ft.<module>`` runs a module that was not imported before.
"""

import importlib
import os
from typing import Any

# albumentations asks PyPI for a newer version when imported (2 s timeout); a training library
# must not phone home, and offline it only costs time. A user's explicit setting still wins.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

_LAZY = {
    "CholeskyJitterWarning": "fseb_ft.method.regularizer",
    "FSEBObjective": "fseb_ft.method.objective",
    "function_space_term": "fseb_ft.method.regularizer",
    "parameter_term": "fseb_ft.method.regularizer",
    "predict_images": "fseb_ft.prediction",
    "prior_covariance": "fseb_ft.method.regularizer",
    "timm_features": "fseb_ft.method.objective",
}
__all__ = sorted(_LAZY)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The public names on first use, and the modules ``api`` and ``finetune`` (PEP 562).

    ``fseb_ft.finetune`` is the CLI module and, being callable, also the Python API:
    ``fseb_ft.finetune(recipe, train=..., test=...)``; it pulls in the training stack
    (Accelerate, datasets, albumentations), which importing ``fseb_ft`` alone must not.
    """
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in ("api", "finetune"):
        return importlib.import_module(f"fseb_ft.{name}")
    raise AttributeError(f"module 'fseb_ft' has no attribute {name!r}")
