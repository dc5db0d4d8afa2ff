"""Where PS-MAP's step spends the time timm's plain step does not: ``torch.profiler`` over both
steps of :mod:`benchmarks.gpu.throughput` (docs/performance.md, "GPU": PS-MAP at 1.13× timm on
ResNet-50 against a goal of 1.05×).

    python -m benchmarks.gpu.profile [--model resnet50] [--batch 128] [--size 224] [--steps 5]
        [--variants eager compile]

Each step is built as the throughput part builds it (bf16 autocast, ``channels_last``,
synthetic tensors on the device; under ``compile``, ``model.compile()``, which leaves the loss
and ``R_θ`` eager), warmed up, then profiled for ``--steps`` steps, each synchronised. Per
step and method it reports the wall time, the summed time of the device's kernels and their
number (a step whose kernels fill its wall time is bound by the device, not by launching
them), and per operator the device time and calls; then the operators whose figures
differ between the two methods, largest difference first. The last line is a JSON object of
the totals and that table per variant.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu.tables import PROFILED as METHODS
from benchmarks.gpu.tables import report
from benchmarks.gpu.throughput import Step, _sync, fseb_step, setup_of, timm_step

VARIANTS = ("eager", "compile")
SHOWN = 15
"""Operators called as often by both steps that the difference table lists."""


@dataclass(frozen=True)
class Profile:
    """One method's profiled steps, per step."""

    wall_ms: float
    kernel_ms: float
    """The summed durations of the device's kernels (on the CPU: 0)."""
    kernels: float
    """Kernels launched (on the CPU: 0)."""
    ops: dict[str, tuple[float, float]]
    """Operator name → (its own device ms, its calls); on the CPU, its own host ms."""


def profile_step(step: Step, device: torch.device, steps: int) -> Profile:
    """``steps`` synchronised steps of ``step`` under the profiler."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _sync(device)
        started = time.perf_counter()
        for _ in range(steps):
            step()
            _sync(device)
        wall = time.perf_counter() - started
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
    on_device = device.type == "cuda"
    ops = {
        e.key: (
            (e.self_device_time_total if on_device else e.self_cpu_time_total) / 1e3 / steps,
            e.count / steps,
        )
        for e in prof.key_averages()
        if e.device_type == DeviceType.CPU
    }
    return Profile(wall * 1e3 / steps, kernel_us / 1e3 / steps, len(kernels) / steps, ops)


def differences(a: Profile, b: Profile, shown: int) -> list[tuple[str, float, float, float, float]]:
    """(operator, a's ms, b's ms, a's calls, b's calls) per step: every operator whose calls
    differ (what one step runs and the other does not), and the ``shown`` others whose time
    differs most (on a busy machine, noise); the largest difference in time first."""
    rows = []
    for name in set(a.ops) | set(b.ops):
        (ta, ca), (tb, cb) = a.ops.get(name, (0.0, 0.0)), b.ops.get(name, (0.0, 0.0))
        rows.append((name, ta, tb, ca, cb))
    rows.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))  # ties by name: a stable table
    called = [r for r in rows if r[3] != r[4]]
    timed = [r for r in rows if r[3] == r[4] and abs(r[2] - r[1]) > 0.01][:shown]
    return sorted(called + timed, key=lambda r: (-abs(r[2] - r[1]), r[0]))


def figures(found: dict[str, Profile]) -> dict[str, object]:
    """Each method's per-step totals, and under ``"differences"`` the operators' table."""
    totals = {m: {k: v for k, v in asdict(p).items() if k != "ops"} for m, p in found.items()}
    return {**totals, "differences": differences(found[METHODS[0]], found[METHODS[1]], SHOWN)}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per method")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", choices=("bf16", "no"), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--compile-backend", default="inductor")
    return parser.parse_args(argv)


def profile_variant(args: argparse.Namespace, compiled: bool) -> dict[str, object]:
    """Both methods' steps built, warmed up and profiled; their :func:`figures`."""
    setup = setup_of(args)
    steps = {
        "timm": timm_step(args.model, setup, compiled=compiled),
        "PS-MAP": fseb_step(args.model, setup, compiled=compiled, M=0),
    }
    for _ in range(args.warmup + 1):
        for step in steps.values():
            step()
    return figures({m: profile_step(steps[m], setup.device, args.steps) for m in METHODS})


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Profile both methods per variant, print the tables, then one JSON line of every figure
    (keyed by variant)."""
    args = parse(argv)
    result: dict[str, object] = {}
    for variant in args.variants:
        result[variant] = profile_variant(args, compiled=variant == "compile")
        print(f"{variant}:\n{report(cast(dict[str, object], result[variant]))}\n", flush=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
