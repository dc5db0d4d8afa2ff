"""The training loop's callbacks: what they see, the protocol, and the built-in ones.

A callback subclasses :class:`Callback` and overrides the hooks it needs; the loop
(:class:`fseb_ft.engine.loop.Trainer`) calls them in this order::

    on_train_begin                      after resuming, before the first epoch
    for each epoch:
        on_epoch_begin                  before the epoch's first batch, the model in train mode
        on_batch_begin                  before each training batch's forward: may replace it
        on_step_end                     after each optimiser step (not each accumulated batch)
        on_validation_begin             the epoch is trained, its ‖θ‖ measured; nothing predicted
        on_validation_end               the validation predictions exist, no metric yet
        on_epoch_end                    the epoch's record is complete, its checkpoint not yet
    on_train_end                        after the last checkpoint (also after a stop)

Each hook gets the trainer (:class:`TrainerView`: its state, Accelerator, objective, config) and
may raise to abort training. Setting ``trainer.should_stop`` ends training gracefully once the
epoch's checkpoint is written; ``trainer.warn`` keeps a warning for the results and the model
card. A callback with state returns it from :meth:`Callback.state_dict` (JSON-serialisable): it is
saved in each checkpoint's ``trainer_state.json`` and given back to :meth:`Callback.load_state_dict`
when the run resumes; tensors (an EMA's weights) go in :meth:`Callback.checkpointed` instead. The
built-in callbacks a run's recipe turns on are listed in :mod:`fseb_ft.engine.run_callbacks`:
:class:`DivergenceStop`, :class:`ValOODScores`, :class:`ChanceWarning` always;
``train.class_weights`` adds :class:`ClassWeights`, ``model.freeze`` and
``train.linear_probe_epochs`` :class:`~fseb_ft.engine.freezing.Freeze`, ``train.label_smoothing``
and ``data.mixup`` :class:`~fseb_ft.engine.soft_targets.SoftTargets`, ``train.ema_decay``
:class:`~fseb_ft.engine.ema.WeightEMA`, ``train.early_stopping``
:class:`~fseb_ft.engine.early_stopping.EarlyStopping`; a sweep adds :class:`PruningCallback`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.metrics import chance_accuracy, chance_nll, ood_detection
from fseb_ft.evaluation.ood import ood_score
from fseb_ft.evaluation.predictions import predict_logits
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import TrainConfig, val_ood_metric

__all__ = [
    "Callback",
    "ChanceWarning",
    "ClassWeights",
    "DivergenceStop",
    "PruningCallback",
    "TrainState",
    "TrainerView",
    "TrainingDivergedError",
    "ValOODScores",
    "Validation",
]


class TrainingDivergedError(FsebError, RuntimeError):
    """The parameter norm grew past ``train.max_param_growth`` × its start: training diverged."""


@dataclass
class TrainState:
    """Loop progress saved with every checkpoint."""

    epoch: int = 0
    """Epochs completed (from an epoch's validation on, that epoch included)."""
    step: int = 0
    """Optimiser steps taken."""
    best_epoch: int = -1
    """Epoch (1-based) whose weights are in ``best/``; -1 before the first validation."""
    best_value: float | None = None
    """Validation value of the selection metric at ``best_epoch``."""
    history: list[dict[str, float]] = field(default_factory=list)
    """Per-epoch training and validation summaries."""
    initial_param_norm: float | None = None
    """‖θ‖ of the trainable parameters before the first step (the divergence check's scale)."""
    seconds: float = 0.0
    """Wall-clock seconds of the completed epochs (training and validation), summed over every
    invocation of a resumed run."""
    warnings: list[str] = field(default_factory=list)
    """Problems found during training that do not stop it (reported in results and the card)."""
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each callback's :meth:`Callback.state_dict` by its ``state_key``, those with state only
    (absent from checkpoints written before callbacks had state, and from runs without any)."""
    stopped: str | None = None
    """Why training ended before ``train.epochs`` (a callback's words, e.g. early stopping);
    ``None``: it did not (absent from ``trainer_state.json`` then)."""


@dataclass
class Validation:
    """One epoch's validation predictions, as ``on_validation_end`` sees them."""

    predictor: nn.Module
    """The model that predicted them (FS-VI: its Monte-Carlo predictive)."""
    logits: Tensor
    """(N_v, K) logits (FS-VI: log-probabilities, which ``log_softmax`` leaves as they are)."""
    labels: Tensor
    """(N_v,) validation labels."""
    log_probs: Tensor
    """(N_v, K) log-probabilities."""
    record: dict[str, float]
    """The epoch's record so far: ``epoch``, ``step``, the ``train_*`` means, ``lr``,
    ``param_norm``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Metrics a callback adds (name → value): recorded as ``val_<name>`` after the loop's own
    (accuracy, NLL, …), and selectable by ``train.select_metric``."""


class TrainerView(Protocol):
    """What a callback sees of the trainer (:class:`fseb_ft.engine.loop.Trainer`)."""

    config: TrainConfig
    state: TrainState
    accelerator: Accelerator
    objective: FSEBObjective
    run_dir: Path
    should_stop: bool
    """Set to end training once this epoch's checkpoint is written (checked before each epoch);
    the run is then evaluated and exported. A rerun resumes after that epoch: a callback that
    must stop it again keeps why in its state and sets this in ``on_train_begin``."""

    def warn(self, message: str) -> None:
        """Keep ``message`` for the results and the card, and log it once."""


class Callback:
    """A hook into the training loop; every hook does nothing unless overridden."""

    @property
    def state_key(self) -> str:
        """The name this callback's state is saved under (unique among a run's callbacks)."""
        return type(self).__name__

    def on_train_begin(self, trainer: TrainerView) -> None:
        """Training starts (or resumes: ``trainer.state`` and this callback's state restored)."""

    def on_epoch_begin(self, trainer: TrainerView, epoch: int) -> None:
        """Epoch ``epoch`` (0-based; ``trainer.state.epoch`` epochs are done) starts; the model
        is in train mode already, so a hook may set parts of it to eval for the epoch."""

    def on_batch_begin(self, trainer: TrainerView, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """A training batch, inputs ``x`` (B, ...) and labels ``y`` (B,), is about to be
        forwarded: return the batch to train on instead (e.g. mixed images and soft targets
        (B, K) whose rows sum to one; only the likelihood reads targets). Each callback gets
        the previous one's batch; validation never passes here."""
        return x, y

    def on_step_end(self, trainer: TrainerView, terms: Mapping[str, Tensor]) -> None:
        """An optimiser step was taken (``trainer.state.step`` counts it). ``terms``: the last
        batch's loss terms, on the device: reading one as a number is a host sync per step."""

    def on_validation_begin(self, trainer: TrainerView) -> None:
        """The epoch is trained (its record has ``param_norm``); validation predicts next, with
        the weights the network holds then, which the best weights are saved from (an EMA
        swaps its own in here, and back in :meth:`on_epoch_end`)."""

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        """The epoch's validation predictions exist; add metrics to ``validation.metrics``."""

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        """The epoch's record (in ``trainer.state.history``) is complete and the best weights
        saved; what this changes is saved with the epoch's checkpoint, written next."""

    def on_train_end(self, trainer: TrainerView) -> None:
        """Training ended: the last epoch's checkpoint is written."""

    def state_dict(self) -> dict[str, Any]:
        """This callback's state to save with a checkpoint (JSON-serialisable; ``{}``: none)."""
        return {}

    def checkpointed(self) -> list[Any]:
        """Objects with tensor state (``state_dict`` / ``load_state_dict``, e.g. a module) that
        each checkpoint holds through Accelerate beside the model, and that a resumed run loads
        before :meth:`on_train_begin`; registered in the callbacks' order, after the loop's own.
        A run must pass the same ones to resume its checkpoints."""
        return []

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, when the run resumes from a checkpoint."""


class DivergenceStop(Callback):
    """Stop a run whose parameter norm grew past ``limit`` × its start, or whose validation
    predictions are not finite (:func:`_check_divergence`)."""

    def __init__(self, limit: float | None, *, suggest_zero_head: bool) -> None:
        """``limit``: ``train.max_param_growth``. ``suggest_zero_head``: the message advises
        ``model.head_init=zeros`` (for a pretrained backbone with a random new head; a network
        trained from scratch needs that one)."""
        self.limit, self.suggest_zero_head = limit, suggest_zero_head

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        start = trainer.state.initial_param_norm
        assert start is not None, "the trainer measures ‖θ‖ before the first step"
        _check_divergence(
            validation.record,
            validation.log_probs,
            start,
            self.limit,
            suggest_zero_head=self.suggest_zero_head,
        )


def _check_divergence(
    record: dict[str, float],
    val_log_probs: Tensor,
    start: float,
    limit: float | None,
    *,
    suggest_zero_head: bool,
) -> None:
    """Stop when ‖θ‖ grew past ``limit`` × its start, or it or the validation predictions are
    not finite: training diverged. ``suggest_zero_head`` adds ``model.head_init=zeros`` to the
    remedies.

    A diverging run is otherwise silent: the training loss can stay finite while ‖θ‖ and
    ``R_θ`` grow by orders of magnitude and validation sits at chance, and the run would end
    with a model card.
    """
    norm = record["param_norm"]
    finite = math.isfinite(norm) and bool(torch.isfinite(val_log_probs).all())
    if finite and (limit is None or norm <= limit * start):
        return
    what = (
        f"the parameter norm grew from {start:.4g} to {norm:.4g} ({norm / start:.3g}×, limit "
        f"train.max_param_growth={limit:g})"
        if finite
        else f"the validation predictions are not finite (parameter norm {norm:.4g}, "
        f"{start:.4g} at the start)"
    )
    head = ", start from model.head_init=zeros," if suggest_zero_head else ""
    raise TrainingDivergedError(
        f"training diverged in epoch {record['epoch']}: {what}; train_param_reg="
        f"{record.get('train_param_reg', float('nan')):.4g}, train_fs_reg="
        f"{record.get('train_fs_reg', float('nan')):.4g}. Stopped before saving this epoch; no "
        f"model card was written. Lower optim.lr{head} or widen the prior (raise "
        "fseb.prior_cov_diag or prior_cov_scale)."
    )


class ValOODScores(Callback):
    """``val_ood_<name>_auroc`` for each ``data.val_ood`` set: the AUROC of the OOD score
    ``score`` (``eval.ood_scores[0]``) separating it from the validation split."""

    def __init__(self, loaders: Mapping[str, DataLoader], score: str) -> None:
        """``loaders``: the validation OOD sets' loaders, prepared by the run's Accelerator."""
        self.loaders, self.score = loaders, score

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        for name, loader in self.loaders.items():
            validation.metrics[val_ood_metric(name)] = _val_ood_auroc(
                validation.predictor, loader, trainer.accelerator, self.score, validation.logits
            )


def _val_ood_auroc(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator, score: str, val_logits: Tensor
) -> float:
    """AUROC of the OOD score ``score`` separating ``loader``'s images from the validation split
    (``val_logits``, (N_v, K)); OOD is the positive class (docs/method.md, "Metrics")."""
    ood_logits = predict_logits(model, loader, accelerator)[0]  # (N_o, K)
    s_in = ood_score(score, torch.softmax(val_logits, -1), val_logits)  # (N_v,)
    s_out = ood_score(score, torch.softmax(ood_logits, -1), ood_logits)  # (N_o,)
    return float(ood_detection(s_in, s_out)["auroc"])


class ChanceWarning(Callback):
    """Record ``val_chance_accuracy`` (always predicting the most frequent class) each epoch, and
    warn after the last epoch when validation accuracy never beat it (:func:`_chance_warning`)."""

    def __init__(self) -> None:
        self._labels: Tensor | None = None  # this epoch's validation labels

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        self._labels = validation.labels
        validation.metrics["chance_accuracy"] = float(chance_accuracy(validation.labels))

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        history = trainer.state.history
        if self._labels is None or trainer.state.epoch != trainer.config.epochs:
            return
        if all(_at_chance(r) for r in history):
            trainer.warn(_chance_warning(history, self._labels))


def _at_chance(record: dict[str, float]) -> bool:
    """Validation accuracy no better than always predicting the most frequent class."""
    return record["val_accuracy"] <= record["val_chance_accuracy"]


_LEARNED = 0.01
"""How far (1 %) a validation NLL must fall below the class frequencies' to count as learning:
a model that predicts them is within rounding of it."""


def _chance_warning(history: Sequence[dict[str, float]], labels: Tensor) -> str:
    """Validation accuracy never beat chance (``labels``: the validation labels, (N_v,)): say so,
    and what it points to.

    The data when validation holds one class (nothing can beat chance there), or when the
    model's NLL is :data:`_LEARNED` below that of the class frequencies
    (:func:`~fseb_ft.evaluation.metrics.chance_nll`): it learned, but not enough to outvote the most
    frequent class, which an unbalanced split makes hard. The training otherwise: it learned
    nothing measurable.
    """
    best, chance = max(r["val_accuracy"] for r in history), history[-1]["val_chance_accuracy"]
    said = (
        f"validation accuracy never beat chance in {len(history)} epoch(s): best {best:.2%} "
        f"against {chance:.2%} for always predicting the most frequent class ({len(labels)} "
        "validation images). "
    )
    if len(torch.unique(labels)) < 2:
        return said + (
            "Every validation image is of one class, so no model can beat chance there and "
            "validation selects nothing: the data is the cause. Give data.val images of at "
            "least two classes (held out from data.train, a class needs two images or more)."
        )
    best_nll, frequency_nll = min(r["val_nll"] for r in history), float(chance_nll(labels))
    nlls = (
        f"best validation NLL {best_nll:.4f} against {frequency_nll:.4f} for predicting the "
        "class frequencies"
    )
    if best_nll < (1 - _LEARNED) * frequency_nll:
        return said + (
            f"The model did learn ({nlls}), but not enough to outvote the most "
            f"frequent class, {chance:.0%} of validation: the class balance, not the learning "
            "rate, is the cause. Judge the run by its NLL (train.select_metric=nll), train "
            "longer, or give the other classes more images."
        )
    balance = f" and the class balance ({chance:.0%} of validation is one class)"
    return said + (
        f"The model has learned nothing measurable ({nlls}): check the labels"
        f"{balance if chance >= 0.5 else ''}, lower optim.lr, or train longer."
    )


class ClassWeights(Callback):
    """Train on the class-weighted likelihood (``train.class_weights``): the objective weights
    each example's log-likelihood by its class's weight while training
    (:meth:`~fseb_ft.method.objective.FSEBObjective.set_class_weights`), and unweighted after.

    No state to save: the weights follow from the recipe and the training labels, and a resumed
    run sets them again before its first epoch.
    """

    def __init__(self, weights: Tensor, smoothing: float = 0.0) -> None:
        """``weights``: (K,), scaled to mean 1 over the training images
        (:func:`fseb_ft.method.likelihood.class_weights`); ``smoothing``:
        ``train.label_smoothing``, which an example's weight undoes."""
        self.weights, self.smoothing = weights, smoothing

    def on_train_begin(self, trainer: TrainerView) -> None:
        device = trainer.accelerator.device
        weights = self.weights.to(device, torch.float32)
        trainer.objective.set_class_weights(weights, self.smoothing)

    def on_train_end(self, trainer: TrainerView) -> None:
        trainer.objective.set_class_weights(None)


class PruningCallback(Callback):
    """Report each epoch's ``val_<metric>`` to an Optuna trial, and prune the trial (raise
    ``optuna.TrialPruned``) when its pruner says so.

    The trial is pruned once the epoch's checkpoint is written (training stops there, and
    :meth:`on_train_end` raises), so a pruned trial loses nothing. After the last epoch the trial
    is trained: scoring it costs nothing more, so it is never pruned there.
    """

    def __init__(self, trial: Any, metric: str, epochs: int) -> None:
        """``trial``: an ``optuna.Trial`` (anything with ``report(value, step)`` and
        ``should_prune()``); ``metric``: the sweep's metric, without ``val_``; ``epochs``: the
        sweep's ``train.epochs``."""
        self.trial, self.metric, self.epochs = trial, metric, epochs
        self._pruned: str | None = None  # why, once the pruner said so

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        epoch = int(record["epoch"])
        self.trial.report(record[f"val_{self.metric}"], step=epoch)
        if epoch < self.epochs and self.trial.should_prune():
            self._pruned = f"val_{self.metric} after epoch {epoch} is behind other trials"
            trainer.should_stop = True

    def on_train_end(self, trainer: TrainerView) -> None:
        if self._pruned is not None:
            import optuna  # only a sweep needs it

            raise optuna.TrialPruned(self._pruned)
