"""What a training step's first use of an input shape costs, and which library spends it
(docs/performance.md, "GPU": each new batch shape cost the H200's fine-tune ~10 s, its first
step 13.7 s and the partial last batch's 10.5 s).

    python -m benchmarks.gpu.firststep [--models efficientnet_lite0 resnet50] [--batch 128]
        [--new 8 24 40] [--size 224] [--precision bf16]

One process; PS-MAP's step as :mod:`benchmarks.gpu.throughput` builds it (bf16 autocast,
``channels_last``, synthetic tensors on the device). Each case builds a fresh step (model,
optimiser, inputs) at its batch size and times its first step and the median of the
:data:`AFTER` steps that follow, each synchronised; the first less that median is the case's
one-time work:

- ``first``: the model's first step, batch B; for the first model also what a process pays
  once (CUDA's context, the cuBLAS and cuDNN handles, the caching allocator's first blocks);
- ``new shape``: a batch no step has used (the fine-tune's partial last batch);
- ``seen shape``: batch B again, in a new model: near zero when the one-time work is kept per
  input shape (cuDNN's execution plans, per convolution and shape), not per model;
- ``new shape, cuDNN off``: ``torch.backends.cudnn.enabled = False`` for this case: a new
  shape that costs no one-time work here is cuDNN's;
- ``seen shape, cuDNN off``: batch B without cuDNN: against ``seen shape``, what a step pays
  for avoiding that work;
- ``new shape, profiled``: under ``torch.profiler``, the host operators with the largest own
  time in that first step (cuDNN's plan search runs on the host, inside the convolutions).

It prints a table and the profiled operators, then one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu.tables import first_steps
from benchmarks.gpu.throughput import Setup, _free, _run, fseb_step, setup_of

TOP = 10
"""Operators listed from the profiled first step."""

AFTER = 5
"""Steps timed after the first; their median is the case's steady step."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One fresh step's first step and the steady step after it."""

    case: str
    batch: int
    cudnn: bool
    first_s: float
    steady_ms: float
    """The median of the :data:`AFTER` steps after the first."""
    one_time_s: float
    """``first_s`` less ``steady_ms``: what the first use cost once."""


def measure(
    name: str, label: str, setup: Setup, cudnn: bool = True, profiled: bool = False
) -> tuple[Case, list[tuple[str, float, int]]]:
    """The case ``label``: a fresh PS-MAP step at ``setup.batch``, cuDNN as ``cudnn`` says; with
    ``profiled``, also the :data:`TOP` host operators of its first step (name, own ms, calls)."""
    _free(setup.device)
    enabled = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = cudnn
    try:
        step = fseb_step(name, setup, compiled=False, M=0)
        top: list[tuple[str, float, int]] = []
        if profiled:
            activities = [ProfilerActivity.CPU]
            activities += [ProfilerActivity.CUDA] if setup.device.type == "cuda" else []
            with profile(activities=activities) as prof:
                first = _run(step, setup.device)[0]
            ops = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
            ops.sort(key=lambda e: -e.self_cpu_time_total)
            top = [(e.key, round(e.self_cpu_time_total / 1e3, 1), e.count) for e in ops[:TOP]]
        else:
            first = _run(step, setup.device)[0]
        steady = statistics.median(_run(step, setup.device)[0] for _ in range(AFTER))
    finally:
        torch.backends.cudnn.enabled = enabled
    case = Case(label, setup.batch, cudnn, round(first, 3), round(steady * 1e3, 2),
                round(first - steady, 3))  # fmt: skip
    return case, top


@dataclasses.dataclass(frozen=True)
class FirstSteps:
    """One model's cases and its profiled first step."""

    model: str
    cases: list[Case]
    profiled_top: list[tuple[str, float, int]]
    """The :data:`TOP` host operators of the profiled case's first step: name, own ms, calls."""


def cases(name: str, setup: Setup, new: Sequence[int]) -> FirstSteps:
    """Every case of the module's docstring, in its order; ``new``: three batch sizes other
    than ``setup.batch`` (new shape, cuDNN off, profiled)."""
    at = [dataclasses.replace(setup, batch=b) for b in new]
    found = [
        measure(name, "first", setup),
        measure(name, "new shape", at[0]),
        measure(name, "seen shape", setup),
        measure(name, "new shape, cuDNN off", at[1], cudnn=False),
        measure(name, "seen shape, cuDNN off", setup, cudnn=False),
        measure(name, "new shape, profiled", at[2], profiled=True),
    ]
    return FirstSteps(name, [c for c, _ in found], found[-1][1])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["efficientnet_lite0", "resnet50"])
    parser.add_argument("--batch", type=int, default=128, help="B, the first case's batch")
    parser.add_argument("--new", type=int, nargs=3, default=[8, 24, 40],
                        help="the new shapes' batch sizes")  # fmt: skip
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--precision", choices=("bf16", "no"), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.batch in args.new or len(set(args.new)) < 3:
        parser.error("--new takes three batch sizes, each other than --batch")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Measure every case per model, print its table, then one JSON line of every figure."""
    args = parse(argv)
    setup = setup_of(args)
    result: dict[str, object] = {"cudnn_version": torch.backends.cudnn.version()}
    for name in args.models:
        result[name] = dataclasses.asdict(cases(name, setup, args.new))
        print(first_steps({name: result[name]}) + "\n", flush=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
