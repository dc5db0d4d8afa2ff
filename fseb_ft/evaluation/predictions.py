"""Predictions of a model on the evaluation sets: the test split (the validation split when the
recipe has no ``data.test``), the OOD sets and that split corrupted by ``eval.corruptions``,
each sample counted once across processes.

The metrics and files made from them are :mod:`fseb_ft.runs.report`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.splits import TEST_SPLIT, VALIDATION_SPLIT, Splits, stratified_split
from fseb_ft.data.transforms import TransformedImages, eval_transform, make_loader
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import (
    FEATURE_SCORES,
    FeatureOodFit,
    feature_ood_score,
    fit_feature_ood,
)
from fseb_ft.evaluation.groups import Groups, reported_groups
from fseb_ft.method.posterior import unwrap_model
from fseb_ft.recipe import EvalConfig

__all__ = [
    "Predictions",
    "corruption_subset",
    "eval_loader",
    "feature_scores",
    "predict",
    "predict_corruptions",
    "predict_features",
    "predict_logits",
    "predict_splits",
]


@dataclasses.dataclass
class Predictions:
    """One model's (or ensemble's) predictions on the evaluation sets, on CPU."""

    test: tuple[Tensor, Tensor]
    """(log-probabilities (N, K), labels (N,)) on the in-distribution split reported on: the
    test split, or the validation split when there is none (``split`` names it)."""
    ood: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """OOD set name → log-probabilities (N_o, K)."""
    corruptions: dict[str, dict[int, Tensor]] = dataclasses.field(default_factory=dict)
    """Corruption name → severity → log-probabilities (N_c, K) on the corrupted test split (the
    test images, or the ``eval.corruption_limit`` subset of them; see
    :func:`predict_corruptions`)."""
    corruption_labels: Tensor | None = None
    """Labels (N_c,) of the corrupted images; ``None``: those of ``test`` (no subset)."""
    test_logits: Tensor | None = None
    """Logits (N, K) behind ``test``; ``None`` for an ensemble (averaged probabilities)."""
    ood_logits: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """OOD set name → logits (N_o, K); empty for an ensemble."""
    val: tuple[Tensor, Tensor] | None = None
    """(logits (N_v, K), labels (N_v,)) on the validation split, for ``eval.temperature_scaling``
    (an ensemble's: its log-probabilities, which softmax treats alike); ``None`` when it is
    off."""
    split: str = TEST_SPLIT
    """The split behind ``test`` and the corruptions: ``TEST_SPLIT`` or ``VALIDATION_SPLIT``."""
    groups: Groups | None = None
    """The ``eval.group_by`` value of each image of ``test``, in its order; ``None``: no
    per-group results."""
    class_names: list[str] | None = None
    """The training split's class names, index = label, for tables and figures; ``None``: the
    labels stand for themselves."""
    test_feature_scores: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """Feature score name → its values (N,) on ``test`` (:func:`feature_scores`); empty unless
    ``eval.ood_scores`` names one, and for an ensemble."""
    ood_feature_scores: dict[str, dict[str, Tensor]] = dataclasses.field(default_factory=dict)
    """OOD set name → feature score name → its values (N_o,)."""
    feature_fit: FeatureOodFit | None = None
    """The fit behind the feature scores, on the training split's features, which a run keeps
    for ``fseb-ft predict`` (``fseb_ft.runs.feature_fit``); ``None`` without feature scores."""

    def scaled(self, temperature: float) -> Predictions:
        """The predictions of ``logits / temperature`` on the test split, the OOD sets and the
        corruptions (no val).

        Log-probabilities suffice, so the corruptions and an ensemble (no logits) are scaled
        too: ``log p = z − c`` with ``c`` the same for every class of an image, and softmax
        ignores that shift, so ``log_softmax(log p / T) = log_softmax(z / T)``. Where logits are
        kept they are used (bit for bit the model's at ``T`` = 1) and scaled, for the logit-based
        OOD scores. The feature scores are kept: the features do not depend on ``T`` (ViM's
        energy is that of the network's own logits).
        """

        def scale(z: Tensor) -> Tensor:
            return torch.log_softmax(z / temperature, -1)  # (N, K)

        test_logits = None if self.test_logits is None else self.test_logits / temperature
        ood_logits = {name: z / temperature for name, z in self.ood_logits.items()}
        return Predictions(
            test=(
                scale(self.test[0] if self.test_logits is None else self.test_logits),
                self.test[1],
            ),
            ood={name: scale(self.ood_logits.get(name, lp)) for name, lp in self.ood.items()},
            corruptions={
                name: {sev: scale(lp) for sev, lp in by_sev.items()}
                for name, by_sev in self.corruptions.items()
            },
            corruption_labels=self.corruption_labels,
            test_logits=test_logits,
            ood_logits=ood_logits,
            split=self.split,
            groups=self.groups,
            class_names=self.class_names,
            test_feature_scores=self.test_feature_scores,
            ood_feature_scores=self.ood_feature_scores,
            feature_fit=self.feature_fit,
        )


def predict(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 log-probabilities (N, K) and labels (N,) on CPU, each sample counted once."""
    logits, labels = predict_logits(model, loader, accelerator)
    return torch.log_softmax(logits, dim=-1), labels


@torch.no_grad()
def predict_logits(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 logits (N, K) and labels (N,) on CPU, each sample counted once.

    ``gather_for_metrics`` drops the samples Accelerate duplicated to even out the last batch
    across processes, so N is the dataset size whatever the process count.
    """
    was_training = model.training
    model.eval()
    all_logits, labels = [], []
    for x, y in tqdm(loader, desc="predict", disable=not accelerator.is_main_process, leave=False):
        with accelerator.autocast():
            logits = model(x)  # (B, K)
        logits, y = accelerator.gather_for_metrics((logits.float(), y))
        all_logits.append(logits.cpu())
        labels.append(y.cpu())
    model.train(was_training)
    return torch.cat(all_logits), torch.cat(labels)


def predict_splits(
    model: nn.Module,
    splits: Splits,
    spec: InputSpec,
    cfg: EvalConfig,
    accelerator: Accelerator,
    num_workers: int,
    seed: int,
    network: nn.Module | None = None,
) -> Predictions:
    """Predict the test split, every OOD set and every corruption of ``cfg.corruptions`` (and
    the validation split's logits with ``cfg.temperature_scaling``), with the reported split's
    ``cfg.group_by`` values, and the feature scores ``cfg.ood_scores`` names
    (:func:`feature_scores` of ``network``, the timm network behind ``model``; default
    ``model``).

    Without a test split (``data.test`` unset) the validation split stands in for it, and the
    predictions say so (``split``): its numbers are those model selection saw, so optimistic.
    ``num_workers`` and ``seed`` are the loaders' (``data.num_workers``, ``train.seed``).
    """
    split, reported = (
        (TEST_SPLIT, splits.test) if splits.test is not None else (VALIDATION_SPLIT, splits.val)
    )
    groups = reported_groups(splits, cfg.group_by)  # before predicting: a missing column stops

    def loader(data: Any) -> DataLoader:
        return accelerator.prepare(eval_loader(data, spec, cfg.batch_size, num_workers, seed))

    test_logits, test_labels = predict_logits(model, loader(reported), accelerator)
    ood_logits = {
        name: predict_logits(model, loader(data), accelerator)[0]
        for name, data in splits.ood.items()
    }
    val = None
    if cfg.temperature_scaling and reported is splits.val:
        val = (test_logits, test_labels)  # predicted already: the same images
    elif cfg.temperature_scaling and splits.val is not None:
        val = predict_logits(model, loader(splits.val), accelerator)
    corrupted = corruption_subset(reported, cfg.corruption_limit, cfg.corruption_seed)
    corruptions = predict_corruptions(model, corrupted, spec, cfg, accelerator, num_workers, seed)
    labels = None if corrupted is reported else torch.as_tensor(corrupted.labels, dtype=torch.long)
    for name, by_severity in corruptions.items():
        for severity, lp in by_severity.items():
            if lp.shape[0] != len(corrupted):
                raise RuntimeError(
                    f"{name} severity {severity}: {lp.shape[0]} predictions for "
                    f"{len(corrupted)} corrupted {split} images"
                )
    return Predictions(
        test=(torch.log_softmax(test_logits, -1), test_labels),
        ood={name: torch.log_softmax(z, -1) for name, z in ood_logits.items()},
        corruptions=corruptions,
        corruption_labels=labels,
        test_logits=test_logits,
        ood_logits=ood_logits,
        val=val,
        split=split,
        groups=groups,
        class_names=list(splits.train.class_names),
        **feature_scores(network or model, splits, reported, cfg.ood_scores, loader, accelerator),
    )


def predict_corruptions(
    model: nn.Module,
    test: Any,
    spec: InputSpec,
    cfg: EvalConfig,
    accelerator: Accelerator,
    num_workers: int,
    seed: int,
) -> dict[str, dict[int, Tensor]]:
    """Predict ``test`` under every corruption and severity of ``cfg`` (the ``eval`` section).

    Each (corruption, severity) is a :class:`~fseb_ft.data.corruptions.CorruptedImages` of the
    test images (the raw pixels corrupted, then the model's evaluation transform), loaded from
    ``eval.corruption_cache`` or computed there by the main process first, then read by the
    others. Empty when ``eval.corruptions`` is.

    Returns:
        corruption name → severity → log-probabilities (N, K), in the order of ``test`` (pass
        :func:`corruption_subset` of the test split to honour ``eval.corruption_limit``).
    """
    if not cfg.corruptions:
        return {}
    from fseb_ft.data.corruptions import CorruptedImages

    main = accelerator.is_main_process
    pairs = [(name, severity) for name in cfg.corruptions for severity in cfg.severities]
    out: dict[str, dict[int, Tensor]] = {}
    for name, severity in tqdm(pairs, desc="corruptions", disable=not main):
        with accelerator.main_process_first():
            data = CorruptedImages(
                test, name, severity, cfg.corruption_seed, cfg.corruption_cache, progress=main
            )
        loader = accelerator.prepare(eval_loader(data, spec, cfg.batch_size, num_workers, seed))
        out.setdefault(name, {})[severity] = predict(model, loader, accelerator)[0]
        del data, loader
    return out


def corruption_subset(test: LabeledImages, limit: int | None, seed: int) -> LabeledImages:
    """The seeded, class-stratified subset of ``test`` that ``eval.corruption_limit`` asks for.

    Corrupting every test image at every corruption and severity costs 70 passes over the
    split; a stratified subset keeps the class balance of the clean test set.
    """
    if limit is None or limit >= len(test):
        return test
    _, keep = stratified_split(test.labels, limit / len(test), seed)  # (≈limit,) sorted
    return IndexedImages(test, keep)


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
    for x, y in tqdm(loader, desc="features", disable=not accelerator.is_main_process, leave=False):
        with accelerator.autocast():
            h = inner.forward_head(inner.forward_features(x), pre_logits=True)  # (B, D)
        h, y = accelerator.gather_for_metrics((h.float().flatten(1), y))
        found.append(h.cpu())
        labels.append(y.cpu())
    inner.train(was_training)
    return torch.cat(found), torch.cat(labels)


def feature_scores(
    network: nn.Module,
    splits: Splits,
    reported: Any,
    names: Sequence[str],
    loader: Callable[[Any], DataLoader],
    accelerator: Accelerator,
) -> dict[str, Any]:
    """The feature scores of ``names`` (:mod:`~fseb_ft.evaluation.feature_ood`) on ``reported``
    and each OOD set, fitted on the training split's features (one un-augmented pass in eval
    mode): the :class:`Predictions` fields ``test_feature_scores``, ``ood_feature_scores`` and
    ``feature_fit``, empty when ``names`` has none.

    The fit holds ViM's part whenever the classifier is linear, ``vim`` named or not, so that
    the fit a run keeps serves every feature score in ``fseb-ft predict``.
    """
    wanted = [name for name in names if name in FEATURE_SCORES]
    if not wanted:
        return {}
    features, labels = predict_features(network, loader(splits.train), accelerator)
    fit = fit_feature_ood(features, labels, *_classifier(network, "vim" in wanted))

    def scores(data: Any) -> dict[str, Tensor]:
        h = predict_features(network, loader(data), accelerator)[0]
        return {name: feature_ood_score(name, fit, h) for name in wanted}

    return {
        "test_feature_scores": scores(reported),
        "ood_feature_scores": {name: scores(data) for name, data in splits.ood.items()},
        "feature_fit": fit,
    }


def _classifier(network: nn.Module, required: bool) -> tuple[Tensor | None, Tensor | None]:
    """The linear classifier's weight and bias, for ViM; unless ``required``, ``(None, None)``
    for another head or one of a single feature (ViM's principal space must be smaller)."""
    head = unwrap_model(network).get_classifier()
    usable = isinstance(head, nn.Linear) and head.in_features > 1
    if not usable and not required:
        return None, None
    if not isinstance(head, nn.Linear):
        raise FsebError(
            f"eval.ood_scores: vim needs a linear classifier (timm's get_classifier()), "
            f"this model's is {type(head).__name__}"
        )
    bias = None if head.bias is None else head.bias.detach().float().cpu()
    return head.weight.detach().float().cpu(), bias


def eval_loader(
    data: Any, spec: InputSpec, batch_size: int, num_workers: int, seed: int
) -> DataLoader:
    """Un-augmented, un-shuffled loader (resize + normalise) for evaluation."""
    dataset = TransformedImages(data, eval_transform(spec.size, spec.mean, spec.std))
    return make_loader(dataset, batch_size, shuffle=False, num_workers=num_workers, seed=seed)
