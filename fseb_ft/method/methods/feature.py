"""Feature-SP (``fseb.method: feature``): feature-space regularisation towards φ0, after DELTA
(Li, Xiong, Wang, Huan, Chen, Huan & Dou, "DELTA: Deep learning transfer using feature map with
attention for convolutional networks", ICLR 2019) without its attention weighting::

    loss = mean_CE(f(x; θ), y) + (reg_scale · R_h + R_θ) / N_train,
    R_h  = Σ_i ‖h(x_i; θ) − h(x_i; φ0)‖²

over the training batch (``fseb.feature.points: train``) or the training and context batches,
``[x; x̂]`` (``joint``), with ``h`` the objective's ``feature_fn`` (timm's pre-logits features)
and ``R_θ`` PS-MAP's (:func:`~fseb_ft.method.methods.fseb.parameter_prior`). The logits are the
classifier (``get_classifier()``) of ``h(x; θ)``, timm's forward in one pass. φ0's features come
from the objective's frozen copy; the context batch from FS-EB's stream (docs/method.md,
"Feature-SP").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.methods.fseb import check_parameter_anchor, parameter_prior
from fseb_ft.method.methods.registry import Objective, TrainingMethod, register_method
from fseb_ft.method.parts import ModelPartsError, head_names, unwrap_model
from fseb_ft.recipe import FSEBConfig, Recipe

__all__ = ["FeatureSP", "feature_term"]


@register_method("feature")
class FeatureSP(TrainingMethod):
    """Feature-SP: the penultimate features held near φ0's, the weights decayed as PS-MAP's.

    Raises:
        ModelPartsError: the model's ``get_classifier()`` is not one module with parameters.
    """

    single_process_reason = (
        "fseb.method=feature runs in one process: it computes the features on the network "
        "inside its wrapper, whose gradients the processes would not average"
    )
    """The feature function reads the unwrapped network (``forward_features``), past DDP."""

    def __init__(self, model: nn.Module, config: FSEBConfig) -> None:
        super().__init__(model, config)
        _check_classifier(model)

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        return "Feature-SP"

    @classmethod
    def uses_context(cls, config: FSEBConfig) -> bool:
        return config.feature.points == "joint"

    @classmethod
    def card_text(
        cls,
        recipe: Recipe,
        prior: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None,
    ) -> str:
        f = recipe.fseb
        points = "training images"
        if cls.uses_context(f):
            points += (
                f" and the context images (`{recipe.context.kind}` context set, batches of "
                f"{recipe.context.batch_size})"
            )
        return (
            "**Feature-SP** (feature-space regularisation towards the starting network, after "
            "DELTA: Li et al., ICLR 2019, without its attention weighting) pulls the penultimate "
            "features of the network towards those of the frozen starting network, by their "
            "squared distance, on top of PS-MAP's weight decay.\n\n"
            f"This model: Feature-SP with reg_scale={f.reg_scale:g}, prior_var={f.prior_var:g}, "
            f"at the {points} (`fseb.feature.points: {f.feature.points}`).\n"
        )

    def check_prior(self, model: nn.Module, prior: nn.Module) -> None:
        check_parameter_anchor(self.config, model, prior)  # PS-MAP's parameter prior

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        cfg = objective.config
        base = unwrap_model(objective.model)
        # With joint points the objective has checked the context batch and φ0's features of it.
        joint = self.uses_context(cfg)
        h = _features(objective, base, x, context if joint else None)  # (B [+ M], D)
        logits = cast(Any, base).get_classifier()(h[: x.shape[0]])  # (B, K); checked
        nll = likelihood_term(logits, y, objective.class_weights, objective.target_smoothing)
        h0 = objective.prior_features(x)  # (B, D)
        if joint:
            h0 = torch.cat([h0, cast(Tensor, features)])  # (B + M, D); the wider dtype
        feature_reg = feature_term(h, h0)
        param_reg = parameter_prior(objective, cfg.param_anchor)
        loss = nll + (cfg.reg_scale * feature_reg + param_reg) / objective.num_train
        return {
            "loss": loss,
            "nll": nll,
            "fs_reg": feature_reg,
            "param_reg": param_reg,
            "logits": logits,
        }


def feature_term(features: Tensor, prior_features: Tensor) -> Tensor:
    """``R_h = Σ_i ‖h_i − h⁰_i‖²``, summed over the points (rows) and feature dimensions, in the
    features' dtype widened to at least float32 (the policy autocast applies to losses).

    Args:
        features: ``h(x; θ)`` (N, D); gradients flow through it.
        prior_features: ``h(x; φ0)`` (N, D), a constant of the loss.
    """
    if features.shape != prior_features.shape:
        raise ValueError(
            f"features {tuple(features.shape)} and φ0's {tuple(prior_features.shape)} differ"
        )
    dtype = torch.promote_types(features.dtype, torch.float32)
    return (features.to(dtype) - prior_features.to(dtype)).square().sum()


def _features(objective: Objective, base: nn.Module, x: Tensor, context: Tensor | None) -> Tensor:
    """``h(·; θ)`` of x, or of ``[x; x̂]`` given the context batch: in one pass (BatchNorm sees
    both) or two, as ``fseb.forward_mode`` says for FS-EB."""
    if context is None:
        return objective.feature_fn(base, x)  # (B, D)
    if objective.config.forward_mode == "joint":
        return objective.feature_fn(base, torch.cat([x, context]))  # (B + M, D)
    return torch.cat([objective.feature_fn(base, x), objective.feature_fn(base, context)])


def _check_classifier(model: nn.Module) -> None:
    """Refuse a network without one classifier module (``get_classifier()``) to map the
    features to the logits. Each step looks it up again rather than the method keeping it, so
    that the method holds none of the network's parameters (which would train twice).

    Raises:
        ModelPartsError: no classifier, or several (a distilled DeiT's two heads).
    """
    head_names(model, key="fseb.method=feature")  # one line when there is none
    head = cast(Any, model).get_classifier()
    if not isinstance(head, nn.Module):
        raise ModelPartsError(
            "fseb.method=feature needs one classifier module from get_classifier() to map the "
            f"features to the logits; {type(model).__name__} gives {type(head).__name__}"
        )
