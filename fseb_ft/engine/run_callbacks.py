"""The built-in callbacks a run gets from its recipe, before the user's own.

Every run: :class:`~fseb_ft.engine.callbacks.DivergenceStop`,
:class:`~fseb_ft.engine.callbacks.ValOODScores`, :class:`~fseb_ft.engine.callbacks.ChanceWarning`;
and one per training behaviour its recipe turns on: ``train.class_weights``
(:class:`~fseb_ft.engine.callbacks.ClassWeights`), ``model.freeze`` /
``train.linear_probe_epochs`` (:class:`~fseb_ft.engine.freezing.Freeze`),
``train.label_smoothing`` / ``data.mixup``
(:class:`~fseb_ft.engine.soft_targets.SoftTargets`), ``train.ema_decay``
(:class:`~fseb_ft.engine.ema.WeightEMA`), ``train.early_stopping``
(:class:`~fseb_ft.engine.early_stopping.EarlyStopping`). A new behaviour is one line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from torch import Tensor
from torch.utils.data import DataLoader

from fseb_ft.engine.callbacks import (
    Callback,
    ChanceWarning,
    ClassWeights,
    DivergenceStop,
    ValOODScores,
)
from fseb_ft.engine.early_stopping import EarlyStopping
from fseb_ft.engine.ema import WeightEMA
from fseb_ft.engine.freezing import freeze_callback
from fseb_ft.engine.loop import Prepared
from fseb_ft.engine.soft_targets import soft_target_callbacks
from fseb_ft.method.models import head_init
from fseb_ft.recipe import Recipe

__all__ = ["builtin_callbacks"]


def builtin_callbacks(
    recipe: Recipe,
    parts: Prepared,
    val_ood_loaders: Mapping[str, DataLoader],
    class_weights: Tensor | None,
    num_classes: int,
) -> list[Callback]:
    """The callbacks of a run of ``recipe`` on its prepared ``parts``, in the order they run.

    ``val_ood_loaders`` are the ``data.val_ood`` sets, ``class_weights`` the resolved (K,)
    weights of ``train.class_weights`` (``None``: unweighted), ``num_classes`` the run's K.
    """
    train = recipe.train
    return [
        DivergenceStop(
            train.max_param_growth,
            # A zero head helps a pretrained backbone's random one, not a network from scratch.
            suggest_zero_head=recipe.model.pretrained and head_init(recipe.model) != "zeros",
        ),
        ValOODScores(val_ood_loaders, recipe.eval.ood_scores[0]),
        ChanceWarning(),
        *([] if class_weights is None else [ClassWeights(class_weights, train.label_smoothing)]),
        *freeze_callback(parts.accelerator.unwrap_model(parts.objective.model), recipe),
        *soft_target_callbacks(train, recipe.data, num_classes),
        *([] if train.ema_decay is None else [_ema(recipe, parts)]),
        *([] if train.early_stopping is None else [EarlyStopping(train.early_stopping)]),
    ]


def _ema(recipe: Recipe, parts: Prepared) -> WeightEMA:
    """The EMA of ``train.ema_decay``, validated on its own with ``train.ema_eval=false``."""
    train, model = recipe.train, parts.objective.model
    decay = cast(float, train.ema_decay)  # called when set (builtin_callbacks)
    return WeightEMA(model, decay, evaluate=train.ema_eval, val_loader=parts.val_loader)
