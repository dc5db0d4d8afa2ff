"""The posterior over the weights and its predictive: what a trained network predicts with.

The posterior is the recipe's method (``fseb.method``, :mod:`fseb_ft.method.methods`) over the
network: nothing beyond the weights for a MAP estimate (FS-EB, PS-MAP, L2-SP), whose predictive
is the network itself; FS-VI's ``q(θ) = N(μ, diag(σ²))``, μ the network's weights, whose
predictive is the Monte-Carlo average of ``fsvi.predict_samples`` draws seeded by the run's seed
(docs/method.md, "FS-VI"). Training (:meth:`fseb_ft.method.objective.FSEBObjective.predictor`)
and a saved run (:func:`fseb_ft.runs.loading.run_predictor`) both build it with
:func:`posterior` and predict with its ``predictor``, so the test split is scored by the same
draws either way.
"""

from __future__ import annotations

from torch import nn

from fseb_ft.method.methods import TrainingMethod, find_method
from fseb_ft.method.parts import unwrap_model
from fseb_ft.recipe import FSEBConfig

__all__ = ["posterior"]


def posterior(model: nn.Module, fseb: FSEBConfig) -> TrainingMethod:
    """The method ``fseb.method`` names, over ``model`` (possibly wrapped) as it is now: what
    it keeps beside the weights (FS-VI: every σ at ``fseb.fsvi.init_std``; nothing for a MAP
    method) and its predictor.

    Raises:
        ValueError: ``fsvi.variance="head"`` and the model has no linear ``get_classifier()``.
        ModelPartsError: L2-SP and the model has no classifier from ``get_classifier()``.
    """
    return find_method(fseb.method)(unwrap_model(model), fseb)
