"""The objective's data term: the mean cross-entropy, weighted per class for imbalanced data.

With per-class weights ``w`` (``train.class_weights``; docs/method.md, "Class imbalance") the
data term of a batch of B examples is::

    nll_w = (1/B) Σ_i w_{y_i} · (−log p(y_i | x_i; θ))

an unbiased minibatch estimate of ``(1/N) Σ_n w_{y_n} · (−log p(y_n | x_n; θ))``, the weighted
log-likelihood of the N training images divided by N, as the unweighted term is. The weights are
scaled so that their mean over the training images is 1 (``Σ_n w_{y_n} = N``): the likelihood
keeps its total weight N against the prior terms, which the objective divides by the same N.

With soft targets ``t_i`` (B, K) (label smoothing, mixup, CutMix: docs/method.md, "Label
smoothing and mixup") the cross-entropy is ``−Σ_k t_ik log p(k | x_i; θ)`` and the weight of an
example is the class weights' mix by its *unsmoothed* target ``m_i``: ``w_{y_i}`` for a label, the
mix ``λ w_a + (1 − λ) w_b`` of its two classes' weights for a mixed pair. timm's smoothing by ε is
affine, ``t = (1 − ε) m + ε/K``, so ``m = (t − ε/K) / (1 − ε)`` and the weight is
``(Σ_k t_ik w_k − ε · mean_k w_k) / (1 − ε)``. Weighting by ``Σ_k t_ik w_k`` itself would move each
weight towards ``mean_k w_k``, which the rare classes dominate: on a 99:1 split with ε = 0.1 the
majority's weight would grow sixfold, undoing the balance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as nnf
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor

from fseb_ft.recipe import ConfigError

__all__ = ["check_class_weights", "class_weights", "example_weights", "likelihood_term"]


def likelihood_term(
    logits: Tensor, y: Tensor, weights: Tensor | None = None, smoothing: float = 0.0
) -> Tensor:
    """The mean cross-entropy of ``logits`` (B, K) at the targets ``y``, each example's
    multiplied by its weight (``weights``: (K,) per class; ``None``: unweighted).

    ``y`` is either integer labels (B,), each example weighted by its class's weight
    ``weights[y]``, or soft targets (B, K) whose rows sum to one, smoothed by ``smoothing`` (ε),
    each example weighted by :func:`example_weights` (timm's ``SoftTargetCrossEntropy`` when
    unweighted).
    Computed at least in float32 (autocast may hand over bf16 logits), never narrower than the
    logits. The mean is over the B examples, not over ``Σ_i w_{y_i}`` as
    ``cross_entropy(weight=w)`` takes it: that ratio would change the likelihood's weight from
    batch to batch. Weights of ones give the unweighted value of labels exactly (a product with
    1.0 is exact, and the reduction is the same).
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if y.dim() == 2:
        return _soft_target_term(logits, y.to(logits.dtype), weights, smoothing)
    if weights is None:
        return nnf.cross_entropy(logits, y)
    log_probs = nnf.log_softmax(logits, dim=-1) * weights.to(logits)  # (B, K)
    return nnf.nll_loss(log_probs, y)


def _soft_target_term(
    logits: Tensor, targets: Tensor, weights: Tensor | None, smoothing: float
) -> Tensor:
    """The mean soft-target cross-entropy of ``logits`` (B, K) at ``targets`` (B, K), each
    example weighted by :func:`example_weights` when ``weights`` (K,) are given."""
    if weights is None:
        return SoftTargetCrossEntropy()(logits, targets)
    per_example = torch.sum(-targets * nnf.log_softmax(logits, dim=-1), dim=-1)  # (B,)
    return (per_example * example_weights(targets, weights.to(logits), smoothing)).mean()


def example_weights(targets: Tensor, weights: Tensor, smoothing: float = 0.0) -> Tensor:
    """Each example's weight (B,): the class ``weights`` (K,) mixed by its unsmoothed target,
    ``m = (t − ε/K) / (1 − ε)`` of its ``targets`` row ``t`` (B, K) smoothed by ``smoothing`` = ε
    < 1: ``w_y`` for a smoothed label, ``λ w_a + (1 − λ) w_b`` for a smoothed mixed pair."""
    mixed = targets @ weights  # (B,) = (1 − ε) m·w + ε mean(w)
    if smoothing == 0:
        return mixed
    return (mixed - smoothing * weights.mean()) / (1 - smoothing)


def check_class_weights(choice: str | Sequence[float], num_classes: int) -> None:
    """Refuse a ``train.class_weights`` list whose length is not ``num_classes`` (K).

    Raises:
        ConfigError: the list has another length; the message names the key and K.
    """
    if not isinstance(choice, str) and len(choice) != num_classes:
        raise ConfigError(
            f"train.class_weights={list(choice)}: needs one weight per class, "
            f"{num_classes} (the classes of data.train)"
        )


def class_weights(
    choice: str | Sequence[float], labels: np.ndarray, num_classes: int
) -> Tensor | None:
    """The per-class weights (K,) of ``train.class_weights`` for the training ``labels`` (N,),
    float64, scaled to mean 1 over the training images (``Σ_n w_{y_n} = N``); ``None`` for
    ``none`` and for weights that are all equal (they scale to ones: the unweighted objective).

    ``balanced`` is scikit-learn's ``compute_class_weight("balanced")``, ``N / (K' · N_k)`` over
    the K' classes with training images, whose mean over the training images is already 1; a
    class without training images (``model.num_classes`` above the labels') enters no loss and
    gets 1. A list gives one weight per class, in label order.

    Raises:
        ConfigError: a list whose length is not ``num_classes``, the class count K.
    """
    if choice == "none":
        return None
    if choice == "balanced":
        from sklearn.utils.class_weight import compute_class_weight  # only weighted runs need it

        present = np.unique(labels)
        raw = np.ones(num_classes)
        raw[present] = compute_class_weight("balanced", classes=present, y=labels)
    else:
        check_class_weights(choice, num_classes)
        raw = np.asarray(choice, dtype=np.float64)
    if np.all(raw == raw[0]):
        return None
    return torch.from_numpy(raw / raw[labels].mean())  # (K,)
