"""Two moons: FS-EB is uncertain away from the data, PS-MAP is not (Rudner et al. 2023, Figure 1).

Reproduces the qualitative claim of Figure 1 of Rudner, Kapoor, Qiu & Wilson, "Function-Space
Regularization in Neural Networks: A Probabilistic Perspective" (ICML 2023): a small MLP trained
on scikit-learn's two moons with a plain Gaussian parameter prior (PS-MAP) extrapolates
over-confidently far from the data, while the same network trained with the function-space
empirical-Bayes prior (FS-EB) reverts to high predictive entropy there yet still fits the moons.

Both methods go through the same :func:`train` loop and
:class:`fseb_ft.method.objective.FSEBObjective`;
only ``reg_scale`` differs (0 for PS-MAP, 1 for FS-EB). Same initialisation (φ0), same seed.

Settings (constants below; ``--steps`` and ``--seed`` on the command line):

- data: ``make_moons(N_SAMPLES=1000, noise=0.1)``, standardised per coordinate;
- model: 2 → 128 → 128 → 2, ReLU; φ0 is its initialisation, ``h(·; φ0)`` the second hidden layer;
- prior: the FashionMNIST reference of design §1 — ``prior_var = 0.1``, ``s = 0.01``, ``d = 1``;
- context: M = 128 points drawn uniformly each step from the box ``CONTEXT_BOX_SCALE = 2`` times
  the data's per-coordinate extent (same centre);
- optimiser: Adam, lr 0.01 with cosine decay to 5 %, full batch, 1000 steps by default.

With N = 300 the weight decay ``1 / (prior_var · N)`` of ``prior_var = 0.1`` kept train accuracy
below 0.9; N = 1000 fits the moons (≥ 0.99) with the reference prior unchanged.

The far-field score is the mean predictive entropy (nats; ln 2 ≈ 0.693 is the maximum) on a ring of
256 points at 3× the largest norm of a standardised training point.

Run: ``python -m benchmarks.two_moons [--steps N] [--seed S] [--out PNG] [--no-plot] [--results
PAGE]``; the last stdout line is a JSON object with ``far_entropy_psmap``, ``far_entropy_fseb``,
``train_acc_psmap`` and ``train_acc_fseb``. ``--results`` also writes the table between
``<!-- two-moons:begin/end -->`` of PAGE, stamped with this process's code.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from sklearn.datasets import make_moons
from torch import Tensor, nn

from benchmarks.provenance import write_section
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.runs.code_record import code_record

N_SAMPLES = 1000
NOISE = 0.1
WIDTH = 128
PRIOR_VAR = 0.1
PRIOR_COV_SCALE = 0.01
PRIOR_COV_DIAG = 1.0
NUM_CONTEXT = 128
CONTEXT_BOX_SCALE = 2.0
LR = 0.01
STEPS = 1000
RING_POINTS = 256
RING_RADIUS_SCALE = 3.0
GRID_RADIUS_SCALE = 3.5
GRID_SIZE = 200
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "two_moons.png"
METHODS = {"psmap": 0.0, "fseb": 1.0}
"""Method name → ``reg_scale``: the only difference between the two runs."""
LABELS = {"psmap": "PS-MAP", "fseb": "FS-EB"}
MARKERS = ("<!-- two-moons:begin -->", "<!-- two-moons:end -->")


class MoonsMLP(nn.Module):
    """2 → width → width → 2 ReLU MLP with timm's feature interface, so φ0's features are free."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(2, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()
        )
        self.head = nn.Linear(width, 2)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.body(x)  # (N, width)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        return x if pre_logits else self.head(x)  # (N, width) or (N, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))  # (N, 2)


def make_data(seed: int) -> tuple[Tensor, Tensor]:
    """Standardised two-moons inputs (N, 2) float32 and labels (N,) int64."""
    x, y = make_moons(n_samples=N_SAMPLES, noise=NOISE, random_state=seed)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64)


