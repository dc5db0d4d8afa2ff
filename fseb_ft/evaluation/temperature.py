"""Temperature scaling (Guo et al., 2017): one temperature fitted on validation logits.

Pure tensor maths; conventions and argument checks are those of the metrics
(:mod:`fseb_ft.evaluation.checks`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_matrix, check_labels, describe, to_float64

__all__ = ["TEMPERATURE_RANGE", "fit_temperature", "temperature_identified", "temperature_warnings"]

TEMPERATURE_RANGE = (1e-3, 1e3)
"""The temperatures :func:`fit_temperature` searches."""
# 80 golden-section steps shrink the log T interval of width 13.8 by 0.618^80 to < 1e-15,
# float64's resolution of log T.
_LOG_T_RANGE = (math.log(TEMPERATURE_RANGE[0]), math.log(TEMPERATURE_RANGE[1]))
_GOLDEN_STEPS = 80


def fit_temperature(logits: Tensor, labels: Tensor) -> Tensor:
    """The temperature ``T > 0`` minimising the NLL of ``softmax(logits / T)`` (Guo et al.,
    2017): temperature scaling, fitted on validation logits.

    With ``β = 1/T`` the NLL ``(1/N) Σ_i [logsumexp_k(β f_ik) - β f_iy]`` is convex in ``β``, so it
    is unimodal in ``log T``: a golden-section search over ``log T ∈ [log 1e-3, log 1e3]`` in
    float64 finds its minimum deterministically (no random start, no step size). A minimum
    beyond the range (e.g. perfectly separated logits, whose NLL falls as ``T → 0``) returns
    the nearest end. Dividing by ``T`` never changes the arg-max, so accuracy is unchanged.

    Args:
        logits: ``(N, K)`` finite logits of one model (validation split).
        labels: ``(N,)`` integer labels in ``[0, K)``.

    Returns:
        0-dim float64 tensor ``T`` (apply as ``softmax(logits / T)``).
    """
    logits = check_float_matrix(logits, "logits")
    labels = check_labels(labels, logits.shape[0], logits.shape[1])
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"`logits` must be finite, got {describe(logits)} with inf or NaN")
    z = to_float64(logits)  # (N, K)
    z_true = z.gather(1, labels.to(z.device)[:, None]).squeeze(1)  # (N,)

    def loss(log_t: float) -> float:
        beta = math.exp(-log_t)
        return float((torch.logsumexp(beta * z, dim=-1) - beta * z_true).mean())

    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    lo, hi = _LOG_T_RANGE
    a, b = hi - inv_phi * (hi - lo), lo + inv_phi * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(_GOLDEN_STEPS):
        if fa <= fb:  # the minimum lies in [lo, b]
            hi, b, fb = b, a, fa
            a = hi - inv_phi * (hi - lo)
            fa = loss(a)
        else:  # in [a, hi]
            lo, a, fa = a, b, fb
            b = lo + inv_phi * (hi - lo)
            fb = loss(b)
    return torch.tensor(math.exp((lo + hi) / 2), dtype=torch.float64, device=z.device)


def temperature_identified(temperature: float) -> bool:
    """Whether a fitted ``temperature`` is a minimum of the validation NLL, not an end of
    :data:`TEMPERATURE_RANGE` the search ran into.

    At the lower end the NLL was still falling as ``T → 0``: every validation image is
    predicted correctly, so validation cannot say how confident the model should be, and
    scaling by that ``T`` makes every test error cost hundreds of nats. (Golden-section
    search ends within 1e-15 of an end in log T; 1 % is far from any interior minimum.)
    """
    low, high = TEMPERATURE_RANGE
    return low * 1.01 < temperature < high / 1.01


def temperature_warnings(temperature: float | None) -> list[str]:
    """A temperature at an end of the fitted range means the fit ran into it, not a minimum."""
    if temperature is None or temperature_identified(temperature):
        return []
    why = " (the validation split is predicted perfectly: its NLL falls as T → 0)"
    return [
        f"the temperature T = {temperature:.4g} is at an end of the range temperature scaling "
        f"searches, [{TEMPERATURE_RANGE[0]:g}, {TEMPERATURE_RANGE[1]:g}]"
        f"{why if temperature < 1 else ''}: the fit "
        "found no minimum inside it; --temperature 1 gives the raw outputs"
    ]
