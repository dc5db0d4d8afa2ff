"""The one Accelerate training loop (PS-MAP and FS-EB are configurations of it).

Mixed precision, gradient accumulation and multi-process come from Accelerate. Every epoch ends
with a validation pass and an atomic checkpoint (written to a temporary directory, then renamed),
so ``train.resume: auto`` continues a killed run from its last complete epoch with the same
result as an uninterrupted one: shuffling, augmentation and the context stream are reseeded from
(seed, epoch) rather than carried over in opaque iterator state. What else happens in an epoch
(the divergence stop, the chance warning, validation-OOD scores, a sweep's pruning) is a
callback (:mod:`fseb_ft.engine.callbacks`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fseb_ft.data.transforms import epoch_seed, seed_transform
from fseb_ft.engine.callbacks import Callback, TrainState, Validation
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.metrics import METRIC_REGISTRY, classification_metrics, higher_is_better
from fseb_ft.evaluation.predictions import predict_logits
from fseb_ft.logs import above_progress_bars, progress_bar
from fseb_ft.method.context import ContextStream
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import OptimConfig, TrainConfig
from fseb_ft.runs.atomic import cleaned_on_failure, publish
from fseb_ft.runs.rundir import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS,
    TRAINER_STATE,
    checkpoint_name,
    latest_checkpoint,
)

__all__ = [
    "NonFiniteLossError",
    "Prepared",
    "Trainer",
    "applied_precision",
    "launch_warnings",
    "make_accelerator",
    "param_norm",
]

logger = logging.getLogger("fseb_ft")


class NonFiniteLossError(FsebError, RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


def _trackers(names: Sequence[str]) -> list[str]:
    available = [n for n in names if importlib.util.find_spec(n) is not None]
    for name in sorted(set(names) - set(available)):
        logger.info("tracker %r is not installed (pip install %s); not logging to it", name, name)
    return available


def _has_accelerator() -> bool:
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    return (
        torch.cuda.is_available()
        or (mps is not None and mps.is_available())
        or (xpu is not None and xpu.is_available())
    )


def make_accelerator(cfg: TrainConfig, run_dir: Path) -> Accelerator:
    """The run's Accelerator: precision, accumulation, trackers, and seedable shuffling."""
    return Accelerator(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        # On a machine with no accelerator, say so: a torchrun/multi-process launch then sets
        # up gloo (multi-CPU) instead of leaving every process to train on its own.
        cpu=cfg.cpu or not _has_accelerator(),
        log_with=_trackers(cfg.trackers) or None,
        project_dir=str(run_dir),
        # Per-epoch seeded shuffling (set_epoch) is what makes a resumed run match.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


def applied_precision(accelerator: Accelerator) -> str:
    """The mixed precision the loop really autocasts to: ``no``, ``bf16``, ``fp16`` (or ``fp8``).

    Accelerate keeps a requested fp16 as its setting on CPU but autocasts nothing there.
    """
    requested = accelerator.mixed_precision
    delegated = accelerator.distributed_type in (
        DistributedType.DEEPSPEED,
        DistributedType.MEGATRON_LM,
    )
    return requested if accelerator.native_amp or delegated else "no"


def launch_warnings(accelerator: Accelerator, environ: Mapping[str, str]) -> list[str]:
    """What was asked of this run but does not happen, to print at start and keep in run.json.

    ``environ`` is the process environment: ``accelerate launch`` sets ``ACCELERATE_USE_CPU``, and
    ``MASTER_ADDR`` only when asked for several processes; its single-process launcher (``--cpu``,
    or no GPU) then still starts one.
    """
    found = []
    applied = applied_precision(accelerator)
    if applied != accelerator.mixed_precision:
        device = accelerator.device.type.upper()
        found.append(
            f"{accelerator.mixed_precision} mixed precision is not supported on {device}; "
            f"training in {'fp32' if applied == 'no' else applied}"
        )
    if accelerator.num_processes == 1 and {"ACCELERATE_USE_CPU", "MASTER_ADDR"} <= set(environ):
        found.append(
            "accelerate launch asked for several processes but only this one runs (without GPUs "
            "or with --cpu it starts a single process); for several CPU processes use torchrun "
            "--nproc_per_node N -m fseb_ft.finetune RECIPE.yaml (docs/cli.md)"
        )
    return found


@dataclass(frozen=True)
class Prepared:
    """What the loop trains with. The model (``objective.model``), ``optimizer`` and loaders are
    prepared by ``accelerator``; ``scheduler`` is not (it counts real optimiser steps)."""

    accelerator: Accelerator
    objective: FSEBObjective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader
    val_loader: DataLoader
    context: ContextStream | None
    """FS-EB's context stream; ``None`` for PS-MAP, which draws no context."""


_Contexts = Iterator[tuple[Tensor, Tensor | None]]
"""An epoch's context batches: ``(x̂, cached φ0 features or None)``."""
_TERMS = ("loss", "nll", "fs_reg", "param_reg")
"""The loss terms averaged over an epoch (``train_<term>`` in its record)."""


class Trainer:
    """Train for ``config.epochs``, validating, checkpointing and resuming as configured.

    Each epoch: train (the training loader reseeded from (seed, epoch); without workers, its
    transform too), validate (FS-VI with its Monte-Carlo predictive, ``objective.predictor``),
    keep the weights best on ``config.select_metric`` (``save_best``, main process), then write
    the checkpoint (Accelerate's state, FS-VI's σ, and :class:`TrainState` with the callbacks'
    states). ``callbacks`` run in their order at each hook (:mod:`fseb_ft.engine.callbacks`).
    Validation computes the standard metrics, the one-number task metrics of ``task_metrics``
    (``eval.metrics``; a per-class one has no place in the history) and the selected one.
    """

    def __init__(
        self,
        parts: Prepared,
        config: TrainConfig,
        optim: OptimConfig,
        run_dir: Path,
        save_best: Callable[[nn.Module], None],
        callbacks: Sequence[Callback] = (),
        task_metrics: Sequence[str] = (),
    ) -> None:
        """``optim`` gives the gradient clipping, and the remedies a non-finite loss names."""
        keys = [c.state_key for c in callbacks]
        if len(set(keys)) < len(keys):
            raise ValueError(f"callbacks need distinct state_key values, got {keys}")
        self.parts, self.config, self.optim, self.run_dir = parts, config, optim, run_dir
        self.accelerator, self.objective = parts.accelerator, parts.objective
        self.save_best, self.callbacks = save_best, list(callbacks)
        # Only those that act per batch or step are called there: the others cost the hot path
        # nothing.
        self._per_step = [c for c in self.callbacks if _overrides(c, "on_step_end")]
        self._per_batch = [c for c in self.callbacks if _overrides(c, "on_batch_begin")]
        self.state = TrainState()
        self.should_stop = False
        named = dict.fromkeys([*task_metrics, config.select_metric])
        self.task_metrics = tuple(
            name
            for name in named
            if (m := METRIC_REGISTRY.get(name)) is not None and m.task and not m.per_class
        )

    def fit(self) -> TrainState:
        """Resume if configured, train the remaining epochs and return the final state."""
        self._resume()
        with above_progress_bars():  # log lines and warnings above the bars, not in them
            self._emit("on_train_begin")
            for epoch in range(self.state.epoch, self.config.epochs):
                if self.should_stop:
                    break
                self._epoch(epoch)
            self._emit("on_train_end")
        return self.state

    def warn(self, message: str) -> None:
        """Keep ``message`` for the results and the card, and log it once (main process), as
        every other warning of a run is."""
        self.state.warnings.append(message)
        if self.accelerator.is_main_process:
            logger.warning(message)

    def _emit(self, hook: str, *args: object) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def _resume(self) -> None:
        """Register what Accelerate checkpoints beside the prepared objects; load the latest
        checkpoint (``train.resume: auto``) with the callbacks' states; measure ‖θ‖ at start."""
        self.accelerator.register_for_checkpointing(self.parts.scheduler)
        for module in self.objective.checkpointed_modules():
            self.accelerator.register_for_checkpointing(module)
        for callback in self.callbacks:  # after the loop's own: their numbering stays
            for thing in callback.checkpointed():
                self.accelerator.register_for_checkpointing(thing)
        checkpoint = latest_checkpoint(self.run_dir) if self.config.resume == "auto" else None
        if checkpoint is not None:
            self.accelerator.load_state(str(checkpoint))
            self.state = TrainState(**json.loads((checkpoint / TRAINER_STATE).read_text()))
            self.accelerator.print(f"resuming from {checkpoint} (epoch {self.state.epoch} done)")
            for callback in self.callbacks:
                if callback.state_key in self.state.callbacks:
                    callback.load_state_dict(self.state.callbacks[callback.state_key])
        if self.state.initial_param_norm is None:
            self.state.initial_param_norm = param_norm(self._network_parameters())

    def _network_parameters(self) -> list[nn.Parameter]:
        """The network's parameters, frozen or not: the divergence check's fixed set for ‖θ‖."""
        return list(self.objective.model.parameters())

    def _epoch(self, epoch: int) -> None:
        """Train, validate and select; then the callbacks' epoch end and the checkpoint."""
        started = time.perf_counter()
        # Train mode before the hook, so that a callback may set parts of the model to eval.
        self.objective.train()
        self._emit("on_epoch_begin", epoch)
        summary = self._train_epoch(epoch)
        self.state.epoch = epoch + 1
        record = {"epoch": self.state.epoch, "step": self.state.step, **summary}
        record["param_norm"] = param_norm(self._network_parameters())
        val = self._validate(record)
        record.update({f"val_{k}": v for k, v in val.items()})
        select = self.config.select_metric
        if _improved(select, val[select], self.state.best_value):
            self.state.best_value, self.state.best_epoch = val[select], self.state.epoch
            if self.accelerator.is_main_process:
                self.save_best(self.accelerator.unwrap_model(self.objective.model))
        logged = {k: v for k, v in record.items() if k != "epoch"}
        self.accelerator.log(logged, step=self.state.step)
        record["seconds"] = time.perf_counter() - started
        self.accelerator.print(_epoch_line(record, select, self.config.epochs))
        self.state.seconds += record["seconds"]
        self.state.history.append(record)
        self._emit("on_epoch_end", record)
        self.state.callbacks = {c.state_key: s for c in self.callbacks if (s := c.state_dict())}
        _save_checkpoint(self.accelerator, self.run_dir, self.state)

    def _validate(self, record: dict[str, float]) -> dict[str, float]:
        """The validation metrics: the loop's (accuracy, NLL, …), then the callbacks'."""
        self._emit("on_validation_begin")
        # FS-VI's predictor returns log-probabilities, which log_softmax leaves as they are.
        predictor = self.objective.predictor(self.config.seed)
        logits, labels = predict_logits(predictor, self.parts.val_loader, self.accelerator)
        log_probs = torch.log_softmax(logits, dim=-1)  # (N_v, K)
        validation = Validation(predictor, logits, labels, log_probs, record)
        # Before the metrics: a diverged run's non-finite predictions stop it here, not in them.
        self._emit("on_validation_end", validation)
        found = classification_metrics(log_probs, labels, self.task_metrics)
        val = {k: float(v) for k, v in found.items()}
        return val | validation.metrics

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training loader; the epoch's mean loss terms and learning rate."""
        loader = self.parts.train_loader
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        if loader.num_workers == 0:
            seed = epoch_seed(self.config.seed, epoch)
            seed_transform(getattr(loader.dataset, "transform", None), seed)
        context = self.parts.context
        ctx_iter = context.epoch(epoch) if context is not None else None
        sums: dict[str, Tensor] = {}
        count = 0
        bar = progress_bar(
            loader,
            desc=f"epoch {epoch + 1}/{self.config.epochs}",
            show=self.accelerator.is_main_process,
            leave=False,
        )
        for x, y in bar:
            terms = self._step(x, y, ctx_iter)
            for key in _TERMS:
                sums[key] = sums.get(key, 0.0) + terms[key].detach().float()
            count += 1
            # One host sync per log interval, not per step: also where a NaN is caught.
            if count % self.config.log_every == 0 or count == len(loader):
                shown = cast(dict[str, str], _fmt(self._means(sums, count, epoch), short=True))
                bar.set_postfix(shown, refresh=False)
        means = {k: float(v) / max(count, 1) for k, v in sums.items()}
        lr = cast(float, self.parts.scheduler.get_last_lr()[0])  # the schedule's: a float
        return {f"train_{k}": v for k, v in means.items()} | {"lr": lr}

    def _step(self, x: Tensor, y: Tensor, ctx_iter: _Contexts | None) -> dict[str, Tensor]:
        """Forward and backward one batch; an optimiser step when the accumulation is full."""
        accelerator, objective = self.accelerator, self.objective
        for callback in self._per_batch:
            x, y = callback.on_batch_begin(self, x, y)
        with accelerator.accumulate(objective.model):
            ctx, feats = next(ctx_iter) if ctx_iter is not None else (None, None)
            with accelerator.autocast():
                terms = objective(x, y, ctx, feats)
            accelerator.backward(terms["loss"])
            stepped = accelerator.sync_gradients
            if stepped and self.optim.grad_clip_norm is not None:
                parameters = objective.trainable_parameters()
                accelerator.clip_grad_norm_(parameters, self.optim.grad_clip_norm)
            self.parts.optimizer.step()
            self.parts.optimizer.zero_grad(set_to_none=True)
            if stepped:
                self.parts.scheduler.step()
                self.state.step += 1
        if stepped:
            for callback in self._per_step:
                callback.on_step_end(self, terms)
        return terms

    def _means(self, sums: Mapping[str, Tensor], count: int, epoch: int) -> dict[str, float]:
        """The running means of the loss terms (a host sync); stop if one is not finite."""
        means = {k: float(v) / count for k, v in sums.items()}
        if not all(math.isfinite(v) for v in means.values()):
            raise NonFiniteLossError(
                _non_finite_message(
                    self.optim,
                    self.objective.reg_scale,
                    self.run_dir,
                    self.accelerator,
                    epoch,
                    self.state,
                    means,
                )
            )
        return means


def _overrides(callback: Callback, hook: str) -> bool:
    """Whether ``callback``'s class defines ``hook`` rather than inheriting the no-op."""
    return getattr(type(callback), hook) is not getattr(Callback, hook)


def param_norm(params: Sequence[Tensor]) -> float:
    """‖θ‖₂ over ``params`` (one host sync): the scale the divergence check compares."""
    with torch.no_grad():
        return math.sqrt(float(sum(p.detach().float().pow(2).sum() for p in params)))


def _non_finite_message(
    optim: OptimConfig,
    reg_scale: float,
    run_dir: Path,
    accelerator: Accelerator,
    epoch: int,
    state: TrainState,
    means: dict[str, float],
) -> str:
    """What happened, what is kept (only what exists) and the remedies that apply to this run."""
    # Only this run's checkpoints count (train.resume=never may find an older run's).
    kept = latest_checkpoint(run_dir) if state.epoch > 0 else None
    if kept is None:
        saved = "no epoch had finished, so there is no checkpoint to resume from"
    else:
        saved = f"the last good checkpoint is kept in {kept}"
    remedies = ["lower optim.lr"]
    if reg_scale > 0:
        remedies.append("raise fseb.prior_cov_diag")
    if optim.grad_clip_norm is None:
        remedies.append("set optim.grad_clip_norm")
    if applied_precision(accelerator) != "no":
        remedies.append(
            f"use train.mixed_precision=no (this run used {applied_precision(accelerator)})"
        )
    return (
        f"training loss became non-finite in epoch {epoch + 1} near step {state.step} "
        f"({_fmt(means)}); {saved}. Try: {', '.join(remedies)}."
    )


def _improved(metric: str, value: float, best: float | None) -> bool:
    """Whether ``value`` beats ``best``: a number beats NaN (an undefined metric, such as an
    AUROC on a validation split missing a class), NaN beats nothing but a first epoch."""
    if best is None or (math.isnan(best) and not math.isnan(value)):
        return True
    return value > best if higher_is_better(metric) else value < best


def _save_checkpoint(accelerator: Accelerator, run_dir: Path, state: TrainState) -> None:
    root = run_dir / CHECKPOINTS
    final = root / checkpoint_name(state.epoch)
    tmp = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    kept = latest_checkpoint(run_dir)
    hint = f"{kept} is intact; rerun to resume from it" if kept else "no checkpoint was lost"
    with cleaned_on_failure(tmp, what=f"checkpoint {final.name}", hint=hint):
        accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            (tmp / TRAINER_STATE).write_text(json.dumps(_saved(state), indent=1))
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        publish(tmp, final)
        for old in root.glob(f"{CHECKPOINT_PREFIX}*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def _saved(state: TrainState) -> dict[str, object]:
    """``state`` as ``trainer_state.json`` holds it: without callback states when there are
    none, nor a stop's reason without a stop, so such a run writes the file it did before."""
    saved = asdict(state)
    for key in ("callbacks", "stopped"):
        if not saved[key]:
            del saved[key]
    return saved


def _fmt(values: dict[str, float], short: bool = False) -> dict[str, str] | str:
    items = {k: f"{v:.4g}" for k, v in values.items()}
    return items if short else ", ".join(f"{k}={v}" for k, v in items.items())


EPOCH_LINE_WIDTH = 80
"""Terminal columns the per-epoch summary fits in; every number is in ``run.json``'s history."""


def _epoch_line(record: dict[str, float], select: str, epochs: int) -> str:
    """The epoch's key numbers: training loss, validation accuracy and NLL, seconds, and the
    selection metric ``select`` when it is another (on a second line when it does not fit)."""
    head = f"epoch {record['epoch']}/{epochs}: train loss {record['train_loss']:.4g} | "
    val = f"val acc {record['val_accuracy']:.2%}, nll {record['val_nll']:.4g}"
    tail = f" | {record['seconds']:.1f} s"
    if select in ("accuracy", "nll"):
        return head + val + tail
    extra = f"{select} {record[f'val_{select}']:.4g}"
    line = f"{head}{val}, {extra}{tail}"
    return line if len(line) <= EPOCH_LINE_WIDTH else f"{head}{val}{tail}\n  val {extra}"
