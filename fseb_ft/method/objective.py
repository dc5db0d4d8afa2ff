"""The FS-EB training objective: a trainable model, its frozen starting copy φ0, named loss terms.

Loss (docs/method.md, "The idea"; the negative of Rudner et al. 2023, eq. 8, divided by N_train)::

    loss = mean_CE(f(x; θ), y) + (reg_scale · R_f + R_θ) / N_train

with ``R_f = ½ Σ_k f_kᵀ Kc⁻¹ f_k`` at the context points (``reg_points="joint"``: at the training
and context points) and ``R_θ = ‖θ − θ_anchor‖² / (2σ_p²)``.
``reg_scale = 0`` is PS-MAP (plain weight decay ``1 / (prior_var · N_train)``): one objective, two
configurations. ``method="fsvi"`` is FS-VI (Rudner et al., NeurIPS 2022) under the same prior::

    loss = mean_CE(f(x; μ + σ ε), y) + reg_scale · KL(q(f(x̂)) ‖ N(0, Kc)) / N_train

with a mean-field Gaussian ``q(θ) = N(μ, diag(σ²))`` and the KL of
:func:`fseb_ft.method.fsvi.function_kl`
(docs/method.md, "FS-VI").

Multi-process training: each process regularises its own context batch, so the prior is
block-diagonal across processes, and gradient averaging turns ``R_f`` into its mean over
processes; ``num_train`` must be the *global* training-set size, counted once.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as nnf
from torch import Tensor, nn
from torch.func import functional_call

from fseb_ft.method.fsvi import function_kl
from fseb_ft.method.regularizer import function_space_term, parameter_term
from fseb_ft.method.variational import (
    MCPredictive,
    MeanFieldGaussian,
    context_moments,
    variance_parameters,
)
from fseb_ft.recipe import FSEBConfig
from fseb_ft.recipe.options import (
    FORWARD_MODES,
    METHODS,
    PARAM_ANCHORS,
    REG_POINTS,
    VARIANCE_SCOPES,
)

__all__ = ["RESOLVED_BY_RUN", "FSEBObjective", "FeatureFn", "timm_features", "unwrap_model"]

_DEFAULTS = FSEBConfig()
"""The hyper-parameters' defaults, written once in :class:`~fseb_ft.recipe.FSEBConfig`."""

RESOLVED_BY_RUN = ("prior_std", "prior_feature_share")
"""``fseb`` fields that are not keywords here: the run resolves them into s and d."""

FeatureFn = Callable[[nn.Module, Tensor], Tensor]
"""``feature_fn(prior_model, x) -> (M, D)`` penultimate features of φ0 at ``x``."""


def timm_features(model: nn.Module, x: Tensor) -> Tensor:
    """Penultimate features of a timm model: ``forward_head(forward_features(x), pre_logits=True)``.

    This is ``h(x; φ0)`` of docs/method.md ("The empirical prior: φ0 and Kc"): the pooled
    representation the classifier head reads, of dimension ``model.num_features`` (after timm's
    optional ``head_hidden_size`` pre-logits layer).
    """
    return model.forward_head(model.forward_features(x), pre_logits=True)  # (M, D)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / ``torch.compile`` / Accelerate wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


