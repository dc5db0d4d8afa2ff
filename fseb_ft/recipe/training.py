"""The recipe's ``optim`` and ``train`` sections: the optimiser, its schedule and the loop.

Each field's docstring is its entry in docs/recipes.md; each ``__post_init__`` validates its
section, raising :class:`~fseb_ft.recipe.schema.ConfigError` naming the dotted key, the value and
what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fseb_ft.recipe.options import ClassWeights, Sampler
from fseb_ft.recipe.schema import check

__all__ = ["OptimConfig", "TrainConfig"]


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule (stepped every optimiser step)."""

    name: Literal["sgd", "adamw"] = "sgd"
    """SGD with momentum (the paper) or AdamW (its decoupled decay is off: the prior decays)."""
    lr: float = 0.005
    """Peak learning rate."""
    momentum: float = 0.9
    """SGD momentum."""
    nesterov: bool = False
    """Nesterov momentum for SGD."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """Cosine decay to ``min_lr_ratio · lr`` (the reference) or constant."""
    min_lr_ratio: float = 0.05
    """Final learning rate as a fraction of ``lr`` for the cosine schedule."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to ``lr``."""
    grad_clip_norm: float | None = None
    """Clip the global gradient norm (``null``: no clipping)."""
    layer_decay: float | None = None
    """Layer-wise learning-rate decay (docs/method.md, "Layer decay"), e.g. 0.75: timm's
    ``param_groups_layer_decay`` groups the parameters by the model's ``group_matcher`` blocks,
    and block i of L learns at ``lr · layer_decay^(L − i)``, the classifier (and FS-VI's ρ) at
    ``lr``; the schedule scales every group alike, and the parameter prior stays a term of the
    loss. A model without timm's ``group_matcher`` stops at start. ``null``: one ``lr`` for all."""

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        check(all(0 <= b < 1 for b in self.betas), "betas", self.betas, "each in [0, 1)")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be ≥ 0")
        check(
            self.grad_clip_norm is None or self.grad_clip_norm > 0,
            "grad_clip_norm",
            self.grad_clip_norm,
            "must be > 0 or null",
        )
        check(
            self.layer_decay is None or 0 < self.layer_decay <= 1,
            "layer_decay",
            self.layer_decay,
            "must be in (0, 1] or null",
        )


