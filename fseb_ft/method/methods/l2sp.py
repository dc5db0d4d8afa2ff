"""L2-SP (``fseb.method: l2sp``; Li, Grandvalet & Davoine, "Explicit inductive bias for
transfer learning with convolutional networks", ICML 2018): weight decay towards the starting
weights rather than towards zero::

    loss = mean_CE(f(x; θ), y) + R_θ / N_train,
    R_θ  = (‖θ_body − θ⁰_body‖² + ‖θ_head‖²) / (2σ_p²),   σ_p² = fseb.prior_var

The starting weights θ⁰ are φ0's, the prior's centre, through the same ``R_θ`` as FS-EB's
``param_anchor: init`` (:func:`~fseb_ft.method.methods.fseb.parameter_prior`); the classifier,
new for the task and so without starting weights, decays towards zero (the paper's Ω'' on the
new layer). No context points, no function-space term (docs/method.md, "L2-SP").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.methods.fseb import check_anchors, parameter_prior
from fseb_ft.method.methods.registry import Objective, TrainingMethod, register_method
from fseb_ft.method.parts import head_names, unwrap_model
from fseb_ft.recipe import FSEBConfig, Recipe

__all__ = ["L2SP"]


@register_method("l2sp")
class L2SP(TrainingMethod):
    """L2-SP: the body anchored at φ0's weights, the classifier (``get_classifier()``) at zero.

    Raises:
        ModelPartsError: the model has no classifier from ``get_classifier()``.
    """

    def __init__(self, model: nn.Module, config: FSEBConfig) -> None:
        super().__init__(model, config)
        self.head = frozenset(head_names(unwrap_model(model), key="fseb.method=l2sp"))

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        return "L2-SP"

    @classmethod
    def card_text(
        cls,
        recipe: Recipe,
        prior: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None,
    ) -> str:
        return (
            "**L2-SP** (Li, Grandvalet & Davoine, ICML 2018) decays the weights towards the "
            "starting weights instead of towards zero; the new classifier, which has no "
            "starting weights, decays towards zero.\n\n"
            f"This model: L2-SP with prior_var={recipe.fseb.prior_var:g}.\n"
        )

    def check_prior(self, model: nn.Module, prior: nn.Module) -> None:
        check_anchors(model, prior, "fseb.method=l2sp")

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        logits = objective.model(x)  # (B, K)
        nll = likelihood_term(logits, y, objective.class_weights, objective.target_smoothing)
        param_reg = parameter_prior(objective, "init", at_zero=self.head)
        loss = nll + param_reg / objective.num_train
        return {"loss": loss, "nll": nll, "param_reg": param_reg, "logits": logits}
