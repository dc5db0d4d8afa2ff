"""The recipe's ``model`` and ``fseb`` sections and the :class:`Recipe` that holds every section:
``data`` and ``context`` (:mod:`~fseb_ft.recipe.datasets`), ``optim`` and ``train``
(:mod:`~fseb_ft.recipe.training`), ``eval`` and ``output`` (:mod:`~fseb_ft.recipe.reporting`) and
``sweep`` (:mod:`~fseb_ft.recipe.sweep`).

Each field's docstring is its entry in docs/recipes.md; each ``__post_init__`` validates its
section, raising :class:`~fseb_ft.recipe.schema.ConfigError` naming the dotted key, the value and
what is allowed.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Literal, cast

from fseb_ft.recipe.datasets import ContextConfig, DataConfig, check_cache_size
from fseb_ft.recipe.options import (
    BINARY_TASK_METRICS,
    SELECT_METRICS,
    FeaturePoints,
    ForwardMode,
    HeadInit,
    Method,
    ParamAnchor,
    RegPoints,
    Solver,
    VarianceScope,
)
from fseb_ft.recipe.reporting import EvalConfig, OutputConfig, check_group_by
from fseb_ft.recipe.schema import check
from fseb_ft.recipe.sweep import SweepConfig, check_space_key
from fseb_ft.recipe.training import OptimConfig, TrainConfig

__all__ = [
    "VAL_OOD_METRIC_SUFFIX",
    "FSEBConfig",
    "FSVIConfig",
    "FeatureConfig",
    "ModelConfig",
    "Recipe",
    "val_ood_metric",
    "validation_metrics",
]


@dataclass(frozen=True)
class ModelConfig:
    """The timm backbone: both the starting weights and φ0."""

    name: str = "resnet18"
    """timm model name, ``hf-hub:org/name`` or ``local-dir:/path`` (timm's Hub folder format)."""
    pretrained: bool = True
    """Load pretrained weights (then φ0 is the pretrained model); else φ0 is the initialisation."""
    num_classes: int | None = None
    """Classifier outputs K; ``null`` takes the training set's class count."""
    input_size: int | None = None
    """Square input resolution; ``null`` uses the model's pretrained data config."""
    drop_rate: float = 0.0
    """Dropout before the classifier (timm ``drop_rate``)."""
    drop_path_rate: float = 0.0
    """Stochastic depth rate (timm ``drop_path_rate``)."""
    head_init: HeadInit = "auto"
    """The new classifier's initialisation: ``zeros``, all-zero weights and bias, so training
    starts from uniform predictions at FS-EB's prior mean (the usual choice for fine-tuning);
    ``timm``, the architecture's own (EfficientNets draw U(±1/√K): large logits for small K,
    which made FS-EB's first steps diverge on a pretrained EfficientNet-Lite0); ``auto``,
    ``zeros`` when ``pretrained`` and ``timm`` otherwise (a network trained from scratch needs
    its random head to break symmetry with its random body)."""
    freeze: Literal["none", "backbone"] | int = "none"
    """Parameters held fixed in training (docs/method.md, "Freezing and LP-FT"): ``none``;
    ``backbone``, all but the classifier's; or an integer k ≥ 1, timm's first k coarse groups of
    the model's ``group_matcher`` (the stem is the first: 2 freezes the stem and the first
    stage). Frozen BatchNorm layers keep their statistics (eval mode). φ0 is the whole starting
    model either way; with a frozen backbone FS-EB regularises what the head does to φ0's
    features. ``train.linear_probe_epochs`` trains the classifier alone first."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them (timm's
    ``set_grad_checkpointing``): less memory for the B + M images of an FS-EB step, about a
    third more compute; the same loss, gradients and BatchNorm statistics (recomputation leaves
    them alone), so the same trained model. A model without it stops at start."""

    def __post_init__(self) -> None:
        check(bool(self.name), "name", self.name, "a timm name, hf-hub:… or local-dir:…")
        check(
            self.num_classes is None or self.num_classes >= 2,
            "num_classes",
            self.num_classes,
            "must be ≥ 2 or null",
        )
        check(
            self.input_size is None or self.input_size >= 8,
            "input_size",
            self.input_size,
            "must be ≥ 8 or null",
        )
        for name in ("drop_rate", "drop_path_rate"):
            value = getattr(self, name)
            check(0 <= value < 1, name, value, "must be in [0, 1)")
        check(
            self.freeze in ("none", "backbone")
            or (isinstance(self.freeze, int) and self.freeze >= 1),
            "freeze",
            self.freeze,
            "none, backbone, or the number of first stages to freeze (≥ 1)",
        )


@dataclass(frozen=True)
class FSVIConfig:
    """FS-VI's own keys (``fseb.method: fsvi``), unused by the other methods."""

    variance: VarianceScope = "head"
    """The parameters with a variance σ² (the others are point estimates): ``head``, the linear
    classifier (covariance in closed form from the features, about FS-EB's cost); ``all``,
    every trainable parameter (exact per-point Jacobians: O(M² · P · K) per step, for small
    networks; the FashionMNIST CNN takes tens of seconds a step on a CPU, docs/method.md), and
    not with ``model.freeze`` or ``train.linear_probe_epochs`` (the σ of a frozen parameter
    would still train and perturb it)."""
    init_std: float = 1e-3
    """σ of every variance-carrying parameter at the start; σ = τ softplus(ρ / τ), τ = 1e-4, so
    SGD moves σ itself (docs/method.md, "FS-VI")."""
    predict_samples: int = 10
    """Parameter draws averaged (as probabilities) for validation and test predictions."""

    def __post_init__(self) -> None:
        check(self.init_std > 0, "init_std", self.init_std, "must be > 0")
        check(self.predict_samples >= 1, "predict_samples", self.predict_samples, "must be ≥ 1")


@dataclass(frozen=True)
class FeatureConfig:
    """Feature-SP's own keys (``fseb.method: feature``), unused by the other methods."""

    points: FeaturePoints = "train"
    """Where the penultimate features are held at φ0's: the training batch x (``train``, B
    points), or the training and context batches together, [x; x̂] (``joint``, B + M points;
    draws context points as FS-EB does, ``context`` section)."""


@dataclass(frozen=True)
class FSEBConfig:
    """The objective and its priors: FS-EB, whose ``reg_scale = 0`` is the PS-MAP baseline;
    ``method: fsvi`` is FS-VI under the same function-space prior; ``method: l2sp`` is L2-SP;
    ``method: feature`` is Feature-SP, feature-space regularisation towards φ0."""

    # FS-VI's keys moved into their sub-section (``fseb.fsvi``); old recipes still load.
    RENAMED_KEYS = types.MappingProxyType(
        {
            "fsvi_variance": "fsvi.variance",
            "fsvi_init_std": "fsvi.init_std",
            "fsvi_predict_samples": "fsvi.predict_samples",
        }
    )

    reg_scale: float = 1.0
    """Weight of the function-space term R_f (Feature-SP: of its feature term); 0 gives PS-MAP
    (plain weight decay)."""
    prior_var: float = 1.0
    """Parameter prior variance σ_p²; weight decay 1 / (σ_p² N_train)."""
    prior_cov_scale: float | None = 1e-5
    """s in Kc = s (H Hᵀ + 1 1ᵀ) + d I (reference: 1e-5 pretrained ResNet-50, 0.01 FMNIST CNN);
    ``null``: resolved from ``prior_std`` (set alone, it is stored as ``null``)."""
    prior_cov_diag: float | None = 1e-2
    """d in Kc (reference: 1e-2 pretrained ResNet-50, 1 FMNIST CNN); ``null``: resolved from
    ``prior_std``, like ``prior_cov_scale``."""
    prior_std: float | None = None
    """The prior standard deviation of a logit at the context points, in place of s and d:
    prior_std² = s (m + 1) + d, m = mean ‖h(x̂; φ0)‖² over the context pool, resolved per run
    (logged in run.json and the model card). Leave s and d unset (or ``null``) with it.
    ``null``: use s and d as given."""
    prior_feature_share: float = 0.5
    """With ``prior_std``: the share s (m + 1) / prior_std² of the prior variance that comes from
    φ0's features (the rest is d), in [0, 1]. 0.5: the pretrained reference prior (s = 1e-5,
    d = 1e-2) gives 0.46–0.50 on EfficientNet-Lite0 at 64 px (m ≈ 850–1,000); the from-scratch
    reference (s = 0.01, d = 1) gives ≈ 0.03 on its CNN (docs/method.md)."""
    forward_mode: ForwardMode = "joint"
    """One forward over [x; x̂] (BatchNorm sees both) or two separate ones."""
    reg_points: RegPoints = "context"
    """Where R_f is evaluated: the context batch x̂ (M points, the paper) or the training batch
    and the context batch together, [x; x̂] (B + M points; Kc from φ0's features of both), as the
    authors' FashionMNIST and ResNet-18 configs do (``--reg_points joint``)."""
    param_anchor: ParamAnchor = "zero"
    """Centre of the parameter prior: zero (the paper) or the starting weights, the classifier's
    too (``method: l2sp`` is L2-SP proper, its new classifier decaying towards zero)."""
    param_noise_std: float = 0.0
    """σ of the EB-VI form θ + σε; 0 is EB-MAP (the paper's σ² = 1e-20 is numerically MAP)."""
    likelihood_samples: int = 1
    """Monte-Carlo samples S for the likelihood when param_noise_std > 0."""
    reg_samples: int = 1
    """Monte-Carlo samples J for R_f when param_noise_std > 0."""
    solver: Solver = "auto"
    """How Kc⁻¹ is applied; ``auto`` picks the cheaper exact one by size (FS-VI: always
    Cholesky, its KL needs log|Kc|)."""
    method: Method = "fseb"
    """``fseb``: FS-EB, the MAP estimate under the function-space and parameter priors (PS-MAP
    at ``reg_scale = 0``); ``fsvi``: FS-VI (Rudner et al., NeurIPS 2022), a mean-field Gaussian
    q(θ) trained on the Monte-Carlo likelihood (``likelihood_samples`` draws per step) minus
    ``reg_scale`` × the KL from q's linearised logits at the context points to the same prior
    N(0, Kc); no parameter prior (``prior_var`` unused); predictions average
    ``fsvi.predict_samples`` draws. The ``fsvi`` keys apply to it only. ``l2sp``: L2-SP (Li
    et al., ICML 2018), weight decay ``1 / (prior_var · N_train)`` towards the starting weights
    (the new classifier's towards zero); it reads ``prior_var`` alone, no context points.
    ``feature``: Feature-SP (after DELTA, Li et al., ICLR 2019, without its attention), the
    squared distance of the penultimate features from φ0's at the ``feature.points``, weighted
    by ``reg_scale / N_train``, with PS-MAP's parameter prior (``prior_var``,
    ``param_anchor``); no prior covariance (s, d and ``prior_std`` unused)."""
    fsvi: FSVIConfig = field(default_factory=FSVIConfig)
    """FS-VI's keys."""
    feature: FeatureConfig = field(default_factory=FeatureConfig)
    """Feature-SP's keys."""

    @property
    def is_ps_map(self) -> bool:
        """The PS-MAP baseline: FS-EB at ``reg_scale = 0``, no function-space term and no
        context (``--compare``'s other arm; L2-SP, which ignores ``reg_scale``, is never it)."""
        return self.method == "fseb" and self.reg_scale == 0

    def __post_init__(self) -> None:
        check(self.reg_scale >= 0, "reg_scale", self.reg_scale, "must be ≥ 0 (0 is PS-MAP)")
        check(self.prior_var > 0, "prior_var", self.prior_var, "must be > 0")
        if self.prior_std is None:
            self._check_covariance()
        else:
            self._resolved_covariance()
        check(
            0 <= self.prior_feature_share <= 1,
            "prior_feature_share",
            self.prior_feature_share,
            "must be in [0, 1]",
        )
        check(self.param_noise_std >= 0, "param_noise_std", self.param_noise_std, "must be ≥ 0")
        for name in ("likelihood_samples", "reg_samples"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be ≥ 1")
        if self.method == "fsvi":
            check(self.reg_scale > 0, "reg_scale", self.reg_scale, "must be > 0 with method fsvi")
            check(
                self.param_noise_std == 0,
                "param_noise_std",
                self.param_noise_std,
                "must be 0 with method fsvi (its noise is the learned σ)",
            )
            check(
                self.reg_points == "context",
                "reg_points",
                self.reg_points,
                "must be 'context' with method fsvi (the KL is at the context points)",
            )
        if self.method == "feature":
            self._check_feature()

    def _check_feature(self) -> None:
        """Feature-SP's settings: a feature term (0 is PS-MAP) and no sampled form."""
        check(
            self.reg_scale > 0,
            "reg_scale",
            self.reg_scale,
            "must be > 0 with method feature (0 is PS-MAP: method fseb)",
        )
        check(
            self.param_noise_std == 0,
            "param_noise_std",
            self.param_noise_std,
            "must be 0 with method feature (it has no sampled form)",
        )

    def _check_covariance(self) -> None:
        """s and d as given: both set, ≥ 0, not both 0."""
        for name in ("prior_cov_scale", "prior_cov_diag"):
            check(getattr(self, name) is not None, name, None, "null needs fseb.prior_std")
        # Neither is None past the checks above, which mypy cannot follow into check().
        scale, diag = cast(float, self.prior_cov_scale), cast(float, self.prior_cov_diag)
        check(scale >= 0, "prior_cov_scale", scale, "must be ≥ 0")
        check(diag >= 0, "prior_cov_diag", diag, "must be ≥ 0")
        check(
            scale > 0 or diag > 0,
            "prior_cov_diag",
            diag,
            "prior_cov_scale and prior_cov_diag cannot both be 0",
        )

    def _resolved_covariance(self) -> None:
        """With ``prior_std``, s and d are resolved per run: stored as ``null`` (so the saved
        recipe says so), and a recipe may not also set them (a default-valued one passes)."""
        # Called with prior_std set (not None).
        check(cast(float, self.prior_std) > 0, "prior_std", self.prior_std, "must be > 0 or null")
        for name in ("prior_cov_scale", "prior_cov_diag"):
            given = getattr(self, name)
            check(
                given in (None, getattr(FSEBConfig, name)),
                name,
                given,
                f"fseb.prior_std and fseb.{name} are both set; give one: prior_std resolves "
                "prior_cov_scale and prior_cov_diag per run (leave them unset or null)",
            )
            object.__setattr__(self, name, None)


@dataclass(frozen=True)
class Recipe:
    """A complete fine-tuning recipe."""

    data: DataConfig
    """Datasets and input pipeline."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Backbone and starting weights."""
    context: ContextConfig = field(default_factory=ContextConfig)
    """Context distribution for the function-space term."""
    fseb: FSEBConfig = field(default_factory=FSEBConfig)
    """The objective; ``fseb.reg_scale=0`` is PS-MAP."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Loop settings."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation settings."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Output location."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """The hyper-parameter search of ``fseb-ft sweep``."""

    def __post_init__(self) -> None:
        for key, param in self.sweep.space.items():
            check_space_key(Recipe, key, param)
        allowed = validation_metrics(self.data)
        for key, metric in (
            ("train.select_metric", self.train.select_metric),
            ("sweep.metric", self.sweep.metric),
        ):
            check(
                metric in allowed,
                key,
                metric,
                f"allowed values are {allowed} (ood_<name>_auroc needs data.val_ood.<name>)",
            )
        check_group_by(self.data, self.eval.group_by)
        # Without a known class count it is the training labels': checked at the run.
        weights, (k, source) = self.train.class_weights, self._class_count()
        check(
            isinstance(weights, str) or k is None or len(weights) == k,
            "train.class_weights",
            weights if isinstance(weights, str) else list(weights),
            f"needs one weight per class: {k} ({source})",
        )
        check(
            self.train.linear_probe_epochs == 0 or self.model.freeze != "backbone",
            "train.linear_probe_epochs",
            self.train.linear_probe_epochs,
            "must be 0 with model.freeze=backbone, which trains the classifier alone throughout",
        )
        fsvi_all = self.fseb.method == "fsvi" and self.fseb.fsvi.variance == "all"
        check(
            not fsvi_all or (self.model.freeze == "none" and self.train.linear_probe_epochs == 0),
            "fseb.fsvi.variance",
            self.fseb.fsvi.variance,
            "needs model.freeze=none and train.linear_probe_epochs=0 (the σ of a frozen "
            "parameter would still train and perturb it); use fseb.fsvi.variance=head",
        )
        check(
            not self.eval.laplace or self.fseb.method != "fsvi",
            "eval.laplace",
            self.eval.laplace,
            "needs a MAP network (FS-EB or PS-MAP): fseb.method=fsvi has its own posterior "
            "q(θ), and a Laplace approximation around its mean is another method",
        )
        check(
            not self.eval.wise_ft or self.model.pretrained,
            "eval.wise_ft",
            self.eval.wise_ft,
            "needs model.pretrained=true: WiSE-FT interpolates towards the pretrained weights, "
            "and a random initialisation is no model to return to",
        )
        size = self.model.input_size
        check_cache_size(self.data.cache, None if size is None else (size, size), self.model.name)
        self._check_binary_metrics()

    def _check_binary_metrics(self) -> None:
        """A two-class metric (reported or selected) in a recipe known to have other than two
        classes (:meth:`_class_count`)."""
        k, source = self._class_count()
        if k is None or k == 2:
            return
        for key, names in (
            ("eval.metrics", self.eval.metrics),
            ("train.select_metric", (self.train.select_metric,)),
            ("sweep.metric", (self.sweep.metric,)),
        ):
            binary = [name for name in names if name in BINARY_TASK_METRICS]
            check(
                not binary,
                key,
                list(names) if key == "eval.metrics" else names[0],
                f"{binary} need two classes (label 1 the positive one); this recipe has {k} "
                f"({source})",
            )

    def _class_count(self) -> tuple[int | None, str]:
        """The class count the recipe fixes, and the key that fixes it: ``model.num_classes``,
        else the length of ``data.train.classes``; ``None`` when only the data will tell."""
        if self.model.num_classes is not None:
            return self.model.num_classes, "model.num_classes"
        classes = self.data.train.classes
        return (None if classes is None else len(classes)), "data.train.classes"


def validation_metrics(data: DataConfig) -> list[str]:
    """The validation metrics a recipe with ``data`` can select on: :data:`SELECT_METRICS` and
    ``ood_<name>_auroc`` for each set of ``data.val_ood``."""
    return [*SELECT_METRICS, *(val_ood_metric(name) for name in data.val_ood)]


VAL_OOD_METRIC_SUFFIX = "_auroc"
"""The ending of every ``data.val_ood`` metric: an AUROC, so higher is better."""


def val_ood_metric(name: str) -> str:
    """The validation metric of the ``data.val_ood`` set ``name``: its AUROC against ``val``."""
    return f"ood_{name}{VAL_OOD_METRIC_SUFFIX}"
