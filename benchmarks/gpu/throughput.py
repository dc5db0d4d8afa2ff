"""Training-step throughput and peak memory on one accelerator: timm's plain step against
fseb_ft's PS-MAP and FS-EB steps (issue 35).

    python -m benchmarks.gpu.throughput [--models resnet50 vit_base_patch16_224] [--batch 128]
        [--size 224] [--variants eager compile] [--steps 20] [--warmup 5]

For each model and variant (``eager``, or ``compile``: ``model.compile()`` with inductor) four
training steps are built on synthetic tensors already on the device, each under bf16 autocast
with the model and its inputs in ``channels_last``:

- ``timm``: timm's own plain step (forward, cross-entropy, backward, SGD step), the reference;
- ``PS-MAP``: :class:`fseb_ft.method.objective.FSEBObjective` with ``reg_scale = 0``, prepared by
  :func:`fseb_ft.engine.speed.apply_speed_keys` as a run prepares it;
- ``FS-EB M=B/4`` and ``FS-EB M=B``: the same objective with M context points drawn each step
  from a fixed pool whose φ0 features were computed once (a run's fixed context), so the
  unavoidable extra work is one forward and backward over M more points: the floor is
  ``(B + M) / B`` × the PS-MAP step.

The four are built at once, and each one's first step (compilation included under
``compile``) is reported apart; then ``--warmup`` untimed rounds and ``--steps`` timed rounds
of one step of each, in turn, each CUDA-synchronised, of which the median is reported: drift
in the device's clocks falls on all four alike. A method's peak memory is what it holds
(weights, φ0, the pool, optimiser state, gradients) plus its largest step's allocations
(:func:`measure_model`). Each row is printed as it is measured (``row: {...}``); the last line
is a JSON object of every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.gpu.tables import ROW_PREFIX, Row, ratios, table
from fseb_ft.engine.speed import apply_speed_keys
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import ModelConfig, TrainConfig

CLASSES = 10
NUM_TRAIN = 50_000
"""N in the objective's ``/ N`` (CIFAR-10's training set); it scales terms, not their cost."""
POOL_FACTOR = 2
"""The fixed context pool holds this many × B images."""
METHODS = ("timm", "PS-MAP", "FS-EB M=B/4", "FS-EB M=B")

Step = Callable[[], None]


@dataclass(frozen=True)
class Setup:
    """What every step of one run shares."""

    device: torch.device
    batch: int
    size: int
    precision: torch.dtype | None
    """Autocast dtype; ``None``: float32 without autocast."""
    compile_backend: str
    """``torch.compile``'s backend for the ``compile`` variant."""


def setup_of(args: argparse.Namespace) -> Setup:
    """The :class:`Setup` of a command line's ``--device``, ``--batch``, ``--size``,
    ``--precision`` and ``--compile-backend`` (inductor where it has none)."""
    precision = torch.bfloat16 if args.precision == "bf16" else None
    backend = getattr(args, "compile_backend", "inductor")
    return Setup(torch.device(args.device), args.batch, args.size, precision, backend)


def _create(name: str, setup: Setup) -> nn.Module:
    torch.manual_seed(0)
    kw = {"img_size": setup.size} if "vit" in name else {}
    return timm.create_model(name, num_classes=CLASSES, **kw).to(setup.device)


def _autocast(setup: Setup) -> torch.autocast:
    dtype = setup.precision or torch.float32
    return torch.autocast(setup.device.type, dtype=dtype, enabled=setup.precision is not None)


def _inputs(setup: Setup, count: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 3, setup.size, setup.size, generator=g)  # (N, 3, S, S)
    y = torch.randint(0, CLASSES, (count,), generator=g)  # (N,)
    x = x.to(setup.device).contiguous(memory_format=torch.channels_last)
    return x, y.to(setup.device)


