"""The recipe's ``sweep`` section: what ``fseb-ft sweep`` searches, and the keys of its space.

The keys of ``sweep.space`` are themselves dotted recipe keys (``fseb.reg_scale``), so the
section also owns how an override such as ``sweep.space.optim.lr.high=0.1`` splits into a path
(:func:`override_path`) and the check that a key names a searchable value of the recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast, get_args, get_type_hints

from fseb_ft.recipe.options import Pruner
from fseb_ft.recipe.schema import ConfigError, check


@dataclass(frozen=True)
class SweepParam:
    """How ``fseb-ft sweep`` searches one recipe key: a number range, or a list of choices."""

    low: float | None = None
    """Smallest value of a range (with ``high``); ``null`` with ``choices``."""
    high: float | None = None
    """Largest value of a range (with ``low``)."""
    log: bool = False
    """Search the range on a log scale (for scales such as ``optim.lr``; needs ``low > 0``)."""
    choices: tuple[bool | int | float | str, ...] = ()
    """The values to choose from, instead of a range (e.g. ``[train, mixture]``)."""

    def __post_init__(self) -> None:
        ranged = self.low is not None and self.high is not None
        check(
            ranged != bool(self.choices) and (self.low is None) == (self.high is None),
            "choices" if self.choices else "low",
            self.choices or self.low,
            "give either low and high, or choices",
        )
        # Both bounds are set where ranged, which mypy cannot follow through the variable.
        low, high = cast(float, self.low), cast(float, self.high)
        check(not ranged or low < high, "high", self.high, "must be > low")
        check(not (ranged and self.log) or low > 0, "low", self.low, "must be > 0 with log")


@dataclass(frozen=True)
class SweepConfig:
    """What ``fseb-ft sweep`` searches and how (ignored by a plain run)."""

    metric: str = "nll"
    """Validation metric each trial is scored on (its best epoch) and selected on (it becomes the
    trial's ``train.select_metric``, whose values it takes): ``nll``, ``accuracy``, ``ece``,
    ``brier``, a task metric (``qwk``, ``roc_auc``, …; ``eval.metrics``), or ``ood_<name>_auroc``
    for a set of ``data.val_ood``; NLL, ECE and Brier are minimised, the others maximised."""
    space: dict[str, SweepParam] = field(default_factory=dict)
    """Dotted recipe key → its range or choices, e.g. ``fseb.reg_scale: {low: 0.01, high: 10,
    log: true}``; it replaces the default space, which ``{}`` keeps: ``optim.lr`` and
    ``fseb.prior_var``, and for FS-EB ``fseb.prior_std`` and ``fseb.prior_feature_share`` (a
    recipe giving ``prior_std``) or ``fseb.reg_scale`` and ``fseb.prior_cov_diag``, and
    ``context.kind`` when the context section supports several (docs/cli.md). One key on the
    command line: ``sweep.space.fseb.reg_scale='{low: 0.01, high: 10, log: true}'``."""
    pruner: Pruner = "hyperband"
    """Stop trials early whose per-epoch validation metric falls behind (``none``: never)."""
    seed: int = 0
    """Seed of the TPE sampler that proposes the trials: trial number k draws with ``seed + k``,
    so a continued sweep, and each worker sharing a study, proposes new values."""


# Sections a sweep must not change: where its trials are written, and the sweep itself.
_UNSEARCHABLE = ("output", "sweep")


def check_space_key(recipe_type: type, key: str, param: SweepParam) -> None:
    """``key`` of ``sweep.space`` names a value of ``recipe_type`` (a number for a range).

    Raises:
        ConfigError: ``key`` is not a recipe key, names a section or an unsearchable value, or
            has a range but is not a number.
    """
    tp: Any = recipe_type
    for part in key.split("."):
        fields = {f.name for f in dataclasses.fields(tp)} if dataclasses.is_dataclass(tp) else ()
        if part not in fields:
            raise ConfigError(
                f"sweep.space: {key!r} is not a recipe key (a dotted key such as fseb.reg_scale)"
            )
        tp = get_type_hints(tp)[part]
    check(
        not dataclasses.is_dataclass(tp) and key.split(".")[0] not in _UNSEARCHABLE,
        "sweep.space",
        key,
        f"not a searchable value (a section, or in {list(_UNSEARCHABLE)})",
    )
    check(
        bool(param.choices) or float in (tp, *get_args(tp)),
        f"sweep.space.{key}",
        {"low": param.low, "high": param.high},
        "a range needs a number key; give choices instead",
    )


# The keys of sweep.space are dotted recipe keys, each mapping to a SweepParam.
_SPACE = ("sweep", "space")
_SWEEP_PARAM_FIELDS = frozenset(f.name for f in dataclasses.fields(SweepParam))


def override_path(key: str) -> list[str]:
    """The path of the dotted override ``key`` in the recipe tree.

    Every dot separates sections, except inside ``sweep.space``, whose keys are themselves
    dotted recipe keys: ``sweep.space.fseb.reg_scale`` is the space's key ``fseb.reg_scale``,
    and ``sweep.space.optim.lr.high`` the ``high`` of its key ``optim.lr`` (no recipe key ends
    in a field of :class:`SweepParam`).
    """
    parts = key.split(".")
    if tuple(parts[:2]) != _SPACE or len(parts) < 3:
        return parts
    inner = parts[2:]
    if len(inner) > 1 and inner[-1] in _SWEEP_PARAM_FIELDS:
        return [*_SPACE, ".".join(inner[:-1]), inner[-1]]
    return [*_SPACE, ".".join(inner)]
