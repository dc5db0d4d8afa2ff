"""FS-VI's network side: the mean-field Gaussian over parameters, the linearised distribution of
the logits at the context points (``torch.func``), and Monte-Carlo predictions.

The maths (the KL, the covariance formulas) is :mod:`fseb_ft.method.fsvi`; the loss that combines
them with the likelihood is the FS-VI method's, :class:`fseb_ft.method.methods.fsvi.FSVI`
(docs/method.md, "FS-VI").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from fseb_ft.method.fsvi import head_covariance, inverse_softplus, jacobian_covariance, softplus_std

__all__ = [
    "MCPredictive",
    "MeanFieldGaussian",
    "context_moments",
    "variance_parameters",
]

_JACOBIAN_BYTES = 2**29
"""Memory budget of one batch of per-point Jacobian rows (``all`` scope): the classes are taken
in chunks of ``c`` with ``c · M · P_σ · 4 bytes`` ≤ 512 MiB, so at least one class per pass."""


class MeanFieldGaussian(nn.Module):
    """``q(θ_V) = N(μ_V, diag(σ²))`` over the variance-carrying parameters V,
    ``σ = τ softplus(ρ / τ)`` (:func:`~fseb_ft.method.fsvi.softplus_std`).

    μ is the network's own parameters (what is trained, saved and exported as usual); this module
    holds only ρ, one tensor per parameter of V, so its ``state_dict`` is the rest of q.

    Args:
        params: name → parameter of the network, for every parameter of V.
        init_std: σ at the start, the same for every parameter (> 0).
    """

    def __init__(self, params: Mapping[str, Tensor], init_std: float) -> None:
        super().__init__()
        if not params:
            raise ValueError("FS-VI needs at least one parameter to carry variance")
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0; got {init_std}")
        self.names = list(params)
        rho = float(inverse_softplus(init_std))
        self.rho = nn.ParameterList(
            nn.Parameter(torch.full_like(p.detach(), rho)) for p in params.values()
        )

    def stds(self) -> dict[str, Tensor]:
        """name → σ, shaped like the parameter."""
        return {n: softplus_std(r) for n, r in zip(self.names, self.rho, strict=True)}

    def sample(
        self, means: Mapping[str, Tensor], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """One reparameterised draw ``μ + σ ε`` (ε ~ N(0, I)) for every parameter of V.

        Gradients reach μ and ρ through it. ``generator`` (a CPU one) makes the draw
        reproducible; without it the global RNG is used.
        """
        out = {}
        for name, std in self.stds().items():
            mu = means[name]
            if generator is None:
                eps = torch.randn_like(mu)
            else:
                eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype).to(mu.device)
            out[name] = mu + std * eps  # like μ
        return out

    @torch.no_grad()
    def load_stds(self, stds: Mapping[str, Tensor]) -> None:
        """Set σ (e.g. from ``model/variational.safetensors``), one tensor per parameter of V."""
        missing = sorted(set(self.names) - set(stds))
        if missing:
            raise ValueError(f"the saved standard deviations lack {missing[:5]}")
        for name, rho in zip(self.names, self.rho, strict=True):
            rho.copy_(inverse_softplus(stds[name].double()).to(rho))


def variance_parameters(model: nn.Module, scope: str) -> dict[str, nn.Parameter]:
    """The parameters that carry variance: all trainable ones, or the classifier head's.

    Raises:
        ValueError: ``scope="head"`` and the model has no linear ``get_classifier()``.
    """
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if scope == "all":
        return named
    if scope != "head":
        raise ValueError(f"variance scope must be 'all' or 'head'; got {scope!r}")
    head = _linear_head(model)
    ids = {id(head.weight), id(head.bias)}
    return {n: p for n, p in named.items() if id(p) in ids}


def context_moments(
    model: nn.Module,
    q: MeanFieldGaussian,
    context: Tensor,
    scope: str,
    feature_fn: Callable[[nn.Module, Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """Mean ``f(x̂; μ)`` (M, K) and linearised covariance ``J_k diag(σ²) J_kᵀ`` (K, M, M).

    Both are of the network in eval mode (BatchNorm running statistics, no dropout): each
    point's Jacobian is that of its own logits, which batch statistics would couple to the other
    points. Gradients reach μ through the mean (and, in the ``head`` scope, through the features
    in the covariance) and σ through the covariance; in the ``all`` scope the Jacobian is taken
    at μ as a constant (no second derivatives; docs/method.md, "FS-VI").

    ``head``: ``S_k = H diag(σ²_{w_k}) Hᵀ + σ²_{b_k}`` from the features (one forward, no
    Jacobian). ``all``: the exact per-point Jacobian rows ``∂f_k(x̂_i)/∂θ`` by ``vmap`` of
    ``jacrev`` over the points, for a chunk of classes at a time (:data:`_JACOBIAN_BYTES`); peak
    memory ≈ ``c · M · P_σ`` floats for ``c`` classes, compute ≈ K backward passes over M points.
    """
    was_training = model.training
    model.eval()
    try:
        if scope == "head":
            head = _linear_head(model)
            features = feature_fn(model, context)  # (M, D)
            mean = head(features)  # (M, K)
            params = dict(model.named_parameters())
            var = {params[n] is head.weight: s.pow(2) for n, s in q.stds().items()}
            cov = head_covariance(features, var[True], var[False])  # (K, M, M)
        else:
            mean = model(context)  # (M, K)
            cov = _jacobian_covariance(model, q, context, mean.shape[1])  # (K, M, M)
    finally:
        model.train(was_training)
    return mean, cov


def _jacobian_covariance(
    model: nn.Module, q: MeanFieldGaussian, context: Tensor, num_classes: int
) -> Tensor:
    """``J_k diag(σ²) J_kᵀ`` from per-point Jacobians, a chunk of classes per ``vmap``."""
    params = dict(model.named_parameters())
    # J at μ as a constant: the gradient w.r.t. μ of the covariance would need second
    # derivatives through every per-point Jacobian.
    means = {n: params[n].detach() for n in q.names}
    variance = torch.cat([s.pow(2).flatten() for s in q.stds().values()])  # (P_σ,)
    M = context.shape[0]
    chunk = max(1, min(num_classes, _JACOBIAN_BYTES // (4 * M * variance.numel())))
    covs = []
    for k0 in range(0, num_classes, chunk):
        k1 = min(num_classes, k0 + chunk)

        def logits(pv: dict[str, Tensor], x1: Tensor, k0: int = k0, k1: int = k1) -> Tensor:
            return functional_call(model, pv, (x1.unsqueeze(0),))[0, k0:k1]  # (c,)

        jac = vmap(jacrev(logits), in_dims=(None, 0))(means, context)  # name → (M, c, *shape)
        rows = torch.cat([jac[n].flatten(2) for n in q.names], dim=2)  # (M, c, P_σ)
        covs.append(jacobian_covariance(rows.transpose(0, 1), variance))  # (c, M, M)
        del jac, rows
    return torch.cat(covs)  # (K, M, M)


def _linear_head(model: nn.Module) -> nn.Linear:
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear) or head.bias is None:
        raise ValueError(
            f"fseb.fsvi.variance=head needs a linear classifier with a bias from "
            f"get_classifier() (timm); {type(model).__name__} has {type(head).__name__}: use "
            "fseb.fsvi.variance=all"
        )
    return head


class MCPredictive(nn.Module):
    """The Monte-Carlo predictive ``p(y | x) ≈ 1/S Σ_s softmax(f(x; θ_s))``, θ_s ~ q.

    The S draws are made once, here, from a seeded generator, so every input is scored by the
    same S networks (an S-member ensemble of samples) and a repeated evaluation is identical.
    ``forward`` returns ``log p``: the log of the averaged probabilities, which softmax maps back
    to them, so the usual log-softmax of the "logits" gives the predictive.

    Args:
        model: the network holding μ (eval mode is set by the caller, as for any model).
        q: the variational distribution.
        samples: S.
        seed: seed of the draws.
    """

    def __init__(self, model: nn.Module, q: MeanFieldGaussian, samples: int, seed: int) -> None:
        super().__init__()
        if samples < 1:
            raise ValueError(f"samples must be ≥ 1; got {samples}")
        self.model = model
        generator = torch.Generator().manual_seed(seed)
        params = dict(model.named_parameters())
        with torch.no_grad():
            self.draws = [q.sample(params, generator) for _ in range(samples)]

    def forward(self, x: Tensor) -> Tensor:
        """``log(1/S Σ_s softmax(f(x; θ_s)))``, (B, K) in float32."""
        probs = None
        for draw in self.draws:
            p = torch.softmax(functional_call(self.model, draw, (x,)).float(), dim=-1)  # (B, K)
            probs = p if probs is None else probs + p
        mean = cast(Tensor, probs) / len(self.draws)  # (B, K); samples ≥ 1 draws
        return mean.clamp_min(torch.finfo(mean.dtype).tiny).log()
