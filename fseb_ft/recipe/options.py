"""Option lists, written once: recipes validate against them, the recipe reference lists them.

Plain constants, importing nothing, so every layer can read them. A recipe field's ``Literal``
type is built from the tuple here (``Literal[AUGMENTATIONS]``), so the recipe reference and the
validation message cannot disagree. Where code finds an option by name in a registry (sources,
augmentations, OOD scores, metrics, corruptions), a test holds the registry equal to its list
here, so a name cannot be valid in a recipe and unknown to the code.
"""

AUGMENTATIONS = ("none", "flip", "crop_flip", "randaug-lite", "timm")
"""Training augmentations (``data.augment``)."""

MIXUP_MODES = ("batch", "pair", "elem")
"""How mixup / CutMix draws its mixing (``data.mixup.mode``): one λ per batch, per pair of
images, or per image (``timm.data.Mixup``'s ``mode``)."""

CONTEXT_KINDS = ("train", "dataset", "mixture")
"""Where context points come from (``context.kind``)."""

METHODS = ("fseb", "fsvi")
"""The objective (``fseb.method``): FS-EB (PS-MAP at ``reg_scale = 0``) or FS-VI."""

VARIANCE_SCOPES = ("head", "all")
"""Which parameters carry FS-VI's variance (``fseb.fsvi_variance``): the linear classifier, or
every trainable parameter."""

SOLVERS = ("auto", "cholesky", "woodbury")
"""How ``Kc⁻¹`` is applied (``fseb.solver``); ``auto`` picks the cheaper exact one."""

FORWARD_MODES = ("joint", "separate")
"""One forward pass over ``[x; x̂]`` or two (``fseb.forward_mode``)."""

REG_POINTS = ("context", "joint")
"""Where the function-space term is evaluated (``fseb.reg_points``)."""

PARAM_ANCHORS = ("zero", "init")
"""Centre of the parameter prior (``fseb.param_anchor``)."""

HEAD_INITS = ("auto", "timm", "zeros")
"""Initialisation of the new classifier (``model.head_init``)."""

CLASS_WEIGHTS = ("none", "balanced")
"""The named per-class likelihood weights (``train.class_weights``; a list of weights too)."""

SAMPLERS = ("shuffle", "balanced")
"""How an epoch draws the training images (``train.sampler``)."""

BAD_IMAGES = ("stop", "skip")
"""What a run does with images found unreadable before training (``data.bad_images``)."""

CACHE_RESIZE = ("bilinear", "bicubic", "lanczos", "box", "hamming")
"""PIL resampling filters (antialiased when shrinking) of the resized-image cache
(``data.cache.resize``)."""

SOURCES = ("hub", "imagefolder", "disk", "arrays", "idx", "sklearn_digits", "csv")
"""Dataset sources (``DatasetSpec.source``)."""

FEATURE_OOD_SCORES = ("mahalanobis", "relative_mahalanobis", "knn", "vim")
"""The OOD scores of the penultimate features (``fseb_ft.evaluation.feature_ood``), fitted on the
training split: not for an ensemble; ``fseb-ft predict`` computes them with the fit a run keeps."""
OUTPUT_OOD_SCORES = ("entropy", "msp", "max_logit", "energy")
"""The OOD scores of the network's outputs (probabilities or logits), those an ensemble can report
and ``fseb-ft predict`` reports by default."""
OOD_SCORES = (*OUTPUT_OOD_SCORES, *FEATURE_OOD_SCORES)
"""OOD detection scores (``eval.ood_scores``), each larger = more likely OOD: predictive entropy,
negative maximum softmax probability, negative maximum logit, energy ``-logsumexp(logits)``, and
the feature scores of :data:`FEATURE_OOD_SCORES`."""

TASK_METRICS = (
    "qwk",
    "balanced_accuracy",
    "macro_f1",
    "roc_auc",
    "average_precision",
    "sensitivity_at_90_specificity",
    "sensitivity_at_95_specificity",
    "per_class_recall",
)
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

PRUNERS = ("hyperband", "successive_halving", "none")
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

LAPLACE_HESSIANS = ("kron", "full", "diag")
"""The last-layer Laplace's GGN structure (``eval.laplace_hessian``): Kronecker-factored, full,
or diagonal (laplace-torch's ``hessian_structure``)."""
LAPLACE_PRIORS = ("marglik", "validation")
"""How the last-layer Laplace's prior precision is chosen (``eval.laplace_prior``): by the
marginal likelihood of the training split, or by a grid search on the validation split's NLL."""

CONFORMAL_METHODS = ("lac", "aps", "raps")
"""The non-conformity scores of conformal prediction sets (``eval.conformal_method``,
``fseb-ft predict --conformal-method``; ``fseb_ft.evaluation.conformal``)."""
