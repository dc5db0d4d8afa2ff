"""The recipe sections that say where images come from: datasets, splits and the context set.

:class:`DatasetSpec` (one source of labelled images), :class:`DataConfig` (the ``data``
section: train/val/test/OOD splits and how images are fed) and :class:`ContextConfig` (the
``context`` section: where the function-space term's points x̂ come from). They are
:class:`~fseb_ft.recipe.Recipe` sections, validated when a recipe loads; ``fseb_ft.recipe``
re-exports them.
"""

from __future__ import annotations

import re
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fseb_ft.recipe.options import (
    Augmentation,
    BadImages,
    CacheResize,
    ContextKind,
    MixupMode,
    Source,
)
from fseb_ft.recipe.schema import ConfigError, check

__all__ = [
    "IN_MEMORY",
    "PIL_MAX_IMAGE_PIXELS",
    "ContextConfig",
    "DataConfig",
    "DatasetSpec",
    "ImageCacheConfig",
    "MixupConfig",
    "check_cache_size",
    "is_data_path_override",
]

PIL_MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3
"""PIL's own decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``), the default of
``data.max_image_pixels`` (written here: the recipe imports no image library)."""

IN_MEMORY = "in-memory:"
"""The path prefix that stands in a resolved recipe for a dataset the Python API was given in
memory (``fseb_ft.finetune(train=...)``): ``in-memory:<split>``. Such data cannot be read again."""


_DATA_PATH_OVERRIDE = re.compile(r"data\.(train|val|test|(ood|val_ood)\.[^.=]+)\.(path|image_dir)=")


def is_data_path_override(override: str) -> bool:
    """Whether ``override`` only says where a dataset of the ``data`` section now is: its
    ``path`` or ``image_dir`` (``data.test.path=DIR``, ``data.ood.NAME.path=DIR``). Evaluating
    and predicting a finished run take these for data moved since training; any other data key
    would change the images themselves."""
    return _DATA_PATH_OVERRIDE.match(override) is not None


