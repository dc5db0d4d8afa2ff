"""Predictions of a model on the evaluation sets: the test split (the validation split when the
recipe has no ``data.test``), the OOD sets and that split corrupted by ``eval.corruptions``,
each sample counted once across processes.

The metrics and files made from them are :mod:`fseb_ft.runs.report`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.splits import TEST_SPLIT, VALIDATION_SPLIT, Splits, stratified_split
from fseb_ft.data.transforms import TransformedImages, eval_transform
from fseb_ft.evaluation.feature_ood import FeatureOodFit
from fseb_ft.evaluation.features import (
    LaplaceLogits,
    feature_scores,
    fit_laplace_logits,
    laplace_classifier,
    laplace_validates,
    predict_features,
    wants_feature_scores,
)
from fseb_ft.evaluation.groups import Groups, reported_groups
from fseb_ft.logs import progress_bar
from fseb_ft.method.parts import unwrap_model
from fseb_ft.recipe import EvalConfig

__all__ = [
    "Predictions",
    "corruption_subset",
    "eval_loader",
    "predict",
    "predict_corruptions",
    "predict_logits",
    "predict_splits",
    "predict_with_features",
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
    corruption_index: Tensor | None = None
    """Indices (N_c,) into ``test`` of the images that were corrupted (``eval.corruption_limit``'s
    subset), so the clean row of the corruption table is taken on the same images; ``None``:
    every image of ``test``."""
    test_logits: Tensor | None = None
    """Logits (N, K) behind ``test``; ``None`` for an ensemble (averaged probabilities)."""
    ood_logits: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """OOD set name → logits (N_o, K); empty for an ensemble."""
    val: tuple[Tensor, Tensor] | None = None
    """(logits (N_v, K), labels (N_v,)) on the validation split, for ``eval.temperature_scaling``
    and ``eval.conformal``, and for LLLA's ``eval.laplace_prior=validation`` (an ensemble's: its
    log-probabilities, which softmax treats alike); ``None`` when none of them is on."""
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
    laplace: Predictions | None = None
    """The "+ LLLA" predictions (``eval.laplace``): those of the last-layer Laplace's probit
    predictive on the same images, its probit-scaled logits as logits, its fit in ``fit``;
    ``None`` when it is off, and for an ensemble."""
    fit: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What ``results.json`` records of the post-hoc fit these predictions come from, before
    their metrics (LLLA's :meth:`~fseb_ft.evaluation.laplace.LaplaceFit.record`, WiSE-FT's
    ``alpha``); empty for the network's own."""
    wise: Predictions | None = None
    """The "+ WiSE" predictions (``eval.wise_ft``): those of the network interpolated with its
    starting weights (:func:`~fseb_ft.evaluation.wise.predict_wise`), its ``α`` in ``fit``;
    ``None`` when it is off, and for an ensemble."""
    wise_weights: dict[str, Tensor] | None = None
    """The state dict behind ``wise``, which the run keeps beside its fine-tuned weights."""

    def with_logits(
        self,
        test_logits: Tensor,
        ood_logits: dict[str, Tensor],
        corruptions: dict[str, dict[int, Tensor]],
        val: tuple[Tensor, Tensor] | None,
        fit: dict[str, Any],
    ) -> Predictions:
        """The same images scored by a post-hoc method's logits: ``test_logits`` (N, K) on
        ``test``, ``ood_logits`` (N_o, K) on each OOD set, the log-probabilities
        ``corruptions`` (N_c, K) on the corrupted split, ``val`` (logits, labels) on the
        validation split; the method's ``fit`` record. Labels, groups and the feature scores
        (of the features, which a post-hoc method leaves as they are) are kept."""
        return dataclasses.replace(
            self,
            test=(torch.log_softmax(test_logits, -1), self.test[1]),
            ood={name: torch.log_softmax(z, -1) for name, z in ood_logits.items()},
            corruptions=corruptions,
            test_logits=test_logits,
            ood_logits=ood_logits,
            val=val,
            laplace=None,
            wise=None,
            wise_weights=None,
            fit=fit,
        )

    def scaled(self, temperature: float) -> Predictions:
        """The predictions of ``logits / temperature`` on the test split, the OOD sets, the
        corruptions and the validation split.

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
        # Every other field (labels, groups, feature scores, ...) is kept as it is.
        return dataclasses.replace(
            self,
            test=(
                scale(self.test[0] if self.test_logits is None else self.test_logits),
                self.test[1],
            ),
            ood={name: scale(self.ood_logits.get(name, lp)) for name, lp in self.ood.items()},
            corruptions={
                name: {sev: scale(lp) for sev, lp in by_sev.items()}
                for name, by_sev in self.corruptions.items()
            },
            test_logits=test_logits,
            ood_logits=ood_logits,
            val=None if self.val is None else (self.val[0] / temperature, self.val[1]),
            laplace=None,
            wise=None,
            wise_weights=None,
            fit={},
        )


_Scored = tuple[Tensor, Tensor, Tensor | None]
"""What one evaluation pass gives: logits (N, K), labels (N,), the classifier's inputs (N, D)."""


