"""Last-layer Laplace (LLLA): pure tensor maths on laplace-torch (docs/method.md, "Last-layer
Laplace").

The network's body is held fixed at its trained weights and only its linear classifier
``f(h) = W h + b`` (``W`` ``(K, D)``, ``b`` ``(K,)``, ``P = (D + 1)·K`` weights) gets a Gaussian
posterior ``N(θ_MAP, Σ)`` (Daxberger et al., 2021, "Laplace Redux"):

- ``Σ⁻¹ = Σ_n J_nᵀ Λ_n J_n + λ I``: the generalised Gauss-Newton (GGN) of the training split's
  cross-entropy at the trained weights (``J_n`` the ``(K, P)`` Jacobian of the logits in the
  classifier's weights, ``Λ_n = diag(p_n) − p_n p_nᵀ``), full, Kronecker-factored or diagonal
  (``hessian``), plus the precision ``λ`` of LLLA's prior ``N(0, λ⁻¹ I)``;
- ``λ`` maximises the Laplace approximation of the training split's log marginal likelihood
  (``marglik``), or minimises the validation split's NLL on a grid (``validation``);
- the predictive is the linearised (GLM) one, ``f ~ N(f_μ, J Σ Jᵀ)``, pushed through the softmax
  by the probit approximation (MacKay, 1992): ``softmax(κ ⊙ f_μ)``,
  ``κ_c = (1 + π/8 · Var[f_c])^(-1/2)``.

laplace-torch does the fitting and the prior's tuning, on an
``nn.Sequential(nn.Identity(), nn.Linear)`` holding the classifier's weights, so that its own
last-layer class fits exactly the classifier on the features given. Two of its generic steps go
through ``(B, K, P)`` Jacobians, which a linear classifier does not need; fseb_ft computes them
in closed form instead, pinned to laplace-torch's own results by tests:

- the ``kron`` predictive's ``Var[f_c]`` from the eigendecomposed Kronecker factors of
  laplace-torch's posterior precision (:func:`kron_output_variance`), where laplace-torch's
  ``KronLLLaplace.functional_variance_fast`` is not implemented;
- the ``diag`` GGN (:func:`linear_ggn_diagonal`), handed to laplace-torch's ``fit`` through its
  documented ``backend`` interface, where its generic one contracts the Jacobians by ``einsum``;
- the validation grid of the prior (:func:`validation_grid_search`): laplace-torch's grid and
  criterion, each point's NLL its own (laplace-torch 0.3's ``gridsearch`` compares running
  means over the points so far) and, for ``kron``, its predictive in closed form.

:func:`laplace_logits` returns the probit-scaled logits ``κ ⊙ f_μ``, whose softmax is
laplace-torch's probit predictive: every function of logits (entropy, MSP, max logit, energy)
applies to them. Everything runs in float64 on the features' device.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.checks import check_float_matrix, describe

__all__ = [
    "FULL_MAX_WEIGHTS",
    "LAPLACE_MISSING",
    "PRIOR_GRID",
    "LaplaceFit",
    "check_hessian_size",
    "fit_last_layer_laplace",
    "kron_output_variance",
    "laplace_logits",
    "laplace_torch",
    "linear_ggn_diagonal",
    "validation_grid_search",
]

LAPLACE_MISSING = "eval.laplace needs laplace-torch: pip install 'fseb_ft[laplace]'"
"""The one line a run with ``eval.laplace`` stops with when laplace-torch is not installed."""
FULL_MAX_WEIGHTS = 25_000
"""The largest classifier (``(D + 1)·K`` weights) the ``full`` GGN is built for: its matrix is
that size squared, 5 GB in float64 here."""
PRIOR_GRID = torch.logspace(-4.0, 4.0, 100)
"""laplace-torch's default grid of ``optimize_prior_precision(method="gridsearch")``, float32
as there: ``eval.laplace_prior: validation`` chooses among these."""
_JACOBIAN_BYTES = 2**28
"""Memory for one batch of last-layer Jacobians ``(B, K, P)`` in float64: sets ``B``."""
_LAST_LAYER = "1"
"""The classifier's name in the ``nn.Sequential(nn.Identity(), nn.Linear)`` laplace-torch fits."""


