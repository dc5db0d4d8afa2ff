"""The speed and memory keys against eager, PS-MAP and FS-EB side by side (issue 25, item 3).

    OMP_NUM_THREADS=1 python -m benchmarks.speed_keys [--models resnet18 efficientnet_lite0]
        [--size 64] [--batch 64] [--context 32] [--steps 10] [--threads 1]

Each training step (forward, backward, SGD step) is :class:`fseb_ft.method.objective.
FSEBObjective`'s on a model prepared by :func:`fseb_ft.engine.speed.apply_speed_keys`, as a run
prepares it; FS-EB uses a fixed context of ``--context`` points whose φ0 features are cached (the
CIFAR-100 context of the transfer protocol). Variants of one model:

- ``eager``: no key; ``channels_last``: ``train.channels_last``; ``compile``: ``train.compile``
  (inductor); ``grad_ckpt``: ``model.grad_checkpointing``.

**Time.** Every variant's PS-MAP and FS-EB steps alternate after ``--warmup`` steps each, so
load on the machine falls on all alike; each time is the median of ``--steps``. ``compile``'s
first step, compilation included, is reported on its own.

**Memory.** Each (model, method, checkpointing off/on) runs its steps in a fresh process, with
glibc returning freed memory at once, which reports its peak resident set size over the steps
after the first (``VmHWM``, reset after it) above its resident size then: what a step's
activations, gradients and workspace hold at their peak.
``tracemalloc`` cannot measure this: it traces Python's allocator, not torch's C++ tensors.

The inputs are synthetic tensors already in memory: a step's cost does not depend on pixel
values. The last line printed is a JSON object of ratios to ``eager`` (time) and of the
checkpointed peak to the plain one (memory).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import timm
import torch

from fseb_ft.engine.allocator import keep_freed_memory
from fseb_ft.engine.speed import apply_speed_keys
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ModelConfig, TrainConfig

MODELS = ("resnet18", "efficientnet_lite0")
VARIANTS = {
    "eager": {},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "grad_ckpt": {"grad_checkpointing": True},
}
METHODS = {"PS-MAP": 0.0, "FS-EB": 1.0}  # reg_scale
CLASSES = 10


def build_step(
    name: str, reg_scale: float, keys: dict[str, bool], size: int, batch: int, context: int
) -> Callable[[], float]:
    """One method's training step on ``name`` with the speed ``keys`` applied, on fixed inputs;
    the step returns its loss."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=CLASSES)
    objective = FSEBObjective(
        model, num_train=9000, reg_scale=reg_scale, prior_var=1.0,
        prior_cov_scale=1e-5, prior_cov_diag=1.0,
    )  # fmt: skip
    model_cfg = ModelConfig(name=name, grad_checkpointing=keys.get("grad_checkpointing", False))
    train_cfg = TrainConfig(
        channels_last=keys.get("channels_last", False), compile=keys.get("compile", False)
    )
    apply_speed_keys(objective, model_cfg, train_cfg)
    objective.train()
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)  # (B, 3, S, S)
    y = torch.randint(0, CLASSES, (batch,), generator=g)  # (B,)
    ctx = torch.randn(context, 3, size, size, generator=g) if reg_scale else None  # (M, 3, S, S)
    feats = objective.prior_features(ctx) if ctx is not None else None  # (M, D): cached φ0

    def step() -> float:
        terms = objective(x, y, ctx, feats)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()
        return terms["loss"].item()

    return step


def time_model(name: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median step ms of every (variant, method), interleaved; the first step's time (compile's
    includes compiling) and its loss's relative difference from eager's."""
    steps = {
        (variant, method): build_step(name, reg, keys, args.size, args.batch, args.context)
        for variant, keys in VARIANTS.items()
        for method, reg in METHODS.items()
    }
    first, loss = {}, {}
    for key, fn in steps.items():
        t0 = time.perf_counter()
        loss[key] = fn()  # compile's first call compiles the forward and the backward
        first[key] = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        for fn in steps.values():
            fn()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
    for _ in range(args.steps):
        for key, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {
        f"{variant}/{method}": {
            "ms": statistics.median(times[variant, method]) * 1e3,
            "first_s": first[variant, method],
            # Same weights, same inputs: the first step's loss against eager's.
            "loss_rel_diff": abs(loss[variant, method] / loss["eager", method] - 1),
        }
        for variant, method in steps
    }


def _status_mib(field: str) -> float:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), MiB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB


def _return_freed_memory() -> None:
    """glibc's mmap and trim thresholds fixed at 128 KiB (a fixed value also stops glibc raising
    them as it goes): every large tensor is mapped when allocated and unmapped when freed, so the
    resident set follows what is live rather than what the allocator keeps for reuse."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    for param in (-3, -1):  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (malloc.h)
        libc.mallopt(param, 128 * 1024)


