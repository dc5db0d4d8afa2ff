"""A run's network rebuilt from its folder: :func:`load_run_model` (its best weights) and
:func:`run_predictor` (what the run predicts with: FS-VI, the Monte-Carlo predictive of the saved
q(θ)). Re-evaluation, the exported model folder and prediction time
(:mod:`fseb_ft.prediction.loading`) build on them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from safetensors.torch import load_model as load_safetensors
from torch import nn

from fseb_ft.method.models import create_model
from fseb_ft.method.posterior import posterior
from fseb_ft.recipe import Recipe
from fseb_ft.runs.rundir import MODEL_WEIGHTS, NOT_A_RUN, RunInfo, read_method_state

__all__ = ["load_run_model", "run_predictor"]


def load_run_model(run_dir: Path, recipe: Recipe, info: RunInfo) -> nn.Module:
    """The run's model with its best weights (:data:`~fseb_ft.runs.rundir.MODEL_WEIGHTS`), on CPU.

    Raises:
        FileNotFoundError: the run has no best weights.
    """
    weights = run_dir / MODEL_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(NOT_A_RUN.format(run_dir=run_dir, missing=MODEL_WEIGHTS))
    # The weights come from the run, so never fetch pretrained ones again.
    model_cfg = dataclasses.replace(recipe.model, pretrained=False)
    model = create_model(model_cfg, int(info.num_classes), in_chans=recipe.data.channels)
    load_safetensors(model, str(weights))
    return model


def run_predictor(run_dir: Path, recipe: Recipe, model: nn.Module) -> nn.Module:
    """What the run predicts with: its method's predictor around ``model`` (its best weights),
    built by :func:`fseb_ft.method.posterior.posterior` with the method's state saved beside
    them (:func:`~fseb_ft.runs.rundir.read_method_state`) and seeded by ``train.seed``, as
    training built the predictor it scored the test split with, draw for draw: ``model``
    itself for a MAP method; for FS-VI the Monte-Carlo predictive of q(θ) = N(μ, diag(σ²)),
    μ = ``model``'s weights and σ the saved state, with ``fsvi.predict_samples`` draws.

    ``model`` may already be on its device (the draws are made where its parameters are).

    Raises:
        FileNotFoundError: a method with state (FS-VI) whose saved state is missing.
    """
    method = posterior(model, recipe.fseb)
    if method.state_file is not None:
        method.load_state(read_method_state(run_dir, method.state_file))
    return method.predictor(model, recipe.train.seed)
