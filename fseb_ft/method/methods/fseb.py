"""FS-EB, and PS-MAP as its ``reg_scale = 0`` (``fseb.method: fseb``): the MAP estimate under
the function-space prior at the context points and the parameter prior (docs/method.md)::

    loss = mean_CE(f(x; θ), y) + (reg_scale · R_f + R_θ) / N_train

with ``R_f = ½ Σ_k f_kᵀ Kc⁻¹ f_k`` at the context points (``reg_points="joint"``: at the training
and context points) and ``R_θ = ‖θ − θ_anchor‖² / (2σ_p²)`` (:func:`parameter_prior`, which
L2-SP shares). With ``param_noise_std > 0`` the terms are Monte-Carlo averages over draws
``θ + σ ε`` (EB-VI).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.methods.registry import Objective, TrainingMethod, register_method
from fseb_ft.method.parts import unwrap_model
from fseb_ft.method.regularizer import function_space_term, parameter_term
from fseb_ft.recipe import FSEBConfig, Recipe

__all__ = ["FSEB", "check_anchors", "check_parameter_anchor", "parameter_prior"]


@register_method("fseb")
class FSEB(TrainingMethod):
    """FS-EB; PS-MAP at ``reg_scale = 0`` (weight decay alone, no context points)."""

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        return "PS-MAP" if config.is_ps_map else "FS-EB"

    @classmethod
    def uses_context(cls, config: FSEBConfig) -> bool:
        return config.reg_scale > 0

    @classmethod
    def card_text(
        cls,
        recipe: Recipe,
        prior: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None,
    ) -> str:
        f = recipe.fseb
        if f.is_ps_map:
            return f"This model: PS-MAP with prior_var={f.prior_var:g}.\n"
        fingerprint = str((context or {}).get("fingerprint", ""))[:12]
        given = {"prior_cov_scale": f.prior_cov_scale, "prior_cov_diag": f.prior_cov_diag}
        used = prior or given
        return (
            f"This model: FS-EB with reg_scale={f.reg_scale:g}, prior_var={f.prior_var:g}, "
            f"prior_cov_scale={used['prior_cov_scale']:g}, "
            f"prior_cov_diag={used['prior_cov_diag']:g}{_resolved(prior)}; "
            f"context set: `{recipe.context.kind}` "
            f"({'perturbed' if recipe.context.perturb else 'unperturbed'}), pool of "
            f"{recipe.context.pool_size} images, batches of {recipe.context.batch_size}"
            + (f" (fingerprint `{fingerprint}…`)" if fingerprint else "")
            + ". Full provenance in `fseb.json`.\n"
        )

    def check_prior(self, model: nn.Module, prior: nn.Module) -> None:
        check_parameter_anchor(self.config, model, prior)

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        cfg = objective.config
        use_fs = cfg.reg_scale > 0
        reg_features = features  # (M, D)
        if use_fs and cfg.reg_points == "joint":
            # features are set with R_f (the objective checks the context batch).
            reg_features = torch.cat([objective.prior_features(x), cast(Tensor, features)])
        if cfg.param_noise_std > 0:
            nll, fs_reg, logits = _sampled_terms(objective, x, y, context, reg_features, use_fs)
        else:
            nll, fs_reg, logits = _terms(
                objective, objective.model, x, y, context, reg_features, use_fs
            )
        param_reg = parameter_prior(objective, cfg.param_anchor)
        loss = nll + (cfg.reg_scale * fs_reg + param_reg) / objective.num_train
        return {
            "loss": loss,
            "nll": nll,
            "fs_reg": fs_reg,
            "param_reg": param_reg,
            "logits": logits,
        }


def check_parameter_anchor(config: FSEBConfig, model: nn.Module, prior: nn.Module) -> None:
    """The check :func:`parameter_prior` needs of φ0: anchored at the starting weights
    (``param_anchor: init``), φ0 must have each of ``model``'s parameters."""
    if config.param_anchor == "init":
        check_anchors(model, prior, "param_anchor='init'")


def parameter_prior(objective: Objective, anchor: str, at_zero: Collection[str] = ()) -> Tensor:
    """``R_θ`` over the parameters that require a gradient now (a frozen one is a constant of
    the loss): anchored at zero (``anchor="zero"``), or each at φ0's of its name
    (``anchor="init"``) but those named in ``at_zero``, which are anchored at zero."""
    params = objective.model_parameters()
    if anchor == "zero":
        return parameter_term(params, objective.config.prior_var)
    prior_params = dict(objective.prior.named_parameters())
    names = [n for n, p in unwrap_model(objective.model).named_parameters() if p.requires_grad]
    anchors = [
        torch.zeros_like(prior_params[n]) if n in at_zero else prior_params[n] for n in names
    ]
    return parameter_term(params, objective.config.prior_var, anchors)


