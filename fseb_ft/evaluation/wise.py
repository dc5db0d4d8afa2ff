"""WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022) as a post-hoc
evaluation step: the fine-tuned network's weights interpolated with its starting ones,
``(1 − α) θ_start + α θ_fine-tuned``, ``α`` chosen on validation NLL from ``eval.wise_ft_alphas``
(docs/method.md, "WiSE-FT").

The backbone is interpolated; the classifier stays the fine-tuned one (the new head has no
pretrained weights to go back to). Strictly between the end points the BatchNorm running
statistics are re-estimated on the training images (torch's ``swa_utils.update_bn``): an
average of two networks' weights is a third network, whose activations neither's statistics
describe. At ``α`` = 1 the network is the fine-tuned one, at ``α`` = 0 the starting backbone with
the fine-tuned head, each with its own statistics.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader

from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import close_workers
from fseb_ft.data.splits import Splits
from fseb_ft.evaluation.predictions import (
    Predictions,
    eval_loader,
    predict_logits,
    predict_splits,
)
from fseb_ft.method.parts import head_names, unwrap_model
from fseb_ft.recipe import EvalConfig

__all__ = ["WiseFit", "choose_alpha", "fit_alpha", "interpolated_state", "set_alpha", "with_wise"]


@dataclasses.dataclass(frozen=True)
class WiseFit:
    """The chosen interpolation, and the validation NLL of every ``α`` tried."""

    alpha: float
    alphas: tuple[float, ...]
    val_nll: tuple[float, ...]

    def record(self) -> dict[str, object]:
        """What ``results.json``'s ``wise_ft`` block says of the choice, before its metrics; at
        ``α`` = 1 a ``note`` (under the tables) on why its row repeats the network's."""
        found: dict[str, object] = {
            "alpha": self.alpha,
            "alphas": list(self.alphas),
            "val_nll": list(self.val_nll),
        }
        if self.alpha == 1:
            found["note"] = "α = 1, the fine-tuned network itself, has the lowest validation NLL"
        return found


def interpolated_state(
    start: Mapping[str, Tensor], tuned: Mapping[str, Tensor], alpha: float, keep: Collection[str]
) -> dict[str, Tensor]:
    """``(1 − α) start + α tuned`` for every floating-point entry of ``tuned`` (a state dict:
    parameters and BatchNorm running statistics) but those named in ``keep`` (the classifier) and
    the integer buffers (BatchNorm's batch count), which are ``tuned``'s. The end points are
    exact: ``α`` = 1 gives ``tuned``, ``α`` = 0 ``start`` (``0 · x`` and ``x + 0`` are exact)."""
    out = {}
    for name, value in tuned.items():
        if name in keep or not value.is_floating_point():
            out[name] = value.detach().clone()
        else:
            begin = start[name].detach().to(value)
            out[name] = (1 - alpha) * begin + alpha * value.detach()
    return out


def set_alpha(
    network: nn.Module,
    start: nn.Module,
    tuned: nn.Module,
    alpha: float,
    train_loader: Iterable[Any] | None,
) -> None:
    """Load into ``network`` (a copy of ``tuned``) the weights :func:`interpolated_state` gives
    at ``alpha``, its classifier ``tuned``'s; for ``0 < α < 1`` re-estimate its BatchNorm
    statistics on the batches of ``train_loader`` (``(images, labels)``; ``None``: keep them
    interpolated)."""
    keep = set(head_names(tuned, "eval.wise_ft"))
    start_state = unwrap_model(start).state_dict()
    network.load_state_dict(interpolated_state(start_state, tuned.state_dict(), alpha, keep))
    if train_loader is not None and 0 < alpha < 1:
        device = next(network.parameters()).device
        update_bn(train_loader, network, device)


def fit_alpha(
    network: nn.Module,
    start: nn.Module,
    tuned: nn.Module,
    alphas: Sequence[float],
    train_loader: Iterable[Any],
    val_loader: DataLoader,
    accelerator: Accelerator,
) -> WiseFit:
    """Set ``network`` (a copy of ``tuned``) to each ``α`` of ``alphas`` in turn
    (:func:`set_alpha`), measure its mean NLL on ``val_loader`` (prepared), and leave it at the
    chosen one (:func:`choose_alpha`)."""
    nll = []
    for alpha in alphas:
        set_alpha(network, start, tuned, alpha, train_loader)
        logits, labels = predict_logits(network, val_loader, accelerator)
        nll.append(float(torch.nn.functional.cross_entropy(logits.double(), labels)))
    fit = choose_alpha(alphas, nll)
    set_alpha(network, start, tuned, fit.alpha, train_loader)
    return fit


def choose_alpha(alphas: Sequence[float], val_nll: Sequence[float]) -> WiseFit:
    """The ``α`` of the lowest validation NLL (the first of the grid's order on a tie)."""
    best = min(range(len(alphas)), key=lambda i: val_nll[i])
    return WiseFit(float(alphas[best]), tuple(map(float, alphas)), tuple(map(float, val_nll)))


def with_wise(
    predictions: Predictions,
    start: nn.Module,
    tuned: nn.Module,
    splits: Splits,
    spec: InputSpec,
    cfg: EvalConfig,
    accelerator: Accelerator,
    num_workers: int,
    seed: int,
) -> Predictions:
    """``predictions`` with the "+ WiSE" ones of ``tuned`` (the trained network, FS-VI's mean)
    and ``start`` (φ0) on every set :func:`~fseb_ft.evaluation.predictions.predict_splits`
    predicts, at the ``α`` of ``cfg.wise_ft_alphas`` with the lowest validation NLL (its record
    in their ``fit``), and the interpolated network's state dict (``wise_weights``).

    The training images go through the evaluation transform (no augmentation) for the
    BatchNorm statistics, the whole split in every process, so every process holds the same
    network.
    """
    tuned = unwrap_model(tuned)
    network = copy.deepcopy(tuned).to(accelerator.device)
    # Read once per α: their workers persist until the fit ends.
    train = eval_loader(splits.train, spec, cfg.batch_size, num_workers, seed, persistent=True)
    val = accelerator.prepare(
        eval_loader(splits.val, spec, cfg.batch_size, num_workers, seed, persistent=True)
    )
    try:
        fit = fit_alpha(network, start, tuned, cfg.wise_ft_alphas, train, val, accelerator)
    finally:
        close_workers(train, val)
    # The interpolated network's own predictions: no post-hoc step on top of it.
    plain = dataclasses.replace(cfg, temperature_scaling=False, laplace=False, wise_ft=False)
    wise = predict_splits(network, splits, spec, plain, accelerator, num_workers, seed)
    weights = {name: value.detach().cpu() for name, value in network.state_dict().items()}
    return dataclasses.replace(
        predictions, wise=dataclasses.replace(wise, fit=fit.record()), wise_weights=weights
    )