@dataclass(frozen=True)
class DatasetSpec:
    """Where one split of labelled images comes from."""

    source: Source
    """``hub``: an HF Hub dataset id; ``imagefolder``: ``path/<split>/<class>/*.jpg``;
    ``disk``: a ``save_to_disk`` folder; ``arrays``: an ``.npz`` with ``images``/``labels``;
    ``idx``: MNIST-style ``{split}-images-idx3-ubyte.gz`` files in ``path``;
    ``sklearn_digits``: scikit-learn's 8×8 digits (no download); ``csv``: a label file (CSV,
    ``.tsv``, ``.parquet``) with one row per image file, e.g. a Kaggle task's ``DIR/train.csv``
    next to ``DIR/train_images/``."""
    path: str = ""
    """Hub id, directory or file, by ``source`` (unused for ``sklearn_digits``)."""
    split: str = "train"
    """Split name (``train``, ``test``, ``validation``; ``t10k`` for MNIST-style IDX files;
    unused for ``csv``, whose file is one split)."""
    revision: str | None = None
    """Hub revision (tag, branch or commit) to pin a ``hub`` dataset."""
    config: str | None = None
    """The configuration (subset) of a ``hub`` dataset that has several, the ``name`` argument
    of ``datasets.load_dataset`` (e.g. ``plain_text``); ``null``: its only or default one."""
    image_column: str = "image"
    """Column holding the image (HF sources); for ``csv``, the column holding each image's file
    name relative to ``image_dir`` (or an id that ``image_pattern`` makes one): ``file_name``
    for a ``datasets`` imagefolder ``metadata.csv`` (``path: DIR/metadata.csv``)."""
    label_column: str = "label"
    """Column holding the integer class label (HF sources); for ``csv``, the class of each row:
    integers (class indices) or names."""
    image_dir: str | None = None
    """``csv``: the folder of the image files, relative to the label file's folder unless
    absolute; ``null``: the label file's folder."""
    image_pattern: str | None = None
    """``csv``: turns the image column's id into a file name, ``{}`` standing for the id (e.g.
    ``"{}.png"`` for APTOS' ``id_code``); ``null``: the column holds file names."""
    group_column: str | None = None
    """``csv``: a column naming each image's group (a patient), kept with every image."""
    metadata_columns: tuple[str, ...] = ()
    """``csv``: further columns kept with every image, as strings (empty cells allowed)."""
    delimiter: str | None = None
    """``csv``: the one character between a text label file's columns, e.g. ``";"`` (a CSV saved
    where the decimal mark is a comma); ``null``: by extension, a tab for ``.tsv`` and ``.tab``
    files, else a comma. A parquet file has none."""
    classes: tuple[int | str, ...] | None = None
    """Keep only these classes, relabelled 0..len-1 in this order (``None``: all): each an
    original label or a class name (an image folder's class folder, e.g. ``[dog, cat]``, a Hub
    dataset's ``ClassLabel`` name). For ``csv`` it is the list of classes, in label order:
    integer labels or class names; a row
    whose label is not listed stops the load (a listed class without rows stays, empty).
    Without it, a ``csv`` file's integer labels are the class indices and its names are
    sorted."""
    limit: int | None = None
    """Use a seeded random subset of at most this many images (quick runs)."""
    fraction: float | None = None
    """Keep a seeded, stratified share of the images: this fraction of every class (rounded
    by largest remainder, at least one image per class), drawn with the run's seed before
    ``limit`` applies; for low-data experiments. ``null``: all."""

    def __post_init__(self) -> None:
        needs_path = self.source != "sklearn_digits"
        check(not needs_path or bool(self.path), "path", self.path, f"required for {self.source}")
        check(
            self.config is None or self.source == "hub",
            "config",
            self.config,
            f"applies to source hub only, not {self.source}",
        )
        for key in ("image_dir", "image_pattern", "group_column", "metadata_columns", "delimiter"):
            check(
                self.source == "csv" or not getattr(self, key),
                key,
                getattr(self, key),
                f"applies to source csv only, not {self.source}",
            )
        check(
            self.delimiter is None or len(self.delimiter) == 1,
            "delimiter",
            self.delimiter,
            "must be one character, e.g. ';' or '\\t'",
        )
        check(
            self.image_pattern is None or self.image_pattern.count("{}") == 1,
            "image_pattern",
            self.image_pattern,
            "must hold {} once, where the image column's id goes (e.g. '{}.png')",
        )
        check(self.limit is None or self.limit > 0, "limit", self.limit, "must be > 0 or null")
        check(
            self.fraction is None or 0.0 < self.fraction <= 1.0,
            "fraction",
            self.fraction,
            "must lie in (0, 1] or be null",
        )
        check(
            self.classes is None or len(set(self.classes)) == len(self.classes) > 0,
            "classes",
            self.classes,
            "must be a non-empty list of distinct labels or null",
        )


@dataclass(frozen=True)
class ImageCacheConfig:
    """The resized-image cache (``data.cache``): every image held encoded (image files,
    ``datasets`` image columns) is decoded once, shrunk so its shorter side is ``size`` and kept
    as uint8 pixels on disk, which every later run, sweep trial and evaluation of the same
    images reads instead of the originals (docs/performance.md, "The resized-image cache")."""

    size: int
    """Shorter side of the cached images in pixels, aspect ratio kept; an image already this
    small is kept as it is. E.g. 256 for a 224-px model. At least the model's input size, or
    the model would see upscaled images: checked when the recipe loads (with
    ``model.input_size``), before the build (a timm name's pretrained config) or, for
    ``hf-hub:`` and ``local-dir:`` models, once the model loads."""
    dir: str | None = None
    """Folder of the cache; ``null``: ``$XDG_CACHE_HOME/fseb_ft/images``, else
    ``~/.cache/fseb_ft/images``. Entries are keyed by each dataset's fingerprint, ``size`` and
    ``resize``: changed images get a new entry, unchanged ones reuse theirs."""
    resize: CacheResize = "bilinear"
    """PIL's resampling filter for the shrink (antialiased): ``bilinear`` (the one evaluation
    resizes with), ``bicubic``, ``lanczos``, ``box`` (area average) or ``hamming``."""

    def __post_init__(self) -> None:
        check(self.size >= 8, "size", self.size, "must be ≥ 8 (pixels of the shorter side)")
        check(self.dir is None or bool(self.dir), "dir", self.dir, "a folder or null")


