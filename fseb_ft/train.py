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
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm

from fseb_ft.config import OptimConfig, Recipe
from fseb_ft.data import seed_transform
from fseb_ft.evaluate import predict
from fseb_ft.metrics import classification_metrics
from fseb_ft.objective import FSEBObjective

__all__ = [
    "ContextStream",
    "NonFiniteLossError",
    "TrainState",
    "applied_precision",
    "build_optimizer",
    "build_scheduler",
    "fit",
    "latest_checkpoint",
    "launch_warnings",
    "make_accelerator",
]

logger = logging.getLogger("fseb_ft")
_HIGHER_IS_BETTER = {"accuracy"}
_STATE_FILE = "trainer_state.json"


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


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


class _SeededPermutations(Sampler[int]):
    """An endless stream of seeded permutations of ``range(n)``, restarted by :meth:`set_epoch`."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        while True:
            yield from torch.randperm(self.n, generator=g).tolist()


class _IndexedPool(torch.utils.data.Dataset):
    """``(image, pool index)`` so cached φ0 features can be looked up by index."""

    def __init__(self, pool: torch.utils.data.Dataset) -> None:
        self.pool = pool

    def __len__(self) -> int:
        return len(self.pool)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.pool[i], i

    def reseed(self, seed: int) -> None:
        """Reseed the pool's transform (DataLoader workers call this)."""
        self.pool.reseed(seed)


class ContextStream:
    """Context batches ``x̂`` (and, for a fixed pool, their cached φ0 features) for every step.

    A fixed pool (deterministic transform) has its features ``h(x̂; φ0)`` computed once, so the
    step runs no φ0 forward. Each process draws from its own seeded permutation of the pool, so
    processes regularise different context batches (design §6).
    """

    def __init__(
        self,
        pool: Any,
        batch_size: int,
        seed: int,
        accelerator: Accelerator,
        objective: FSEBObjective,
        num_workers: int = 0,
    ) -> None:
        self.pool = pool
        self.device = accelerator.device
        self.num_workers = num_workers
        self.seed = seed + 7919 * accelerator.process_index
        self.sampler = _SeededPermutations(len(pool), self.seed)
        self.loader = DataLoader(
            _IndexedPool(pool),
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=num_workers,
            drop_last=True,
            pin_memory=self.device.type == "cuda",
        )
        self.features = self._cache(pool, objective, accelerator) if pool.is_fixed else None

    def _cache(self, pool: Any, objective: FSEBObjective, accelerator: Accelerator) -> Tensor:
        loader = DataLoader(pool, batch_size=256, num_workers=self.num_workers)
        chunks = []
        with accelerator.autocast():
            for x in tqdm(loader, desc="φ0 features", disable=not accelerator.is_main_process):
                chunks.append(objective.prior_features(x.to(self.device)).float())
        return torch.cat(chunks)  # (P, D)

    def epoch(self, epoch: int) -> Iterator[tuple[Tensor, Tensor | None]]:
        """Endless ``(x̂, cached features or None)`` for one training epoch, seeded by epoch."""
        self.sampler.set_epoch(epoch)
        if self.num_workers == 0:
            self.pool.reseed(self.seed * 1_000_003 + epoch)
        for x, idx in self.loader:
            x = x.to(self.device, non_blocking=True)  # (M, C, H, W)
            feats = (
                None
                if self.features is None
                else self.features[idx.to(self.device, non_blocking=True)]
            )
            yield x, feats


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


