"""The graph ``fseb-ft export`` writes: one ``torch.nn.Module`` from normalised images to what
``fseb-ft predict`` reports of each image, with the abstention rule and the OOD scores inside.

:class:`DeployedModel` runs the network once (timm's ``forward_features``, then ``forward_head``
for the logits and, with a feature fit, ``forward_head(pre_logits=True)`` for the penultimate
features, as predict's pass does) and computes, in float64 as predict does from the float32
logits, with the functions predict calls where they trace:

- ``probabilities``: ``softmax(logits / T)``, ``T`` the run's temperature (1 without one);
- ``predicted``: the index of the top class;
- ``log_odds``: the top class's log-odds (:func:`~fseb_ft.evaluation.selective.top_class_log_odds`);
- ``abstain``: ``log_odds < log(τ / (1 − τ))``, the rule's threshold;
- ``entropy`` and ``energy`` of the temperature-scaled logits
  (:func:`~fseb_ft.evaluation.ood.entropy_score`, :func:`~fseb_ft.evaluation.ood.energy_score`);
- with the fit the model keeps, ``mahalanobis`` (:func:`mahalanobis_min`, the one definition
  rewritten for tracing: ONNX has no triangular solve) and, when the fit has the classifier,
  ``vim`` (:func:`~fseb_ft.evaluation.feature_ood.vim_score` itself).

:data:`OUTPUTS` defines each output in words, for the file's metadata.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from fseb_ft.evaluation.feature_ood import FeatureOodFit, fit_scores, vim_score
from fseb_ft.evaluation.ood import energy_score, entropy_score
from fseb_ft.evaluation.selective import top_class_log_odds

__all__ = ["OUTPUTS", "DeployedModel", "mahalanobis_min", "output_definitions", "whitened"]

OUTPUTS = {
    "probabilities": "(N, K) float64: softmax(logits / T), T the temperature",
    "predicted": "(N,) int64: the index of the top class (class_names gives its name)",
    "log_odds": "(N,) float64: the top class's log-odds log(p_max / (1 - p_max)), computed as "
    "z_max - logsumexp of the other z, z = logits / T",
    "abstain": "(N,) bool: log_odds < abstention.log_odds_threshold, i.e. p_max < threshold",
    "entropy": "(N,) float64: predictive entropy -sum_k p_k log p_k in nats (larger: more OOD)",
    "energy": "(N,) float64: energy -logsumexp(logits / T) (larger: more OOD)",
    "mahalanobis": "(N,) float64: min over classes of the squared Mahalanobis distance of the "
    "penultimate features to the training split's class means, shared covariance "
    "(larger: more OOD)",
    "vim": "(N,) float64: ViM, alpha * |(h - u) R| - logsumexp(W h + b) of the penultimate "
    "features h (larger: more OOD)",
}
"""Every output the graph can have, in its order, and what it is (the metadata's ``outputs``)."""


def whitened(fit: FeatureOodFit) -> tuple[Tensor, Tensor]:
    """``L⁻¹`` ``(D, D)`` of the fit's Cholesky factor ``L`` and the whitened class means
    ``L⁻¹ μ_k`` ``(K, D)``, float64: what :func:`mahalanobis_min` needs, computed once."""
    eye = torch.eye(fit.chol.shape[0], dtype=fit.chol.dtype)
    inverse = torch.linalg.solve_triangular(fit.chol, eye, upper=False)  # (D, D)
    return inverse, fit.means @ inverse.T


def mahalanobis_min(features: Tensor, inverse: Tensor, white_means: Tensor) -> Tensor:
    """:func:`~fseb_ft.evaluation.feature_ood.mahalanobis_score` for tracing: ``min_k ‖L⁻¹ h −
    L⁻¹ μ_k‖²`` with ``L⁻¹`` given (:func:`whitened`), in one piece (the original solves
    triangular systems and scores in chunks whose count depends on the batch size).

    Args:
        features: ``(N, D)`` penultimate features.
        inverse: ``(D, D)`` ``L⁻¹``.
        white_means: ``(K, D)`` the whitened class means.

    Returns:
        ``(N,)`` float64.
    """
    white = features.to(torch.float64) @ inverse.T  # (N, D)
    return (white[:, None, :] - white_means[None, :, :]).pow(2).sum(-1).min(dim=1).values


class DeployedModel(nn.Module):
    """``network`` with its temperature, abstention threshold and OOD scores: images ``(N, C,
    H, W)`` → the :data:`OUTPUTS` it has, in that order (:attr:`output_names`)."""

    def __init__(
        self,
        network: nn.Module,
        temperature: float | None,
        log_odds_threshold: float,
        fit: FeatureOodFit | None = None,
    ) -> None:
        super().__init__()
        self.network = network.eval()
        self.temperature = float(temperature or 1.0)
        self.log_odds_threshold = float(log_odds_threshold)
        self.scores = () if fit is None else tuple(s for s in ("mahalanobis", "vim")
                                                   if s in fit_scores(fit))  # fmt: skip
        self.output_names = [
            *("probabilities", "predicted", "log_odds", "abstain", "entropy", "energy"),
            *self.scores,
        ]
        self.vim_alpha = None if fit is None else fit.alpha
        if fit is not None:
            inverse, white_means = whitened(fit)
            self.register_buffer("inverse", inverse)
            self.register_buffer("white_means", white_means)
            for name in ("means", "weight", "bias", "origin", "residual"):
                if getattr(fit, name) is not None:
                    self.register_buffer(f"vim_{name}", getattr(fit, name))

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        """The outputs of ``images`` ``(N, C, H, W)``, normalised as the network's input."""
        timm_network = cast(Any, self.network)  # timm's methods, which nn.Module does not declare
        found = timm_network.forward_features(images)
        z = timm_network.forward_head(found).to(torch.float64) / self.temperature  # (N, K)
        probs = torch.softmax(z, dim=-1)
        log_odds = top_class_log_odds(z)  # (N,)
        outputs = [probs, z.argmax(dim=-1), log_odds, log_odds < self.log_odds_threshold]
        outputs += [entropy_score(probs), energy_score(z)]
        if self.scores:
            h = timm_network.forward_head(found, pre_logits=True).flatten(1)  # (N, D)
            outputs.append(mahalanobis_min(h, self._buffer("inverse"), self._buffer("white_means")))
            if "vim" in self.scores:
                outputs.append(vim_score(self._vim_fit(), h))
        return tuple(outputs)

    def _vim_fit(self) -> FeatureOodFit:
        """The fit's fields :func:`vim_score` reads, as this module's buffers (so they are the
        graph's initializers); the others are left empty."""
        empty = torch.empty(0, dtype=torch.float64)
        return FeatureOodFit(
            means=self._buffer("vim_means"), chol=empty, background_mean=empty,
            background_chol=empty, train_unit=empty, k=1, weight=self._buffer("vim_weight"),
            bias=self._buffer("vim_bias"), origin=self._buffer("vim_origin"),
            residual=self._buffer("vim_residual"), alpha=self.vim_alpha,
        )  # fmt: skip

    def _buffer(self, name: str) -> Tensor:
        """The buffer ``name`` (``nn.Module``'s attributes are typed as modules or tensors)."""
        return cast(Tensor, getattr(self, name))


def output_definitions(names: list[str]) -> dict[str, str]:
    """:data:`OUTPUTS`'s definitions of ``names``, in their order."""
    return {name: OUTPUTS[name] for name in names}
