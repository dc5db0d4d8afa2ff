"""Subsets, splits and label checks of :class:`~fseb_ft.data.images.LabeledImages`.

The seeded stratified hold-out (:mod:`fseb_ft.data.holdout` takes a run's with it), class
selection, the largest-remainder allocation the context pool also draws with, and
:class:`Splits`: the datasets a recipe names, checked against each other before training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fseb_ft.data.images import IndexedImages, LabeledImages
from fseb_ft.errors import FsebError

__all__ = [
    "TEST_SPLIT",
    "VALIDATION_SPLIT",
    "Splits",
    "TooFewClassesError",
    "allocate",
    "check_labels",
    "require_two_classes",
    "select_classes",
    "stratified_split",
]


TEST_SPLIT = "test"
"""The split a run reports on when its recipe has ``data.test``."""
VALIDATION_SPLIT = "validation"
"""The split a run without ``data.test`` reports on: the one model selection saw (optimistic)."""


class TooFewClassesError(FsebError, ValueError):
    """The training images are of fewer than two classes: a classifier has nothing to learn."""


def stratified_split(
    labels: np.ndarray | Sequence[int], fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split into (train indices, held-out indices), both sorted.

    ``fraction`` of the samples are held out (for validation, or a test split), allocated to
    classes in proportion to their size (largest remainder), but never a class's last sample:
    every class keeps at least one training sample, so a rare class may get fewer held-out
    samples than its share.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"a held-out fraction must lie in (0, 1), got {fraction}")
    labels = np.asarray(labels)  # (N,)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = np.minimum(allocate(round(fraction * len(labels)), counts), counts - 1)  # (C,)
    rng = np.random.default_rng(seed)
    val = [rng.permutation(np.flatnonzero(inverse == c))[: quota[c]] for c in range(len(classes))]
    val_idx = np.sort(np.concatenate(val)).astype(np.int64)  # (V,)
    if len(val_idx) == 0:
        raise ValueError(
            f"a share {fraction} of {len(labels)} samples leaves an empty hold-out; raise the "
            "fraction"
        )
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx)  # (N - V,)
    return train_idx, val_idx


def allocate(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Split the integer ``total`` in proportion to ``weights`` (largest remainder method).

    The counts are non-negative integers that sum exactly to ``total``.
    """
    weights = np.asarray(weights, dtype=np.float64)  # (S,)
    if weights.ndim != 1 or len(weights) == 0:
        raise ValueError(f"weights must be a non-empty 1-D sequence, got shape {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(
            f"weights must be finite, non-negative and not all zero, got {weights.tolist()}"
        )
    exact = total * weights / weights.sum()  # (S,)
    counts = np.floor(exact).astype(np.int64)
    # Ties break towards the earlier entry (stable sort), which keeps the result reproducible.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def check_labels(data: LabeledImages, num_classes: int) -> None:
    """Raise ValueError if any label of ``data`` lies outside [0, num_classes)."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    bad = np.unique(data.labels[(data.labels < 0) | (data.labels >= num_classes)])
    if len(bad):
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise ValueError(
            f"{data.identity} has label values {shown} outside the allowed range [0, {num_classes})"
        )


def require_two_classes(data: LabeledImages, described: str, hint: str) -> None:
    """Raise :class:`TooFewClassesError` unless ``data`` has images of at least two classes.

    A one-class classifier is right by construction (100 % accuracy, NLL 0) and learns nothing.
    The message starts with ``described`` (which data), says what was found and ends with
    ``hint`` (what to do).
    """
    present = np.unique(data.labels)  # (C,)
    if len(present) >= 2:
        return
    names = [data.class_names[k] if k < len(data.class_names) else str(k) for k in present]
    found = f"1 class ({names[0]!r})" if names else "no images"
    if names and len(data.class_names) > 1:  # the others are empty (class folders without images)
        found = f"images of only 1 of its {len(data.class_names)} classes ({names[0]!r})"
    raise TooFewClassesError(
        f"{described} has {found}: a classifier needs images of at least 2 classes. {hint}"
    )


def select_classes(data: LabeledImages, classes: Sequence[int | str]) -> IndexedImages:
    """Keep the samples of ``classes`` and relabel them ``0..len(classes)-1`` in that order.

    A class is its label or its name (an image folder's class folder, a ``ClassLabel`` name).
    """
    wanted = _labels_of(data, classes)
    known = set(np.unique(data.labels).tolist())
    absent = [c for c, label in zip(classes, wanted, strict=True) if label not in known]
    if absent:
        raise ValueError(f"classes {absent} do not occur in {data.identity}")
    subset = IndexedImages(data, np.flatnonzero(np.isin(data.labels, wanted)))
    remap = np.full(int(data.labels.max()) + 1, -1, dtype=np.int64)
    remap[wanted] = np.arange(len(wanted))
    subset.labels = remap[subset.labels]  # (M,)
    names = data.class_names
    subset.class_names = [names[c] if c < len(names) else str(c) for c in wanted]
    subset.identity += f"|classes:{','.join(map(str, classes))}"
    return subset


def _labels_of(data: LabeledImages, classes: Sequence[int | str]) -> list[int]:
    """Each of ``classes`` as a label of ``data``: a label as it is, a name by its index in
    ``data.class_names``.

    Raises:
        ValueError: a name that is none of ``data``'s classes, or one class given twice (by
            its label and its name).
    """
    index = {name: k for k, name in enumerate(data.class_names)}
    unknown = [c for c in classes if isinstance(c, str) and c not in index]
    if unknown:
        raise ValueError(
            f"classes {unknown} are not class names of {data.identity}; its classes are "
            f"{list(data.class_names)} (or give labels 0..{len(data.class_names) - 1})"
        )
    labels = [index[c] if isinstance(c, str) else int(c) for c in classes]
    if len(set(labels)) < len(labels):
        raise ValueError(f"classes {list(classes)} name one class twice (labels {labels})")
    return labels


@dataclass
class Splits:
    """The datasets a recipe names, loaded and split."""

    train: LabeledImages
    """Training images (without the held-out validation part)."""
    val: LabeledImages
    """Validation images: model selection only."""
    test: LabeledImages | None
    """In-distribution test images, reported once at the end."""
    ood: dict[str, LabeledImages]
    """Named semantic-shift sets."""

    def identities(self) -> dict[str, Any]:
        """Provenance of every split, for ``run.json``."""
        return {
            "train": self.train.identity,
            "val": self.val.identity,
            "test": None if self.test is None else self.test.identity,
            "ood": {name: data.identity for name, data in self.ood.items()},
        }

    def check_labels(self, num_classes: int) -> list[str]:
        """Check every labelled split against ``[0, num_classes)`` and train's classes.

        Raises ValueError naming the split (``data.test: ...``) when val/test call a label by
        another class name than train (an extra or renamed class folder) or a label is out of
        range. Returns a warning for training classes without images (an empty class folder).
        """
        for key, data in (("train", self.train), ("val", self.val), ("test", self.test)):
            if data is None:
                continue
            if key != "train":
                _check_same_classes(data, self.train, f"data.{key}")
            try:
                check_labels(data, num_classes)
            except ValueError as err:
                raise ValueError(f"data.{key}: {err}") from err
        counts = np.bincount(self.train.labels, minlength=num_classes)  # (K,)
        empty = [name for name, n in zip(self.train.class_names, counts, strict=False) if n == 0]
        if not empty:
            return []
        return [
            f"data.train ({self.train.identity}) has no images of class(es) {empty}: their "
            f"outputs of the {num_classes}-way head are never trained (an empty class folder?)"
        ]


def _check_same_classes(data: LabeledImages, train: LabeledImages, key: str) -> None:
    """Raise when ``data`` names a label it uses differently from ``train`` (both named)."""
    if not (_named(data) and _named(train)):
        return
    names, known = data.class_names, train.class_names
    used = [int(k) for k in np.unique(data.labels) if 0 <= k < len(names)]
    if all(k < len(known) and names[k] == known[k] for k in used):
        return
    extra = [names[k] for k in used if names[k] not in known]
    missing = [name for name in known if name not in names]
    found = [f"it has {extra} that data.train lacks"] if extra else []
    found += [f"it lacks {missing}"] if missing else []
    found = found or [f"it numbers its classes {names}, data.train {known}"]
    raise ValueError(
        f"{key} ({data.identity}) does not match the classes of data.train "
        f"({train.identity}): {'; '.join(found)}. Give every split the same class folders "
        "(an empty one is fine) with the same names."
    )


def _named(data: LabeledImages) -> bool:
    """Whether ``data`` has real class names, not the "0".."K-1" stand-ins."""
    return data.class_names != [str(k) for k in range(len(data.class_names))]