def timm_step(name: str, setup: Setup, compiled: bool) -> Step:
    """timm's plain training step (as its ``train.py`` does it): forward under autocast,
    cross-entropy, backward, SGD with momentum; model and inputs in ``channels_last``."""
    model = _create(name, setup).to(memory_format=torch.channels_last).train()
    if compiled:
        model.compile(backend=setup.compile_backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = _inputs(setup, setup.batch, seed=1)

    def step() -> None:
        with _autocast(setup):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def fseb_step(name: str, setup: Setup, compiled: bool, M: int) -> Step:
    """fseb_ft's training step: PS-MAP with ``M = 0``, else FS-EB with ``M`` context points
    drawn each step from a fixed pool with cached φ0 features (a run's fixed context)."""
    model = _create(name, setup)
    # The CIFAR-10 recipe's prior; its values change what is computed, not how long it takes.
    objective = FSEBObjective(
        model, num_train=NUM_TRAIN, reg_scale=1.0 if M else 0.0, prior_var=1.0,
        prior_cov_scale=1e-5, prior_cov_diag=1e-2,
    )  # fmt: skip
    train_cfg = TrainConfig(channels_last=True, compile=compiled)
    apply_speed_keys(objective, ModelConfig(name=name), train_cfg, setup.compile_backend)
    objective.train()
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=1e-3, momentum=0.9)
    x, y = _inputs(setup, setup.batch, seed=1)
    pool = feats = None
    if M:
        pool, _ = _inputs(setup, POOL_FACTOR * setup.batch, seed=2)  # (P, 3, S, S)
        with _autocast(setup):
            feats = torch.cat([objective.prior_features(c) for c in pool.split(setup.batch)])

    def step() -> None:
        ctx = ctx_feats = None
        if pool is not None:
            idx = torch.randint(0, pool.shape[0], (M,), device=pool.device)  # no host sync
            ctx, ctx_feats = pool[idx], feats[idx]  # (M, 3, S, S), (M, D)
        with _autocast(setup):
            terms = objective(x, y, ctx, ctx_feats)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(step: Step, device: torch.device) -> tuple[float, int]:
    """One synchronised step: its seconds, and the bytes it allocated at its peak above what
    was allocated before it (0 on the CPU)."""
    _sync(device)
    before = _allocated(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    step()
    _sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else before
    return seconds, peak - before


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_model(name: str, variant: str, setup: Setup, steps: int, warmup: int) -> list[Row]:
    """Every method of one model and variant. Each is built and takes its first step in turn
    (what it then holds is its resident memory: weights, φ0, pool, optimiser state, gradients);
    then the timed steps run in interleaved rounds, so that drift in the device's clocks falls
    on every method alike. A method's peak is its resident memory plus its largest step's
    allocations above what was allocated before that step."""
    _free(setup.device)
    compiled = variant == "compile"
    sizes = {"timm": 0, "PS-MAP": 0, "FS-EB M=B/4": setup.batch // 4, "FS-EB M=B": setup.batch}
    steps_of, first, resident = {}, {}, {}
    for method in METHODS:
        before = _allocated(setup.device)
        steps_of[method] = (
            timm_step(name, setup, compiled)
            if method == "timm"
            else fseb_step(name, setup, compiled, sizes[method])
        )
        first[method] = _run(steps_of[method], setup.device)[0]
        resident[method] = _allocated(setup.device) - before
    for _ in range(warmup):
        for step in steps_of.values():
            step()
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    transient = dict.fromkeys(METHODS, 0)
    for _ in range(steps):
        for method, step in steps_of.items():
            seconds, extra = _run(step, setup.device)
            times[method].append(seconds)
            transient[method] = max(transient[method], extra)
    del steps_of
    _free(setup.device)
    rows = []
    for method in METHODS:
        median = statistics.median(times[method])
        peak = (resident[method] + transient[method]) / 2**20
        rows.append(
            Row(name, variant, method, setup.batch, sizes[method], median * 1e3,
                setup.batch / median, peak if setup.device.type == "cuda" else None, first[method])
        )  # fmt: skip
    return rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "vit_base_patch16_224"])
    parser.add_argument("--variants", nargs="+", choices=("eager", "compile"), default=["eager"])
    parser.add_argument("--batch", type=int, default=128, help="B, training images per step")
    parser.add_argument("--size", type=int, default=224, help="input resolution")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per method (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    parser.add_argument("--precision", choices=("bf16", "no"), default="bf16")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Measure, print the table, then one JSON line of every figure; return that object."""
    args = parse(argv)
    setup = setup_of(args)
    rows = []
    for name in args.models:
        for variant in args.variants:
            for row in measure_model(name, variant, setup, args.steps, args.warmup):
                rows.append(row)
                print(ROW_PREFIX + json.dumps(asdict(row)), flush=True)
    found = ratios(rows)
    print(table(rows, found))
    result = {"rows": [asdict(r) for r in rows], "ratios": found}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
