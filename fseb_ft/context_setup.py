"""A run's context, from its recipe: the context sets, the stream of context batches, the prior.

The recipe-facing side of :mod:`fseb_ft.context`: it loads ``context.datasets``, builds the
seeded pool and its :class:`~fseb_ft.context.ContextStream` for a FS-EB run (none for PS-MAP),
and resolves a prior given as ``fseb.prior_std`` into s and d on that pool (docs/method.md).
"""

from __future__ import annotations

from accelerate import Accelerator

from fseb_ft.config import ContextConfig, FSEBConfig
from fseb_ft.context import ContextStream, build_context_pool
from fseb_ft.images import LabeledImages
from fseb_ft.models import InputSpec
from fseb_ft.objective import FSEBObjective
from fseb_ft.regularizer import resolve_prior
from fseb_ft.sources import load_split

__all__ = ["context_sets", "context_stream", "resolve_prior_on_pool"]


def context_sets(ctx: ContextConfig, channels: int, seed: int) -> list[LabeledImages]:
    """The datasets of ``context.datasets``, loaded with the run's ``channels`` and ``seed``."""
    return [
        load_split(f"context.datasets[{i}]", s, channels, seed) for i, s in enumerate(ctx.datasets)
    ]


def context_stream(
    ctx: ContextConfig,
    seed: int,
    train: LabeledImages,
    others: list[LabeledImages],
    spec: InputSpec,
    accelerator: Accelerator,
    objective: FSEBObjective,
    num_workers: int = 0,
) -> ContextStream:
    """The stream of context batches of a FS-EB run, its pool drawn from ``train`` and/or
    ``others`` (:func:`context_sets`) as ``ctx`` says, seeded by the run's ``seed``."""
    pool = build_context_pool(
        kind=ctx.kind,
        train=train if ctx.kind in ("train", "mixture") else None,
        datasets=others,
        weights=list(ctx.weights) or None,
        size=ctx.pool_size,
        seed=seed,
        input_size=spec.size,
        mean=spec.mean,
        std=spec.std,
        perturb=ctx.perturb,
    )
    accelerator.print(f"context: {pool!r}")
    return ContextStream(
        pool, ctx.batch_size, seed, accelerator, objective, num_workers=num_workers
    )


def resolve_prior_on_pool(
    fseb: FSEBConfig, context: ContextStream | None, objective: FSEBObjective
) -> dict[str, float] | None:
    """Resolve ``fseb.prior_std`` into s and d from m = mean ‖h(x̂; φ0)‖² over the context pool,
    set them on ``objective`` and return them for run.json (``None``: the recipe gives s and d).

    Every process builds the same pool with the same seed, so each resolves the same s and d.
    """
    if fseb.prior_std is None or context is None:
        return None
    m = context.mean_sq_norm(objective)
    scale, diag = resolve_prior(fseb.prior_std, fseb.prior_feature_share, m)
    objective.set_prior_covariance(scale, diag)
    return {
        "prior_std": fseb.prior_std,
        "feature_share": fseb.prior_feature_share,
        "mean_sq_norm": m,
        "prior_cov_scale": scale,
        "prior_cov_diag": diag,
    }