def check_cache_size(
    config: ImageCacheConfig | None, input_size: Sequence[int] | None, model: str
) -> None:
    """Refuse a cache smaller than the model's input (``input_size``, (H, W); ``None``: not
    known yet): the one rule, checked when a recipe states ``model.input_size`` and again once
    the input size is known (before the cache's build, or when the model loads).

    Raises:
        ConfigError: ``data.cache.size`` is below the larger side of the input.
    """
    if config is None or input_size is None or config.size >= max(input_size):
        return
    height, width = input_size
    raise ConfigError(
        f"data.cache.size={config.size}: must be ≥ {max(input_size)}, the input size of "
        f"model.name={model!r} ({height}×{width}); a smaller cache would be upscaled again "
        "for training"
    )


@dataclass(frozen=True)
class MixupConfig:
    """Mixup and CutMix of the training batches (``data.mixup``), by ``timm.data.Mixup``: each
    batch's images are blended (mixup) or pasted into each other (CutMix) and their targets
    mixed in the same proportion, soft targets that only the likelihood sees (docs/method.md,
    "Label smoothing and mixup"). Give at least one of the two alphas."""

    mixup_alpha: float = 0.0
    """α of the Beta(α, α) that mixup draws its proportion λ from (timm's recipes: 0.8);
    0: no mixup."""
    cutmix_alpha: float = 0.0
    """α of CutMix's Beta(α, α) (timm's recipes: 1.0); 0: no CutMix."""
    prob: float = 1.0
    """Probability that a batch (an image, a pair: ``mode``) is mixed at all."""
    switch_prob: float = 0.5
    """With both alphas above 0: the probability of CutMix instead of mixup."""
    mode: MixupMode = "batch"
    """One λ per ``batch``, per ``pair`` of images, or per image (``elem``)."""

    def __post_init__(self) -> None:
        for name in ("mixup_alpha", "cutmix_alpha"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "must be ≥ 0")
        check(
            self.mixup_alpha > 0 or self.cutmix_alpha > 0,
            "mixup_alpha",
            self.mixup_alpha,
            f"with cutmix_alpha={self.cutmix_alpha!r}: one of them must be > 0 (data.mixup: "
            "null turns both off)",
        )
        check(0 < self.prob <= 1, "prob", self.prob, "must be in (0, 1]")
        check(0 <= self.switch_prob <= 1, "switch_prob", self.switch_prob, "must be in [0, 1]")


