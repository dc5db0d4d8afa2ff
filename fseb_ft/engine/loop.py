"""The one Accelerate training loop (PS-MAP and FS-EB are configurations of it).

Mixed precision, gradient accumulation and multi-process come from Accelerate. Every epoch ends
with a validation pass and an atomic checkpoint (written to a temporary directory, then renamed),
so ``train.resume: auto`` continues a killed run from its last complete epoch with the same
result as an uninterrupted one: shuffling, augmentation and the context stream are reseeded from
(seed, epoch) rather than carried over in opaque iterator state.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fseb_ft.data.transforms import epoch_seed, seed_transform
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.metrics import (
    chance_accuracy,
    chance_nll,
    classification_metrics,
    ood_detection,
)
from fseb_ft.evaluation.ood import ood_score
from fseb_ft.evaluation.predictions import predict_logits
from fseb_ft.logs import above_progress_bars
from fseb_ft.method.context import ContextStream
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import VAL_OOD_METRIC_SUFFIX, OptimConfig, TrainConfig, val_ood_metric
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
    "TrainState",
    "TrainingDivergedError",
    "applied_precision",
    "build_optimizer",
    "build_scheduler",
    "fit",
    "higher_is_better",
    "launch_warnings",
    "make_accelerator",
]

logger = logging.getLogger("fseb_ft")
_HIGHER_IS_BETTER = {"accuracy"}


class NonFiniteLossError(FsebError, RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class TrainingDivergedError(FsebError, RuntimeError):
    """The parameter norm grew past ``train.max_param_growth`` × its start: training diverged."""


@dataclass
class TrainState:
    """Loop progress saved with every checkpoint."""

    epoch: int = 0
    """Epochs completed."""
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


def build_optimizer(cfg: OptimConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD-momentum or AdamW; no decoupled decay because the parameter prior ``R_θ`` decays."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)


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


def fit(
    *,
    train: TrainConfig,
    optim: OptimConfig,
    num_workers: int,
    accelerator: Accelerator,
    objective: FSEBObjective,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_loader: DataLoader,
    val_loader: DataLoader,
    context: ContextStream | None,
    run_dir: Path,
    save_best: Callable[[nn.Module], None],
    on_epoch_end: Callable[[dict[str, float]], None] | None = None,
    val_ood_loaders: Mapping[str, DataLoader] | None = None,
    ood_score_name: str = "entropy",
    suggest_zero_head: bool = False,
) -> TrainState:
    """Train for ``train.epochs``, validating, checkpointing and resuming as configured.

    ``train_loader``/``val_loader`` and ``objective.model``/``optimizer`` must already be
    prepared by ``accelerator``; ``scheduler`` is stepped here once per optimiser step (not
    prepared, so it counts real steps) and registered for checkpointing. ``num_workers`` is the
    training loader's (``data.num_workers``): without workers, its transform is reseeded here.
    FS-VI validates with its Monte-Carlo predictive (``objective.predictor``) and checkpoints
    its σ with the rest. ``on_epoch_end`` receives each epoch's record (with its ``val_*``
    metrics) once the epoch's checkpoint is saved, so an exception it raises (a sweep pruning
    the trial) loses nothing.
    ``val_ood_loaders`` (prepared; ``data.val_ood``) are predicted after each validation and
    scored against it by ``ood_score_name``: ``val_ood_<name>_auroc`` in the record.
    ``suggest_zero_head``: a divergence message advises ``model.head_init=zeros`` (for a
    pretrained backbone with a random new head; a network trained from scratch needs that one).
    """
    state = TrainState()
    accelerator.register_for_checkpointing(scheduler)
    if objective.variational is not None:  # FS-VI's ρ: not part of the prepared model
        accelerator.register_for_checkpointing(objective.variational)
    checkpoint = latest_checkpoint(run_dir) if train.resume == "auto" else None
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        state = TrainState(**json.loads((checkpoint / TRAINER_STATE).read_text()))
        accelerator.print(f"resuming from {checkpoint} (epoch {state.epoch} done)")
    model = objective.model
    if state.initial_param_norm is None:
        state.initial_param_norm = param_norm(objective.model_parameters())
    with above_progress_bars():  # log lines and warnings above the bars, not in them
        for epoch in range(state.epoch, train.epochs):
            started = time.perf_counter()
            train_summary = _train_epoch(
                train,
                optim,
                num_workers,
                run_dir,
                accelerator,
                objective,
                optimizer,
                scheduler,
                train_loader,
                context,
                state,
                epoch,
            )
            # FS-VI's predictor returns log-probabilities, which log_softmax leaves as they are.
            predictor = objective.predictor(train.seed)
            logits, labels = predict_logits(predictor, val_loader, accelerator)  # (N_v, K), (N_v,)
            log_probs = torch.log_softmax(logits, dim=-1)  # (N_v, K)
            state.epoch = epoch + 1
            record = {"epoch": state.epoch, "step": state.step, **train_summary}
            record["param_norm"] = param_norm(objective.model_parameters())
            _check_divergence(
                record,
                log_probs,
                state.initial_param_norm,
                train.max_param_growth,
                suggest_zero_head=suggest_zero_head,
            )
            val = {k: float(v) for k, v in classification_metrics(log_probs, labels).items()}
            for name, loader in (val_ood_loaders or {}).items():
                val[val_ood_metric(name)] = _val_ood_auroc(
                    predictor, loader, accelerator, ood_score_name, logits
                )
            record.update({f"val_{k}": v for k, v in val.items()})
            record["val_chance_accuracy"] = float(chance_accuracy(labels))
            if _improved(train.select_metric, val[train.select_metric], state.best_value):
                state.best_value, state.best_epoch = val[train.select_metric], state.epoch
                if accelerator.is_main_process:
                    save_best(accelerator.unwrap_model(model))
            accelerator.log({k: v for k, v in record.items() if k != "epoch"}, step=state.step)
            record["seconds"] = time.perf_counter() - started
            accelerator.print(_epoch_line(record, train.select_metric, train.epochs))
            state.seconds += record["seconds"]
            state.history.append(record)
            if state.epoch == train.epochs and all(_at_chance(r) for r in state.history):
                _warn(state, accelerator, _chance_warning(state.history, labels))
            _save_checkpoint(accelerator, run_dir, state)
            if on_epoch_end is not None:
                on_epoch_end(record)
    return state


def _val_ood_auroc(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator, score: str, val_logits: Tensor
) -> float:
    """AUROC of the OOD score ``score`` separating ``loader``'s images from the validation split
    (``val_logits``, (N_v, K)); OOD is the positive class (docs/method.md, "Metrics")."""
    ood_logits = predict_logits(model, loader, accelerator)[0]  # (N_o, K)
    s_in = ood_score(score, torch.softmax(val_logits, -1), val_logits)  # (N_v,)
    s_out = ood_score(score, torch.softmax(ood_logits, -1), ood_logits)  # (N_o,)
    return float(ood_detection(s_in, s_out)["auroc"])


def param_norm(params: Sequence[Tensor]) -> float:
    """‖θ‖₂ over ``params`` (one host sync): the scale the divergence check compares."""
    with torch.no_grad():
        return math.sqrt(float(sum(p.detach().float().pow(2).sum() for p in params)))


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


def _warn(state: TrainState, accelerator: Accelerator, message: str) -> None:
    """Keep ``message`` for the results and the card, and log it once (main process), as every
    other warning of a run is."""
    state.warnings.append(message)
    if accelerator.is_main_process:
        logger.warning(message)


def _train_epoch(
    cfg: TrainConfig,
    optim: OptimConfig,
    num_workers: int,
    run_dir: Path,
    accelerator: Accelerator,
    objective: FSEBObjective,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_loader: DataLoader,
    context: ContextStream | None,
    state: TrainState,
    epoch: int,
) -> dict[str, float]:
    seed = epoch_seed(cfg.seed, epoch)
    if hasattr(train_loader, "set_epoch"):
        train_loader.set_epoch(epoch)
    if num_workers == 0:
        seed_transform(getattr(train_loader.dataset, "transform", None), seed)
    objective.train()
    ctx_iter = context.epoch(epoch) if context is not None else None
    sums: dict[str, Tensor] = {}
    count = 0
    bar = tqdm(
        train_loader,
        desc=f"epoch {epoch + 1}/{cfg.epochs}",
        disable=not accelerator.is_main_process,
        leave=False,
    )
    for x, y in bar:
        with accelerator.accumulate(objective.model):
            ctx, feats = next(ctx_iter) if ctx_iter is not None else (None, None)
            with accelerator.autocast():
                terms = objective(x, y, ctx, feats)
            accelerator.backward(terms["loss"])
            if accelerator.sync_gradients and optim.grad_clip_norm is not None:
                accelerator.clip_grad_norm_(objective.trainable_parameters(), optim.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if accelerator.sync_gradients:
                scheduler.step()
                state.step += 1
        for key in ("loss", "nll", "fs_reg", "param_reg"):
            sums[key] = sums.get(key, 0.0) + terms[key].detach().float()
        count += 1
        # One host sync per log interval, not per step: also where a NaN is caught.
        if count % cfg.log_every == 0 or count == len(train_loader):
            means = {k: float(v) / count for k, v in sums.items()}
            if not all(math.isfinite(v) for v in means.values()):
                raise NonFiniteLossError(
                    _non_finite_message(
                        optim, objective.reg_scale, run_dir, accelerator, epoch, state, means
                    )
                )
            bar.set_postfix(_fmt(means, short=True), refresh=False)
    means = {k: float(v) / max(count, 1) for k, v in sums.items()}
    return {f"train_{k}": v for k, v in means.items()} | {"lr": scheduler.get_last_lr()[0]}


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


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of the validation ``metric`` is better (accuracy, a
    ``data.val_ood`` set's ``ood_<name>_auroc``) or worse (NLL, ECE, Brier)."""
    return metric in _HIGHER_IS_BETTER or metric.endswith(VAL_OOD_METRIC_SUFFIX)


def _improved(metric: str, value: float, best: float | None) -> bool:
    if best is None:
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
            (tmp / TRAINER_STATE).write_text(json.dumps(asdict(state), indent=1))
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        publish(tmp, final)
        for old in root.glob(f"{CHECKPOINT_PREFIX}*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


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
