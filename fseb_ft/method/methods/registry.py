"""The training methods by name: ``@register_method("fsvi")`` registers the class a recipe's
``fseb.method`` names, and :class:`TrainingMethod` is what every layer asks of a method.

A method is an ``nn.Module`` built from the network (unwrapped) and the recipe's ``fseb``
section. It holds what it keeps beside the network's weights (FS-VI's ρ; nothing for a MAP
method) and answers, from its class alone, what the run folder, the model card and the tables
say of it. :class:`~fseb_ft.method.objective.FSEBObjective` holds φ0, the class weights and the
prior covariance, and computes each step's loss through its method's :meth:`TrainingMethod.terms`.
Each module of :mod:`fseb_ft.method.methods` registers one; the recipe's option list
(:data:`fseb_ft.recipe.options.METHODS`) must name the same methods, which a test checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from torch import Tensor, nn

from fseb_ft.recipe import FSEBConfig, Recipe

__all__ = [
    "METHODS",
    "TERMS",
    "FeatureFn",
    "Objective",
    "TrainingMethod",
    "find_method",
    "register_method",
]

FeatureFn = Callable[[nn.Module, Tensor], Tensor]
"""``feature_fn(prior_model, x) -> (M, D)`` penultimate features of φ0 at ``x``."""

TERMS = ("loss", "nll", "fs_reg", "param_reg")
"""The loss terms every step reports (the loop averages them per epoch, ``train_<term>``); a
method that has no such term leaves it out and the objective reports it as 0."""


class Objective(Protocol):
    """What a method reads of the objective it trains with
    (:class:`~fseb_ft.method.objective.FSEBObjective`)."""

    model: nn.Module
    """The network being trained, possibly wrapped (DDP, Accelerate)."""
    prior: nn.Module
    """φ0: the frozen copy of the network at its start."""
    config: FSEBConfig
    num_train: int
    feature_fn: FeatureFn
    class_weights: Tensor | None
    target_smoothing: float
    prior_cov_scale: float | None
    prior_cov_diag: float | None

    def prior_features(self, context: Tensor) -> Tensor:
        """``h(x̂; φ0)`` (M, D), without an autograd graph."""
        ...

    def model_parameters(self) -> list[nn.Parameter]:
        """The network's parameters that require a gradient now."""
        ...


class TrainingMethod(nn.Module):
    """One training method: its loss terms, its state beside the weights, its predictor, and
    what the run folder, the card and the tables say of it.

    The defaults are a MAP method's: no state, no file, the network itself as its predictor,
    any number of processes, no context points. A subclass overrides :meth:`title`,
    :meth:`card_text` and :meth:`terms`, and what differs of the rest.

    Args:
        model: the network (unwrapped), as it is at the start of training.
        config: the recipe's ``fseb`` section.
    """

    name: ClassVar[str] = ""
    """The recipe's ``fseb.method`` value; set by :func:`register_method`."""
    state_file: ClassVar[str | None] = None
    """The file of :meth:`state` in the run's model folder (``model/<state_file>``), which the
    export publishes with the weights; ``None`` for a method without state."""
    state_name: ClassVar[str] = "the method's state"
    """What :meth:`state` holds, as an error writing it names it."""
    single_process_reason: ClassVar[str | None] = None
    """Why the method trains in one process only (``None``: it may train on several)."""

    def __init__(self, model: nn.Module, config: FSEBConfig) -> None:
        super().__init__()
        self.config = config

    @classmethod
    def title(cls, config: FSEBConfig) -> str:
        """The name tables, titles and cards show (``FS-EB``, ``PS-MAP``, ``FS-VI``, …)."""
        raise NotImplementedError

    @classmethod
    def uses_context(cls, config: FSEBConfig) -> bool:
        """Whether training draws context points (and needs s and d of ``Kc``)."""
        return False

    @classmethod
    def card_text(
        cls,
        recipe: Recipe,
        prior: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None,
    ) -> str:
        """The model card's paragraph on this model's method and hyper-parameters (Markdown,
        ending in a newline); ``prior`` and ``context``: ``run.json``'s records of the prior
        resolved from ``fseb.prior_std`` and of the context pool (``None`` when absent)."""
        raise NotImplementedError

    def check_prior(self, model: nn.Module, prior: nn.Module) -> None:
        """Refuse a φ0 the method cannot use with ``model`` (a ``ValueError``); at construction."""

    def terms(
        self,
        objective: Objective,
        x: Tensor,
        y: Tensor,
        context: Tensor | None,
        features: Tensor | None,
    ) -> dict[str, Tensor]:
        """One step's named loss terms (``loss`` to minimise, the others of :data:`TERMS` it
        has) and the training batch's ``logits`` (B, K). ``context`` and ``features``: the
        context batch and φ0's features of it, checked, when :meth:`uses_context`; else
        ``None``."""
        raise NotImplementedError

    def extra_parameters(self) -> dict[str, nn.Parameter]:
        """The method's own trainable parameters by the name of the network parameter each
        belongs to (FS-VI's ρ), so that they join its layer-decay group."""
        return {}

    def checkpointed_modules(self) -> list[nn.Module]:
        """Trainable modules outside the network that a checkpoint holds to resume exactly."""
        return []

    def state(self) -> dict[str, Tensor]:
        """The tensors kept beside the best weights, in :attr:`state_file`."""
        return {}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set what :meth:`state` saved."""

    def predictor(self, network: nn.Module, seed: int) -> nn.Module:
        """What ``network`` (these weights; possibly wrapped) predicts with: itself, or a module
        around it whose outputs softmax maps to the predictive probabilities; ``seed`` seeds any
        draws, so training and a saved run predict alike."""
        return network


METHODS: dict[str, type[TrainingMethod]] = {}
"""Every registered method by name, in the order their modules were imported."""

_Method = TypeVar("_Method", bound=type[TrainingMethod])


def register_method(name: str) -> Callable[[_Method], _Method]:
    """Register the decorated :class:`TrainingMethod` subclass as ``fseb.method: name``; a name
    registered twice is refused."""

    def register(cls: _Method) -> _Method:
        if name in METHODS:
            raise ValueError(f"method {name!r} is registered twice ({METHODS[name]})")
        cls.name = name
        METHODS[name] = cls
        return cls

    return register


def find_method(name: str) -> type[TrainingMethod]:
    """The registered method ``name``; an unknown one fails as the recipe's validation does."""
    if name not in METHODS:
        raise ValueError(f"fseb.method={name!r}: allowed values are {sorted(METHODS)}")
    return METHODS[name]