@dataclass(frozen=True)
class DataConfig:
    """Training, validation, test and OOD data, and how images are fed to the model."""

    train: DatasetSpec
    """The training split."""
    val: DatasetSpec | None = None
    """Validation split for model selection; ``null`` holds out ``val_fraction`` of ``train``
    (stratified, seeded; whole groups when ``train`` has a ``group_column``) — the test split
    is never used for selection."""
    test: DatasetSpec | None = None
    """The in-distribution test split reported at the end. ``null``: ``test_fraction`` of
    ``train`` is held out as the test split when it is set; else (no test labels, as on
    Kaggle) the run reports its validation split instead (``"split": "validation"`` in
    ``results.json``, labelled so in ``results.md`` and the model card); those are the numbers
    model selection saw, so they are optimistic."""
    ood: dict[str, DatasetSpec] = field(default_factory=dict)
    """Named semantic-shift (OOD) sets, scored against ``test`` (the validation split without
    one)."""
    val_ood: dict[str, DatasetSpec] = field(default_factory=dict)
    """Named OOD sets for validation, scored against the validation split after every epoch:
    ``val_ood_<name>_auroc`` in the history, by the first score of ``eval.ood_scores``, and
    selectable as ``train.select_metric`` / ``sweep.metric`` ``ood_<name>_auroc``. They must be
    other images than the ``ood`` sets (selecting on the images the results report would
    overstate them): the same split of the same source is refused unless their ``classes`` are
    disjoint. Each is predicted every epoch: keep it small with ``limit``."""
    val_fraction: float = 0.1
    """Fraction of ``train`` held out when ``val`` is ``null``: a seeded, stratified share of
    its images, or, when ``train`` has a ``group_column``, of its groups' images with no group
    on both sides (scikit-learn's ``StratifiedGroupKFold``). Taken after ``test_fraction``'s
    hold-out, from the rest, still as a share of all of ``train``."""
    test_fraction: float | None = None
    """Fraction of ``train`` held out as the test split when ``test`` is ``null`` (a task that
    ships one labelled file, as on Kaggle): seeded with ``seed`` (else ``train.seed``) and
    stratified like ``val_fraction``, group-aware in the same way (no group in two splits),
    and taken first, so the validation hold-out (or a ``val`` split given later) leaves it
    unchanged. Must be ``null`` when ``test`` is given, and ``val_fraction + test_fraction``
    below 1. ``null``: no test hold-out."""
    augment: Augmentation = "crop_flip"
    """Training augmentation: ``none`` (resize), ``flip``, ``crop_flip`` (pad, crop, flip: the
    CIFAR recipe) and ``randaug-lite`` (random resized crop, flip) with albumentations; ``timm``:
    timm's training transform, ``timm.data.create_transform(is_training=True,
    auto_augment="rand-m9-mstd0.5-inc1-mmax9", re_prob=0.25)`` (random resized crop of scale
    (0.08, 1), flip, RandAugment, random erasing), with timm's other defaults; the magnitude
    is clipped at 9, not 10, where timm's posterize keeps 0 bits (Pillow ≥ 13 refuses it)."""
    channels: Literal[1, 3] = 3
    """Image channels fed to the model; grayscale sources are repeated to 3 by default."""
    mean: tuple[float, ...] | None = None
    """Normalisation mean in [0, 1] units; ``null`` takes the model's data config."""
    std: tuple[float, ...] | None = None
    """Normalisation std; ``null`` takes the model's data config."""
    batch_size: int = 128
    """Training batch size B per process. An epoch's partial last batch trains, except a lone
    image, which is left out (BatchNorm cannot train on one)."""
    num_workers: int = 2
    """DataLoader worker processes."""
    bad_images: BadImages = "stop"
    """Before training, every image still held encoded (image folders, ``datasets`` image
    columns) of every split and context dataset is read; ``stop`` ends the run there with one
    message naming the unreadable files, ``skip`` leaves them out and records them in
    ``run.json`` and the model card. With ``cache``, this check is the cache's build: each image
    is decoded once, for both."""
    max_image_pixels: int | None = PIL_MAX_IMAGE_PIXELS
    """PIL's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``), for every image this
    run and its evaluation decode: PIL warns on an image of more pixels and refuses one of more
    than twice as many, which the check before training reports as unreadable (``bad_images``
    then stops or skips it). Default: PIL's, 89,478,485 pixels (about 9,459 × 9,459); raise it
    for larger scans you trust, or ``null`` for no limit."""
    cache: ImageCacheConfig | None = None
    """Decode every image once, shrink it to ``cache.size`` (shorter side) and train and evaluate
    from that copy (``fseb-ft cache RECIPE`` builds it ahead); e.g. ``{size: 256}`` or
    ``data.cache.size=256`` on the command line. ``null``: decode the original files at every
    epoch. Evaluation then resizes the cached copy, not the original, to the input size:
    docs/performance.md says how far that moves the pixels."""
    seed: int | None = None
    """Seed of every random draw of the data: the ``limit`` and ``fraction`` subsets of each
    dataset and the ``val_fraction`` / ``test_fraction`` hold-outs. ``null``: ``train.seed``, so
    each training seed draws its own images. Fix it to train runs that differ only in their
    training randomness (initialisation, batch order, augmentation) on the same images and
    validation split, as the members of a deep ensemble: ``fseb-ft evaluate --ensemble`` then
    fits the ensemble's temperature on that shared validation split."""
    mixup: MixupConfig | None = None
    """Mixup / CutMix of the training batches, e.g. ``{mixup_alpha: 0.8, cutmix_alpha: 1.0}``
    or ``data.mixup.mixup_alpha=0.2`` on the command line; ``null``: off. Validation, selection
    and test metrics stay on the hard labels."""

    def __post_init__(self) -> None:
        check(0 < self.val_fraction < 1, "val_fraction", self.val_fraction, "must be in (0, 1)")
        self._check_test_fraction()
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be ≥ 1")
        check(self.num_workers >= 0, "num_workers", self.num_workers, "must be ≥ 0")
        check(
            self.max_image_pixels is None or self.max_image_pixels >= 1,
            "max_image_pixels",
            self.max_image_pixels,
            "must be ≥ 1 or null",
        )
        check(self.seed is None or self.seed >= 0, "seed", self.seed, "must be ≥ 0 or null")
        for name in ("mean", "std"):
            value = getattr(self, name)
            check(
                value is None or len(value) == self.channels,
                name,
                value,
                f"must have {self.channels} values (one per channel) or be null",
            )
        check(self.std is None or all(s > 0 for s in self.std), "std", self.std, "must be > 0")
        for name, spec in self.val_ood.items():
            for other, test_spec in self.ood.items():
                check(
                    not _same_images(spec, test_spec),
                    f"val_ood.{name}",
                    _spec_text(spec),
                    f"the same images as the test-time OOD set data.ood.{other}; validate on "
                    "another split or other classes",
                )

    def draw_seed(self, train_seed: int) -> int:
        """The seed of the data's random draws: ``seed``, else ``train_seed`` (``train.seed``)."""
        return train_seed if self.seed is None else self.seed

    def _check_test_fraction(self) -> None:
        """``test_fraction``: in (0, 1), with ``val_fraction`` below 1, and only without
        ``test``."""
        fraction = self.test_fraction
        if fraction is None:
            return
        check(0 < fraction < 1, "test_fraction", fraction, "must be in (0, 1) or null")
        check(
            self.test is None,
            "test_fraction",
            fraction,
            "must be null when data.test is given (the test split is then data.test; hold out "
            "a test split from data.train only without one)",
        )
        if self.val is None:
            check(
                self.val_fraction + fraction < 1,
                "test_fraction",
                fraction,
                f"with val_fraction={self.val_fraction} must leave training images: "
                "val_fraction + test_fraction must be below 1",
            )


