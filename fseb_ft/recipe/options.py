"""Option lists, written once: recipes validate against them, the recipe reference lists them.

Plain constants, importing nothing but :mod:`typing`, so every layer can read them. A recipe
field's type is the ``Literal`` here (``Augmentation``) whose values are the tuple beside it
(``AUGMENTATIONS``), so the recipe reference, the validation message and the type checker cannot
disagree. Where code finds an option by name in a registry (sources, augmentations, OOD scores,
metrics, corruptions), a test holds the registry equal to its list here, so a name cannot be
valid in a recipe and unknown to the code.
"""

from typing import Literal, get_args

Augmentation = Literal["none", "flip", "crop_flip", "randaug-lite", "timm"]
AUGMENTATIONS: tuple[str, ...] = get_args(Augmentation)
"""Training augmentations (``data.augment``)."""

MixupMode = Literal["batch", "pair", "elem"]
MIXUP_MODES: tuple[str, ...] = get_args(MixupMode)
"""How mixup / CutMix draws its mixing (``data.mixup.mode``): one λ per batch, per pair of
images, or per image (``timm.data.Mixup``'s ``mode``)."""

ContextKind = Literal["train", "dataset", "mixture"]
CONTEXT_KINDS: tuple[str, ...] = get_args(ContextKind)
"""Where context points come from (``context.kind``)."""

Method = Literal["fseb", "fsvi", "l2sp", "feature"]
METHODS: tuple[str, ...] = get_args(Method)
"""The objective (``fseb.method``): FS-EB (PS-MAP at ``reg_scale = 0``), FS-VI, L2-SP or
Feature-SP; one registered method each (``fseb_ft.method.methods``)."""

METHOD_SUMMARIES: dict[str, str] = {
    "fseb": "FS-EB: a Gaussian prior on the logits at context points (reg_scale=0: PS-MAP)",
    "fsvi": "FS-VI: a mean-field q(θ), the KL to the same function-space prior",
    "l2sp": "L2-SP: weight decay towards the starting weights",
    "feature": "Feature-SP: the penultimate features held near the starting model's",
}
"""One line per method for ``fseb-ft --help``, in :data:`METHODS`' order (a test holds the keys
equal)."""

VarianceScope = Literal["head", "all"]
VARIANCE_SCOPES: tuple[str, ...] = get_args(VarianceScope)
"""Which parameters carry FS-VI's variance (``fseb.fsvi.variance``): the linear classifier, or
every trainable parameter."""

FeaturePoints = Literal["train", "joint"]
FEATURE_POINTS: tuple[str, ...] = get_args(FeaturePoints)
"""Where Feature-SP holds the features at φ0's (``fseb.feature.points``): the training batch,
or the training and context batches together."""

Solver = Literal["auto", "cholesky", "woodbury"]
SOLVERS: tuple[str, ...] = get_args(Solver)
"""How ``Kc⁻¹`` is applied (``fseb.solver``); ``auto`` picks the cheaper exact one."""

ForwardMode = Literal["joint", "separate"]
FORWARD_MODES: tuple[str, ...] = get_args(ForwardMode)
"""One forward pass over ``[x; x̂]`` or two (``fseb.forward_mode``)."""

RegPoints = Literal["context", "joint"]
REG_POINTS: tuple[str, ...] = get_args(RegPoints)
"""Where the function-space term is evaluated (``fseb.reg_points``)."""

ParamAnchor = Literal["zero", "init"]
PARAM_ANCHORS: tuple[str, ...] = get_args(ParamAnchor)
"""Centre of the parameter prior (``fseb.param_anchor``)."""

HeadInit = Literal["auto", "timm", "zeros"]
HEAD_INITS: tuple[str, ...] = get_args(HeadInit)
"""Initialisation of the new classifier (``model.head_init``)."""

ClassWeights = Literal["none", "balanced"]
CLASS_WEIGHTS: tuple[str, ...] = get_args(ClassWeights)
"""The named per-class likelihood weights (``train.class_weights``; a list of weights too)."""

Sampler = Literal["shuffle", "balanced"]
SAMPLERS: tuple[str, ...] = get_args(Sampler)
"""How an epoch draws the training images (``train.sampler``)."""

BadImages = Literal["stop", "skip"]
BAD_IMAGES: tuple[str, ...] = get_args(BadImages)
"""What a run does with images found unreadable before training (``data.bad_images``)."""

CacheResize = Literal["bilinear", "bicubic", "lanczos", "box", "hamming"]
CACHE_RESIZE: tuple[str, ...] = get_args(CacheResize)
"""PIL resampling filters (antialiased when shrinking) of the resized-image cache
(``data.cache.resize``)."""

