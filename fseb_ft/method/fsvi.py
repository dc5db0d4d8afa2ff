"""Pure tensor maths of FS-VI (Rudner, Chen, Teh & Gal, NeurIPS 2022): the function-space KL.

FS-VI keeps a mean-field Gaussian ``q(θ) = N(μ, diag(σ²))`` over the parameters and regularises
the distribution it induces over the logits at the M context points x̂. Linearising the network
around μ (Rudner et al. 2022's linearised function-space distribution) makes it Gaussian, per
class k::

    q(f_k(x̂)) = N(f_k(x̂; μ), J_k diag(σ²) J_kᵀ)        J_k = ∂f_k(x̂; θ)/∂θ at μ, (M, P)

and the objective's regulariser is its KL divergence to the prior over function values,
here FS-EB's empirical prior ``N(0, Kc)``, ``Kc = s (H Hᵀ + 1 1ᵀ) + d I``, per class
(:func:`fseb_ft.method.regularizer.prior_covariance`). Everything here takes tensors and returns
tensors; the network plumbing (Jacobians with ``torch.func``) is :mod:`fseb_ft.method.variational`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import Tensor

from fseb_ft.method.regularizer import cholesky_with_jitter, prior_covariance

__all__ = [
    "FUNCTION_JITTER",
    "STD_SCALE",
    "function_kl",
    "head_covariance",
    "inverse_softplus",
    "jacobian_covariance",
    "softplus_std",
]

FUNCTION_JITTER = 1e-6
"""``ε`` added to every ``J_k diag(σ²) J_kᵀ``: it has rank ≤ min(M, P), so without it the
log-determinant of a rank-deficient covariance (any M larger than the variance-carrying
parameter count, and σ → 0) is −∞. The FS-VI reference adds such a diagonal too."""

STD_SCALE = 1e-4
"""τ of ``σ = τ softplus(ρ / τ)``: σ is linear in ρ above it and exponential below, so σ stays
positive. Below τ a σ moves little (every gradient on ρ carries the factor σ / τ): the KL's
``−log|S|`` pulls it back up only while its weight carries a share of ``S``; the variance of a
weight whose feature others cover may stay near 0. Below any σ that matters for the logits."""


def softplus_std(rho: Tensor) -> Tensor:
    """``σ = τ softplus(ρ / τ)``, τ = :data:`STD_SCALE`: positive and smooth in ρ.

    Above τ, σ ≈ ρ: SGD moves σ itself, which q's Fisher information weighs like μ
    (``1/σ²`` for μ, ``2/σ²`` for σ), so one learning rate suits both. The plain
    ``softplus(ρ)`` is ≈ log σ for σ ≪ 1, whose Fisher weight 2 is ``2σ²`` times μ's: at
    σ = 1e-3 its steps were 10⁶ times too small to move σ (docs/method.md, "FS-VI").
    """
    return STD_SCALE * nnf.softplus(rho / STD_SCALE)


def inverse_softplus(std: Tensor | float) -> Tensor:
    """``ρ`` with ``softplus_std(ρ) = σ`` (σ ≥ 0): ``τ log(expm1(σ / τ))``, stable for any σ.

    σ = 0 is a float32 σ that underflowed deep in the exponential tail (a weight whose variance
    the KL leaves to others, see :data:`STD_SCALE`); the smallest normal float32 stands for it.
    """
    std = torch.as_tensor(std, dtype=torch.float64)
    if not bool((std >= 0).all()):
        raise ValueError("a standard deviation must be ≥ 0 to invert softplus")
    z = std.clamp_min(torch.finfo(torch.float32).tiny) / STD_SCALE
    # log(expm1(z)) = z + log(1 − e^{−z}): no overflow for large z, no cancellation for small.
    return STD_SCALE * (z + torch.log(-torch.expm1(-z)))


def jacobian_covariance(jacobian: Tensor, variance: Tensor) -> Tensor:
    """``S_k = J_k diag(σ²) J_kᵀ`` for every class k from the explicit Jacobian.

    Args:
        jacobian: ``J``, (K, M, P): the logits' derivatives at the M points w.r.t. the P
            variance-carrying parameters.
        variance: ``σ²``, (P,).

    Returns:
        (K, M, M), symmetric positive semi-definite.
    """
    if jacobian.ndim != 3 or variance.shape != jacobian.shape[-1:]:
        raise ValueError(
            f"jacobian must be (K, M, P) and variance (P,); got {tuple(jacobian.shape)} and "
            f"{tuple(variance.shape)}"
        )
    return (jacobian * variance) @ jacobian.mT  # (K, M, M)


def head_covariance(features: Tensor, weight_var: Tensor, bias_var: Tensor) -> Tensor:
    """``S_k`` when only a linear head ``f_k = w_kᵀ h + b_k`` carries variance.

    Its Jacobian is ``∂f_k/∂w_k = h``, ``∂f_k/∂b_k = 1`` (and 0 for the other classes' rows),
    so ``S_k = H diag(σ²_{w_k}) Hᵀ + σ²_{b_k} 1 1ᵀ``: FS-EB's ``Kc`` shape, with the trained
    features and a learned variance per weight. No Jacobian is materialised.

    Args:
        features: ``H = h(x̂; μ)``, (M, D), the head's input at the context points.
        weight_var: ``σ²`` of the head's weight, (K, D).
        bias_var: ``σ²`` of its bias, (K,).

    Returns:
        (K, M, M).
    """
    if features.ndim != 2 or weight_var.shape[-1] != features.shape[-1]:
        raise ValueError(
            f"features must be (M, D) and weight_var (K, D); got {tuple(features.shape)} and "
            f"{tuple(weight_var.shape)}"
        )
    weighted = features.unsqueeze(0) * weight_var.unsqueeze(1)  # (K, M, D)
    return weighted @ features.mT + bias_var[:, None, None]  # (K, M, M)


def function_kl(
    mean: Tensor,
    cov: Tensor,
    prior_features: Tensor,
    scale: float,
    diag: float,
    jitter: float = FUNCTION_JITTER,
) -> Tensor:
    """``Σ_k KL(N(m_k, S_k + εI) ‖ N(0, Kc))``: FS-VI's regulariser (Rudner et al. 2022).

    Per class, with M context points::

        KL_k = ½ [tr(Kc⁻¹ S_k) + m_kᵀ Kc⁻¹ m_k − M + log|Kc| − log|S_k|]

    The classes are independent under the prior (FS-EB's ``Kc`` per output dimension), and ``S_k``
    is the k-th diagonal block of the linearised (MK × MK) covariance: the cross-class covariances
    are dropped, so q factorises over classes like the prior (K Cholesky factors of M × M instead of
    one of MK × MK). ``Σ_k ½ m_kᵀ Kc⁻¹ m_k`` is FS-EB's ``R_f`` at the mean
    (:func:`fseb_ft.method.regularizer.function_space_term`); as σ → 0, ``S_k → εI`` and the rest is
    a constant. Computed in float64 (float32 on MPS) outside autocast, like ``R_f``.

    Args:
        mean: ``f(x̂; μ)``, (M, K).
        cov: ``S``, (K, M, M) (:func:`jacobian_covariance` or :func:`head_covariance`).
        prior_features: ``H = h(x̂; φ0)``, (M, D).
        scale: ``s`` in ``Kc``.
        diag: ``d`` in ``Kc``.
        jitter: ``ε`` added to each ``S_k``; a factorisation that still fails gets the
            escalating relative jitter of :func:`fseb_ft.method.regularizer.cholesky_with_jitter`.

    Returns:
        0-dim tensor, in the inputs' dtype widened to at least float32.
    """
    if mean.ndim != 2 or cov.shape != (mean.shape[1], mean.shape[0], mean.shape[0]):
        raise ValueError(
            f"mean must be (M, K) and cov (K, M, M); got {tuple(mean.shape)} and {tuple(cov.shape)}"
        )
    if not jitter >= 0:
        raise ValueError(f"jitter must be ≥ 0; got {jitter}")
    out_dtype = torch.promote_types(mean.dtype, torch.float32)
    with torch.autocast(device_type=mean.device.type, enabled=False):
        compute = torch.float64 if mean.device.type != "mps" else torch.float32
        F = mean.to(compute)  # (M, K)
        M, K = F.shape
        Kc = prior_covariance(prior_features, scale, diag, dtype=compute)  # (M, M)
        advice = "raise fseb.prior_cov_diag"
        Lp = cholesky_with_jitter(Kc, 1e-10, "the prior covariance Kc", advice, "context points")
        eye = torch.eye(M, dtype=compute, device=F.device)
        S = cov.to(compute) + jitter * eye  # (K, M, M)
        Ls = torch.stack(
            [
                cholesky_with_jitter(S[k], 1e-10, f"the FS-VI covariance of class {k}", advice)
                for k in range(K)
            ]
        )  # (K, M, M)
        mahalanobis = torch.linalg.solve_triangular(Lp, F, upper=False).pow(2).sum()
        # tr(Kc⁻¹ S_k) = ‖Lp⁻¹ Ls_k‖²_F.
        trace = torch.linalg.solve_triangular(Lp, Ls, upper=False).pow(2).sum()
        logdet_prior = 2.0 * Lp.diagonal().log().sum()
        logdet_q = 2.0 * Ls.diagonal(dim1=-2, dim2=-1).log().sum()
        kl = 0.5 * (mahalanobis + trace - K * M + K * logdet_prior - logdet_q)
    return kl.to(out_dtype)