@dataclass(frozen=True)
class LaplaceFit:
    """A fitted last-layer Laplace: what :func:`laplace_logits` needs."""

    hessian: str
    """The GGN's structure: ``kron``, ``full`` or ``diag``."""
    prior_method: str
    """How the prior precision was chosen: ``marglik``, ``validation``, or ``fixed`` (given)."""
    prior_precision: float
    """The prior precision ``λ`` the posterior uses."""
    posterior: Any
    """laplace-torch's fitted last-layer Laplace (its ``backend`` and ``functional_variance``)."""

    def record(self) -> dict[str, Any]:
        """What ``results.json``'s ``laplace`` block says of the fit, before its metrics."""
        return {
            "hessian": self.hessian,
            "prior_method": self.prior_method,
            "prior_precision": self.prior_precision,
        }


def laplace_torch() -> ModuleType:
    """The ``laplace`` package, imported now (its import costs seconds).

    Raises:
        FsebError: laplace-torch is not installed; the message names the extra.
    """
    try:
        with _quiet_jit(), _quiet_root_log():
            import laplace
    except ImportError:
        raise FsebError(LAPLACE_MISSING) from None
    return laplace


def fit_last_layer_laplace(
    features: Tensor,
    labels: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    hessian: str = "kron",
    prior: str | float = "marglik",
    val: tuple[Tensor, Tensor] | None = None,
) -> LaplaceFit:
    """Fit LLLA on the training split's features (module docstring).

    Args:
        features: ``(N, D)`` the training split's penultimate features (the classifier's
            input), from the network in eval mode, un-augmented.
        labels: ``(N,)`` their labels.
        weight: ``(K, D)`` the classifier's weight.
        bias: ``(K,)`` its bias, or ``None`` when it has none.
        hessian: ``kron``, ``full`` or ``diag``.
        prior: ``marglik``, ``validation`` (needs ``val``), or a fixed prior precision.
        val: ``(features (N_v, D), labels (N_v,))`` of the validation split, for ``validation``.

    Raises:
        FsebError: laplace-torch is missing, or ``full`` for a classifier of more than
            :data:`FULL_MAX_WEIGHTS` weights.
    """
    h = check_float_matrix(features, "features").double()
    head = _head(weight, bias, h.device)
    k, d = cast(nn.Linear, head[1]).weight.shape  # _head's classifier
    check_hessian_size(hessian, d, k, bias is not None)
    n_weights = sum(p.numel() for p in head.parameters())
    if labels.shape != (h.shape[0],):
        raise ValueError(f"`labels` must have shape ({h.shape[0]},), got {describe(labels)}")
    la = laplace_torch().Laplace(
        head,
        "classification",
        subset_of_weights="last_layer",
        hessian_structure=hessian,
        last_layer_name=_LAST_LAYER,
        backend=_linear_ggn_backend() if hessian == "diag" else None,
    )
    # kron and diag build no (B, K, P) Jacobians: their batches are bounded by the features'.
    features_batch = max(1, _JACOBIAN_BYTES // (8 * (d + k)))
    batch = _batch_size(k, n_weights) if hessian == "full" else features_batch
    with _quiet_jit():
        la.fit(_loader(h, labels, batch))
        _tune_prior(la, prior, val)
    method = prior if isinstance(prior, str) else "fixed"
    return LaplaceFit(hessian, method, float(la.prior_precision), la)


def check_hessian_size(hessian: str, features: int, classes: int, bias: bool) -> None:
    """Refuse ``full`` for a classifier of more than :data:`FULL_MAX_WEIGHTS` weights.

    Raises:
        FsebError: naming the classifier's size and the structure to use instead.
    """
    n_weights = (features + int(bias)) * classes
    if hessian == "full" and n_weights > FULL_MAX_WEIGHTS:
        raise FsebError(
            f"eval.laplace_hessian=full: this classifier has {n_weights} weights ({features} "
            f"features{' + 1' if bias else ''}, times {classes} classes), above "
            f"{FULL_MAX_WEIGHTS} for a full {n_weights}² matrix; use eval.laplace_hessian=kron"
        )


@torch.no_grad()
def laplace_logits(fit: LaplaceFit, features: Tensor) -> Tensor:
    """The probit-scaled logits ``κ ⊙ f_μ`` ``(N, K)``, float64, of ``features`` ``(N, D)``:
    their softmax is laplace-torch's GLM predictive with ``link_approx="probit"``.

    ``Var[f_c]`` is :func:`kron_output_variance`'s closed form for a ``kron`` fit it handles,
    else laplace-torch's ``functional_variance`` of the last-layer Jacobians."""
    return _probit_logits(fit.posterior, check_float_matrix(features, "features").double())


def _probit_logits(la: Any, h: Tensor) -> Tensor:
    """``κ ⊙ f_μ`` ``(N, K)`` of features ``h`` ``(N, D)`` under ``la``'s posterior as it is."""
    kron = isinstance(la, laplace_torch().lllaplace.KronLLLaplace)
    f_var = kron_output_variance(la.posterior_precision, h) if kron else None
    if f_var is None:
        f_mu, f_var = _jacobian_variance(la, h)  # (N, K), (N, K)
    else:
        f_mu = la.model(h)  # (N, K)
    return f_mu * torch.rsqrt(1.0 + math.pi / 8.0 * f_var)  # (N, K)


def kron_output_variance(precision: Any, features: Tensor) -> Tensor | None:
    """``Var[f_c]`` ``(N, K)`` of a linear classifier's logits under laplace-torch's Kronecker
    posterior, in closed form; ``None`` for a posterior of another form.

    ``precision`` is laplace-torch's ``KronDecomposed`` posterior precision of one
    ``nn.Linear(D, K)``: a weight block with factors ``B`` ``(K, K)`` (the logits' curvature) and
    ``A`` ``(D, D)`` (the features'), eigendecomposed as ``B = Q_B diag(μ) Q_Bᵀ``,
    ``A = Q_A diag(λ) Q_Aᵀ``, whose precision is ``B ⊗ A + δ_W I`` over ``W`` flattened row by
    row (temperature already in ``μ`` and ``λ``, the prior precision in ``δ``); and, with a bias, a
    bias block ``B + δ_b I`` (laplace-torch's ``KronDecomposed._bmm``). The Jacobian of ``f_c`` in
    ``W`` is ``e_c ⊗ h``, so

        Var[f_c] = Σ_{j,i} Q_B[c, j]² (Q_Aᵀ h)_i² / (μ_j λ_i + δ_W) + Σ_j Q_B[c, j]² / (μ_j + δ_b),

    ``O(N D²)`` for the projection ``Q_Aᵀ h`` where the Jacobians cost ``O(N K² D)`` in memory
    and ``O(N K² D²)`` in time. ``None`` (take the Jacobians) for a damped precision or blocks
    of other sizes.
    """
    sizes = [tuple(len(values) for values in block) for block in precision.eigenvalues]
    k, d = len(precision.eigenvalues[0][0]), features.shape[1]
    if precision.damping or sizes not in ([(k, d)], [(k, d), (k,)]):
        return None
    (q_out, q_in), (mu, lam) = precision.eigenvectors[0], precision.eigenvalues[0]
    inverse = 1.0 / (torch.outer(mu, lam) + precision.deltas[0])  # (K, D)
    projected = (features @ q_in).square()  # (N, D)
    variance = projected @ inverse.T @ q_out.square().T  # (N, K)
    if len(sizes) == 2:
        (q_bias,), (mu_bias,) = precision.eigenvectors[1], precision.eigenvalues[1]
        variance = variance + q_bias.square() @ (1.0 / (mu_bias + precision.deltas[1]))  # (N, K)
    return variance


def linear_ggn_diagonal(features: Tensor, logits: Tensor, bias: bool) -> Tensor:
    """The diagonal ``(P,)`` of the softmax cross-entropy's GGN ``Σ_n J_nᵀ Λ_n J_n`` in a linear
    classifier's weights, ``W`` ``(K, D)`` flattened row by row, then ``b`` when ``bias``
    (laplace-torch's order): with ``Λ_n = diag(p_n) − p_n p_nᵀ`` and ``J_n`` selecting ``h_n``
    for ``W``'s row ``c`` and 1 for ``b_c``, ``Σ_n (p_nc − p_nc²) h_ni²`` and
    ``Σ_n (p_nc − p_nc²)``.

    Args:
        features: ``(N, D)`` the classifier's inputs ``h_n``.
        logits: ``(N, K)`` its outputs.
        bias: whether the classifier has a bias.
    """
    probs = torch.softmax(logits, dim=-1)  # (N, K)
    curvature = probs - probs.square()  # (N, K): Λ_n's diagonal
    weight = curvature.T @ features.square()  # (K, D)
    return torch.cat([weight.flatten(), curvature.sum(0)] if bias else [weight.flatten()])


@functools.cache
def _linear_ggn_backend() -> type:
    """laplace-torch's default GGN backend whose ``diag`` is :func:`linear_ggn_diagonal`: the
    ``backend`` argument is laplace-torch's interface for a curvature's source, and ``diag``
    returns what its ``fit`` sums, the batch's summed cross-entropy and diagonal."""

    class LinearGGN(laplace_torch().curvature.CurvlinopsGGN):  # type: ignore[misc]  # a run-time base
        def diag(self, x: Tensor, y: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
            with torch.no_grad():
                logits, features = self.model.forward_with_features(x)  # (B, K), (B, D)
                has_bias = self.model.last_layer.bias is not None
                loss = self.factor * self.lossfunc(logits, y)
                return loss, linear_ggn_diagonal(features, logits, has_bias)

    return LinearGGN


def _jacobian_variance(la: Any, h: Tensor) -> tuple[Tensor, Tensor]:
    """``f_μ`` and ``Var[f_c]`` ``(N, K)`` by laplace-torch's generic path: last-layer Jacobians
    and its ``functional_variance``."""
    k = la.model.last_layer.out_features
    means, variances = [h.new_zeros(0, k)], [h.new_zeros(0, k)]
    for chunk in h.split(_batch_size(k, la.n_params)):
        jacobians, f_mu = la.backend.last_layer_jacobians(chunk)  # (B, K, P), (B, K)
        means.append(f_mu)
        variances.append(la.functional_variance(jacobians).diagonal(dim1=1, dim2=2))  # (B, K)
    return torch.cat(means), torch.cat(variances)


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """Silence torch's deprecation of ``torch.jit.script``, which laplace-torch's import and the
    forward-mode derivatives of the full GGN (torch's own decompositions) call: not the user's
    to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script` is deprecated", FutureWarning)
        yield


@contextlib.contextmanager
def _quiet_root_log() -> Iterator[None]:
    """Silence the INFO line laplace-torch's import logs on the root logger about a backend
    (asdfghjkl) fseb_ft never uses: not the user's to act on."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(previous)


def _head(weight: Tensor, bias: Tensor | None, device: torch.device) -> nn.Sequential:
    """``nn.Sequential(nn.Identity(), nn.Linear)`` in float64 holding ``weight`` and ``bias``:
    on features, the classifier itself, as laplace-torch's last layer."""
    k, d = weight.shape
    linear = nn.Linear(d, k, bias=bias is not None, dtype=torch.float64, device=device)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return nn.Sequential(nn.Identity(), linear).eval()


def _tune_prior(la: Any, prior: str | float, val: tuple[Tensor, Tensor] | None) -> None:
    """Set ``la``'s prior precision by ``prior`` (:func:`fit_last_layer_laplace`)."""
    if not isinstance(prior, str):
        la.prior_precision = float(prior)
    elif prior == "marglik":
        with warnings.catch_warnings():
            # laplace-torch reminds every caller that its tuning assumes the probit link: ours does.
            warnings.filterwarnings("ignore", "By default `link_approx` is `probit`", UserWarning)
            la.optimize_prior_precision(pred_type="glm", method="marglik")
    elif prior == "validation" and val is not None:
        val_features = check_float_matrix(val[0], "val features").double()
        la.prior_precision = validation_grid_search(la, val_features, val[1])
    else:
        raise ValueError(f"prior must be marglik, validation (with val) or a float: {prior!r}")


@torch.no_grad()
def validation_grid_search(la: Any, features: Tensor, labels: Tensor) -> Tensor:
    """The prior precision of :data:`PRIOR_GRID` whose probit predictive has the lowest mean NLL
    on ``features`` ``(N, D)`` with ``labels`` ``(N,)``, the first of equal ones: what
    laplace-torch's ``optimize_prior_precision(method="gridsearch")`` is for, which fseb_ft does
    not call (docs/method.md, "Last-layer Laplace": laplace-torch 0.3 never resets its running
    NLL between grid points, and takes the Jacobians where the kron closed form serves). It
    changes ``la``'s prior precision: the caller sets the winner."""
    labels = torch.as_tensor(labels, device=features.device).long()
    losses = []
    for precision in PRIOR_GRID:
        la.prior_precision = precision
        losses.append(nn.functional.cross_entropy(_probit_logits(la, features), labels))
    return PRIOR_GRID[int(torch.stack(losses).argmin())]


def _loader(features: Tensor, labels: Tensor, batch: int) -> DataLoader:
    """The (features, labels) batches laplace-torch reads, in order."""
    labels = torch.as_tensor(labels, device=features.device).long()
    return DataLoader(TensorDataset(features, labels), batch_size=batch)


def _batch_size(k: int, n_weights: int) -> int:
    """Images per batch whose ``(B, K, P)`` Jacobians fit :data:`_JACOBIAN_BYTES`."""
    return max(1, _JACOBIAN_BYTES // (8 * k * n_weights))
