"""Pure tensor maths of the FS-EB regulariser (Rudner et al., ICML 2023).

Everything here takes tensors and returns tensors: no Accelerate, files or logging. The only
side channel is a :class:`CholeskyJitterWarning` raised through :mod:`warnings` when a prior
covariance had to be stabilised, so callers decide whether to log it.

Notation (docs/method.md, "The empirical prior: φ0 and Kc"): ``H = h(x̂; φ0)`` are the
penultimate features of the frozen starting model at the M context points (M, D);
``F = f(x̂; θ)`` are the trainable model's logits there (M, K).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.recipe.options import SOLVERS

__all__ = [
    "CholeskyError",
    "CholeskyJitterWarning",
    "cholesky_with_jitter",
    "function_space_term",
    "parameter_term",
    "prior_covariance",
    "prior_std_of",
    "resolve_prior",
    "select_solver",
]


_MAX_JITTER_TRIES = 8
_DEVICE_FALLBACK_JITTER = 1e-6
SINGULAR_RTOL = 1e-10
"""A factor whose smallest pivot ``L_ii²`` is below this share of ``A``'s mean diagonal counts as
failed: ``A`` is numerically singular. A Cholesky of a singular matrix may "succeed" or fail
depending on how the CPU's BLAS rounds (its last pivots are rounding residue, ~1e-16 of the
diagonal, of either sign); this threshold, six orders above that residue, gives one verdict on
every machine. The numerical rank in the warning uses the same tolerance."""


class CholeskyJitterWarning(RuntimeWarning):
    """A prior covariance was not numerically positive definite and got extra diagonal jitter."""


class CholeskyError(FsebError, torch.linalg.LinAlgError):
    """A prior covariance could not be factorised, even with jitter: the message says why and
    which setting to change. A ``torch.linalg.LinAlgError``, so code catching that still does."""


def prior_covariance(
    features: Tensor, scale: float, diag: float, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Prior covariance of function values at the context points.

    ``Kc = s · (H Hᵀ + 1 1ᵀ) + d · I`` — the paper's ``τ_f⁻¹ (h hᵀ + I)`` (Rudner et al. 2023,
    §4, the linearised prior over the last layer of φ0) with the bias column ``1 1ᵀ`` and the
    separate scale ``s`` and diagonal ``d`` of the reference implementation.

    Args:
        features: ``H``, (M, D) features of the frozen model at the context points.
        scale: ``s`` = ``prior_cov_scale`` (≥ 0).
        diag: ``d`` = ``prior_cov_diag`` (≥ 0).
        dtype: dtype to build ``Kc`` in; float64 by default because the factorisation needs it.

    Returns:
        ``Kc``, (M, M) in ``dtype``.
    """
    _check_features(features)
    _check_hyper(scale, diag)
    H = features.to(dtype)  # (M, D)
    M = H.shape[0]
    K = scale * (H @ H.mT + 1.0)  # (M, M)
    return K + diag * torch.eye(M, dtype=dtype, device=H.device)  # (M, M)


def resolve_prior(
    prior_std: float, feature_share: float, mean_sq_norm: float
) -> tuple[float, float]:
    """``(s, d)`` for a prior standard deviation of a logit at the context points.

    The prior variance of a logit at x̂ is ``Kc[i, i] = s (‖h(x̂; φ0)‖² + 1) + d``
    (docs/method.md, "A prior stated in units that transfer"). Averaged over the context pool,
    with ``m = mean ‖h‖²``, it is ``v = s (m + 1) + d``. Given ``v = prior_std²`` and the share
    of it that comes from φ0's features, ``feature_share = s (m + 1) / v``::

        s = feature_share · v / (m + 1)        d = (1 − feature_share) · v

    :func:`prior_std_of` is the inverse.

    Raises:
        ValueError: ``prior_std ≤ 0``, ``feature_share`` outside [0, 1] or ``mean_sq_norm < 0``.
    """
    if not (prior_std > 0 and math.isfinite(prior_std)):
        raise ValueError(f"prior_std must be a finite number > 0; got {prior_std}")
    if not 0 <= feature_share <= 1:
        raise ValueError(f"prior_feature_share must be in [0, 1]; got {feature_share}")
    if not (mean_sq_norm >= 0 and math.isfinite(mean_sq_norm)):
        raise ValueError(f"mean_sq_norm must be a finite number ≥ 0; got {mean_sq_norm}")
    var = prior_std**2
    return feature_share * var / (mean_sq_norm + 1), (1 - feature_share) * var


