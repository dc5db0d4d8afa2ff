"""The posterior over the weights and its predictive: what a trained network predicts with.

FS-EB and PS-MAP are MAP estimates: their posterior is the network's weights, and the network
itself is the predictive. FS-VI's posterior is ``q(θ) = N(μ, diag(σ²))``, μ the network's
weights, and its predictive the Monte-Carlo average of ``fsvi_predict_samples`` draws seeded by
the run's seed (docs/method.md, "FS-VI"). Training
(:meth:`fseb_ft.method.objective.FSEBObjective.predictor`) and a saved run
(:func:`fseb_ft.runs.loading.run_predictor`) both build q with :func:`posterior` and the
predictive with :func:`predictive`, so the test split is scored by the same draws either way.
"""

from __future__ import annotations

from torch import nn

from fseb_ft.method.variational import MCPredictive, MeanFieldGaussian, variance_parameters
from fseb_ft.recipe import FSEBConfig

__all__ = ["posterior", "predictive", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / ``torch.compile`` / Accelerate wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def posterior(model: nn.Module, fseb: FSEBConfig) -> MeanFieldGaussian | None:
    """FS-VI's q(θ) over ``model``'s variance-carrying parameters (``fseb.fsvi_variance``), every
    σ at ``fseb.fsvi_init_std``; ``None`` for the MAP methods (FS-EB, PS-MAP), which have none.

    Raises:
        ValueError: ``fsvi_variance="head"`` and the model has no linear ``get_classifier()``.
    """
    if fseb.method != "fsvi":
        return None
    params = variance_parameters(unwrap_model(model), fseb.fsvi_variance)
    return MeanFieldGaussian(params, fseb.fsvi_init_std)


def predictive(
    model: nn.Module, q: MeanFieldGaussian | None, fseb: FSEBConfig, seed: int
) -> nn.Module:
    """What ``model`` predicts with: itself without q; else the
    :class:`~fseb_ft.method.variational.MCPredictive` of q around ``model``'s weights, with
    ``fseb.fsvi_predict_samples`` draws seeded by ``seed``, whose outputs are the
    log-probabilities of the averaged prediction.

    ``model`` may be wrapped (DDP, Accelerate) and already on its device: the draws are made
    where its parameters are.
    """
    if q is None:
        return model
    return MCPredictive(unwrap_model(model), q, fseb.fsvi_predict_samples, seed)
