"""The feature OOD scores' fit a loaded model keeps, read back to score new images with exactly
the fit the evaluation scored with (:func:`load_feature_fit`), refused with one line naming the
command that writes it when the model keeps none or keeps one made for other weights. Writing
and reading the file is :mod:`fseb_ft.runs.feature_fit`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import FeatureOodFit, fit_scores
from fseb_ft.prediction.loading import LoadedModel
from fseb_ft.recipe.options import FEATURE_OOD_SCORES
from fseb_ft.runs.feature_fit import read_feature_fit
from fseb_ft.runs.rundir import FEATURE_OOD_FIT

__all__ = ["load_feature_fit"]


def load_feature_fit(loaded: LoadedModel, name: str) -> FeatureOodFit | None:
    """The fit ``loaded`` keeps for the OOD score ``name``; ``None`` for a score of the outputs.

    Raises:
        FsebError: the model keeps no fit (the message names the command that writes one), its
            fit cannot compute ``name``, or it was fitted with other weights.
    """
    if name not in FEATURE_OOD_SCORES:
        return None
    path = loaded.feature_fit_file()
    if path is None:
        raise FsebError(_missing(loaded, name))
    fit = read_feature_fit(path)
    if name not in fit_scores(fit):
        raise FsebError(
            f"--ood-score {name}: {loaded.where}'s feature OOD fit has no ViM part (its "
            f"classifier is not linear); choose one of {list(fit_scores(fit))}"
        )
    _check_weights(fit, loaded.network or loaded.model, loaded, name)
    return fit


def _missing(loaded: LoadedModel, name: str) -> str:
    """Why ``loaded`` cannot compute the feature score ``name``, and the command that fixes it."""
    evaluate = _evaluate_command(loaded, name)
    what = (
        f"--ood-score {name} scores the penultimate features with a fit on the training split "
        f"that the model keeps ({FEATURE_OOD_FIT.name}), and {loaded.where} keeps none"
    )
    if loaded.run_dir is not None:
        return f"{what}: run `{evaluate}` (it fits and keeps it)"
    if loaded.where.startswith("hf-hub:"):
        repo = loaded.where.removeprefix("hf-hub:").partition("@")[0]
        return f"{what}: run `{evaluate}` on the run it pushed, then `fseb-ft push RUN {repo}`"
    return f"{what}: run `{evaluate}` on the run it was exported from and use that run's model/"


def _evaluate_command(loaded: LoadedModel, name: str) -> str:
    """The ``fseb-ft evaluate`` command that fits (again) and keeps the fit of ``name``: the
    run's own ``eval.ood_scores`` with ``name`` added, so its results keep their scores."""
    scores: Sequence[str] = loaded.recipe.eval.ood_scores if loaded.recipe is not None else ()
    named = ",".join(dict.fromkeys([*scores, name]))
    return f"fseb-ft evaluate {loaded.run_dir or 'RUN'} eval.ood_scores=[{named}]"


def _check_weights(fit: FeatureOodFit, network: nn.Module, loaded: LoadedModel, name: str) -> None:
    """Refuse a fit whose classifier (kept for ViM) is not ``network``'s: fitted on other
    weights, since replaced."""
    timm_network = cast(Any, network)  # timm's method, which nn.Module does not declare
    head = timm_network.get_classifier() if hasattr(network, "get_classifier") else None
    if fit.weight is None or not isinstance(head, nn.Linear):
        return
    if head.weight.shape != fit.weight.shape or not torch.equal(
        head.weight.detach().double().cpu(), fit.weight
    ):
        raise FsebError(
            f"--ood-score {name}: {loaded.where}'s feature OOD fit was made for other weights "
            f"than its own: run `{_evaluate_command(loaded, name)}` again"
        )
