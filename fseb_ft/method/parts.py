"""A timm model's parts, as timm groups them: the classifier, the first k stages to freeze
(``model.freeze``), and the per-parameter learning-rate scales of layer decay
(``optim.layer_decay``); and the network inside its wrappers (:func:`unwrap_model`).

timm's ``group_matcher`` names the parts: ``coarse=True`` gives the stem and the stages in order
(the classifier last), ``coarse=False`` the blocks that layer decay counts. Both come through
timm's own :func:`timm.models.group_parameters` and
:func:`timm.optim.param_groups_layer_decay`; nothing here re-derives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from timm.models import group_parameters
from timm.optim import param_groups_layer_decay
from torch import nn

from fseb_ft.errors import FsebError

__all__ = [
    "ModelPartsError",
    "frozen_names",
    "head_names",
    "layer_decay_groups",
    "require_group_matcher",
    "unwrap_model",
]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / ``torch.compile`` / Accelerate wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


class ModelPartsError(FsebError, ValueError):
    """A recipe key needs a part of the model that it does not name (no ``group_matcher``)."""


def require_group_matcher(model: nn.Module, key: str, name: str) -> None:
    """Stop when ``model`` has no timm ``group_matcher``, which ``key`` needs to find its stages.

    Raises:
        ModelPartsError: one line naming ``key`` and the model ``name``.
    """
    if not callable(getattr(model, "group_matcher", None)):
        raise ModelPartsError(
            f"{key} needs the model's stages, from timm's group_matcher(), which model.name="
            f"{name!r} ({type(model).__name__}) lacks; use a timm architecture or leave {key} off"
        )


def head_names(model: nn.Module, key: str = "model.freeze", name: str = "") -> list[str]:
    """The classifier's parameter names in ``model``: those of every module
    ``model.get_classifier()`` returns (a distilled DeiT returns two, its head and its
    distillation head).

    Raises:
        ModelPartsError: ``model`` has no ``get_classifier()``, or no parameters in what it
            returns; one line naming ``key`` (the recipe key that needs the classifier) and the
            model ``name``.
    """
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    modules = head if isinstance(head, tuple | list) else (head,)
    ids = {id(p) for m in modules if isinstance(m, nn.Module) for p in m.parameters()}
    names = [n for n, p in model.named_parameters() if id(p) in ids]
    if not names:
        raise ModelPartsError(
            f"{key} needs the model's classifier, from timm's get_classifier(), which gives no "
            f"parameters for model.name={name!r} ({type(model).__name__}); leave {key} off"
        )
    return names


def frozen_names(
    model: nn.Module, freeze: Literal["none", "backbone"] | int, name: str = ""
) -> list[str]:
    """The parameter names ``model.freeze`` holds fixed: none (``none``), all but the
    classifier's (``backbone``), or those of timm's first ``freeze`` coarse groups, the stem
    being the first (``2``: the stem and the first stage); the classifier is never among them.

    Raises:
        ModelPartsError: an integer ``freeze`` for a model without ``group_matcher``, or one that
            leaves no group but the classifier's to train.
    """
    if freeze == "none":
        return []
    head = set(head_names(model, "model.freeze", name))
    if freeze == "backbone":
        return [n for n, _ in model.named_parameters() if n not in head]
    require_group_matcher(model, "model.freeze", name)
    matcher = cast(Any, model).group_matcher(coarse=True)  # timm's, checked above
    groups = group_parameters(model, matcher)  # ordinal → names
    stages = [names for _, names in sorted(groups.items()) if not head.issuperset(names)]
    if freeze >= len(stages):
        raise ModelPartsError(
            f"model.freeze={freeze}: model.name={name!r} has {len(stages)} stages (the stem "
            f"first) before its classifier; use 1–{len(stages) - 1}, or backbone to freeze all"
        )
    return [n for names in stages[:freeze] for n in names if n not in head]


def layer_decay_groups(
    model: nn.Module,
    lr: float,
    decay: float,
    extra: Mapping[str, nn.Parameter] | None = None,
    name: str = "",
) -> list[dict[str, object]]:
    """The optimiser's parameter groups under layer decay: timm's
    :func:`~timm.optim.param_groups_layer_decay` on ``model`` (block i of L has
    ``lr · decay^(L − i)``, the classifier ``lr``), each group's ``lr`` set from its
    ``lr_scale`` and its ``weight_decay`` 0 (the parameter prior is a term of the loss).
    ``extra`` (FS-VI's ρ, by the name of the network parameter each belongs to) joins its
    parameter's group, so σ learns at the rate of the mean it perturbs.

    Raises:
        ModelPartsError: ``model`` has no timm ``group_matcher``.
    """
    require_group_matcher(model, "optim.layer_decay", name)
    groups = param_groups_layer_decay(model, weight_decay=0.0, layer_decay=decay)
    names = {id(p): n for n, p in model.named_parameters()}
    extra = extra or {}
    for group in groups:
        group["params"] = list(group["params"]) + [
            extra[names[id(p)]] for p in group["params"] if names[id(p)] in extra
        ]
    return [g | {"lr": lr * g["lr_scale"], "weight_decay": 0.0} for g in groups]