def context_box(x: Tensor, scale: float = CONTEXT_BOX_SCALE) -> tuple[Tensor, Tensor]:
    """Lower and upper corners (2,) of the data's bounding box widened ``scale`` times."""
    lo, hi = x.min(dim=0).values, x.max(dim=0).values  # (2,), (2,)
    centre, half = (lo + hi) / 2, scale * (hi - lo) / 2  # (2,), (2,)
    return centre - half, centre + half


def train(
    x: Tensor,
    y: Tensor,
    *,
    reg_scale: float,
    steps: int,
    seed: int,
    num_context: int = NUM_CONTEXT,
    lr: float = LR,
) -> nn.Module:
    """Train a fresh :class:`MoonsMLP` on ``(x, y)`` with the FS-EB objective at ``reg_scale``.

    The seed fixes both the initialisation (hence φ0) and the context draws, so PS-MAP and FS-EB
    start from identical weights and differ only by ``reg_scale``.
    """
    if steps < 1:
        raise ValueError(f"steps must be ≥ 1; got {steps}")
    # Seeded init without touching the caller's global RNG stream.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MoonsMLP()
    objective = FSEBObjective(
        model,
        num_train=x.shape[0],
        reg_scale=reg_scale,
        prior_var=PRIOR_VAR,
        prior_cov_scale=PRIOR_COV_SCALE,
        prior_cov_diag=PRIOR_COV_DIAG,
    )
    optimiser = torch.optim.Adam(objective.trainable_parameters(), lr=lr)
    # Cosine decay to 5% (design §1 reference schedule) averages out the context-sampling noise.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps, eta_min=0.05 * lr)
    lo, hi = context_box(x)
    gen = torch.Generator().manual_seed(seed)
    objective.train()
    for _ in range(steps):
        # Fresh uniform context every step covers the box instead of a few fixed points.
        context = lo + (hi - lo) * torch.rand(num_context, 2, generator=gen)  # (M, 2)
        loss = objective(x, y, context=context)["loss"]
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
    return model.eval()