def _same_images(a: DatasetSpec, b: DatasetSpec) -> bool:
    """Whether two specs may share images: the same split of the same source, and classes not
    disjoint (a ``limit`` subset of a split still shares its images). A class named in one and
    given by its label in the other cannot be compared without the data: taken as shared."""
    where = ("source", "path", "config", "split", "revision")
    if any(getattr(a, k) != getattr(b, k) for k in where):
        return False
    if a.classes is None or b.classes is None:
        return True
    kinds = {type(c) for c in (*a.classes, *b.classes)}
    return len(kinds) > 1 or bool(set(a.classes) & set(b.classes))


def _spec_text(spec: DatasetSpec) -> str:
    """The identifying fields of ``spec``, for a one-line message."""
    return f"{spec.source}:{spec.path or '-'}[{spec.split}]" + (
        f" classes {list(spec.classes)}" if spec.classes is not None else ""
    )


@dataclass(frozen=True)
class ContextConfig:
    """The context distribution: where the points x̂ of the function-space term come from."""

    # "corruption" now means only the covariate-shift suite (eval.corruptions).
    RENAMED_KEYS = types.MappingProxyType({"corrupt": "perturb"})

    kind: ContextKind = "train"
    """``train``: the training inputs; ``dataset``: ``datasets``; ``mixture``: both, by weight."""
    datasets: tuple[DatasetSpec, ...] = ()
    """Other datasets (labels ignored) for ``dataset`` and ``mixture``."""
    weights: tuple[float, ...] = ()
    """Mixture weights: training inputs first, then each of ``datasets`` (``mixture`` only)."""
    perturb: bool = True
    """Perturb each context image afresh when it is drawn, with the reference's "corrupted
    training inputs" transform (random crop, flip, blur, solarise, colour jitter); ``false``
    makes the pool fixed so φ0 features are computed once and cached. Called ``corrupt``
    before, which is still accepted."""
    pool_size: int = 10_000
    """Size of the fixed, seeded pool drawn from the sources; reshuffled each epoch."""
    batch_size: int = 32
    """Context batch size M per process and step."""

    def __post_init__(self) -> None:
        check(self.pool_size >= 1, "pool_size", self.pool_size, "must be ≥ 1")
        check(self.batch_size >= 2, "batch_size", self.batch_size, "must be ≥ 2")
        check(
            self.kind != "dataset" or len(self.datasets) == 1,
            "datasets",
            self.datasets,
            "kind='dataset' needs exactly one dataset (use kind='mixture' to combine several)",
        )
        check(
            self.kind != "mixture" or len(self.datasets) > 0,
            "datasets",
            self.datasets,
            "kind='mixture' needs at least one dataset besides the training inputs",
        )
        if self.kind == "mixture":
            n = len(self.datasets) + 1
            check(
                len(self.weights) == n
                and all(w >= 0 for w in self.weights)
                and sum(self.weights) > 0,
                "weights",
                self.weights,
                f"mixture needs {n} non-negative weights (train first), not all zero",
            )