@dataclass(frozen=True)
class TrainConfig:
    """The Accelerate loop."""

    epochs: int = 10
    """Passes over the training set."""
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    """Autocast dtype for forward passes (the Cholesky always runs in float64); ``null`` takes
    Accelerate's setting (``accelerate launch --mixed_precision`` or its config), else ``no``."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimiser step."""
    seed: int = 0
    """Seed for initialisation, shuffling, augmentation and the context pool, and of the data's
    draws (subsets, validation and test hold-outs) unless ``data.seed`` fixes those."""
    select_metric: str = "nll"
    """Validation metric that picks the best checkpoint: ``nll``, ``accuracy``, ``ece``,
    ``brier``, a task metric of ``eval.metrics``' list but ``per_class_recall`` (``qwk``,
    ``balanced_accuracy``, ``macro_f1``, ``roc_auc``, ``average_precision``,
    ``sensitivity_at_90_specificity``, ``sensitivity_at_95_specificity``; computed on validation
    whether ``eval.metrics`` names it or not), or ``ood_<name>_auroc`` for a set of
    ``data.val_ood``. NLL, ECE and Brier are minimised, the others maximised; an epoch whose
    value is NaN (e.g. ``roc_auc`` with a class missing from validation) is never selected over
    one with a number."""
    resume: Literal["auto", "never"] = "auto"
    """``auto`` continues from the last complete checkpoint in the run directory."""
    cpu: bool = False
    """Force CPU even when an accelerator is present."""
    log_every: int = 10
    """Optimiser steps between progress-bar / tracker updates."""
    max_param_growth: float | None = 10.0
    """Stop as diverged when the trainable parameters' norm ‖θ‖ exceeds this multiple of its
    starting value at the end of an epoch (SGD on a stable objective moves ‖θ‖ by far less;
    a blow-up shows as orders of magnitude); ``null``: never stop for it."""
    trackers: tuple[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "aim"], ...] = ()
    """Accelerate trackers for per-epoch metrics (none by default; the history is in
    ``run.json`` either way), e.g. ``[tensorboard]`` after ``pip install tensorboard``; one whose
    package is not installed is skipped with a log message."""
    class_weights: ClassWeights | tuple[float, ...] = "none"
    """Weight each training image's log-likelihood by a weight of its class (docs/method.md,
    "Class imbalance"): ``none``; ``balanced``, scikit-learn's ``compute_class_weight("balanced")``
    on the training labels (``N / (K · N_k)``); or a list ``[w_0, …]``, one positive weight per
    class in label order. The weights are scaled so that their mean over the training images is
    1, so the prior terms keep their weight against the likelihood; the weights used are in
    ``run.json``. Validation and test metrics stay unweighted (the natural class balance)."""
    sampler: Sampler = "shuffle"
    """How an epoch draws the training images: ``shuffle`` (each once, in a seeded random
    order) or ``balanced`` (as many draws, with replacement, each class equally likely; seeded
    per epoch, so a resumed run draws as an uninterrupted one). ``balanced`` rebalances the
    classes instead of ``class_weights``, which must then be ``none``."""
    label_smoothing: float = 0.0
    """Train on smoothed targets: ``1 − ε + ε/K`` for the label, ``ε/K`` for every other class
    (timm's, with ``data.mixup`` too), the loss of torch's ``cross_entropy(label_smoothing=ε)``;
    0: off. It changes only the likelihood (docs/method.md, "Label smoothing and mixup") and is
    known to hurt selective prediction and OOD detection: compare those columns too."""
    ema_decay: float | None = None
    """Keep an exponential moving average (EMA) of the network's weights, updated after every
    optimiser step with this decay, e.g. ``0.999`` (timm's ``ModelEmaV3``, no decay warm-up; its
    first update copies the weights); ``null``: no EMA. It averages the network's parameters and
    floating-point buffers (BatchNorm's running statistics too), not φ0 nor FS-VI's σ; it is
    saved in every checkpoint and restored on resume (docs/method.md, "EMA")."""
    ema_eval: bool = True
    """With ``ema_decay``: validate, select (``select_metric``), evaluate and export the EMA's
    weights (``true``); or the trained weights (``false``), recording each epoch's EMA
    validation accuracy and NLL as ``val_ema_accuracy`` and ``val_ema_nll`` in the history."""
    early_stopping: int | None = None
    """Stop after this many epochs in a row without a better validation ``select_metric`` (its
    direction: NLL, ECE and Brier fall, the others rise), keeping the best epoch's weights;
    ``null``: train every epoch. Why it stopped, and after which epoch, is in ``run.json``'s
    and ``results.json``'s training record (docs/method.md, "Early stopping")."""
    linear_probe_epochs: int = 0
    """LP-FT (docs/method.md, "Freezing and LP-FT"): train the classifier alone for this many
    first epochs (the rest of the model frozen, its BatchNorm statistics fixed), then what
    ``model.freeze`` leaves trainable. 0: no linear probe. Below ``epochs``."""
    channels_last: bool = False
    """Convert the model (and φ0) and each input batch to the ``channels_last`` memory layout: a
    speed-up for convolutions on recent GPUs (tensor cores), little or none on a CPU; the
    exported weights are the same tensors."""
    compile: bool = False
    """``torch.compile`` the model's forward (``nn.Module.compile``: the weights keep their
    names); the function-space term, its float64 Cholesky included, stays outside the compiled
    region. The first steps (and the first validation) are slow while it compiles: worth it for
    long GPU runs, rarely on a CPU."""

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "epochs", self.epochs, "must be ≥ 1")
        check(self.grad_accum_steps >= 1, "grad_accum_steps", self.grad_accum_steps, "must be ≥ 1")
        check(self.log_every >= 1, "log_every", self.log_every, "must be ≥ 1")
        check(
            self.ema_decay is None or 0 < self.ema_decay < 1,
            "ema_decay",
            self.ema_decay,
            "must be in (0, 1), e.g. 0.999, or null",
        )
        check(
            self.early_stopping is None or self.early_stopping >= 1,
            "early_stopping",
            self.early_stopping,
            "a patience in epochs, ≥ 1, or null",
        )
        check(
            self.max_param_growth is None or self.max_param_growth > 1,
            "max_param_growth",
            self.max_param_growth,
            "must be > 1 or null",
        )
        check(
            0 <= self.label_smoothing < 1,
            "label_smoothing",
            self.label_smoothing,
            "must be in [0, 1)",
        )
        weights = self.class_weights
        if not isinstance(weights, str):
            check(
                len(weights) >= 2 and all(math.isfinite(w) and w > 0 for w in weights),
                "class_weights",
                list(weights),
                "a list of positive, finite weights, one per class (≥ 2), or none or balanced",
            )
        check(
            self.sampler == "shuffle" or weights == "none",
            "sampler",
            self.sampler,
            f"balanced rebalances the classes itself; with it train.class_weights must be none, "
            f"not {weights if isinstance(weights, str) else list(weights)}",
        )
        check(
            0 <= self.linear_probe_epochs < self.epochs,
            "linear_probe_epochs",
            self.linear_probe_epochs,
            f"must be ≥ 0 and below train.epochs ({self.epochs})",
        )