def predict(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 log-probabilities (N, K) and labels (N,) on CPU, each sample counted once."""
    logits, labels = predict_logits(model, loader, accelerator)
    return torch.log_softmax(logits, dim=-1), labels


def predict_logits(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 logits (N, K) and labels (N,) on CPU, each sample counted once.

    ``gather_for_metrics`` drops the samples Accelerate duplicated to even out the last batch
    across processes, so N is the dataset size whatever the process count.
    """
    logits, labels, _ = predict_with_features(model, loader, accelerator)
    return logits, labels


@torch.no_grad()
def predict_with_features(
    model: nn.Module,
    loader: DataLoader,
    accelerator: Accelerator,
    classifier: nn.Module | None = None,
) -> _Scored:
    """:func:`predict_logits`' logits and labels, and the input of ``classifier`` (a module
    inside ``model``) in the same forward passes: float32 features (N, D) on CPU, recorded by a
    forward hook so the logits are the model's own; ``None`` without ``classifier``."""
    was_training = model.training
    model.eval()
    inputs: list[Tensor] = []
    hook = None
    if classifier is not None:
        hook = classifier.register_forward_hook(lambda _m, args, _out: inputs.append(args[0]))
    found: list[list[Tensor]] = [[], [], []]  # logits, labels, features
    try:
        for x, y in progress_bar(
            loader, desc="predict", show=accelerator.is_main_process, leave=False
        ):
            with accelerator.autocast():
                logits = model(x)  # (B, K)
            batch = [logits.float(), y]
            if classifier is not None:
                if len(inputs) != 1:  # the features would not be those the fit was made on
                    raise RuntimeError(
                        f"the classifier ran {len(inputs)} times in one forward pass: its input "
                        "is not one set of penultimate features"
                    )
                batch.append(inputs.pop().float().flatten(1))  # (B, D)
            for kept, part in zip(found, accelerator.gather_for_metrics(batch), strict=False):
                kept.append(part.cpu())
    finally:
        if hook is not None:
            hook.remove()
        model.train(was_training)
    logits, labels, features = (torch.cat(parts) if parts else None for parts in found)
    # A split has images (an empty one is refused when loaded): logits and labels are set.
    return cast(Tensor, logits), cast(Tensor, labels), features


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
    the validation split's logits with ``cfg.temperature_scaling`` or ``cfg.conformal``, or
    for LLLA's validation prior), with the reported split's
    ``cfg.group_by`` values, the feature scores ``cfg.ood_scores`` names
    (:func:`feature_scores` of ``network``, the timm network behind ``model``; default
    ``model``) and, with ``cfg.laplace``, the "+ LLLA" predictions (``laplace``) of a
    last-layer Laplace fitted on the training split's features. Both take the features the
    logits passes record (one pass per set; :func:`_recorded_classifier` says when another is
    needed), fitted on one more pass, over the training split.

    Without a test split (``data.test`` unset) the validation split stands in for it, and the
    predictions say so (``split``): its numbers are those model selection saw, so optimistic.
    ``num_workers`` and ``seed`` are the loaders' (``data.num_workers``, ``train.seed``).
    """
    split, reported = (
        (TEST_SPLIT, splits.test) if splits.test is not None else (VALIDATION_SPLIT, splits.val)
    )
    groups = reported_groups(splits, cfg.group_by)  # before predicting: a missing column stops
    network = network or model

    def loader(data: Any) -> DataLoader:
        return accelerator.prepare(eval_loader(data, spec, cfg.batch_size, num_workers, seed))

    head = _recorded_classifier(model, network, cfg)  # first: LLLA's checks before any pass
    needs_train = cfg.laplace or wants_feature_scores(cfg.ood_scores)
    train = predict_features(network, loader(splits.train), accelerator) if needs_train else None

    def scored(data: Any) -> _Scored:
        return predict_with_features(model, loader(data), accelerator, head)

    def features(data: Any) -> Tensor:
        return predict_features(network, loader(data), accelerator)[0]

    test = scored(reported)
    ood = {name: scored(data) for name, data in splits.ood.items()}
    passes = {None: (reported, test)} | {name: (splits.ood[name], got) for name, got in ood.items()}
    scores = _passes_feature_scores(network, cfg, train, passes, features)
    val = None
    if _wants_val(cfg) and splits.val is not None:
        val = test if reported is splits.val else scored(splits.val)  # the same images: once
    laplace = _fitted_laplace(cfg, head, train, val, accelerator)
    corrupted = corruption_subset(reported, cfg.corruption_limit, cfg.corruption_seed)
    corruptions, laplace_corruptions = predict_corruptions(
        model, corrupted, spec, cfg, accelerator, num_workers, seed, laplace
    )
    _check_corrupted(corruptions, len(corrupted), split)
    predictions = Predictions(
        test=(torch.log_softmax(test[0], -1), test[1]),
        ood={name: torch.log_softmax(z, -1) for name, (z, _, _) in ood.items()},
        corruptions=corruptions,
        corruption_index=_subset_index(corrupted, reported),
        test_logits=test[0],
        ood_logits={name: z for name, (z, _, _) in ood.items()},
        val=None if val is None else val[:2],
        split=split,
        groups=groups,
        class_names=list(splits.train.class_names),
        **scores,
    )
    if laplace is None:
        return predictions
    return dataclasses.replace(
        predictions,
        laplace=_laplace_predictions(predictions, laplace, test, ood, val, laplace_corruptions),
    )


def _fitted_laplace(
    cfg: EvalConfig,
    head: nn.Module | None,
    train: tuple[Tensor, Tensor] | None,
    val: _Scored | None,
    accelerator: Accelerator,
) -> LaplaceLogits | None:
    """The last-layer Laplace of ``cfg.laplace`` fitted on the training split's features (the
    validation split's for its prior, when predicted), or ``None``."""
    if not (cfg.laplace and head is not None and train is not None):
        return None
    val_features = None if val is None or val[2] is None else (val[2], val[1])
    linear = cast(nn.Linear, head)  # with eval.laplace, laplace_classifier's (a Linear)
    return fit_laplace_logits(linear, train, val_features, cfg, _maths_device(accelerator))


def _subset_index(corrupted: LabeledImages, reported: LabeledImages) -> Tensor | None:
    """The indices into the reported split of the images corrupted, ``None`` when all were."""
    if corrupted is reported:
        return None
    return torch.as_tensor(cast(IndexedImages, corrupted).indices, dtype=torch.long)


def _passes_feature_scores(
    network: nn.Module,
    cfg: EvalConfig,
    train: tuple[Tensor, Tensor] | None,
    passes: dict[str | None, tuple[Any, _Scored]],
    features_pass: Callable[[Any], Tensor],
) -> dict[str, Any]:
    """:func:`feature_scores` of ``cfg.ood_scores`` for the reported split (key ``None``) and each
    OOD set of ``passes`` (set → its data and its logits pass): each set's features those its
    logits pass recorded, else ``features_pass`` of its data; ``{}`` when none is asked for."""
    if not wants_feature_scores(cfg.ood_scores):
        return {}
    by_set = {
        name: passed[2] if passed[2] is not None else features_pass(data)
        for name, (data, passed) in passes.items()
    }
    reported = by_set.pop(None)
    ood = cast(dict[str, Tensor], by_set)  # the OOD sets' names, the reported split popped
    return feature_scores(network, cfg.ood_scores, train, reported, ood)


def _laplace_predictions(
    predictions: Predictions,
    laplace: LaplaceLogits,
    test: _Scored,
    ood: dict[str, _Scored],
    val: _Scored | None,
    corruptions: dict[str, dict[int, Tensor]],
) -> Predictions:
    """The "+ LLLA" predictions: ``laplace``'s logits of the features the passes recorded on
    the test split, the OOD sets and the validation split, and its ``corruptions``."""

    def llla(features: Tensor | None) -> Tensor:
        # With LLLA every pass records its classifier's input.
        return laplace.logits(cast(Tensor, features))

    return predictions.with_logits(
        llla(test[2]),
        {name: llla(h) for name, (_, _, h) in ood.items()},
        corruptions,
        None if val is None else (llla(val[2]), val[1]),
        laplace.fit.record(),
    )


def _recorded_classifier(model: nn.Module, network: nn.Module, cfg: EvalConfig) -> nn.Module | None:
    """The classifier whose input the evaluation passes of ``model`` record: LLLA's
    (``eval.laplace``), else for the feature scores ``network``'s linear classifier, whose input
    is the penultimate features :func:`predict_features` computes, when ``model`` is
    ``network`` itself (a MAP run; FS-VI's Monte-Carlo predictive runs sampled weights, and a
    classifier of another kind may take other inputs: both get a pass of their own); ``None``:
    nothing to record."""
    if cfg.laplace:
        return laplace_classifier(network, cfg)
    head = cast(Any, unwrap_model(network)).get_classifier()  # a timm model's
    same = unwrap_model(model) is unwrap_model(network)
    if wants_feature_scores(cfg.ood_scores) and same and isinstance(head, nn.Linear):
        return head
    return None


def _wants_val(cfg: EvalConfig) -> bool:
    """Whether the validation split is predicted: for temperature scaling, conformal
    calibration or LLLA's validation prior."""
    return cfg.temperature_scaling or cfg.conformal is not None or laplace_validates(cfg)


def _maths_device(accelerator: Accelerator) -> torch.device:
    """Where the post-hoc float64 maths runs: the accelerator's GPU, else the CPU (float64 is
    slow or missing on other accelerators)."""
    return accelerator.device if accelerator.device.type == "cuda" else torch.device("cpu")


def predict_corruptions(
    model: nn.Module,
    test: Any,
    spec: InputSpec,
    cfg: EvalConfig,
    accelerator: Accelerator,
    num_workers: int,
    seed: int,
    laplace: LaplaceLogits | None = None,
) -> tuple[dict[str, dict[int, Tensor]], dict[str, dict[int, Tensor]]]:
    """Predict ``test`` under every corruption and severity of ``cfg`` (the ``eval`` section).

    Each (corruption, severity) is a :class:`~fseb_ft.data.corruptions.CorruptedImages` of the
    test images (the raw pixels corrupted, then the model's evaluation transform), loaded from
    ``eval.corruption_cache`` or computed there by the main process first, then read by the
    others. Empty when ``eval.corruptions`` is.

    Returns:
        corruption name → severity → log-probabilities (N, K), in the order of ``test`` (pass
        :func:`corruption_subset` of the test split to honour ``eval.corruption_limit``); and
        the same of ``laplace``'s logits, from the same passes (empty without it).
    """
    if not cfg.corruptions:
        return {}, {}
    from fseb_ft.data.corruptions import CorruptedImages

    main = accelerator.is_main_process
    pairs = [(name, severity) for name in cfg.corruptions for severity in cfg.severities]
    out: dict[str, dict[int, Tensor]] = {}
    posthoc: dict[str, dict[int, Tensor]] = {}
    classifier = None if laplace is None else laplace.classifier
    for name, severity in progress_bar(pairs, desc="corruptions", show=main):
        with accelerator.main_process_first():
            data = CorruptedImages(
                test, name, severity, cfg.corruption_seed, cfg.corruption_cache, progress=main
            )
        loader = accelerator.prepare(eval_loader(data, spec, cfg.batch_size, num_workers, seed))
        logits, _, features = predict_with_features(model, loader, accelerator, classifier)
        out.setdefault(name, {})[severity] = torch.log_softmax(logits, -1)
        if laplace is not None:
            recorded = cast(Tensor, features)  # the pass records LLLA's classifier's input
            posthoc.setdefault(name, {})[severity] = torch.log_softmax(laplace.logits(recorded), -1)
        del data, loader
    return out, posthoc


def _check_corrupted(corruptions: dict[str, dict[int, Tensor]], n: int, split: str) -> None:
    """Every corruption and severity has one prediction per corrupted image."""
    for name, by_severity in corruptions.items():
        for severity, lp in by_severity.items():
            if lp.shape[0] != n:
                raise RuntimeError(
                    f"{name} severity {severity}: {lp.shape[0]} predictions for {n} corrupted "
                    f"{split} images"
                )


def corruption_subset(
    test: LabeledImages, limit: int | None, seed: int
) -> LabeledImages | IndexedImages:
    """The seeded, class-stratified subset of ``test`` that ``eval.corruption_limit`` asks for
    (an :class:`IndexedImages`, whose ``indices`` locate it in ``test``), or ``test`` itself.

    Corrupting every test image at every corruption and severity costs 70 passes over the
    split; a stratified subset keeps the class balance of the clean test set.
    """
    if limit is None or limit >= len(test):
        return test
    _, keep = stratified_split(test.labels, limit / len(test), seed)  # (≈limit,) sorted
    return IndexedImages(test, keep)


def eval_loader(
    data: Any,
    spec: InputSpec,
    batch_size: int,
    num_workers: int,
    seed: int,
    persistent: bool = False,
) -> DataLoader:
    """Un-augmented, un-shuffled loader (resize + normalise) for evaluation; ``persistent``
    for one read every epoch (:func:`~fseb_ft.data.loaders.make_loader`)."""
    dataset = TransformedImages(data, eval_transform(spec.size, spec.mean, spec.std))
    return make_loader(
        dataset, batch_size, shuffle=False, num_workers=num_workers, seed=seed,
        persistent=persistent,
    )  # fmt: skip
