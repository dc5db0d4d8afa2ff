"""Argument checks shared by the evaluation maths, and its float64 widening.

Every check returns its argument (some converted) or raises :class:`ValueError` naming the
argument, what was expected and what was received; :func:`to_float64` widens a tensor for the
float64 sums of :mod:`fseb_ft.evaluation.metrics`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "check_correct",
    "check_float_matrix",
    "check_float_vector",
    "check_labels",
    "check_tensor",
    "describe",
    "to_float64",
]


def describe(x: object) -> str:
    """``x`` as an error message names it: a tensor's shape and dtype, else its type."""
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"object of type {type(x).__name__}"


def check_tensor(x: object, name: str) -> Tensor:
    """Check ``x`` is a :class:`torch.Tensor`."""
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {describe(x)}")
    return x


def _check_floating(x: Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise ValueError(
            f"`{name}` must have a floating-point dtype (float16/bfloat16/float32/float64), "
            f"got {describe(x)}"
        )


def check_float_matrix(x: object, name: str) -> Tensor:
    """Check ``x`` is a non-empty ``(N, K)`` floating tensor."""
    x = check_tensor(x, name)
    if x.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D (N, K) floating tensor, got {describe(x)}")
    _check_floating(x, name)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"`{name}` must be non-empty with N >= 1 and K >= 1, got {describe(x)}")
    return x


def check_float_vector(x: object, name: str) -> Tensor:
    """Check ``x`` is a non-empty ``(N,)`` floating tensor without NaN."""
    x = check_tensor(x, name)
    if x.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D (N,) floating tensor, got {describe(x)}")
    _check_floating(x, name)
    if x.shape[0] == 0:
        raise ValueError(f"`{name}` must be non-empty (N >= 1), got {describe(x)}")
    # NaN compares unequal to itself, so it would silently corrupt sorting and tie grouping.
    if bool(torch.isnan(x).any()):
        raise ValueError(f"`{name}` must not contain NaN, got {describe(x)} with NaN entries")
    return x


def check_labels(labels: object, n: int, k: int, name: str = "labels") -> Tensor:
    """Check ``labels`` is an ``(n,)`` integer tensor with values in ``[0, k)``; return int64."""
    labels = check_tensor(labels, name)
    if labels.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D (N,) int64 tensor, got {describe(labels)}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(
            f"`{name}` must have an integer dtype (int64 expected), got {describe(labels)}"
        )
    if labels.shape[0] != n:
        raise ValueError(
            f"`{name}` must have length N={n} to match the predictions, got {describe(labels)}"
        )
    if n > 0:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= k:
            raise ValueError(
                f"`{name}` values must lie in [0, K) = [0, {k}), got values in [{lo}, {hi}]"
            )
    return labels.long()


def check_correct(correct: object, n: int) -> Tensor:
    """Check ``correct`` is an ``(n,)`` bool or 0/1 tensor (one per confidence); return bool."""
    correct = check_tensor(correct, "correct")
    if correct.ndim != 1:
        raise ValueError(
            f"`correct` must be a 1-D (N,) bool or 0/1 tensor, got {describe(correct)}"
        )
    if correct.shape[0] != n:
        raise ValueError(
            f"`correct` must have length N={n} to match `confidence`, got {describe(correct)}"
        )
    is_binary = correct.dtype == torch.bool or (
        not correct.is_complex() and bool(((correct == 0) | (correct == 1)).all())
    )
    if not is_binary:
        raise ValueError(
            f"`correct` must be a bool tensor or contain only 0 and 1, got {describe(correct)}"
        )
    return correct.bool()


def to_float64(x: Tensor) -> Tensor:
    """``x`` as float64, on its device (on the CPU for MPS, which has no float64 at all)."""
    if x.device.type == "mps":
        x = x.cpu()
    return x.to(torch.float64)
