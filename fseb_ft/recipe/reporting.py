"""The recipe's ``eval`` and ``output`` sections: what the final report contains and where the
run writes and shares it.

Each field's docstring is its entry in docs/recipes.md; each ``__post_init__`` validates its
section, raising :class:`~fseb_ft.recipe.schema.ConfigError` naming the dotted key, the value and
what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fseb_ft.recipe.datasets import IN_MEMORY, DataConfig
from fseb_ft.recipe.options import (
    ALL_CORRUPTIONS,
    BENCHMARK_CORRUPTIONS,
    CORRUPTIONS,
    ConformalMethod,
    LaplaceHessian,
    LaplacePrior,
    OodScore,
    TaskMetric,
)
from fseb_ft.recipe.schema import ConfigError, check

__all__ = ["EvalConfig", "OutputConfig", "check_group_by", "resolve_corruptions"]


@dataclass(frozen=True)
class EvalConfig:
    """What the final report contains."""

    batch_size: int = 256
    """Evaluation batch size per process (validation, test and OOD sets)."""
    corruptions: tuple[str, ...] | str = ()
    """Covariate shift: also evaluate the test split (the validation split when there is no
    ``data.test``) under these common corruptions (Hendrycks & Dietterich 2019, CIFAR-10-C
    parameters), each at every severity of ``severities``; ``all`` (alone or in the list)
    stands for the 14 benchmark corruptions, saved expanded in the run's ``recipe.yaml``. Names
    are those of ``fseb_ft.recipe.options.CORRUPTIONS``; results go to ``corruptions`` in
    ``results.json``, a table in ``results.md`` and ``corruptions.png``. ``[]``: none."""
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    """Corruption severities to evaluate, each in 1–5."""
    corruption_seed: int = 0
    """Seed of the corruptions' randomness: image i always gets the same corrupted pixels."""
    corruption_limit: int | None = None
    """Corrupt only a seeded, class-stratified subset of at most this many test images (the
    same subset for every corruption and severity, drawn with ``corruption_seed``). The
    corruption table's and figure's clean row is taken on the same subset
    (``corruption_clean`` in ``results.json``), so clean and corrupted rows compare the same
    images; the test split's own metrics still use the whole split. ``null``: the whole test
    split."""
    corruption_cache: str | None = None
    """Folder caching the corrupted test images (uint8 ``.npy`` with an ``.npz`` index), so a
    re-evaluation does not recompute them; ``null``: ``$XDG_CACHE_HOME/fseb_ft/corruptions``, else
    ``~/.cache/fseb_ft/corruptions``."""
    ood_scores: tuple[OodScore, ...] = ("entropy",)
    """OOD detection scores reported for each OOD set (AUROC, AUPR, FPR95 each; larger score =
    more likely OOD): ``entropy`` (predictive entropy, the paper's), ``msp`` (negative maximum
    softmax probability), ``max_logit`` (negative maximum logit), ``energy`` (negative
    logsumexp of the logits); and the scores of the penultimate features (the classifier's
    input), fitted on one extra un-augmented pass over the training split (docs/method.md,
    "Feature-space OOD scores"): ``mahalanobis`` (class means, shared covariance),
    ``relative_mahalanobis`` (minus the distance under one background Gaussian), ``knn``
    (distance to the 50th nearest normalised training feature), ``vim`` (virtual logit minus
    energy; needs a linear classifier). ``max_logit`` and ``energy`` are not defined for an
    ensemble (averaged probabilities, no logits), nor the feature scores, and are left out of
    its results. With a feature score the run keeps their fit with its model, for
    ``fseb-ft predict --ood-score``."""
    metrics: tuple[TaskMetric, ...] = ()
    """Task metrics reported beside the standard ones, computed with scikit-learn on the
    reported split and on validation every epoch (docs/method.md, "Task metrics"): ``qwk``
    (quadratic weighted Cohen's kappa, the class indices as grades), ``balanced_accuracy``,
    ``macro_f1``, ``roc_auc`` and ``average_precision`` (two classes: of label 1's probability;
    more: the macro mean over the classes, one-vs-rest), ``sensitivity_at_90_specificity`` and
    ``sensitivity_at_95_specificity`` (two classes only, label 1 positive: the largest
    sensitivity at a threshold whose specificity reaches 90 / 95 %, tied scores called
    together), ``per_class_recall`` (one value per class: a table of its own). They are keys of
    ``results.json``'s ``test`` and columns of ``results.md``, ``--compare`` and the model card;
    any but ``per_class_recall`` can be ``train.select_metric``. A two-class metric stops a
    recipe whose class count (``model.num_classes``, else ``data.train.classes``) is another;
    when the count is known only from the data, it is left out with a log line. ``[]``: none."""
    temperature_scaling: bool = False
    """Also fit a temperature ``T`` on the validation split (minimising its NLL) and report the
    test, OOD and corruption metrics of ``softmax(logits / T)`` as a second row "<method> + TS",
    and as ``temperature_scaled`` in ``results.json``; the model card and ``fseb.json`` give
    ``T``."""
    group_by: str | None = None
    """Also report every in-distribution metric of the test split (the validation split
    without one) per group of images sharing a value of this column (a hospital, a camera),
    with each group's size ``n``: ``groups`` in ``results.json``, a table in ``results.md`` and
    the model card (the "+ TS" row's too with ``temperature_scaling``). It must be one of the
    ``metadata_columns`` of that split's ``csv`` dataset (list a ``group_column`` there too to
    group by it). A metric a group cannot define (AUROC on one class) is ``null``, its reason
    under ``undefined``. ``null``: no per-group results."""
    bootstrap: int = 1000
    """Resamples of the bootstrap intervals: every scalar test metric (the validation split's
    without a test split), OOD AUROC, AUPR and FPR95 gets a percentile interval over its
    images, resampled with ``train.seed`` (the OOD metrics resample the test and the OOD images
    each), in ``results.json`` (``intervals``), ``results.md`` and the model card (the "+ TS"
    row's too); ``--compare`` adds the paired difference's (docs/method.md, "Bootstrap
    intervals"). The model is held fixed: an interval does not include seed-to-seed variation.
    ``0``: no intervals."""
    bootstrap_confidence: float = 0.95
    """Confidence level of the bootstrap intervals, in (0, 1)."""
    laplace: bool = False
    """Also fit a last-layer Laplace approximation (LLLA, laplace-torch) around the trained
    network: a Gaussian posterior over the linear classifier's weights and bias (the rest of the
    network held fixed), its generalised Gauss-Newton fitted on the training split's
    penultimate features (one extra un-augmented pass, shared with the feature OOD scores), and
    report the test, OOD and corruption metrics of its probit predictive as a row
    "<method> + LLLA", and as ``laplace`` in ``results.json`` (docs/method.md, "Last-layer
    Laplace"). Evaluation only: the model folder does not carry the posterior, and
    ``fseb-ft predict`` uses the network's own (or temperature-scaled) probabilities. Needs
    ``pip install 'fseb_ft[laplace]'``, a linear classifier (timm's ``get_classifier()``) and
    a MAP run (FS-EB or PS-MAP, not ``fseb.method=fsvi``); an ensemble reports none."""
    laplace_hessian: LaplaceHessian = "kron"
    """The structure of LLLA's Gauss-Newton matrix over the classifier's ``P = (D + 1)·K``
    weights (``D`` features, ``K`` classes): ``kron`` (Kronecker factors of ``D + 1`` and ``K``
    rows: any head), ``full`` (the exact ``P × P`` matrix: small heads only, ``P ≤ 25000``,
    5 GB in float64 at that size; a larger head stops with an error), ``diag`` (its
    diagonal)."""
    laplace_prior: LaplacePrior = "marglik"
    """How LLLA's prior precision ``λ`` (its prior ``N(0, λ⁻¹ I)`` over the classifier's
    weights; not the run's ``fseb`` prior) is chosen: ``marglik`` (maximise the training
    split's Laplace marginal likelihood; no validation image used), ``validation`` (the value
    of a grid of 100 in ``[1e-4, 1e4]`` whose probit predictive has the lowest validation
    NLL)."""
    wise_ft: bool = False
    """Also evaluate WiSE-FT (Wortsman et al. 2022): the network whose backbone weights are
    ``(1 − α) θ_start + α θ_fine-tuned``, ``θ_start`` the pretrained weights the run started
    from (φ0), its classifier the fine-tuned one; ``α`` the value of ``wise_ft_alphas`` with the
    lowest validation NLL; strictly between 0 and 1 its BatchNorm statistics re-estimated on the
    training images. Reported as a row "<method> + WiSE" and as ``wise_ft`` in
    ``results.json`` (with ``alpha`` and each ``α``'s validation NLL); its weights are kept as
    ``model/wise_ft.safetensors`` beside the fine-tuned ``model.safetensors``, in the same
    layout (docs/method.md, "WiSE-FT"). FS-VI interpolates its mean network. Needs
    ``model.pretrained: true``; an ensemble reports none."""
    wise_ft_alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    """The grid of WiSE-FT's mixing weight ``α`` (1: the fine-tuned network, 0: the starting
    backbone with the fine-tuned classifier), each in [0, 1]; each costs one pass over the
    training images (the BatchNorm statistics) and one over the validation images. The
    default holds the paper's ``α`` = 0.5 and both end points, so validation can also keep the
    fine-tuned network."""
    conformal: float | None = None
    """Also report split-conformal prediction sets for this target coverage ``C`` in (0, 1):
    calibrated on the validation split (predicted for it), their empirical coverage on the test
    split (``conformal_coverage``) and mean size (``conformal_set_size``) in each results block's
    ``test`` (the "+ TS" block's calibrated on the temperature-scaled validation logits, the
    "+ LLLA" block's on its own), and the columns "Cov. (%)" and "Set size" of the tables
    (docs/method.md, "Conformal coverage"). The sets are those of ``fseb-ft predict
    --conformal`` at the same coverage. ``null``: none."""
    conformal_method: ConformalMethod = "lac"
    """The conformal sets' non-conformity score: ``lac`` (``1 − p_y``, the smallest sets),
    ``aps`` or ``raps`` (the mass of the classes ranked before ``y``; RAPS penalises long
    tails), deterministic (not randomised)."""
    conformal_class_conditional: bool = False
    """One conformal quantile per class, from that class's validation images: the coverage then
    holds for each class, rare ones too (larger sets for them)."""

    def __post_init__(self) -> None:
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be ≥ 1")
        check(
            self.bootstrap == 0 or self.bootstrap >= 100,
            "bootstrap",
            self.bootstrap,
            "must be 0 (no intervals) or ≥ 100 resamples",
        )
        check(
            0 < self.bootstrap_confidence < 1,
            "bootstrap_confidence",
            self.bootstrap_confidence,
            "must be in (0, 1)",
        )
        check(
            self.conformal is None or 0 < self.conformal < 1,
            "conformal",
            self.conformal,
            "must be a target coverage in (0, 1), e.g. 0.9, or null",
        )
        check(
            len(self.wise_ft_alphas) > 0 and all(0 <= a <= 1 for a in self.wise_ft_alphas),
            "wise_ft_alphas",
            self.wise_ft_alphas,
            "must be a non-empty list of mixing weights in [0, 1]",
        )
        object.__setattr__(self, "wise_ft_alphas", tuple(sorted(set(self.wise_ft_alphas))))
        check(len(self.ood_scores) > 0, "ood_scores", self.ood_scores, "must name ≥ 1 score")
        object.__setattr__(self, "ood_scores", tuple(dict.fromkeys(self.ood_scores)))
        object.__setattr__(self, "metrics", tuple(dict.fromkeys(self.metrics)))
        check(
            self.corruption_limit is None or self.corruption_limit >= 1,
            "corruption_limit",
            self.corruption_limit,
            "must be ≥ 1 or null",
        )
        check(
            len(self.severities) > 0 and all(1 <= s <= 5 for s in self.severities),
            "severities",
            self.severities,
            "must be a non-empty list of levels in 1..5",
        )
        # Sorted and without repeats, so results and tables list them in order.
        object.__setattr__(self, "severities", tuple(sorted(set(self.severities))))
        check(self.corruption_seed >= 0, "corruption_seed", self.corruption_seed, "must be ≥ 0")
        if isinstance(self.corruptions, str):  # eval.corruptions=all on the command line
            object.__setattr__(self, "corruptions", (self.corruptions,))
        if self.corruptions:
            try:
                names = resolve_corruptions(self.corruptions)
            except ValueError as err:
                raise ConfigError(f"corruptions={list(self.corruptions)!r}: {err}") from None
            object.__setattr__(self, "corruptions", names)