class FSEBObjective(nn.Module):
    """FS-EB (or, with ``reg_scale = 0``, PS-MAP) loss for a classifier.

    Holds the trainable ``model`` and a frozen copy of it at its starting point, ``prior`` (φ0):
    eval mode forever (BatchNorm running statistics, no dropout), ``requires_grad = False``, and
    excluded from :meth:`trainable_parameters`, so it never enters an optimiser.

    Args:
        model: the classifier ``f(·; θ)`` returning logits (N, K); may be wrapped by DDP or
            Accelerate (φ0 is copied from the unwrapped module).
        num_train: global training-set size N_train that scales the prior terms.
        reg_scale: weight of the function-space term ``R_f``; 0 gives PS-MAP.
        prior_var: variance ``σ_p²`` of the Gaussian parameter prior.
        prior_cov_scale: ``s`` in ``Kc = s (H Hᵀ + 1 1ᵀ) + d I``; ``None``: not known yet, set
            by :meth:`set_prior_covariance` before ``R_f`` is computed (``fseb.prior_std``).
        prior_cov_diag: ``d`` in ``Kc``; ``None`` like ``prior_cov_scale``.
        forward_mode: ``"joint"`` runs one forward over ``[x; x̂]`` (BatchNorm sees both, as in
            the reference code); ``"separate"`` runs two.
        reg_points: ``"context"`` evaluates ``R_f`` at x̂ (M points); ``"joint"`` at ``[x; x̂]``
            (B + M points, Kc from φ0's features of both), the reference code's
            ``--reg_points joint``.
        param_anchor: ``"zero"`` (the paper) or ``"init"`` (the starting weights: L2-SP).
        param_noise_std: σ of the EB-VI form ``θ + σ ε`` (Rudner et al. 2023, eq. e-vi); 0 is
            EB-MAP. The paper's σ² = 1e-20 is numerically MAP.
        likelihood_samples: Monte-Carlo samples S for the likelihood when σ > 0.
        reg_samples: Monte-Carlo samples J for ``R_f`` when σ > 0.
        solver: ``"auto"``, ``"cholesky"`` or ``"woodbury"`` (see
            :mod:`fseb_ft.method.regularizer`).
        method: ``"fseb"`` (FS-EB / PS-MAP) or ``"fsvi"`` (FS-VI: ``likelihood_samples`` draws
            of θ ~ q per step, the function-space KL in place of ``R_f``, no ``R_θ``).
        fsvi_variance: which parameters carry FS-VI's variance: ``"head"`` (the linear
            classifier of ``get_classifier()``) or ``"all"``.
        fsvi_init_std: σ of every variance-carrying parameter at the start.
        fsvi_predict_samples: draws averaged by :meth:`predictor` (FS-VI).
        prior: φ0; defaults to a deep copy of ``model`` as it is now.
        feature_fn: ``h(·; φ0)``; defaults to :func:`timm_features`, so any timm model works and
            other modules pass their own.
    """

    def __init__(
        self,
        model: nn.Module,
        num_train: int,
        *,
        reg_scale: float = _DEFAULTS.reg_scale,
        prior_var: float = _DEFAULTS.prior_var,
        prior_cov_scale: float | None = _DEFAULTS.prior_cov_scale,
        prior_cov_diag: float | None = _DEFAULTS.prior_cov_diag,
        forward_mode: str = _DEFAULTS.forward_mode,
        reg_points: str = _DEFAULTS.reg_points,
        param_anchor: str = _DEFAULTS.param_anchor,
        param_noise_std: float = _DEFAULTS.param_noise_std,
        likelihood_samples: int = _DEFAULTS.likelihood_samples,
        reg_samples: int = _DEFAULTS.reg_samples,
        solver: str = _DEFAULTS.solver,
        method: str = _DEFAULTS.method,
        fsvi_variance: str = _DEFAULTS.fsvi_variance,
        fsvi_init_std: float = _DEFAULTS.fsvi_init_std,
        fsvi_predict_samples: int = _DEFAULTS.fsvi_predict_samples,
        prior: nn.Module | None = None,
        feature_fn: FeatureFn | None = None,
    ) -> None:
        super().__init__()
        _validate(
            num_train=num_train,
            reg_scale=reg_scale,
            prior_var=prior_var,
            forward_mode=forward_mode,
            reg_points=reg_points,
            param_anchor=param_anchor,
            param_noise_std=param_noise_std,
            likelihood_samples=likelihood_samples,
            reg_samples=reg_samples,
        )
        _validate_method(method, fsvi_variance, reg_scale, reg_points, param_noise_std)
        self.model = model
        self.num_train = num_train
        self.reg_scale = reg_scale
        self.prior_var = prior_var
        self.prior_cov_scale = prior_cov_scale
        self.prior_cov_diag = prior_cov_diag
        self.forward_mode = forward_mode
        self.reg_points = reg_points
        self.param_anchor = param_anchor
        self.param_noise_std = param_noise_std
        self.likelihood_samples = likelihood_samples
        self.reg_samples = reg_samples
        self.solver = solver
        self.method = method
        self.fsvi_predict_samples = fsvi_predict_samples
        self.fsvi_variance = fsvi_variance
        self.fsvi_init_std = fsvi_init_std
        self.feature_fn = feature_fn or timm_features
        base = unwrap_model(model)
        self.variance_scope: str | None = None
        self.variational: MeanFieldGaussian | None = None
        if method == "fsvi":
            self.variance_scope = fsvi_variance
            self.variational = MeanFieldGaussian(
                variance_parameters(base, self.variance_scope), fsvi_init_std
            )
        if feature_fn is None and not (
            hasattr(base, "forward_features") and hasattr(base, "forward_head")
        ):
            raise TypeError(
                f"{type(base).__name__} has no timm forward_features/forward_head; pass "
                "feature_fn=lambda prior, x: <(M, D) penultimate features of prior at x>"
            )
        self.prior = copy.deepcopy(base) if prior is None else prior
        self.prior.requires_grad_(False)
        self.prior.eval()
        self._anchor_names = [n for n, p in base.named_parameters() if p.requires_grad]
        if param_anchor == "init":
            prior_params = dict(self.prior.named_parameters())
            missing = [n for n in self._anchor_names if n not in prior_params]
            if missing:
                raise ValueError(
                    f"param_anchor='init' needs φ0 to have the trainable parameters' names; "
                    f"missing in the prior: {missing[:5]}"
                )

    @classmethod
    def from_config(
        cls,
        model: nn.Module,
        num_train: int,
        cfg: FSEBConfig,
        *,
        prior: nn.Module | None = None,
        feature_fn: FeatureFn | None = None,
    ) -> FSEBObjective:
        """The objective a recipe's ``fseb`` section describes (every field is a keyword here).

        With ``cfg.prior_std`` set, s and d are ``None`` until :meth:`set_prior_covariance` gives
        them (``finetune.run`` resolves them from φ0's features of the context pool).
        """
        hyper = dataclasses.asdict(cfg)
        for name in RESOLVED_BY_RUN:
            del hyper[name]
        return cls(model, num_train, **hyper, prior=prior, feature_fn=feature_fn)

    def set_prior_covariance(self, scale: float, diag: float) -> None:
        """Use ``Kc = scale · (H Hᵀ + 1 1ᵀ) + diag · I`` from now on (e.g. s and d resolved from
        ``fseb.prior_std`` by :func:`fseb_ft.method.regularizer.resolve_prior`)."""
        self.prior_cov_scale, self.prior_cov_diag = scale, diag

    def replace_model(self, model: nn.Module, device: torch.device | str | None = None) -> None:
        """Train ``model`` from now on: the same network wrapped, e.g. by ``accelerator.prepare``.

        φ0 was copied from the network at construction and stays; it moves to ``device`` when
        given, where the wrapped model now lives.

        Raises:
            ValueError: ``model`` wraps another network than the one φ0 was copied from.
        """
        if unwrap_model(model) is not unwrap_model(self.model):
            raise ValueError(
                "replace_model needs the same network (wrapped); build a new FSEBObjective for "
                "another one, so that φ0 is its own starting point"
            )
        self.model = model
        if device is not None:
            self.prior.to(device)

    def train(self, mode: bool = True) -> FSEBObjective:
        """Set the trainable model's mode; φ0 stays in eval mode whatever ``mode`` is."""
        super().train(mode)
        self.prior.eval()
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimiser should update (never φ0's): θ, and FS-VI's ρ."""
        rho = list(self.variational.parameters()) if self.variational is not None else []
        return self.model_parameters() + rho

    def model_parameters(self) -> list[nn.Parameter]:
        """The network's trainable parameters θ (FS-VI: the mean μ), which ``R_θ`` sees."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def predictor(self, seed: int = 0) -> nn.Module:
        """The model to predict with: the network itself, or FS-VI's Monte-Carlo predictive
        (:class:`~fseb_ft.method.variational.MCPredictive`, ``fsvi_predict_samples`` draws seeded by
        ``seed``) whose outputs are the log-probabilities of the averaged prediction."""
        if self.variational is None:
            return self.model
        base = unwrap_model(self.model)
        return MCPredictive(base, self.variational, self.fsvi_predict_samples, seed)

    @torch.no_grad()
    def prior_features(self, context: Tensor) -> Tensor:
        """``H = h(x̂; φ0)``: frozen features of the context batch, no autograd graph."""
        return self.feature_fn(self.prior, context)  # (M, D)

    def forward(
        self,
        x: Tensor,
        y: Tensor,
        context: Tensor | None = None,
        context_features: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Named loss terms for one step.

        Args:
            x: training inputs (B, ...).
            y: integer labels (B,).
            context: context inputs x̂ (M, ...); required when ``reg_scale > 0``.
            context_features: precomputed ``h(x̂; φ0)`` (M, D) — e.g. cached once for a fixed,
                un-augmented context pool; computed from ``prior`` when omitted. With
                ``reg_points="joint"`` the training batch's features are computed here, each step.

        Returns:
            ``loss`` (to minimise), ``nll`` (mean cross-entropy), ``fs_reg`` (``R_f``, unscaled),
            ``param_reg`` (``R_θ``) and ``logits`` (B, K) of the training batch.
        """
        use_fs = self.reg_scale > 0
        if use_fs and context is None:
            raise ValueError("reg_scale > 0 needs a context batch: pass context=x̂ (M, ...)")
        if use_fs and (self.prior_cov_scale is None or self.prior_cov_diag is None):
            raise ValueError(
                "the prior covariance is not set (fseb.prior_std is resolved per run): call "
                "set_prior_covariance(s, d), e.g. with fseb_ft.method.regularizer.resolve_prior"
            )
        if use_fs and context_features is None:
            context_features = self.prior_features(context)  # (M, D)
        if use_fs and context_features.shape[0] != context.shape[0]:
            raise ValueError(
                f"context_features has {context_features.shape[0]} rows for a context batch "
                f"of {context.shape[0]}"
            )
        if self.variational is not None:
            nll, fs_reg, logits = self._fsvi_terms(x, y, context, context_features)
            loss = nll + self.reg_scale * fs_reg / self.num_train
            zero = x.new_zeros((), dtype=torch.float32)
            return {"loss": loss, "nll": nll, "fs_reg": fs_reg, "param_reg": zero, "logits": logits}
        reg_features = context_features  # (M, D)
        if use_fs and self.reg_points == "joint":
            reg_features = torch.cat([self.prior_features(x), context_features])  # (B + M, D)
        if self.param_noise_std > 0:
            nll, fs_reg, logits = self._sampled_terms(x, y, context, reg_features, use_fs)
        else:
            nll, fs_reg, logits = self._terms(self.model, x, y, context, reg_features, use_fs)
        param_reg = self._param_reg()
        loss = nll + (self.reg_scale * fs_reg + param_reg) / self.num_train
        return {
            "loss": loss,
            "nll": nll,
            "fs_reg": fs_reg,
            "param_reg": param_reg,
            "logits": logits,
        }

    def _terms(
        self,
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
        joint_reg = use_fs and self.reg_points == "joint"
        if use_fs and self.forward_mode == "joint":
            logits_all = call(torch.cat([x, context], dim=0))  # (B + M, K)
            logits, ctx_logits = logits_all[: x.shape[0]], logits_all[x.shape[0] :]
        else:
            logits = call(x) if want_nll or joint_reg else None  # (B, K)
            ctx_logits = call(context) if use_fs else None  # (M, K)
        if want_nll:
            # At least float32 (autocast may hand us bf16 logits), never narrower than the input.
            nll = nnf.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y)
        else:
            nll = x.new_zeros((), dtype=torch.float32)
        if use_fs:
            reg_logits = torch.cat([logits, ctx_logits]) if joint_reg else ctx_logits  # (·, K)
            fs_reg = function_space_term(
                reg_logits, features, self.prior_cov_scale, self.prior_cov_diag, self.solver
            )
        else:
            fs_reg = x.new_zeros((), dtype=torch.float32)
        return nll, fs_reg, logits

    def _sampled_terms(
        self,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
        use_fs: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Monte-Carlo EB-VI terms: S likelihood and J regulariser draws of ``θ + σ ε``."""
        named = dict(self.model.named_parameters())
        S, J = self.likelihood_samples, self.reg_samples
        nlls, regs, first_logits = [], [], None
        for i in range(max(S, J) if use_fs else S):
            # Reparameterised draw: gradients reach θ through θ + σ ε.
            params = {
                n: p + self.param_noise_std * torch.randn_like(p) if p.requires_grad else p
                for n, p in named.items()
            }

            def call(inp: Tensor, params: dict[str, Tensor] = params) -> Tensor:
                return functional_call(self.model, params, (inp,))

            nll, fs_reg, logits = self._terms(
                call, x, y, context, features, use_fs and i < J, want_nll=i < S
            )
            if i < S:
                nlls.append(nll)
                first_logits = logits if first_logits is None else first_logits
            if use_fs and i < J:
                regs.append(fs_reg)
        nll = torch.stack(nlls).mean()
        fs_reg = torch.stack(regs).mean() if regs else x.new_zeros((), dtype=torch.float32)
        return nll, fs_reg, first_logits

    def _fsvi_terms(
        self, x: Tensor, y: Tensor, context: Tensor, features: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """FS-VI: (MC mean CE over ``likelihood_samples`` draws θ ~ q, KL, first draw's logits).

        The likelihood draws are reparameterised (``μ + σ ε``), so gradients reach μ and ρ
        (one sample per step by default, as the FS-EB paper's I = J = 1).
        """
        base = unwrap_model(self.model)
        means = dict(base.named_parameters())
        nlls, first = [], None
        for _ in range(self.likelihood_samples):
            draw = self.variational.sample(means)
            logits = functional_call(base, draw, (x,))  # (B, K)
            first = logits if first is None else first
            nlls.append(
                nnf.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y)
            )
        mean, cov = context_moments(
            base, self.variational, context, self.variance_scope, self.feature_fn
        )  # (M, K), (K, M, M)
        kl = function_kl(mean, cov, features, self.prior_cov_scale, self.prior_cov_diag)
        return torch.stack(nlls).mean(), kl, first

    def _param_reg(self) -> Tensor:
        params = self.model_parameters()
        if self.param_anchor == "zero":
            return parameter_term(params, self.prior_var)
        prior_params = dict(self.prior.named_parameters())
        anchors = [prior_params[n] for n in self._anchor_names]
        return parameter_term(params, self.prior_var, anchors)


def _validate(
    *,
    num_train: int,
    reg_scale: float,
    prior_var: float,
    forward_mode: str,
    reg_points: str,
    param_anchor: str,
    param_noise_std: float,
    likelihood_samples: int,
    reg_samples: int,
) -> None:
    if not (isinstance(num_train, int) and num_train > 0):
        raise ValueError(f"num_train must be a positive int; got {num_train!r}")
    if not reg_scale >= 0:
        raise ValueError(f"reg_scale must be ≥ 0 (0 is PS-MAP); got {reg_scale}")
    if not prior_var > 0:
        raise ValueError(f"prior_var must be > 0; got {prior_var}")
    for name, value, allowed in (
        ("forward_mode", forward_mode, FORWARD_MODES),
        ("reg_points", reg_points, REG_POINTS),
        ("param_anchor", param_anchor, PARAM_ANCHORS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be {_one_of(allowed)}; got {value!r}")
    if not param_noise_std >= 0:
        raise ValueError(f"param_noise_std must be ≥ 0; got {param_noise_std}")
    for name, value in (("likelihood_samples", likelihood_samples), ("reg_samples", reg_samples)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be an int ≥ 1; got {value!r}")


def _validate_method(
    method: str, variance: str, reg_scale: float, reg_points: str, param_noise_std: float
) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be {_one_of(METHODS)}; got {method!r}")
    if variance not in VARIANCE_SCOPES:
        raise ValueError(f"fsvi_variance must be {_one_of(VARIANCE_SCOPES)}; got {variance!r}")
    if method == "fsvi" and not (
        reg_scale > 0 and reg_points == "context" and param_noise_std == 0
    ):
        raise ValueError(
            "method='fsvi' needs reg_scale > 0, reg_points='context' and param_noise_std = 0 "
            f"(its noise is the learned σ); got {reg_scale}, {reg_points!r}, {param_noise_std}"
        )


def _one_of(allowed: Sequence[str]) -> str:
    """``'a', 'b' or 'c'``."""
    quoted = [repr(a) for a in allowed]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"
