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

With class weights (:meth:`FSEBObjective.set_class_weights`, ``train.class_weights``) every
method's mean CE is the class-weighted one of :func:`fseb_ft.method.likelihood.likelihood_term`;
the prior terms keep ``N_train``. Soft targets (label smoothing, mixup, CutMix) enter that
likelihood alone: ``R_f`` at the context points and ``R_θ`` read no labels.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fseb_ft.method.fsvi import function_kl
from fseb_ft.method.likelihood import likelihood_term
from fseb_ft.method.posterior import posterior, predictive, unwrap_model
from fseb_ft.method.regularizer import function_space_term, parameter_term
from fseb_ft.method.variational import MeanFieldGaussian, context_moments
from fseb_ft.recipe import FSEBConfig
from fseb_ft.recipe.schema import build

__all__ = ["FSEBObjective", "FeatureFn", "timm_features"]

_Class = TypeVar("_Class", bound=type)

FeatureFn = Callable[[nn.Module, Tensor], Tensor]
"""``feature_fn(prior_model, x) -> (M, D)`` penultimate features of φ0 at ``x``."""


def timm_features(model: nn.Module, x: Tensor) -> Tensor:
    """Penultimate features of a timm model: ``forward_head(forward_features(x), pre_logits=True)``.

    This is ``h(x; φ0)`` of docs/method.md ("The empirical prior: φ0 and Kc"): the pooled
    representation the classifier head reads, of dimension ``model.num_features`` (after timm's
    optional ``head_hidden_size`` pre-logits layer).
    """
    timm_model = cast(Any, model)  # timm's methods, which nn.Module does not declare
    return timm_model.forward_head(timm_model.forward_features(x), pre_logits=True)  # (M, D)


def _checked_config(config: FSEBConfig | None, overrides: Mapping[str, Any]) -> FSEBConfig:
    """``config`` (default: :class:`~fseb_ft.recipe.FSEBConfig`'s defaults) with ``overrides``,
    checked by the rules of a recipe's ``fseb`` section: types, allowed values and ranges, with
    its messages (the key, the value and what is allowed).

    Raises:
        TypeError: ``config`` is not an ``FSEBConfig``, or an override is none of its fields.
        ConfigError: a value breaks a rule (a ``ValueError``).
    """
    if not isinstance(config, FSEBConfig | None):
        raise TypeError(f"config must be an FSEBConfig or None; got {type(config).__name__}")
    fields = [f.name for f in dataclasses.fields(FSEBConfig)]
    unknown = [name for name in overrides if name not in fields]
    if unknown:
        raise TypeError(
            f"FSEBObjective got unexpected keyword argument(s) {unknown}; its hyper-parameters "
            f"are FSEBConfig's fields: {fields}"
        )
    given = dataclasses.asdict(config or FSEBConfig())
    return build(FSEBConfig, {**given, **overrides})


def _config_attribute(name: str) -> property:
    """``objective.<name>``: ``objective.config.<name>``; setting it is refused, with the way."""

    def read(self: FSEBObjective) -> Any:
        return getattr(self.config, name)

    def refuse(self: FSEBObjective, value: Any) -> None:
        raise AttributeError(
            f"FSEBObjective.{name} is its config's (fseb.{name}), fixed at construction: build "
            f"a new FSEBObjective(model, num_train, config, {name}={value!r})"
        )

    return property(read, refuse, doc=f"``config.{name}``: the recipe's ``fseb.{name}``.")


def _config_attributes(cls: _Class) -> _Class:
    """``cls`` with every FSEBConfig field as a read-only attribute, as when the constructor
    took them one by one; but s and d of Kc, which are the objective's own attributes (set per
    run by ``set_prior_covariance``)."""
    for field in dataclasses.fields(FSEBConfig):
        if field.name not in ("prior_cov_scale", "prior_cov_diag"):
            setattr(cls, field.name, _config_attribute(field.name))
    return cls