def probe_memory(name: str, method: str, ckpt: bool, args: argparse.Namespace) -> float:
    """In this (fresh) process: the peak RSS of ``--steps`` steps above the RSS before them, MiB.

    One untimed step first creates what persists between steps (the optimiser's momentum, the
    libraries' caches); then the peak (``VmHWM``) is reset to the current RSS (Linux's
    ``/proc/self/clear_refs``), so only what a step allocates and frees counts.
    """
    _return_freed_memory()
    keys = {"grad_checkpointing": ckpt}
    step = build_step(name, METHODS[method], keys, args.size, args.batch, args.context)
    step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS to the RSS now
    before = _status_mib("VmRSS")
    for _ in range(args.steps):
        step()
    return _status_mib("VmHWM") - before


def memory_model(name: str, args: argparse.Namespace) -> dict[str, float]:
    """Peak step memory (MiB) of each (method, checkpointing), each in a fresh process."""
    out = {}
    for method in METHODS:
        for ckpt in (False, True):
            cmd = [sys.executable, "-m", "benchmarks.speed_keys", "--probe", name, method,
                   str(ckpt), "--size", str(args.size), "--batch", str(args.batch),
                   "--context", str(args.context), "--steps", "3", "--threads",
                   str(torch.get_num_threads())]  # fmt: skip
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            out[f"{'grad_ckpt' if ckpt else 'eager'}/{method}"] = float(line.split()[-1])
    return out


def report(name: str, timing: dict, memory: dict) -> tuple[str, dict[str, float]]:
    """Markdown rows of one model and its ratios."""
    lines, ratios = [], {}
    for variant in VARIANTS:
        cells = []
        for method in METHODS:
            row = timing[f"{variant}/{method}"]
            ratio = row["ms"] / timing[f"eager/{method}"]["ms"]
            ratios[f"{name}/{variant}/{method}"] = round(ratio, 3)
            diff = float(f"{row['loss_rel_diff']:.1e}")
            ratios[f"{name}/{variant}/{method}/loss_rel_diff"] = diff
            cells += [f"{row['ms']:.0f}", f"**{ratio:.2f}**"]
        mem = [memory.get(f"{variant}/{m}") for m in METHODS]
        mem_cells = ["—" if v is None else f"{v:.0f}" for v in mem]
        first = timing[f"{variant}/FS-EB"]["first_s"]
        diff = max(timing[f"{variant}/{m}"]["loss_rel_diff"] for m in METHODS)
        cells += [*mem_cells, f"{first:.1f}", f"{diff:.1e}"]
        lines.append(f"| {name} | {variant} | " + " | ".join(cells) + " |")
    for method in METHODS:
        ratios[f"{name}/grad_ckpt/{method}/memory"] = round(
            memory[f"grad_ckpt/{method}"] / memory[f"eager/{method}"], 3
        )
    return "\n".join(lines), ratios


def main() -> None:
    """CLI: print the Markdown table, then the JSON line of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--size", type=int, default=64, help="input resolution")
    parser.add_argument("--batch", type=int, default=64, help="B, training images per step")
    parser.add_argument("--context", type=int, default=32, help="M, FS-EB's context points")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--probe", nargs=3, metavar=("MODEL", "METHOD", "CKPT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.probe:
        name, method, ckpt = args.probe
        print(f"{probe_memory(name, method, ckpt == 'True', args):.1f}")
        return
    keep_freed_memory()  # for the times: as fseb_ft.finetune does on CPU
    print(f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} "
          f"threads; torch {torch.__version__}; B = {args.batch}, M = {args.context}, "
          f"{args.size}×{args.size}")  # fmt: skip
    print("| model | variant | PS-MAP ms | ratio | FS-EB ms | ratio | PS-MAP peak MiB | "
          "FS-EB peak MiB | first FS-EB step (s) | first loss vs eager |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, float] = {}
    for name in args.models:
        rows, got = report(name, time_model(name, args), memory_model(name, args))
        print(rows, flush=True)
        ratios |= got
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
