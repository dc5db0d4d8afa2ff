"""FS-EB step time against PS-MAP, measured side by side in one process.

    python -m benchmarks.overhead [--steps 20] [--warmup 5] [--models cnn resnet18]

For each model (the paper's FashionMNIST CNN at 28×28, timm's ResNet-18 at 32×32), context size
M ∈ {B, B/4} (B = 128) and context kind, PS-MAP and FS-EB training steps (forward, backward,
SGD step) alternate after a warm-up, and the median step times are compared:

- ``cached``: a fixed context pool (no augmentation) whose φ0 features were computed once, so
  the only unavoidable extra work is one forward/backward over the M context points; the floor
  is ``(B + M) / B`` × the PS-MAP step.
- ``augmented``: fresh context images every step, so φ0 also runs forward on the M new points;
  the floor adds that measured φ0 forward time.
- ``naive`` (``--naive``, for the before/after table): the straightforward configuration —
  separate forwards for x and x̂ and φ0 recomputed every step even for a fixed pool.
- ``fsvi``: FS-VI (``method="fsvi"``, variance on the classifier head) on the cached pool: one
  sampled forward over x, an eval-mode forward over x̂ and K Cholesky factors of M × M; its
  row's "FS-EB ms" column is the FS-VI step and the floor is the cached one.
- ``l2sp`` and ``feature`` (rows ``M=0``: no context): the other regularisers of
  ``benchmarks.regularisers``. L2-SP's norm is PS-MAP's centred on θ0, so its floor is 1;
  Feature-SP runs φ0 forward over the training batch each step (its features change with every
  batch), so its floor adds that measured forward. Their "FS-EB ms" column is their step.

On CPU the process first asks glibc to keep freed memory (:mod:`fseb_ft.engine.allocator`, as
``fseb_ft.finetune`` does); ``--no-mallopt`` measures the allocator's defaults.

The inputs are synthetic tensors already on the device: the step's cost does not depend on
pixel values, and data loading is not part of the step. The last line printed is a JSON object
of each method's step time over PS-MAP's keyed ``"<model>/<context>/M=<M>"``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import timm
import torch
from torch import Tensor

import fseb_ft.method.models  # noqa: F401  (registers fseb_cnn with timm)
from fseb_ft.engine.allocator import keep_freed_memory
from fseb_ft.method.objective import FSEBObjective

B = 128
POOL = 1024
MODELS = {"cnn": ("fseb_cnn", (1, 28, 28)), "resnet18": ("resnet18", (3, 32, 32))}


@dataclass
class Case:
    """One benchmark row."""

    model: str
    context: str
    M: int
    psmap_ms: float
    fseb_ms: float
    floor: float
    psmap_ips: float
    fseb_ips: float
    psmap_mem_mb: float | None
    fseb_mem_mb: float | None

    @property
    def ratio(self) -> float:
        """FS-EB / PS-MAP median step time."""
        return self.fseb_ms / self.psmap_ms

    @property
    def key(self) -> str:
        """JSON key of the ratio."""
        return f"{self.model}/{self.context}/M={self.M}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _objective(name: str, shape: tuple[int, ...], reg_scale: float, device: torch.device, **kw):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, in_chans=shape[0]).to(device)
    objective = FSEBObjective(
        model, num_train=60_000, reg_scale=reg_scale, prior_var=0.1,
        prior_cov_scale=0.01, prior_cov_diag=1.0, **kw,
    )  # fmt: skip
    objective.train()
    optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=1e-3, momentum=0.9)
    return objective, optimizer


def _step_fn(
    objective: FSEBObjective,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    pool: Tensor | None,
    cache: Tensor | None,
    M: int,
    augmented: bool,
) -> Callable[[], None]:
    def step() -> None:
        ctx = feats = None
        if pool is not None:
            idx = torch.randint(0, pool.shape[0], (M,), device=pool.device)  # no host sync
            ctx = pool[idx]  # (M, C, H, W)
            if augmented:
                # Stand-in for a per-step augmentation: new pixels, so φ0 cannot be cached.
                ctx = ctx + 0.1 * torch.randn_like(ctx)
            elif cache is not None:
                feats = cache[idx]  # (M, D)
        terms = objective(x, y, ctx, feats)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()

    return step


def _time(steps: dict[str, Callable[[], None]], n: int, warmup: int, device: torch.device):
    times: dict[str, list[float]] = {k: [] for k in steps}
    peaks: dict[str, float | None] = {k: None for k in steps}
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    for _ in range(n):
        for key, fn in steps.items():  # interleaved: drift hits both methods alike
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[key].append(time.perf_counter() - t0)
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(device) / 2**20
                peaks[key] = max(peaks[key] or 0.0, peak)
    return {k: statistics.median(v) for k, v in times.items()}, peaks


def _phi0_forward_ms(objective: FSEBObjective, ctx: Tensor, n: int, device: torch.device) -> float:
    for _ in range(3):
        objective.prior_features(ctx)
    samples = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        objective.prior_features(ctx)
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def run_model(
    name: str, steps: int, warmup: int, device: torch.device, naive: bool = False
) -> list[Case]:
    """All context kinds and sizes for one model, PS-MAP and FS-EB interleaved."""
    arch, shape = MODELS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, *shape, generator=g).to(device)  # (B, C, H, W)
    y = torch.randint(0, 10, (B,), generator=g).to(device)  # (B,)
    pool = torch.randn(POOL, *shape, generator=g).to(device)  # (P, C, H, W)
    rows = []
    for M in (B, B // 4):
        ps, ps_opt = _objective(arch, shape, 0.0, device)
        fs, fs_opt = _objective(arch, shape, 1.0, device)
        fv, fv_opt = _objective(arch, shape, 1.0, device, method="fsvi")
        cache = torch.cat([fs.prior_features(c) for c in pool.split(256)])  # (P, D)
        fns = {
            "psmap": _step_fn(ps, ps_opt, x, y, None, None, M, False),
            "cached": _step_fn(fs, fs_opt, x, y, pool, cache, M, False),
            "augmented": _step_fn(fs, fs_opt, x, y, pool, None, M, True),
            "fsvi": _step_fn(fv, fv_opt, x, y, pool, cache, M, False),
        }
        if M == B:  # neither uses a context: one row each
            for method in ("l2sp", "feature"):
                obj, opt = _objective(arch, shape, 1.0, device, method=method)
                fns[method] = _step_fn(obj, opt, x, y, None, None, M, False)
        if naive:
            slow, slow_opt = _objective(arch, shape, 1.0, device, forward_mode="separate")
            fns["naive"] = _step_fn(slow, slow_opt, x, y, pool, None, M, False)
        med, peak = _time(fns, steps, warmup, device)
        phi0_ms = _phi0_forward_ms(fs, pool[:M], steps, device)
        base = med["psmap"] * 1e3
        for context in (c for c in fns if c != "psmap"):
            floor, m = _floor(context, M, phi0_ms / base)
            rows.append(
                Case(
                    model=name, context=context, M=m, psmap_ms=base, fseb_ms=med[context] * 1e3,
                    floor=floor, psmap_ips=B / med["psmap"], fseb_ips=B / med[context],
                    psmap_mem_mb=peak["psmap"], fseb_mem_mb=peak[context],
                )
            )  # fmt: skip
    return rows


def _floor(context: str, M: int, phi0: float) -> tuple[float, int]:
    """A row's floor over the PS-MAP step and its number of context points, given φ0's forward
    over M points as a fraction ``phi0`` of the PS-MAP step (M = B for the context-free rows)."""
    if context == "l2sp":
        return 1.0, 0
    if context == "feature":
        return 1.0 + phi0, 0
    floor = (B + M) / B
    return (floor, M) if context in ("cached", "fsvi") else (floor + phi0, M)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _mem(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def main() -> None:
    """CLI: print the table, then the JSON line of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per method (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per method first")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--naive", action="store_true", help="also time the naive configuration (before/after)"
    )
    parser.add_argument(
        "--no-mallopt",
        action="store_true",
        help="leave glibc's allocator at its defaults (fseb_ft tunes it for CPU runs)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tuned = device.type == "cpu" and not args.no_mallopt and keep_freed_memory()
    rows = [
        row
        for name in args.models
        for row in run_model(name, args.steps, args.warmup, device, args.naive)
    ]
    print(
        f"device: {_device_name(device)}; torch {torch.__version__}; B = {B}; "
        f"glibc keeps freed memory: {tuned}"
    )
    header = (
        f"{'case':28s} {'PS-MAP ms':>10s} {'FS-EB ms':>9s} {'ratio':>6s} {'floor':>6s} "
        f"{'goal':>6s} {'PS img/s':>9s} {'FS img/s':>9s} {'PS MiB':>7s} {'FS MiB':>7s}"
    )
    print(header)
    for r in rows:
        print(
            f"{r.key:28s} {r.psmap_ms:10.1f} {r.fseb_ms:9.1f} {r.ratio:6.2f} {r.floor:6.2f} "
            f"{1.1 * r.floor:6.2f} {r.psmap_ips:9.0f} {r.fseb_ips:9.0f} "
            f"{_mem(r.psmap_mem_mb):>7s} {_mem(r.fseb_mem_mb):>7s}"
        )
    print(json.dumps({r.key: round(r.ratio, 3) for r in rows if r.context != "naive"}))


if __name__ == "__main__":
    main()
