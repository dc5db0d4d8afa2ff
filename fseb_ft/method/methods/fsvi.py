"""FS-VI (``fseb.method: fsvi``; Rudner et al., NeurIPS 2022) under FS-EB's prior::

    loss = mean_CE(f(x; μ + σ ε), y) + reg_scale · KL(q(f(x̂)) ‖ N(0, Kc)) / N_train

with a mean-field Gaussian ``q(θ) = N(μ, diag(σ²))`` (:mod:`fseb_ft.method.variational`) and
the KL of :func:`fseb_ft.method.fsvi.function_kl` (docs/method.md, "FS-VI"). μ is the network's
weights; the method keeps ρ (σ), saves σ beside the weights and predicts with the Monte-Carlo
average of ``fsvi.predict_samples`` draws seeded by the run's seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fseb_ft.method.fsvi import function_kl
from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.methods.registry import Objective, TrainingMethod, register_method
from fseb_ft.method.parts import unwrap_model
from fseb_ft.method.variational import (
    MCPredictive,
    MeanFieldGaussian,
    context_moments,
    variance_parameters,
)
from fseb_ft.recipe import FSEBConfig, Recipe

__all__ = ["FSVI"]


@register_method("fsvi")
class FSVI(TrainingMethod):
    """FS-VI: q(θ) over the ``fseb.fsvi.variance`` parameters, every σ at ``fsvi.init_std``.

    Raises:
        ValueError: ``fsvi.variance="head"`` and the model has no linear ``get_classifier()``.
    """

    state_file = "variational.safetensors"
    """σ of each variance-carrying parameter (by its name) at the best epoch; with the mean μ
    in the weights it is q(θ) = N(μ, diag(σ²))."""
    state_name = "FS-VI's standard deviations"
    single_process_reason = (
        "fseb.method=fsvi runs in one process: its σ is not synchronised across processes"
    )
    """ρ lies outside the wrapped network, so no process averages its gradients."""

    def __init__(self, model: nn.Module, config: FSEBConfig) -> None:
        super().__init__(model, config)
        params = variance_parameters(unwrap_model(model), config.fsvi.variance)
        self.q = MeanFieldGaussian(params, config.fsvi.init_std)

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        return "FS-VI"

    @classmethod
    def uses_context(cls, config: FSEBConfig) -> bool:
        return True

    @classmethod
    def card_text(
        cls,
        recipe: Recipe,
        prior: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None,
    ) -> str:
        f = recipe.fseb
        return (
            "**FS-VI** (function-space variational inference; Rudner, Chen, Teh & Gal, NeurIPS "
            "2022) learns a Gaussian over the parameters whose linearised logits at the context "
            "images are pulled towards the same prior by a KL divergence.\n\n"
            f"This model: FS-VI with reg_scale={f.reg_scale:g}, variance on the "
            f"`{f.fsvi.variance}` parameters (`fseb.fsvi.variance`). "
            "**The exported weights "
            "(`model.safetensors`) are the variational mean μ**, so `timm.create_model` gives the "
            "deterministic network at μ; the reported results average the predictions of "
            f"{f.fsvi.predict_samples} draws θ ~ N(μ, diag(σ²)), with σ per parameter in "
            f"`{cls.state_file}` (keyed by parameter name).\n"
        )

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        """(MC mean CE over ``likelihood_samples`` draws θ ~ q, KL, first draw's logits).

        The likelihood draws are reparameterised (``μ + σ ε``), so gradients reach μ and ρ
        (one sample per step by default, as the FS-EB paper's I = J = 1).
        """
        cfg = objective.config
        base = unwrap_model(objective.model)
        means = dict(base.named_parameters())
        nlls: list[Tensor] = []
        first: Tensor | None = None
        weights, smoothing = objective.class_weights, objective.target_smoothing
        for _ in range(cfg.likelihood_samples):
            logits = functional_call(base, self.q.sample(means), (x,))  # (B, K)
            first = logits if first is None else first
            nlls.append(likelihood_term(logits, y, weights, smoothing))
        # The KL needs the context batch, its features and s and d (checked: uses_context).
        mean, cov = context_moments(
            base, self.q, cast(Tensor, context), cfg.fsvi.variance, objective.feature_fn
        )  # (M, K), (K, M, M)
        scale = cast(float, objective.prior_cov_scale)
        diag = cast(float, objective.prior_cov_diag)
        kl = function_kl(mean, cov, cast(Tensor, features), scale, diag)
        nll = torch.stack(nlls).mean()  # likelihood_samples ≥ 1
        loss = nll + cfg.reg_scale * kl / objective.num_train
        return {"loss": loss, "nll": nll, "fs_reg": kl, "logits": cast(Tensor, first)}

    def extra_parameters(self) -> dict[str, nn.Parameter]:
        return dict(zip(self.q.names, self.q.rho, strict=True))

    def checkpointed_modules(self) -> list[nn.Module]:
        return [self.q]

    def state(self) -> dict[str, Tensor]:
        return self.q.stds()

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.q.load_stds(state)

    def predictor(self, network: nn.Module, seed: int) -> nn.Module:
        """The :class:`~fseb_ft.method.variational.MCPredictive` of q around ``network``'s
        weights, whose outputs are the log-probabilities of the averaged prediction; the draws
        are made where its parameters are."""
        samples = self.config.fsvi.predict_samples
        return MCPredictive(unwrap_model(network), self.q, samples, seed)
