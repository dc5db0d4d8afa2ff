"""What evaluation computes from the penultimate features, the linear classifier's input: one
un-augmented pass over a split (:func:`predict_features`: the training split's), the feature
OOD scores' values fitted on the training split's (:func:`feature_scores`, of the features the
evaluation passes record), and the last-layer Laplace fitted on them
(:func:`fit_laplace_logits`), which turns the features the evaluation passes record into LLLA's
logits (:class:`LaplaceLogits`).

The maths is :mod:`~fseb_ft.evaluation.feature_ood`'s and :mod:`~fseb_ft.evaluation.laplace`'s;
the passes over the other splits are :mod:`~fseb_ft.evaluation.predictions`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import FEATURE_SCORES, feature_ood_score, fit_feature_ood
from fseb_ft.evaluation.laplace import (
    LaplaceFit,
    check_hessian_size,
    fit_last_layer_laplace,
    laplace_logits,
    laplace_torch,
)
from fseb_ft.logs import progress_bar
from fseb_ft.method.parts import unwrap_model
from fseb_ft.recipe import EvalConfig

__all__ = [
    "LaplaceLogits",
    "feature_scores",
    "fit_laplace_logits",
    "laplace_classifier",
    "laplace_validates",
    "linear_classifier",
    "predict_features",
    "wants_feature_scores",
]


@dataclasses.dataclass(frozen=True)
class LaplaceLogits:
    """A fitted last-layer Laplace at work in the evaluation passes: the classifier whose input
    the passes record (a forward hook, so no second forward), and the fit that turns those
    features into LLLA's probit-scaled logits, computed on ``device``."""

    classifier: nn.Module
    fit: LaplaceFit
    device: torch.device

    def logits(self, features: Tensor) -> Tensor:
        """LLLA's float32 logits (N, K) on CPU of the classifier's inputs ``features`` (N, D)."""
        return laplace_logits(self.fit, features.to(self.device)).float().cpu()


def laplace_validates(cfg: EvalConfig) -> bool:
    """Whether the last-layer Laplace's prior is tuned on the validation split."""
    return cfg.laplace and cfg.laplace_prior == "validation"


def fit_laplace_logits(
    classifier: nn.Linear,
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor] | None,
    cfg: EvalConfig,
    device: torch.device,
) -> LaplaceLogits:
    """The last-layer Laplace of ``cfg`` (``eval.laplace_hessian``, ``eval.laplace_prior``)
    around ``classifier``, fitted on ``device`` on the training split's features and labels
    ``train``, its prior tuned on the validation split's ``val`` when ``cfg`` says so.

    Raises:
        FsebError: ``eval.laplace_prior=validation`` without a validation split.
    """
    if laplace_validates(cfg) and val is None:
        raise FsebError(
            "eval.laplace_prior=validation needs a validation split (data.val_fraction or "
            "data.val); use eval.laplace_prior=marglik"
        )
    bias = None if classifier.bias is None else classifier.bias.detach().to(device)
    fit = fit_last_layer_laplace(
        train[0].to(device),
        train[1],
        classifier.weight.detach().to(device),
        bias,
        cfg.laplace_hessian,
        cfg.laplace_prior,
        (val[0].to(device), val[1]) if laplace_validates(cfg) and val is not None else None,
    )
    return LaplaceLogits(classifier, fit, device)


@torch.no_grad()
def predict_features(
    network: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 penultimate features (N, D), the classifier's input (timm's
    ``forward_head(forward_features(x), pre_logits=True)``), and labels (N,) on CPU, in eval
    mode, each sample counted once."""
    inner = unwrap_model(network)
    was_training = inner.training
    inner.eval()
    found, labels = [], []
    main = accelerator.is_main_process
    for x, y in progress_bar(loader, desc="features", show=main, leave=False):
        with accelerator.autocast():
            timm_model = cast(Any, inner)  # timm's methods, which nn.Module does not declare
            h = timm_model.forward_head(timm_model.forward_features(x), pre_logits=True)  # (B, D)
        h, y = accelerator.gather_for_metrics((h.float().flatten(1), y))
        found.append(h.cpu())
        labels.append(y.cpu())
    inner.train(was_training)
    return torch.cat(found), torch.cat(labels)


def wants_feature_scores(names: Sequence[str]) -> bool:
    """Whether the OOD scores ``names`` (``eval.ood_scores``) hold a feature score."""
    return any(name in FEATURE_SCORES for name in names)


def feature_scores(
    network: nn.Module,
    names: Sequence[str],
    train: tuple[Tensor, Tensor] | None,
    test: Tensor,
    ood: Mapping[str, Tensor],
) -> dict[str, Any]:
    """The feature scores of ``names`` (:mod:`~fseb_ft.evaluation.feature_ood`) of the
    penultimate features ``test`` (N, D) of the reported split and ``ood`` (N_o, D) of each OOD
    set, fitted on ``train``, the training split's features and labels
    (:func:`predict_features`: one un-augmented pass in eval mode): the
    :class:`~fseb_ft.evaluation.predictions.Predictions` fields ``test_feature_scores``,
    ``ood_feature_scores`` and ``feature_fit``, empty when ``names`` has none.

    The fit holds ViM's part whenever the classifier is linear, ``vim`` named or not, so that
    the fit a run keeps serves every feature score in ``fseb-ft predict``.
    """
    wanted = [name for name in names if name in FEATURE_SCORES]
    if not wanted:
        return {}
    if train is None:
        raise ValueError("the feature scores need the training split's features")
    fit = fit_feature_ood(*train, *_vim_classifier(network, "vim" in wanted))

    def scores(h: Tensor) -> dict[str, Tensor]:
        return {name: feature_ood_score(name, fit, h) for name in wanted}

    return {
        "test_feature_scores": scores(test),
        "ood_feature_scores": {name: scores(h) for name, h in ood.items()},
        "feature_fit": fit,
    }


def _vim_classifier(network: nn.Module, required: bool) -> tuple[Tensor | None, Tensor | None]:
    """The linear classifier's weight and bias, for ViM; unless ``required``, ``(None, None)``
    for another head or one of a single feature (ViM's principal space must be smaller)."""
    head = cast(Any, unwrap_model(network)).get_classifier()  # a timm model's
    if not required and not (isinstance(head, nn.Linear) and head.in_features > 1):
        return None, None
    head = linear_classifier(network, "eval.ood_scores: vim")
    bias = None if head.bias is None else head.bias.detach().float().cpu()
    return head.weight.detach().float().cpu(), bias


def laplace_classifier(network: nn.Module, cfg: EvalConfig) -> nn.Linear:
    """The classifier ``eval.laplace`` fits, checked before any pass: laplace-torch installed,
    a linear classifier, and one small enough for ``eval.laplace_hessian=full``.

    Raises:
        FsebError: naming what to change.
    """
    laplace_torch()
    head = linear_classifier(network, "eval.laplace")
    check_hessian_size(
        cfg.laplace_hessian, head.in_features, head.out_features, head.bias is not None
    )
    return head


def linear_classifier(network: nn.Module, key: str) -> nn.Linear:
    """The network's linear classifier (timm's ``get_classifier()``), which ``key`` needs.

    Raises:
        FsebError: it is not an ``nn.Linear``.
    """
    head = cast(Any, unwrap_model(network)).get_classifier()  # a timm model's
    if not isinstance(head, nn.Linear):
        raise FsebError(
            f"{key} needs a linear classifier (timm's get_classifier()), this model's is "
            f"{type(head).__name__}"
        )
    return head
