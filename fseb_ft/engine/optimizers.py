"""The optimiser and its learning-rate schedule, from the ``optim`` section.

SGD with momentum (the paper's) or AdamW, with no decoupled weight decay: the parameter prior
``R_θ`` is a term of the loss. With ``optim.layer_decay`` the parameters are in timm's
layer-decay groups (:func:`fseb_ft.method.parts.layer_decay_groups`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from fseb_ft.method.parts import layer_decay_groups
from fseb_ft.recipe import OptimConfig

__all__ = ["build_optimizer", "build_scheduler"]


def build_optimizer(
    cfg: OptimConfig,
    params: list[nn.Parameter],
    model: nn.Module,
    name: str = "",
    rho: Mapping[str, nn.Parameter] | None = None,
) -> torch.optim.Optimizer:
    """SGD-momentum or AdamW; no decoupled decay because the parameter prior ``R_θ`` decays.

    With ``optim.layer_decay``, ``model``'s parameters (``name``: its ``model.name``, for the
    error) are in timm's layer-decay groups, each at its scaled ``lr``, and the method's own
    parameters ``rho`` (FS-VI's ρ; by the name of the parameter each belongs to; all of them must
    be among ``params``) in their parameters' groups
    (:func:`fseb_ft.method.parts.layer_decay_groups`); the schedule scales every group alike.
    Frozen parameters are in the optimiser too: they get no gradient, so it leaves them (and
    their momentum) alone until they are unfrozen.
    """
    groups: list[nn.Parameter] | list[dict[str, object]] = params
    if cfg.layer_decay is not None:
        groups = layer_decay_groups(model, cfg.lr, cfg.layer_decay, rho, name)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)


def build_scheduler(
    cfg: OptimConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to ``min_lr_ratio · lr`` (or constant), per step."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
