"""Feature-space OOD scores: pure tensor maths (docs/method.md, "Feature-space OOD scores").

The features are the fine-tuned network's penultimate ones, the input of its classifier (timm's
``forward_head(forward_features(x), pre_logits=True)``): that is where Lee et al. (2018) fit
their class-conditional Gaussians, where the logits are linear (so ViM's principal space and its
origin ``-W⁺b`` are defined by the classifier's own ``W`` and ``b``), and it is the fine-tuned
model's representation of the task, not φ0's (the prior's features).

:func:`fit_feature_ood` fits everything once on the training split's features;
:func:`feature_ood_score` scores new features. Every score is per sample, larger meaning more
likely out of distribution, like the logit scores of :mod:`fseb_ft.evaluation.ood`:

- ``mahalanobis``: ``min_k (h − μ_k)ᵀ Σ⁻¹ (h − μ_k)``, class means and one shared (tied)
  covariance (Lee et al., 2018);
- ``relative_mahalanobis``: ``min_k MD_k(h) − MD_0(h)``, ``MD_0`` the Mahalanobis distance under
  one background Gaussian of all training features (Ren et al., 2021);
- ``knn``: the distance of the unit-normalised ``h`` to its k-th nearest unit-normalised
  training feature (Sun et al., 2022; k = 50, at most the training size);
- ``vim``: ``α ‖P⊥(h − u)‖ − logsumexp(W h + b)``, the virtual logit minus the energy (Wang et
  al., 2022), a monotone transform of the virtual class's softmax probability.

Covariances are float64 with a ridge of ``ridge · mean eigenvalue`` on the diagonal (scale-free;
it keeps them invertible when the training split has fewer images than feature dimensions), and
are used through their Cholesky factors (``torch.linalg``), never an explicit inverse. The unit
training features KNN compares with are float32: they are the bulk of the fit (N × D), a model
keeps them (:func:`fit_tensors`), and a cosine similarity needs no more digits; the scores are
computed in float64 all the same.

:func:`fit_tensors` and :func:`fit_from_tensors` turn a fit into named tensors and back, exactly
(what a model folder stores, ``fseb_ft.runs.feature_fit``); :func:`fit_scores` names the scores
a fit can compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.checks import check_float_matrix, describe, to_float64
from fseb_ft.recipe.options import FEATURE_OOD_SCORES

__all__ = [
    "FEATURE_SCORES",
    "FeatureOodFit",
    "feature_ood_score",
    "fit_feature_ood",
    "fit_from_tensors",
    "fit_scores",
    "fit_tensors",
    "knn_score",
    "mahalanobis_distances",
    "mahalanobis_score",
    "relative_mahalanobis_score",
    "vim_principal_dim",
    "vim_score",
]

FEATURE_SCORES = FEATURE_OOD_SCORES
"""The feature-space scores, in the order of :data:`~fseb_ft.recipe.options.OOD_SCORES`."""

_KNN_CHUNK = 256  # rows scored at once: bounds the (rows, N_train) similarity matrix
_MAHALANOBIS_ELEMENTS = 1 << 22  # bounds the (rows, K, D) differences scored at once (32 MiB)


@dataclass(frozen=True)
class FeatureOodFit:
    """What the feature scores need of the training split's features, float64 but for
    ``train_unit``.

    Attributes:
        means: ``(K, D)`` class means (the classes present in the training labels).
        chol: ``(D, D)`` lower Cholesky factor of the shared class covariance + ridge.
        background_mean: ``(D,)`` mean of all training features.
        background_chol: ``(D, D)`` Cholesky factor of their covariance + ridge.
        train_unit: ``(N, D)`` the training features scaled to unit length, float32.
        k: the neighbour whose distance ``knn`` reports.
        weight: ``(C, D)`` the classifier's weights; ``None`` without them (no ``vim``).
        bias: ``(C,)`` its bias.
        origin: ``(D,)`` ViM's origin ``u = −W⁺ b``.
        residual: ``(D, D − D')`` orthonormal basis of the complement of ViM's principal space.
        alpha: ViM's scale, mean max logit over mean residual norm on the training split.
    """

    means: Tensor
    chol: Tensor
    background_mean: Tensor
    background_chol: Tensor
    train_unit: Tensor
    k: int
    weight: Tensor | None = None
    bias: Tensor | None = None
    origin: Tensor | None = None
    residual: Tensor | None = None
    alpha: float | None = None


def fit_feature_ood(
    features: Tensor,
    labels: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    k: int = 50,
    ridge: float = 1e-6,
    principal_dim: int | None = None,
) -> FeatureOodFit:
    """Fit the feature scores on the training split's penultimate features.

    Args:
        features: ``(N, D)`` training features, from the network in eval mode, un-augmented.
        labels: ``(N,)`` their class labels.
        weight: ``(C, D)`` the classifier's weights (ViM); ``None``: no ``vim``.
        bias: ``(C,)`` its bias (zeros when it has none).
        k: KNN's neighbour, capped at ``N``.
        ridge: added to the covariances' diagonals, times their mean eigenvalue; ``≥ 0``.
        principal_dim: ViM's principal dimension ``D'`` (``< D``); ``None``:
            :func:`vim_principal_dim`.

    Returns:
        The fit, float64 (``train_unit`` float32) on ``features``' device.
    """
    h = to_float64(check_float_matrix(features, "features"))
    labels = torch.as_tensor(labels, device=h.device).long()
    if labels.shape != (h.shape[0],):
        raise ValueError(f"`labels` must have shape ({h.shape[0]},), got {describe(labels)}")
    if h.shape[0] < 2 or k < 1 or ridge < 0:
        raise ValueError(f"need ≥ 2 features, k ≥ 1 and ridge ≥ 0, got {h.shape[0]}, {k}, {ridge}")
    classes = labels.unique()  # sorted
    means = torch.stack([h[labels == c].mean(0) for c in classes])  # (K, D)
    within = h - means[torch.searchsorted(classes, labels)]  # (N, D) class-centred
    background_mean = h.mean(0)  # (D,)
    fit = FeatureOodFit(
        means=means,
        chol=_cholesky(within, ridge),
        background_mean=background_mean,
        background_chol=_cholesky(h - background_mean, ridge),
        train_unit=_unit(h).float(),  # (N, D) float32: the bulk of what a model keeps
        k=min(k, h.shape[0]),
    )
    if weight is None:
        return fit
    return _fit_vim(fit, h, weight, bias, principal_dim)


def _cholesky(centred: Tensor, ridge: float) -> Tensor:
    """Lower Cholesky factor of ``centredᵀ centred / N`` + ``ridge`` · its mean eigenvalue."""
    cov = centred.T @ centred / centred.shape[0]  # (D, D), the maximum-likelihood covariance
    if not cov.diagonal().any():
        raise FsebError(
            "feature OOD scores: the training split's penultimate features do not vary (every "
            "image of a class gives the same features), so no Gaussian can be fitted to them"
        )
    cov = cov + ridge * cov.diagonal().mean() * torch.eye(
        cov.shape[0], dtype=cov.dtype, device=cov.device
    )
    return torch.linalg.cholesky(cov)


def _unit(h: Tensor) -> Tensor:
    """Rows scaled to unit Euclidean length (a zero row stays zero)."""
    return h / h.norm(dim=1, keepdim=True).clamp_min(torch.finfo(h.dtype).tiny)


def vim_principal_dim(dim: int) -> int:
    """ViM's principal dimension for ``dim`` features, Wang et al.'s (2022) choices: 1000 for
    ``D ≥ 2048``, 512 for ``D ≥ 768``, else ``D // 2`` (at least 1)."""
    if dim >= 2048:
        return 1000
    return 512 if dim >= 768 else max(dim // 2, 1)


def _fit_vim(
    fit: FeatureOodFit, h: Tensor, weight: Tensor, bias: Tensor | None, principal_dim: int | None
) -> FeatureOodFit:
    """``fit`` with ViM's origin, residual space and ``α`` (Wang et al., 2022)."""
    w = to_float64(check_float_matrix(weight, "weight"))
    b = torch.zeros(w.shape[0], dtype=w.dtype) if bias is None else to_float64(bias)
    dim = h.shape[1]
    if w.shape[1] != dim or b.shape != (w.shape[0],):
        raise ValueError(f"classifier {describe(w)} + bias {describe(b)} for {dim} features")
    d = vim_principal_dim(dim) if principal_dim is None else principal_dim
    if not 1 <= d < dim:
        raise ValueError(f"ViM's principal dimension must be in [1, {dim}), got {d}")
    origin = -torch.linalg.pinv(w) @ b  # (D,), where the logits are 0
    centred = h - origin  # (N, D)
    _, vectors = torch.linalg.eigh(centred.T @ centred / h.shape[0])  # ascending eigenvalues
    residual = vectors[:, : dim - d]  # (D, D − d), the least-explained directions
    max_logit = (h @ w.T + b).max(dim=1).values  # (N,)
    alpha = float(max_logit.mean() / (centred @ residual).norm(dim=1).mean())
    return dataclasses.replace(fit, weight=w, bias=b, origin=origin, residual=residual, alpha=alpha)


def mahalanobis_distances(h: Tensor, means: Tensor, chol: Tensor) -> Tensor:
    """``(N, K)`` squared Mahalanobis distances ``(h_n − μ_k)ᵀ Σ⁻¹ (h_n − μ_k)``, ``Σ = L Lᵀ``:
    features and means whitened by one triangular solve each, the differences taken in chunks of
    rows so that memory stays bounded whatever N, K and D."""
    white = torch.linalg.solve_triangular(chol, h.T, upper=False).T  # (N, D)
    white_means = torch.linalg.solve_triangular(chol, means.T, upper=False).T  # (K, D)
    rows = max(1, _MAHALANOBIS_ELEMENTS // white_means.numel())
    return torch.cat(
        [
            (chunk[:, None, :] - white_means[None, :, :]).pow(2).sum(-1)  # (rows, K)
            for chunk in white.split(rows)
        ]
    )  # (N, K)


def mahalanobis_score(fit: FeatureOodFit, features: Tensor) -> Tensor:
    """``min_k`` squared Mahalanobis distance to the class means (Lee et al., 2018): ``(N,)``."""
    h = _features(fit, features)
    return mahalanobis_distances(h, fit.means, fit.chol).min(dim=1).values


def relative_mahalanobis_score(fit: FeatureOodFit, features: Tensor) -> Tensor:
    """``min_k MD_k − MD_0`` (Ren et al., 2021), ``MD_0`` under the background Gaussian:
    ``(N,)``."""
    h = _features(fit, features)
    background = mahalanobis_distances(h, fit.background_mean[None], fit.background_chol)[:, 0]
    return mahalanobis_distances(h, fit.means, fit.chol).min(dim=1).values - background


def knn_score(fit: FeatureOodFit, features: Tensor) -> Tensor:
    """Euclidean distance of the unit feature to its ``k``-th nearest unit training feature (Sun
    et al., 2022), ``√(2 − 2 cos)`` of the k-th largest cosine similarity: ``(N,)``."""
    unit = _unit(_features(fit, features))
    train = fit.train_unit.to(unit.dtype)  # (N, D) float64 of the float32 kept
    out = []
    for rows in unit.split(_KNN_CHUNK):
        similar = (rows @ train.T).topk(fit.k, dim=1).values[:, -1]  # (n,)
        out.append((2 - 2 * similar).clamp_min(0).sqrt())
    return torch.cat(out)


def vim_score(fit: FeatureOodFit, features: Tensor) -> Tensor:
    """``α ‖(h − u) R‖ − logsumexp(W h + b)`` (Wang et al., 2022), ``R`` the residual basis:
    ``(N,)``."""
    if fit.residual is None or fit.weight is None or fit.bias is None or fit.alpha is None:
        raise ValueError("the `vim` score needs a fit with the classifier's weights")
    h = _features(fit, features)
    origin = cast(Tensor, fit.origin)  # set with the residual space (_fit_vim)
    virtual = fit.alpha * ((h - origin) @ fit.residual).norm(dim=1)  # (N,)
    return virtual - torch.logsumexp(h @ fit.weight.T + fit.bias, dim=1)


_SCORES = {
    "mahalanobis": mahalanobis_score,
    "relative_mahalanobis": relative_mahalanobis_score,
    "knn": knn_score,
    "vim": vim_score,
}


def feature_ood_score(name: str, fit: FeatureOodFit, features: Tensor) -> Tensor:
    """The feature score ``name`` of :data:`FEATURE_SCORES` of ``(N, D)`` features: ``(N,)``
    float64, larger = more likely OOD."""
    if name not in _SCORES:
        raise ValueError(f"`name` must be one of {list(FEATURE_SCORES)}, got {name!r}")
    return _SCORES[name](fit, features)


def _features(fit: FeatureOodFit, features: Tensor) -> Tensor:
    """``features`` checked against the fit's dimension, float64 on its device."""
    h = to_float64(check_float_matrix(features, "features")).to(fit.means.device)
    if h.shape[1] != fit.means.shape[1]:
        raise ValueError(
            f"`features` must have {fit.means.shape[1]} columns, like the fit's, got {describe(h)}"
        )
    return h


_VIM_FIELDS = ("weight", "bias", "origin", "residual", "alpha")
"""The fields of a fit that ViM needs, ``None`` without the classifier."""


def fit_scores(fit: FeatureOodFit) -> tuple[str, ...]:
    """The scores of :data:`FEATURE_SCORES` that ``fit`` can compute: all of them, but ``vim``
    only with the classifier's weights."""
    return tuple(name for name in FEATURE_SCORES if name != "vim" or fit.weight is not None)


def fit_tensors(fit: FeatureOodFit) -> dict[str, Tensor]:
    """``fit`` as named contiguous tensors (as safetensors stores them), each field at its own
    dtype (``k``: 0-dim int64, ``alpha``: 0-dim float64); the ViM fields only when fitted.
    :func:`fit_from_tensors` inverts it exactly."""
    out = {}
    for field in dataclasses.fields(fit):
        value = getattr(fit, field.name)
        if value is None:
            continue
        if field.name == "k":
            value = torch.tensor(value, dtype=torch.int64)
        elif field.name == "alpha":
            value = torch.tensor(value, dtype=torch.float64)
        out[field.name] = value.contiguous()  # a Cholesky factor comes column-major
    return out


def fit_from_tensors(tensors: Mapping[str, Tensor]) -> FeatureOodFit:
    """The fit :func:`fit_tensors` gave ``tensors`` of.

    Raises:
        ValueError: a field is missing, or only some of ViM's are there.
    """
    required = [f.name for f in dataclasses.fields(FeatureOodFit) if f.name not in _VIM_FIELDS]
    vim = [name for name in _VIM_FIELDS if name in tensors]
    missing = [name for name in required if name not in tensors]
    if missing or vim not in ([], list(_VIM_FIELDS)):
        lacking = missing + [name for name in _VIM_FIELDS if vim and name not in tensors]
        raise ValueError(f"not a feature-score fit: {lacking} missing")
    values: dict[str, Any] = {name: tensors[name] for name in (*required, *vim)}
    values["k"] = int(values["k"])
    if vim:
        values["alpha"] = float(values["alpha"])
    return FeatureOodFit(**values)