@_config_attributes
class FSEBObjective(nn.Module):
    """FS-EB (or, with ``reg_scale = 0``, PS-MAP; with ``method="fsvi"``, FS-VI) loss for a
    classifier.

    Holds the trainable ``model`` and a frozen copy of it at its starting point, ``prior`` (φ0):
    eval mode forever (BatchNorm running statistics, no dropout), ``requires_grad = False``, and
    excluded from :meth:`trainable_parameters`, so it never enters an optimiser.

    The hyper-parameters are a recipe's ``fseb`` section, :class:`~fseb_ft.recipe.FSEBConfig`
    (docs/recipes.md): its defaults, its rules, its meanings. Give them as ``config``, as
    keywords (``FSEBObjective(model, n, reg_scale=0.0, prior_var=0.1)``), or both (the keywords
    win); they are validated once, as a recipe's are, and kept as :attr:`config`. Each field
    also reads as an attribute (``objective.reg_scale``, ``objective.solver``, …), read-only:
    a change of hyper-parameters is a new objective.
    With ``prior_std`` set, s and d of ``Kc`` are ``None`` until :meth:`set_prior_covariance`
    gives them (``fseb_ft.method.context.resolve_prior_on_pool`` resolves them per run).

    Args:
        model: the classifier ``f(·; θ)`` returning logits (N, K); may be wrapped by DDP or
            Accelerate (φ0 is copied from the unwrapped module).
        num_train: global training-set size N_train that scales the prior terms.
        config: the hyper-parameters; ``None``: ``FSEBConfig()``'s.
        prior: φ0; defaults to a deep copy of ``model`` as it is now.
        feature_fn: ``h(·; φ0)``; defaults to :func:`timm_features`, so any timm model works and
            other modules pass their own.
        **hyper: fields of ``FSEBConfig`` that replace ``config``'s.

    Raises:
        ConfigError: a hyper-parameter breaks a rule of ``FSEBConfig``.
        TypeError: an unknown keyword; or no ``feature_fn`` for a model without timm's
            ``forward_features`` / ``forward_head``.
        ValueError: ``num_train`` is not a positive int; ``param_anchor="init"`` with a ``prior``
            that lacks the trainable parameters' names.
    """

    if TYPE_CHECKING:  # a config field as @_config_attributes reads it (the ones read here)
        reg_scale: float

    def __init__(
        self,
        model: nn.Module,
        num_train: int,
        config: FSEBConfig | None = None,
        *,
        prior: nn.Module | None = None,
        feature_fn: FeatureFn | None = None,
        **hyper: Any,
    ) -> None:
        super().__init__()
        self.config = _checked_config(config, hyper)
        if not (isinstance(num_train, int) and num_train > 0):
            raise ValueError(f"num_train must be a positive int; got {num_train!r}")
        self.model = model
        self.num_train = num_train
        # s and d of Kc: the config's, or set per run by set_prior_covariance.
        self.prior_cov_scale = self.config.prior_cov_scale
        self.prior_cov_diag = self.config.prior_cov_diag
        self.class_weights: Tensor | None = None  # set by set_class_weights
        self.target_smoothing = 0.0  # set by set_class_weights
        base = unwrap_model(model)
        self.variational = posterior(base, self.config)
        self.feature_fn = feature_fn or _timm_feature_fn(base)
        self.prior = _frozen(copy.deepcopy(base) if prior is None else prior)
        _check_anchors(base, self.prior, self.config.param_anchor)

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
        """The objective a recipe's ``fseb`` section describes: ``cls(model, num_train, cfg)``."""
        return cls(model, num_train, cfg, prior=prior, feature_fn=feature_fn)

    def set_prior_covariance(self, scale: float, diag: float) -> None:
        """Use ``Kc = scale · (H Hᵀ + 1 1ᵀ) + diag · I`` from now on (e.g. s and d resolved from
        ``fseb.prior_std`` by :func:`fseb_ft.method.regularizer.resolve_prior`)."""
        self.prior_cov_scale, self.prior_cov_diag = scale, diag

    def set_class_weights(self, weights: Tensor | None, smoothing: float = 0.0) -> None:
        """Weight each example's log-likelihood by its class's weight from now on: ``weights``
        (K,), best on the model's device and scaled to mean 1 over the training images
        (:func:`fseb_ft.method.likelihood.class_weights`); ``None``: unweighted. ``smoothing``:
        the label smoothing ε of the soft targets to come, which the weight of an example undoes
        (:func:`fseb_ft.method.likelihood.example_weights`). The training loop's
        :class:`~fseb_ft.engine.callbacks.ClassWeights` sets them from ``train.class_weights``
        and ``train.label_smoothing``."""
        self.class_weights, self.target_smoothing = weights, smoothing

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
        """The model to predict with (:func:`fseb_ft.method.posterior.predictive`): the network
        itself, or FS-VI's Monte-Carlo predictive (``fsvi_predict_samples`` draws seeded by
        ``seed``) whose outputs are the log-probabilities of the averaged prediction."""
        return predictive(self.model, self.variational, self.config, seed)

    def method_state(self) -> dict[str, Tensor]:
        """The tensors the method keeps beside the network's weights, to save with them: FS-VI's
        σ by parameter name (μ is the weights); none for FS-EB and PS-MAP."""
        return {} if self.variational is None else self.variational.stds()

    def load_method_state(self, state: Mapping[str, Tensor]) -> None:
        """Set what :meth:`method_state` saved (FS-VI's σ); nothing to set for FS-EB, PS-MAP."""
        if self.variational is not None:
            self.variational.load_stds(state)

    def checkpointed_modules(self) -> list[nn.Module]:
        """Trainable modules outside the prepared network that a training checkpoint must hold
        to resume exactly (FS-VI's ρ); none for FS-EB and PS-MAP."""
        return [] if self.variational is None else [self.variational]

    @property
    def method_state_name(self) -> str:
        """What :meth:`method_state` holds, as an error writing it names it."""
        return "the method's state" if self.variational is None else self.variational.STATE_NAME

    @property
    def single_process_reason(self) -> str | None:
        """Why this method trains in one process only (FS-VI: σ is not synchronised across
        processes), or ``None`` when it may train on several."""
        return None if self.variational is None else self.variational.SINGLE_PROCESS_REASON

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
            y: integer labels (B,), or soft targets (B, K) whose rows sum to one (label
                smoothing, mixup: :class:`~fseb_ft.engine.soft_targets.SoftTargets`); only
                the likelihood reads them, ``R_f`` and ``R_θ`` never do.
            context: context inputs x̂ (M, ...); required when ``reg_scale > 0``.
            context_features: precomputed ``h(x̂; φ0)`` (M, D) — e.g. cached once for a fixed,
                un-augmented context pool; computed from ``prior`` when omitted. With
                ``reg_points="joint"`` the training batch's features are computed here, each step.

        Returns:
            ``loss`` (to minimise), ``nll`` (mean cross-entropy, class-weighted when
            :attr:`class_weights` are set), ``fs_reg`` (``R_f``, unscaled),
            ``param_reg`` (``R_θ``) and ``logits`` (B, K) of the training batch.
        """
        use_fs = self.reg_scale > 0
        if use_fs:
            context, context_features = self._checked_context(context, context_features)
        if self.variational is not None:
            nll, fs_reg, logits = self._fsvi_terms(x, y, context, context_features)
            loss = nll + self.reg_scale * fs_reg / self.num_train
            zero = x.new_zeros((), dtype=torch.float32)
            return {"loss": loss, "nll": nll, "fs_reg": fs_reg, "param_reg": zero, "logits": logits}
        reg_features = context_features  # (M, D)
        if use_fs and self.config.reg_points == "joint":
            # context_features is set with R_f (_checked_context).
            reg_features = torch.cat([self.prior_features(x), cast(Tensor, context_features)])
        if self.config.param_noise_std > 0:
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

    def _checked_context(
        self, context: Tensor | None, features: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The context batch x̂ (M, ...) and φ0's features of it (M, D), computed when not given,
        for a step with ``R_f`` (``reg_scale > 0``), which needs both and the prior covariance."""
        if context is None:
            raise ValueError("reg_scale > 0 needs a context batch: pass context=x̂ (M, ...)")
        if self.prior_cov_scale is None or self.prior_cov_diag is None:
            raise ValueError(
                "the prior covariance is not set (fseb.prior_std is resolved per run): call "
                "set_prior_covariance(s, d), e.g. with fseb_ft.method.regularizer.resolve_prior"
            )
        if features is None:
            features = self.prior_features(context)  # (M, D)
        if features.shape[0] != context.shape[0]:
            raise ValueError(
                f"context_features has {features.shape[0]} rows for a context batch "
                f"of {context.shape[0]}"
            )
        return context, features

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
        joint_reg = use_fs and self.config.reg_points == "joint"
        # With R_f (use_fs) the context, its features and s and d are set (_checked_context);
        # the training logits are computed where they are read (want_nll, joint_reg).
        logits: Tensor | None
        ctx_logits: Tensor | None
        if use_fs and self.config.forward_mode == "joint":
            logits_all = call(torch.cat([x, cast(Tensor, context)], dim=0))  # (B + M, K)
            logits, ctx_logits = logits_all[: x.shape[0]], logits_all[x.shape[0] :]
        else:
            logits = call(x) if want_nll or joint_reg else None  # (B, K)
            ctx_logits = call(cast(Tensor, context)) if use_fs else None  # (M, K)
        if want_nll:
            nll = likelihood_term(
                cast(Tensor, logits), y, self.class_weights, self.target_smoothing
            )
        else:
            nll = x.new_zeros((), dtype=torch.float32)
        if use_fs:
            if joint_reg:
                reg_logits = torch.cat(
                    [cast(Tensor, logits), cast(Tensor, ctx_logits)]
                )  # (B + M, K)
            else:
                reg_logits = cast(Tensor, ctx_logits)  # (M, K)
            scale, diag = cast(float, self.prior_cov_scale), cast(float, self.prior_cov_diag)
            fs_reg = function_space_term(
                reg_logits, cast(Tensor, features), scale, diag, self.config.solver
            )
        else:
            fs_reg = x.new_zeros((), dtype=torch.float32)
        # None only for a draw that computes R_f alone, whose logits its caller drops.
        return nll, fs_reg, cast(Tensor, logits)

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
        S, J = self.config.likelihood_samples, self.config.reg_samples
        nlls, regs, first_logits = [], [], None
        for i in range(max(S, J) if use_fs else S):
            # Reparameterised draw: gradients reach θ through θ + σ ε.
            params = {
                n: p + self.config.param_noise_std * torch.randn_like(p) if p.requires_grad else p
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
        return nll, fs_reg, cast(Tensor, first_logits)  # S ≥ 1 draws gave logits

    def _fsvi_terms(
        self, x: Tensor, y: Tensor, context: Tensor | None, features: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """FS-VI: (MC mean CE over ``likelihood_samples`` draws θ ~ q, KL, first draw's logits).

        The likelihood draws are reparameterised (``μ + σ ε``), so gradients reach μ and ρ
        (one sample per step by default, as the FS-EB paper's I = J = 1).
        """
        # FS-VI's q(θ) (forward calls this with one); its KL needs the context batch, its
        # features and s and d (_checked_context: FS-VI regularises, reg_scale > 0).
        q = cast(MeanFieldGaussian, self.variational)
        base = unwrap_model(self.model)
        means = dict(base.named_parameters())
        nlls: list[Tensor] = []
        first: Tensor | None = None
        for _ in range(self.config.likelihood_samples):
            draw = q.sample(means)
            logits = functional_call(base, draw, (x,))  # (B, K)
            first = logits if first is None else first
            nlls.append(likelihood_term(logits, y, self.class_weights, self.target_smoothing))
        mean, cov = context_moments(
            base, q, cast(Tensor, context), self.config.fsvi_variance, self.feature_fn
        )  # (M, K), (K, M, M)
        scale, diag = cast(float, self.prior_cov_scale), cast(float, self.prior_cov_diag)
        kl = function_kl(mean, cov, cast(Tensor, features), scale, diag)
        return torch.stack(nlls).mean(), kl, cast(Tensor, first)  # likelihood_samples ≥ 1

    def _param_reg(self) -> Tensor:
        """``R_θ`` over the parameters that require a gradient now (a frozen one is a constant
        of the loss), each anchored at φ0's of its name (``param_anchor="init"``)."""
        params = self.model_parameters()
        if self.config.param_anchor == "zero":
            return parameter_term(params, self.config.prior_var)
        prior_params = dict(self.prior.named_parameters())
        names = [n for n, p in unwrap_model(self.model).named_parameters() if p.requires_grad]
        anchors = [prior_params[n] for n in names]
        return parameter_term(params, self.config.prior_var, anchors)


def _timm_feature_fn(model: nn.Module) -> FeatureFn:
    """:func:`timm_features`, once ``model`` is known to have timm's feature interface."""
    if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
        raise TypeError(
            f"{type(model).__name__} has no timm forward_features/forward_head; pass "
            "feature_fn=lambda prior, x: <(M, D) penultimate features of prior at x>"
        )
    return timm_features


def _frozen(prior: nn.Module) -> nn.Module:
    """φ0 as the objective keeps it: no gradients, eval mode."""
    prior.requires_grad_(False)
    return prior.eval()


def _check_anchors(model: nn.Module, prior: nn.Module, anchor: str) -> None:
    """Check that φ0 has the trainable parameters' names, at which ``R_θ`` anchors them
    (``param_anchor="init"``).

    Raises:
        ValueError: ``anchor="init"`` and φ0 lacks some of these names.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    prior_names = {n for n, _ in prior.named_parameters()}
    missing = [n for n in names if n not in prior_names]
    if anchor == "init" and missing:
        raise ValueError(
            f"param_anchor='init' needs φ0 to have the trainable parameters' names; "
            f"missing in the prior: {missing[:5]}"
        )