@torch.no_grad()
def predictive_entropy(model: nn.Module, x: Tensor) -> Tensor:
    """Entropy (nats) of the softmax predictive at each input, (N,)."""
    log_p = torch.log_softmax(model(x), dim=-1)  # (N, 2)
    return -(log_p.exp() * log_p).sum(dim=-1)  # (N,)


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Fraction of ``x`` classified as ``y``."""
    return float((model(x).argmax(dim=-1) == y).float().mean())


def ring(x: Tensor, scale: float = RING_RADIUS_SCALE, n: int = RING_POINTS) -> Tensor:
    """``n`` points (n, 2) on a circle of radius ``scale`` × the largest training-point norm."""
    radius = scale * float(x.norm(dim=1).max())
    angle = torch.linspace(0, 2 * math.pi, n + 1)[:-1]  # (n,)
    return radius * torch.stack([angle.cos(), angle.sin()], dim=1)  # (n, 2)


def run(steps: int = STEPS, seed: int = 0, out: Path | None = DEFAULT_OUT) -> dict[str, float]:
    """Train PS-MAP and FS-EB, score far-field entropy and train accuracy, optionally plot.

    Args:
        steps: optimiser steps per method.
        seed: seeds the data, the shared initialisation and the context draws.
        out: where to write the entropy-map PNG; ``None`` skips plotting.

    Returns:
        ``far_entropy_psmap``, ``far_entropy_fseb``, ``train_acc_psmap``, ``train_acc_fseb``.
    """
    x, y = make_data(seed)
    far = ring(x)
    models = {
        name: train(x, y, reg_scale=rs, steps=steps, seed=seed) for name, rs in METHODS.items()
    }
    results = {
        f"far_entropy_{n}": float(predictive_entropy(m, far).mean()) for n, m in models.items()
    }
    results |= {f"train_acc_{n}": accuracy(m, x, y) for n, m in models.items()}
    if out is not None:
        plot(models, x, y, results, Path(out))
    return results


def plot(
    models: dict[str, nn.Module], x: Tensor, y: Tensor, results: dict[str, float], out: Path
) -> None:
    """Side-by-side predictive-entropy maps on a shared colour scale, training points on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    r = GRID_RADIUS_SCALE * float(x.norm(dim=1).max())
    axis = torch.linspace(-r, r, GRID_SIZE)  # (G,)
    gx, gy = torch.meshgrid(axis, axis, indexing="xy")  # (G, G), (G, G)
    grid = torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)  # (G², 2)
    titles = {"psmap": "PS-MAP", "fseb": "FS-EB"}
    ring_pts = ring(x)  # (n, 2)
    lo, hi = context_box(x)  # (2,), (2,)
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.2), sharey=True, constrained_layout=True)
    for ax, (name, model) in zip(axes, models.items(), strict=True):
        ent = predictive_entropy(model, grid).reshape(GRID_SIZE, GRID_SIZE)  # (G, G)
        mesh = ax.pcolormesh(
            gx.numpy(), gy.numpy(), ent.numpy(), vmin=0.0, vmax=math.log(2), cmap="viridis"
        )
        ax.scatter(x[:, 0], x[:, 1], c=y, cmap="coolwarm", s=6, edgecolors="white", linewidths=0.2)
        ax.plot(*torch.cat([ring_pts, ring_pts[:1]]).T, "w--", lw=0.8, label="far-entropy ring")
        ax.add_patch(
            Rectangle(
                lo.tolist(), *(hi - lo).tolist(), fill=False, ec="w", ls=":", label="context box"
            )
        )
        ax.set_title(f"{titles[name]} — train acc {results[f'train_acc_{name}']:.3f}")
        ax.set_aspect("equal")
        ax.set_xlabel("$x_1$")
    axes[0].set_ylabel("$x_2$")
    axes[0].legend(loc="lower right", fontsize=7, framealpha=0.5)
    fig.colorbar(mesh, ax=axes, label="predictive entropy (nats)", shrink=0.9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """CLI: train both methods, print a table, then the JSON result as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="optimiser steps per method")
    parser.add_argument("--seed", type=int, default=0, help="data, init and context seed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="entropy-map PNG path")
    parser.add_argument("--no-plot", action="store_true", help="skip writing the figure")
    parser.add_argument(
        "--results", type=Path, help="also write the table into this page's two-moons section"
    )
    args = parser.parse_args(argv)
    # 128-wide matmuls gain nothing from intra-op threads; on a shared 2-core box a second thread
    # spin-waits on busy cores and was measured 20-80x slower per step.
    torch.set_num_threads(1)
    start = time.perf_counter()
    results = run(args.steps, args.seed, None if args.no_plot else args.out)
    elapsed = time.perf_counter() - start
    print(f"{'method':<8} {'far entropy (nats)':>19} {'train acc':>10}")
    for name, label in LABELS.items():
        far, acc = results[f"far_entropy_{name}"], results[f"train_acc_{name}"]
        print(f"{label:<8} {far:>19.3f} {acc:>10.3f}")
    print(f"({args.steps} steps, seed {args.seed}, {elapsed:.1f} s)")
    if args.results is not None:
        text = section(results, args.steps, args.seed)
        write_section(args.results, text, MARKERS, codes=[code_record()])
    print(json.dumps(results))


def section(results: dict[str, float], steps: int, seed: int) -> str:
    """The results page's table of one call, under the command that reproduces it."""
    options = (f" --steps {steps}" if steps != STEPS else "") + (f" --seed {seed}" if seed else "")
    rows = "".join(
        f"| {label} | {results[f'far_entropy_{name}']:.3f} | {results[f'train_acc_{name}']:.3f} |\n"
        for name, label in LABELS.items()
    )
    return (
        f"`python -m benchmarks.two_moons{options} --results docs/results.md`; {steps} steps, "
        f"seed {seed}, one thread:\n\n| method | mean predictive entropy far from the data "
        f"(nats) | train accuracy |\n|---|---|---|\n{rows}"
    )


if __name__ == "__main__":
    main()
