"""The training objective: a trainable model, its frozen starting copy φ0, named loss terms.

The loss is the method's (``fseb.method``, one module each in :mod:`fseb_ft.method.methods`):
FS-EB (docs/method.md, "The idea"; the negative of Rudner et al. 2023, eq. 8, divided by
N_train), PS-MAP as its ``reg_scale = 0``, FS-VI, L2-SP, Feature-SP. The objective holds what
they share: φ0, the class weights, the prior covariance ``Kc``'s s and d, the context batch's
checks; its method (:attr:`FSEBObjective.algorithm`) computes each step's terms, keeps its state
beside the weights and builds the predictor.

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import Tensor, nn

from fseb_ft.method.methods.registry import TERMS, FeatureFn
from fseb_ft.method.parts import unwrap_model
from fseb_ft.method.posterior import posterior
from fseb_ft.recipe import FeatureConfig, FSEBConfig, FSVIConfig
from fseb_ft.recipe.schema import build

__all__ = ["FSEBObjective", "FeatureFn", "timm_features"]

_Class = TypeVar("_Class", bound=type)


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
    # A sub-section (fsvi, feature) may be given as its dataclass or as a mapping, as in a recipe.
    plain = {
        k: dataclasses.asdict(v) if isinstance(v, FSVIConfig | FeatureConfig) else v
        for k, v in overrides.items()
    }
    return build(FSEBConfig, {**given, **plain})


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
    """The loss of a recipe's method (``fseb.method``: FS-EB, or PS-MAP with ``reg_scale = 0``;
    FS-VI; L2-SP; Feature-SP) for a classifier.

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
        ValueError: ``num_train`` is not a positive int; a ``prior`` the method cannot use
            (``param_anchor="init"``, L2-SP: one that lacks the trainable parameters' names).
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
        # The method (objective.method is the config's name of it, as every field's).
        self.algorithm = posterior(base, self.config)
        self.feature_fn = feature_fn or _timm_feature_fn(base)
        self.prior = _frozen(copy.deepcopy(base) if prior is None else prior)
        self.algorithm.check_prior(base, self.prior)

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
        """The parameters an optimiser should update (never φ0's): θ, and the method's own
        (FS-VI's ρ)."""
        return self.model_parameters() + list(self.algorithm.parameters())

    def model_parameters(self) -> list[nn.Parameter]:
        """The network's trainable parameters θ (FS-VI: the mean μ), which ``R_θ`` sees."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def predictor(self, seed: int = 0, network: nn.Module | None = None) -> nn.Module:
        """The model to predict with (the method's
        :meth:`~fseb_ft.method.methods.registry.TrainingMethod.predictor`) around ``network``
        (default: the trained model; an EMA gives its average): the network itself, or FS-VI's
        Monte-Carlo predictive (``fsvi.predict_samples`` draws seeded by ``seed``) whose outputs
        are the log-probabilities of the averaged prediction."""
        return self.algorithm.predictor(self.model if network is None else network, seed)

    def method_state(self) -> dict[str, Tensor]:
        """The tensors the method keeps beside the network's weights, to save with them: FS-VI's
        σ by parameter name (μ is the weights); none for a MAP method (FS-EB, PS-MAP, L2-SP,
        Feature-SP)."""
        return self.algorithm.state()

    def load_method_state(self, state: Mapping[str, Tensor]) -> None:
        """Set what :meth:`method_state` saved (FS-VI's σ); nothing to set for a MAP method."""
        self.algorithm.load_state(state)

    def checkpointed_modules(self) -> list[nn.Module]:
        """Trainable modules outside the prepared network that a training checkpoint must hold
        to resume exactly (FS-VI's ρ); none for a MAP method."""
        return self.algorithm.checkpointed_modules()

    @property
    def method_state_name(self) -> str:
        """What :meth:`method_state` holds, as an error writing it names it."""
        return self.algorithm.state_name

    @property
    def method_state_file(self) -> str | None:
        """The file of :meth:`method_state` in the run's model folder (``None``: no state)."""
        return self.algorithm.state_file

    @property
    def single_process_reason(self) -> str | None:
        """Why this method trains in one process only (FS-VI: σ is not synchronised across
        processes), or ``None`` when it may train on several."""
        return self.algorithm.single_process_reason

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
            context: context inputs x̂ (M, ...); required when the method draws context points
                (FS-EB with ``reg_scale > 0``, FS-VI, Feature-SP at ``feature.points="joint"``).
            context_features: precomputed ``h(x̂; φ0)`` (M, D) — e.g. cached once for a fixed,
                un-augmented context pool; computed from ``prior`` when omitted. With
                ``reg_points="joint"`` the training batch's features are computed here, each step.

        Returns:
            ``loss`` (to minimise), ``nll`` (mean cross-entropy, class-weighted when
            :attr:`class_weights` are set), ``fs_reg`` (``R_f``, unscaled; FS-VI's KL),
            ``param_reg`` (``R_θ``), each 0 for a method without it, the method's other terms,
            and ``logits`` (B, K) of the training batch.
        """
        if self.algorithm.uses_context(self.config):
            context, context_features = self._checked_context(context, context_features)
        terms = self.algorithm.terms(self, x, y, context, context_features)
        zero = x.new_zeros((), dtype=torch.float32)  # a term the method does not have
        return {**dict.fromkeys(TERMS, zero), **terms}

    def _checked_context(
        self, context: Tensor | None, features: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The context batch x̂ (M, ...) and φ0's features of it (M, D), computed when not given,
        for a step of a method that draws them (FS-EB's ``R_f``, ``reg_scale > 0``), which needs
        both and the prior covariance."""
        if context is None:
            raise ValueError(
                f"fseb.method={self.config.method!r} with these settings draws "
                "context points: pass context=x̂ (M, ...)"
            )
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
