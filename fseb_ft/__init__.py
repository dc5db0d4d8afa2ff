"""fseb_ft: function-space empirical Bayes (FS-EB) fine-tuning for timm vision models.

The regulariser and objective are importable without the training stack::

    from fseb_ft import FSEBObjective, function_space_term
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