def make_accelerator(recipe: Recipe, run_dir: Path) -> Accelerator:
    """The run's Accelerator: precision, accumulation, trackers, and seedable shuffling."""
    return Accelerator(
        mixed_precision=recipe.train.mixed_precision,
        gradient_accumulation_steps=recipe.train.grad_accum_steps,
        # On a machine with no accelerator, say so: a torchrun/multi-process launch then sets
        # up gloo (multi-CPU) instead of leaving every process to train on its own.
        cpu=recipe.train.cpu or not _has_accelerator(),
        log_with=_trackers(recipe.train.trackers) or None,
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


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory (one with a trainer state), if any."""
    root = run_dir / "checkpoints"
    done = sorted(p for p in root.glob("epoch-*") if (p / _STATE_FILE).is_file())
    return done[-1] if done else None


def fit(
    *,
    recipe: Recipe,
    accelerator: Accelerator,
    objective: FSEBObjective,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_loader: DataLoader,
    val_loader: DataLoader,
    context: ContextStream | None,
    run_dir: Path,
    save_best: Callable[[nn.Module], None],
) -> TrainState:
    """Train for ``recipe.train.epochs``, validating, checkpointing and resuming as configured.

    ``train_loader``/``val_loader`` and ``objective.model``/``optimizer`` must already be
    prepared by ``accelerator``; ``scheduler`` is stepped here once per optimiser step (not
    prepared, so it counts real steps) and registered for checkpointing.
    """
    cfg = recipe.train
    state = TrainState()
    accelerator.register_for_checkpointing(scheduler)
    checkpoint = latest_checkpoint(run_dir) if cfg.resume == "auto" else None
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        state = TrainState(**json.loads((checkpoint / _STATE_FILE).read_text()))
        accelerator.print(f"resuming from {checkpoint} (epoch {state.epoch} done)")
    model = objective.model
    for epoch in range(state.epoch, cfg.epochs):
        train_summary = _train_epoch(
            recipe,
            accelerator,
            objective,
            optimizer,
            scheduler,
            train_loader,
            context,
            state,
            epoch,
        )
        log_probs, labels = predict(model, val_loader, accelerator)
        val = {k: float(v) for k, v in classification_metrics(log_probs, labels).items()}
        state.epoch = epoch + 1
        record = {"epoch": state.epoch, "step": state.step, **train_summary}
        record.update({f"val_{k}": v for k, v in val.items()})
        state.history.append(record)
        if _improved(cfg.select_metric, val[cfg.select_metric], state.best_value):
            state.best_value, state.best_epoch = val[cfg.select_metric], state.epoch
            if accelerator.is_main_process:
                save_best(accelerator.unwrap_model(model))
        accelerator.log({k: v for k, v in record.items() if k != "epoch"}, step=state.step)
        accelerator.print(_epoch_line(record, cfg.select_metric))
        _save_checkpoint(accelerator, run_dir, state)
    return state


def _train_epoch(
    recipe: Recipe,
    accelerator: Accelerator,
    objective: FSEBObjective,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_loader: DataLoader,
    context: ContextStream | None,
    state: TrainState,
    epoch: int,
) -> dict[str, float]:
    cfg = recipe.train
    seed = cfg.seed * 1_000_003 + epoch
    if hasattr(train_loader, "set_epoch"):
        train_loader.set_epoch(epoch)
    if recipe.data.num_workers == 0:
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
            if accelerator.sync_gradients and recipe.optim.grad_clip_norm is not None:
                accelerator.clip_grad_norm_(
                    objective.trainable_parameters(), recipe.optim.grad_clip_norm
                )
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
                    f"training loss became non-finite in epoch {epoch + 1} near step "
                    f"{state.step} ({_fmt(means)}); the last good checkpoint is kept in "
                    f"{Path(recipe.output.dir) / 'checkpoints'}. Lower optim.lr, use "
                    "train.mixed_precision=no, or raise fseb.prior_cov_diag."
                )
            bar.set_postfix(_fmt(means, short=True), refresh=False)
    means = {k: float(v) / max(count, 1) for k, v in sums.items()}
    return {f"train_{k}": v for k, v in means.items()} | {"lr": scheduler.get_last_lr()[0]}


def _improved(metric: str, value: float, best: float | None) -> bool:
    if best is None:
        return True
    return value > best if metric in _HIGHER_IS_BETTER else value < best


def _save_checkpoint(accelerator: Accelerator, run_dir: Path, state: TrainState) -> None:
    root = run_dir / "checkpoints"
    final = root / f"epoch-{state.epoch:04d}"
    tmp = root / f".tmp-epoch-{state.epoch:04d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / _STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in root.glob("epoch-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def _fmt(values: dict[str, float], short: bool = False) -> dict[str, str] | str:
    items = {k: f"{v:.4g}" for k, v in values.items()}
    return items if short else ", ".join(f"{k}={v}" for k, v in items.items())


def _epoch_line(record: dict[str, float], select: str) -> str:
    keys = ["train_loss", "train_nll", "train_fs_reg", "val_accuracy", "val_nll", "val_ece"]
    shown = " ".join(f"{k}={record[k]:.4f}" for k in keys if k in record)
    return f"epoch {record['epoch']}: {shown} (selecting on val_{select})"
