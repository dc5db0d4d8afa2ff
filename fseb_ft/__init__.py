"""fseb_ft: function-space empirical Bayes (FS-EB) fine-tuning for timm vision models.

The regulariser and objective are importable without the training stack::

    from fseb_ft import FSEBObjective, function_space_term

Fine-tuning from Python (imports the training stack on first use)::

    import fseb_ft
    results = fseb_ft.finetune("recipes/cifar10.yaml", train=train_ds, test=test_ds)
"""

import os

# albumentations asks PyPI for a newer version when imported (2 s timeout); a training library
# must not phone home, and offline it only costs time. A user's explicit setting still wins.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from fseb_ft.objective import FSEBObjective, timm_features
from fseb_ft.regularizer import (
    CholeskyJitterWarning,
    function_space_term,
    parameter_term,
    prior_covariance,
)

__all__ = [
    "CholeskyJitterWarning",
    "FSEBObjective",
    "function_space_term",
    "parameter_term",
    "prior_covariance",
    "timm_features",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import ``fseb_ft.finetune`` and ``fseb_ft.api`` on first use (PEP 562).

    They pull in the training stack (Accelerate, datasets, albumentations), which importing
    ``fseb_ft`` for the regulariser alone must not. ``fseb_ft.finetune`` is the CLI module and,
    being callable, also the Python API: ``fseb_ft.finetune(recipe, train=..., test=...)``.
    """
    if name in ("api", "finetune"):
        import importlib

        return importlib.import_module(f"fseb_ft.{name}")
    raise AttributeError(f"module 'fseb_ft' has no attribute {name!r}")