@dataclass(frozen=True)
class OutputConfig:
    """Where the run writes its checkpoints, recipe and results, and where it shares the model."""

    dir: str = "runs/default"
    """Run directory (created; a rerun with ``train.resume=auto`` continues in it)."""
    push_to_hub: str | None = None
    """Hub repo ``user/name`` to upload the model folder (``model/``: weights, config, card,
    recipe, plots; never checkpoints) to after training; ``null``: keep it on disk only. Retry
    or push later with ``fseb-ft push RUN_DIR user/name``."""
    private: bool = False
    """Create the Hub repo as private (an existing repo keeps its visibility)."""
    revision: str | None = None
    """Hub branch to push to (created if missing); ``null``: the default branch."""
    commit_message: str = "Upload model fine-tuned with fseb_ft"
    """Commit message of the Hub upload."""
    license: str | None = None
    """Model-card license (a Hub license id, e.g. ``apache-2.0``, ``mit``, ``cc-by-nc-4.0``);
    ``null``: the license timm records for the pretrained weights of a timm or ``hf-hub:``
    model, else ``other`` (a ``local-dir:`` or untrained start), which the card flags as not
    known. Check the training data's terms too."""

    def __post_init__(self) -> None:
        repo = self.push_to_hub
        well_formed = repo is not None and repo.count("/") == 1 and all(repo.split("/"))
        check(
            repo is None or (well_formed and not any(c.isspace() for c in repo)),
            "push_to_hub",
            repo,
            "a Hub repo id 'user/name' or null",
        )
        check(self.revision is None or bool(self.revision), "revision", self.revision, "a branch")
        check(bool(self.commit_message), "commit_message", self.commit_message, "non-empty")
        check(self.license is None or bool(self.license), "license", self.license, "an id or null")