Source = Literal["hub", "imagefolder", "disk", "arrays", "idx", "sklearn_digits", "csv"]
SOURCES: tuple[str, ...] = get_args(Source)
"""Dataset sources (``DatasetSpec.source``)."""

FeatureOodScore = Literal["mahalanobis", "relative_mahalanobis", "knn", "vim"]
FEATURE_OOD_SCORES: tuple[str, ...] = get_args(FeatureOodScore)
"""The OOD scores of the penultimate features (``fseb_ft.evaluation.feature_ood``), fitted on the
training split: not for an ensemble; ``fseb-ft predict`` computes them with the fit a run keeps."""
OutputOodScore = Literal["entropy", "msp", "max_logit", "energy"]
OUTPUT_OOD_SCORES: tuple[str, ...] = get_args(OutputOodScore)
"""The OOD scores of the network's outputs (probabilities or logits), those an ensemble can report
and ``fseb-ft predict`` reports by default."""
OodScore = Literal[OutputOodScore, FeatureOodScore]
OOD_SCORES: tuple[str, ...] = get_args(OodScore)
"""OOD detection scores (``eval.ood_scores``), each larger = more likely OOD: predictive entropy,
negative maximum softmax probability, negative maximum logit, energy ``-logsumexp(logits)``, and
the feature scores of :data:`FEATURE_OOD_SCORES`."""

TaskMetric = Literal[
    "qwk",
    "balanced_accuracy",
    "macro_f1",
    "roc_auc",
    "average_precision",
    "sensitivity_at_90_specificity",
    "sensitivity_at_95_specificity",
    "per_class_recall",
]
TASK_METRICS: tuple[str, ...] = get_args(TaskMetric)
"""The task metrics a recipe may report (``eval.metrics``), computed with scikit-learn
(``fseb_ft.evaluation.task_metrics``, registered with ``task=True``), in registration order."""
BINARY_TASK_METRICS = ("sensitivity_at_90_specificity", "sensitivity_at_95_specificity")
"""The task metrics defined for two classes only (label 1 the positive class)."""
PER_CLASS_METRICS = ("per_class_recall",)
"""The task metrics with one value per class: reported, never selected on."""
SELECT_METRICS = (
    "nll",
    "accuracy",
    "ece",
    "brier",
    *(name for name in TASK_METRICS if name not in PER_CLASS_METRICS),
)
"""Validation metrics that select a checkpoint (``train.select_metric``) or a sweep's winner
(``sweep.metric``); the metric registry (``fseb_ft.evaluation.metric_registry``) knows which
are higher-is-better."""

Pruner = Literal["hyperband", "successive_halving", "none"]
PRUNERS: tuple[str, ...] = get_args(Pruner)
"""How a sweep stops unpromising trials early on their per-epoch validation metric
(``sweep.pruner``)."""

CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "speckle_noise",
    "gaussian_blur",
    "saturate",
)
"""Every corruption of ``eval.corruptions``: the benchmark's, in its order, then the extras.
:data:`fseb_ft.data.corruption_ops.CORRUPTIONS` registers one function per name (a test pins the
two together)."""
BENCHMARK_CORRUPTIONS = CORRUPTIONS[:14]
"""The corruptions ``all`` stands for: CIFAR-10-C's 15 less ``frost``."""
ALL_CORRUPTIONS = "all"
"""The name that ``eval.corruptions`` expands to :data:`BENCHMARK_CORRUPTIONS`."""

LaplaceHessian = Literal["kron", "full", "diag"]
LAPLACE_HESSIANS: tuple[str, ...] = get_args(LaplaceHessian)
"""The last-layer Laplace's GGN structure (``eval.laplace_hessian``): Kronecker-factored, full,
or diagonal (laplace-torch's ``hessian_structure``)."""
LaplacePrior = Literal["marglik", "validation"]
LAPLACE_PRIORS: tuple[str, ...] = get_args(LaplacePrior)
"""How the last-layer Laplace's prior precision is chosen (``eval.laplace_prior``): by the
marginal likelihood of the training split, or by a grid search on the validation split's NLL."""

ConformalMethod = Literal["lac", "aps", "raps"]
CONFORMAL_METHODS: tuple[str, ...] = get_args(ConformalMethod)
"""The non-conformity scores of conformal prediction sets (``eval.conformal_method``,
``fseb-ft predict --conformal-method``; ``fseb_ft.evaluation.conformal``)."""