def check_anchors(model: nn.Module, prior: nn.Module, what: str) -> None:
    """Check that φ0 has the trainable parameters' names, at which ``R_θ`` anchors them
    (``what``: the setting that anchors them, for the message).

    Raises:
        ValueError: φ0 lacks some of these names.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    prior_names = {n for n, _ in prior.named_parameters()}
    missing = [n for n in names if n not in prior_names]
    if missing:
        raise ValueError(
            f"{what} needs φ0 to have the trainable parameters' names; "
            f"missing in the prior: {missing[:5]}"
        )


def _resolved(prior: Mapping[str, Any] | None) -> str:
    """Where s and d came from when ``fseb.prior_std`` set them (empty when the recipe did)."""
    if prior is None:
        return ""
    return (
        f" (resolved from prior_std={prior['prior_std']:g}, "
        f"prior_feature_share={prior['feature_share']:g} at m = mean ‖h(x̂; φ0)‖² = "
        f"{prior['mean_sq_norm']:.4g} over the context pool)"
    )


def _terms(
    objective: Objective,
    call: Callable[[Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    context: Tensor | None,
    features: Tensor | None,
    use_fs: bool,
    want_nll: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """(mean CE, R_f, train logits) for one draw of the parameters, computed by ``call``.

    ``features`` are φ0's features of the points ``R_f`` is evaluated at: x̂ (M, D), or
    ``[x; x̂]`` (B + M, D) with ``reg_points="joint"``.
    """
    cfg = objective.config
    joint_reg = use_fs and cfg.reg_points == "joint"
    # With R_f (use_fs) the context, its features and s and d are set (the objective checks);
    # the training logits are computed where they are read (want_nll, joint_reg).
    logits: Tensor | None
    ctx_logits: Tensor | None
    if use_fs and cfg.forward_mode == "joint":
        logits_all = call(torch.cat([x, cast(Tensor, context)], dim=0))  # (B + M, K)
        logits, ctx_logits = logits_all[: x.shape[0]], logits_all[x.shape[0] :]
    else:
        logits = call(x) if want_nll or joint_reg else None  # (B, K)
        ctx_logits = call(cast(Tensor, context)) if use_fs else None  # (M, K)
    if want_nll:
        weights, smoothing = objective.class_weights, objective.target_smoothing
        nll = likelihood_term(cast(Tensor, logits), y, weights, smoothing)
    else:
        nll = x.new_zeros((), dtype=torch.float32)
    if use_fs:
        if joint_reg:
            reg_logits = torch.cat([cast(Tensor, logits), cast(Tensor, ctx_logits)])  # (B + M, K)
        else:
            reg_logits = cast(Tensor, ctx_logits)  # (M, K)
        scale = cast(float, objective.prior_cov_scale)
        diag = cast(float, objective.prior_cov_diag)
        fs_reg = function_space_term(reg_logits, cast(Tensor, features), scale, diag, cfg.solver)
    else:
        fs_reg = x.new_zeros((), dtype=torch.float32)
    # None only for a draw that computes R_f alone, whose logits its caller drops.
    return nll, fs_reg, cast(Tensor, logits)


def _sampled_terms(
    objective: Objective,
    x: Tensor,
    y: Tensor,
    context: Tensor | None,
    features: Tensor | None,
    use_fs: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Monte-Carlo EB-VI terms: S likelihood and J regulariser draws of ``θ + σ ε``."""
    model, cfg = objective.model, objective.config
    named = dict(model.named_parameters())
    S, J = cfg.likelihood_samples, cfg.reg_samples
    nlls, regs, first_logits = [], [], None
    for i in range(max(S, J) if use_fs else S):
        # Reparameterised draw: gradients reach θ through θ + σ ε.
        params = {
            n: p + cfg.param_noise_std * torch.randn_like(p) if p.requires_grad else p
            for n, p in named.items()
        }

        def call(inp: Tensor, params: dict[str, Tensor] = params) -> Tensor:
            return functional_call(model, params, (inp,))

        nll, fs_reg, logits = _terms(
            objective, call, x, y, context, features, use_fs and i < J, want_nll=i < S
        )
        if i < S:
            nlls.append(nll)
            first_logits = logits if first_logits is None else first_logits
        if use_fs and i < J:
            regs.append(fs_reg)
    nll = torch.stack(nlls).mean()
    fs_reg = torch.stack(regs).mean() if regs else x.new_zeros((), dtype=torch.float32)
    return nll, fs_reg, cast(Tensor, first_logits)  # S ≥ 1 draws gave logits