def check_group_by(data: DataConfig, column: str | None) -> None:
    """Refuse an ``eval.group_by`` that is not a metadata column of the split the results are
    on: ``data.test``, else ``data.train`` with ``data.test_fraction`` (the test hold-out),
    else ``data.val``, else ``data.train`` (its validation hold-out).

    Datasets given in memory are checked when they load (their images carry the columns).
    """
    if column is None:
        return
    if data.test is not None:
        name = "test"
    else:
        name = "val" if data.val is not None and data.test_fraction is None else "train"
    spec = getattr(data, name)
    if spec.path.startswith(IN_MEMORY):
        return
    columns = list(spec.metadata_columns)
    check(
        column in columns,
        "eval.group_by",
        column,
        f"must be one of data.{name}.metadata_columns {columns} (the split the results are on)"
        if columns
        else f"data.{name} (source {spec.source}) keeps no metadata_columns; list {column!r} "
        "in those of a csv source",
    )


def resolve_corruptions(names: Iterable[str]) -> tuple[str, ...]:
    """Validate corruption names, expand ``all`` to :data:`BENCHMARK_CORRUPTIONS`, drop repeats
    (in order).

    Raises:
        ValueError: a name is unknown; the message lists every available one.
    """
    out: list[str] = []
    for name in names:
        expanded = BENCHMARK_CORRUPTIONS if name == ALL_CORRUPTIONS else (name,)
        for item in expanded:
            if item not in CORRUPTIONS:
                raise ValueError(
                    f"unknown corruption {item!r}; available: {[*CORRUPTIONS]} or "
                    f"{ALL_CORRUPTIONS!r} (= {list(BENCHMARK_CORRUPTIONS)})"
                )
            if item not in out:
                out.append(item)
    return tuple(out)