def prior_std_of(scale: float, diag: float, mean_sq_norm: float) -> tuple[float, float]:
    """``(prior_std, feature_share)`` of ``(s, d)`` at ``m = mean ‖h‖²``: :func:`resolve_prior`'s
    inverse, ``prior_std = √(s (m + 1) + d)`` and ``feature_share = s (m + 1) / prior_std²``."""
    _check_hyper(scale, diag)
    features = scale * (mean_sq_norm + 1)
    var = features + diag
    return math.sqrt(var), features / var


def select_solver(num_context: int, feature_dim: int, scale: float, diag: float) -> str:
    """Pick the cheaper exact way to apply ``Kc⁻¹``.

    Woodbury factorises a (D+1)×(D+1) matrix instead of M×M, so it wins when ``M > D + 1``; it
    needs ``d > 0`` and ``s > 0`` (otherwise ``Kc`` is not "diagonal plus low rank").
    """
    if diag > 0 and scale > 0 and num_context > feature_dim + 1:
        return "woodbury"
    return "cholesky"


def function_space_term(
    logits: Tensor,
    features: Tensor,
    scale: float,
    diag: float,
    solver: str = "auto",
    jitter: float = 1e-10,
) -> Tensor:
    """Function-space prior term ``R_f = ½ Σ_k f_kᵀ Kc⁻¹ f_k`` (negative log prior + const).

    This is the Gaussian log-density of the context logits under the empirical prior
    ``N(0, Kc)`` summed over the K output dimensions (Rudner et al. 2023, eq. 8 / the
    ``log p(f(x̂; θ))`` term of the FS-EB objective). It is computed in float64 outside any
    autocast region, so bf16/fp16 never reach the factorisation, and returned in the caller's
    dtype widened to at least float32 (the same policy autocast applies to losses).

    Args:
        logits: ``F = f(x̂; θ)``, (M, K); gradients flow through it.
        features: ``H = h(x̂; φ0)``, (M, D); usually detached (φ0 is frozen).
        scale: ``s`` = ``prior_cov_scale``.
        diag: ``d`` = ``prior_cov_diag``.
        solver: ``"cholesky"`` (M×M), ``"woodbury"`` ((D+1)×(D+1), needs ``s, d > 0``) or
            ``"auto"`` (the cheaper of the two, :func:`select_solver`).
        jitter: first relative jitter tried if a factorisation fails; multiplied by 10 on each
            retry (a :class:`CholeskyJitterWarning` says how much was needed).

    Returns:
        0-dim tensor ``R_f``.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be (M, K); got shape {tuple(logits.shape)}")
    _check_features(features)
    if features.shape[0] != logits.shape[0]:
        raise ValueError(
            f"features and logits must have the same number of context points M; got "
            f"{features.shape[0]} feature rows and {logits.shape[0]} logit rows"
        )
    _check_hyper(scale, diag)
    if solver == "auto":
        solver = select_solver(features.shape[0], features.shape[1], scale, diag)
    if solver == "auto" or solver not in SOLVERS:
        allowed = ", ".join(repr(name) for name in SOLVERS)
        raise ValueError(f"solver must be one of {allowed}; got {solver!r}")
    if solver == "woodbury" and not (scale > 0 and diag > 0):
        raise ValueError(
            f"the woodbury solver needs prior_cov_scale > 0 and prior_cov_diag > 0; got "
            f"scale={scale}, diag={diag}"
        )
    out_dtype = torch.promote_types(logits.dtype, torch.float32)
    # A float64 solve of a (near-)singular Kc is meaningless under bf16 autocast, so switch it off.
    with torch.autocast(device_type=logits.device.type, enabled=False):
        compute = torch.float64 if logits.device.type != "mps" else torch.float32
        F = logits.to(compute)  # (M, K)
        H = features.to(compute)  # (M, D)
        if solver == "cholesky":
            quad = _quad_cholesky(F, H, scale, diag, jitter)
        else:
            quad = _quad_woodbury(F, H, scale, diag, jitter)
    return (0.5 * quad).to(out_dtype)


def parameter_term(
    params: Iterable[Tensor], prior_var: float, anchors: Iterable[Tensor] | None = None
) -> Tensor:
    """Parameter-space prior term ``R_θ = ‖θ − θ_anchor‖² / (2 · prior_var)``.

    The isotropic Gaussian prior ``N(θ_anchor, prior_var · I)`` of the FS-EB objective (Rudner
    et al. 2023, eq. 8, ``log p(θ)``). With ``θ_anchor = 0`` (the paper) and the loss divided by
    N_train this is plain weight decay ``1 / (prior_var · N)``; with the starting weights as
    anchors it is an L2-SP regulariser.

    Args:
        params: trainable parameters θ.
        prior_var: prior variance (> 0).
        anchors: ``θ_anchor``, one tensor per parameter in the same order, or ``None`` for zero.

    Returns:
        0-dim float32 (or float64 if any parameter is float64) tensor ``R_θ``.
    """
    if not prior_var > 0:
        raise ValueError(f"prior_var must be > 0; got {prior_var}")
    params = list(params)
    if not params:
        raise ValueError("parameter_term got no parameters")
    if anchors is not None:
        anchors = list(anchors)
        if len(anchors) != len(params):
            raise ValueError(
                f"anchors must match params one to one; got {len(anchors)} anchors for "
                f"{len(params)} parameters"
            )
        anchors = [a.detach().to(p.dtype) for p, a in zip(params, anchors, strict=True)]
    return _SquaredDistance.apply(anchors, *params) / (2.0 * prior_var)


class _SquaredDistance(torch.autograd.Function):
    """``‖θ − a‖²`` over a list of tensors with multi-tensor (``_foreach``) kernels.

    A loop over the parameters launches about six kernels per tensor (square, sum, stack;
    their backward): on a GPU, 160 tensors of a ResNet-50 made fseb_ft's PS-MAP step 1.35× timm's
    plain step (docs/performance.md, "GPU"). The fused norms and the fused ``2 g (θ − a)`` take
    a few launches in all, and no host synchronisation.
    """

    @staticmethod
    def forward(ctx: Any, anchors: list[Tensor] | None, *params: Tensor) -> Tensor:
        ctx.anchors = anchors
        ctx.save_for_backward(*params)
        acc = torch.promote_types(params[0].dtype, torch.float32)
        diffs = _differences(params, anchors)
        norms = torch._foreach_norm([d if d.dtype == acc else d.to(acc) for d in diffs])
        return torch.stack(norms).pow(2).sum()  # ()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        diffs = _differences(ctx.saved_tensors, ctx.anchors)
        return (None, *torch._foreach_mul(diffs, 2 * grad))


def _differences(params: Sequence[Tensor], anchors: list[Tensor] | None) -> list[Tensor]:
    """``θ − a`` per tensor (``θ`` itself without anchors), in one multi-tensor kernel."""
    if anchors is None:
        return list(params)
    return list(torch._foreach_sub(params, anchors))  # type: ignore[call-overload]  # takes tuples


def _quad_cholesky(F: Tensor, H: Tensor, scale: float, diag: float, jitter: float) -> Tensor:
    """``Σ_k f_kᵀ Kc⁻¹ f_k`` via ``Kc = L Lᵀ``: ``‖L⁻¹ F‖²_F``."""
    Kc = prior_covariance(H, scale, diag, dtype=F.dtype)  # (M, M)
    if diag == 0:
        advice = (
            "With prior_cov_diag = 0, Kc = s·(HHᵀ + 11ᵀ) has no diagonal term to keep it positive "
            "definite: it is singular whenever the context points' features [H, 1] are linearly "
            "dependent or nearly so (duplicate or near-collinear points, M > D + 1, float "
            "rounding). Raise fseb.prior_cov_diag (it adds to the diagonal as the jitter did)"
        )
    else:
        advice = f"prior_cov_diag = {diag:g} is too small for these features: raise it"
    L = cholesky_with_jitter(Kc, jitter, "the prior covariance Kc", advice, "context points")
    Z = torch.linalg.solve_triangular(L, F, upper=False)  # (M, K)
    return Z.pow(2).sum()


def _quad_woodbury(F: Tensor, H: Tensor, scale: float, diag: float, jitter: float) -> Tensor:
    """``Σ_k f_kᵀ Kc⁻¹ f_k`` via Woodbury with ``U = [H, 1]``.

    ``Kc⁻¹ = d⁻¹ [I − U (d/s · I + UᵀU)⁻¹ Uᵀ]``, so with ``A = d/s · I + UᵀU = L Lᵀ`` the quadratic
    form is ``(‖F‖² − ‖L⁻¹ Uᵀ F‖²) / d``.
    """
    ones = torch.ones(H.shape[0], 1, dtype=H.dtype, device=H.device)  # (M, 1)
    U = torch.cat([H, ones], dim=1)  # (M, P), P = D + 1
    P = U.shape[1]
    A = U.mT @ U + (diag / scale) * torch.eye(P, dtype=U.dtype, device=U.device)  # (P, P)
    advice = f"prior_cov_diag / prior_cov_scale = {diag / scale:g} is too small: raise it"
    L = cholesky_with_jitter(A, jitter, "the Woodbury capacitance matrix", advice)  # (P, P)
    G = torch.linalg.solve_triangular(L, U.mT @ F, upper=False)  # (P, K)
    return (F.pow(2).sum() - G.pow(2).sum()) / diag


def cholesky_with_jitter(
    A: Tensor, jitter: float, what: str, advice: str, rows: str | None = None
) -> Tensor:
    """Lower Cholesky factor of ``A``, adding ``jitter · mean(diag A) · 10^i`` until it succeeds.

    A factorisation counts as failed when it fails outright or when its smallest pivot is below
    :data:`SINGULAR_RTOL` of the mean diagonal (:func:`_well_conditioned`), so a numerically
    singular ``A`` takes the jitter path, with its warning, on every CPU alike. ``advice`` (the
    remedy) and ``rows`` (what a row of ``A`` stands for, if anything; its duplicates are
    counted) go into the warning, which also gives ``A``'s spectrum. On an accelerator this
    defers to :func:`_cholesky_on_device`, which never syncs the host.
    """
    if A.device.type != "cpu":
        return _cholesky_on_device(A)
    level = A.diagonal().abs().mean().clamp_min(torch.finfo(A.dtype).tiny)  # ()
    L, info = torch.linalg.cholesky_ex(A)
    if not bool(info.any()) and bool(_well_conditioned(L, level)):
        return L
    if not bool(torch.isfinite(A).all()):
        raise CholeskyError(
            f"{what} ({A.shape[-1]}×{A.shape[-1]}) has NaN/inf entries: check the φ0 features "
            "of the context batch (inputs, normalisation) and the prior hyper-parameters."
        )
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    for i in range(_MAX_JITTER_TRIES):
        added = jitter * 10.0**i * level
        # The jitter itself bounds every pivot from below, so success alone is the test here.
        L, info = torch.linalg.cholesky_ex(A + added * eye)
        if not bool(info.any()):
            warnings.warn(
                f"Cholesky of {what} ({A.shape[-1]}×{A.shape[-1]}) failed: it is numerically "
                f"singular ({_diagnosis(A, rows)}); succeeded after adding {float(added):.3g} to "
                f"the diagonal ({jitter * 10.0**i:.0e} × mean diagonal). {advice} to silence "
                "this warning.",
                CholeskyJitterWarning,
                stacklevel=3,
            )
            return L
    raise CholeskyError(
        f"Cholesky of {what} failed even with {float(added):.3g} added to the diagonal "
        f"({_diagnosis(A, rows)}). {advice}."
    )


def _well_conditioned(L: Tensor, level: Tensor) -> Tensor:
    """Whether the factor ``L`` (n, n) has every pivot ``L_ii²`` above :data:`SINGULAR_RTOL` ×
    ``level`` (the mean diagonal of the factorised matrix): a 0-dim bool tensor, no host sync."""
    return L.diagonal().pow(2).min() > SINGULAR_RTOL * level


def _diagnosis(A: Tensor, rows: str | None) -> str:
    """The facts behind a failed factorisation of the symmetric ``A``: spectrum, rank, repeats.

    Only runs once a factorisation has failed, so its extra O(n³) is off the normal path.
    """
    eig = torch.linalg.eigvalsh(A)  # (n,) ascending
    n = A.shape[-1]
    top = eig[-1].abs().clamp_min(torch.finfo(A.dtype).tiny)
    rank = int((eig > SINGULAR_RTOL * top).sum())
    text = (
        f"eigenvalues from {float(eig[0]):.3g} to {float(eig[-1]):.3g}, numerical rank "
        f"{rank} of {n}"
    )
    if rows is not None:
        # Rows equal to 8 digits: identical inputs can differ in the last bits after the matmul.
        same = torch.cdist(A, A) <= 1e-8 * A.diagonal().abs().max()  # (n, n)
        repeats = int(same.tril(-1).any(dim=1).sum())
        text += (
            f"; {repeats} of the {n} {rows} repeat an earlier one"
            if repeats
            else f"; no two {rows} are identical"
        )
    return text


def _check_features(features: Tensor) -> None:
    if features.ndim != 2:
        raise ValueError(f"features must be (M, D); got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise ValueError(f"features must be a floating tensor; got {features.dtype}")


def _check_hyper(scale: float, diag: float) -> None:
    if not (scale >= 0 and math.isfinite(scale)):
        raise ValueError(f"prior_cov_scale must be a finite number ≥ 0; got {scale}")
    if not (diag >= 0 and math.isfinite(diag)):
        raise ValueError(f"prior_cov_diag must be a finite number ≥ 0; got {diag}")
    if scale == 0 and diag == 0:
        raise ValueError("prior_cov_scale and prior_cov_diag are both 0: Kc would be 0")


def _cholesky_on_device(A: Tensor) -> Tensor:
    """Sync-free factorisation for accelerators: both candidates run there, one is selected there.

    Reading ``info`` on the host would stall the device once per training step, so the factor
    of ``A + 1e-6 · mean(diag A) · I`` replaces a failed or numerically singular one
    (:func:`_well_conditioned`, as on the CPU) by ``torch.where``, without the escalation or the
    warning of the CPU path (both need the host to look). If that fails too, the factor is NaN:
    the training loop's periodic finiteness check then stops the run.
    """
    L, info = torch.linalg.cholesky_ex(A)  # (P, P), ()
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    level = A.diagonal().abs().mean()
    L_jit, info_jit = torch.linalg.cholesky_ex(A + _DEVICE_FALLBACK_JITTER * level * eye)
    ok = (info == 0) & _well_conditioned(L, level)
    chosen = torch.where(ok, L, L_jit)  # (P, P)
    return torch.where(ok | (info_jit == 0), chosen, torch.full_like(chosen, float("nan")))
