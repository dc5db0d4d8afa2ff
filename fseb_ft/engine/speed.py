"""The speed and memory keys: ``train.channels_last``, ``train.compile`` and
``model.grad_checkpointing``, applied to the model once the objective has copied φ0 from it.

None of them changes what is computed (up to the rounding of other kernels) nor the weights'
names: ``nn.Module.compile`` compiles the module's call in place (no ``_orig_mod.`` prefix in its
``state_dict``), and the function-space term, computed by the objective after the model's call,
is never in a compiled region. Gradient checkpointing runs each checkpointed segment's forward
again in the backward pass, in train mode: a normalisation layer with running statistics
(BatchNorm) would update them twice per step, so those layers keep their statistics out of the
recomputation (:func:`_statistics_once`); dropout draws the same masks, as
``torch.utils.checkpoint`` (which timm calls with its defaults) restores the RNG state first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.parts import ModelPartsError
from fseb_ft.recipe import ModelConfig, TrainConfig

__all__ = ["COMPILE_BACKEND", "apply_speed_keys"]

COMPILE_BACKEND = "inductor"
"""``torch.compile``'s backend for ``train.compile`` (tests set a cheaper one)."""


def apply_speed_keys(
    objective: FSEBObjective,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    backend: str | Callable[..., Any] | None = None,
) -> None:
    """Apply the keys to ``objective.model`` (not yet prepared): ``channels_last`` to it and φ0
    (and to the inputs of its calls), gradient checkpointing, then ``torch.compile`` with
    ``backend`` (default :data:`COMPILE_BACKEND`).

    Raises:
        ModelPartsError: ``model.grad_checkpointing`` for a model without timm's support.
    """
    model = objective.model
    if train_cfg.channels_last:
        for module in (model, objective.prior):
            module.to(memory_format=torch.channels_last)
        model.register_forward_pre_hook(_channels_last_inputs)
    if model_cfg.grad_checkpointing:
        _set_grad_checkpointing(model, model_cfg.name)
    if train_cfg.compile:
        model.compile(backend=backend or COMPILE_BACKEND)


def _channels_last_inputs(module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
    """A forward pre-hook: 4-d tensor inputs in ``channels_last`` layout."""
    return tuple(
        a.contiguous(memory_format=torch.channels_last)
        if isinstance(a, Tensor) and a.dim() == 4
        else a
        for a in args
    )


def _set_grad_checkpointing(model: nn.Module, name: str) -> None:
    """timm's ``model.set_grad_checkpointing(True)``, or one line naming the model."""
    refusal = ModelPartsError(
        f"model.grad_checkpointing: model.name={name!r} ({type(model).__name__}) does not "
        "support timm's gradient checkpointing; set it to false"
    )
    setter = getattr(model, "set_grad_checkpointing", None)
    if not callable(setter):
        raise refusal
    try:
        setter(True)
    except (AssertionError, NotImplementedError) as err:  # timm's refusals
        raise refusal from err
    _statistics_once(model)


def _statistics_once(model: nn.Module) -> None:
    """Make every layer of ``model`` that tracks running statistics (BatchNorm and timm's
    BatchNormAct, through ``track_running_stats``) leave its buffers alone when its forward runs
    in a backward pass, which is where checkpointing recomputes it."""
    for module in model.modules():
        if getattr(module, "track_running_stats", False):
            module.register_forward_pre_hook(_pause_statistics)
            module.register_forward_hook(_resume_statistics, always_call=True)


def _pause_statistics(module: nn.Module, args: tuple[object, ...]) -> None:
    """A forward pre-hook: in train mode inside a backward pass (a recomputation), the layer
    updates copies of its buffers, which :func:`_resume_statistics` drops."""
    # The autograd engine's current graph task is -1 outside a backward pass; torch's own
    # autograd.graph tells a backward apart by it. Compiled code recomputes in its own backward
    # graph, where this hook does not run, so tracing skips the check.
    if torch.compiler.is_compiling() or not module.training:
        return
    if torch._C._current_graph_task_id() != -1:
        # Copies, not a switch of track_running_stats: the recomputation must save the same
        # tensors as the first forward did (non-reentrant checkpointing checks their count).
        kept = dict(module.named_buffers(recurse=False))
        for name, buffer in kept.items():
            setattr(module, name, buffer.clone())
        cast(Any, module)._fseb_kept_buffers = kept  # a plain attribute, not a submodule


def _resume_statistics(module: nn.Module, args: tuple[object, ...], output: object) -> None:
    """A forward hook: the buffers that :func:`_pause_statistics` set aside are back."""
    kept = module.__dict__.pop("_fseb_kept_buffers", None)
    for name, buffer in (kept or {}).items():
        setattr(module, name, buffer)
