"""Hold-outs from one labelled set: the test and validation parts a recipe takes from its
training images (``data.test_fraction``, ``data.val_fraction``), and what ``run.json`` records
of every split.

The test part is taken first and the validation part from the rest, so a validation split
given later (or another ``val_fraction``) leaves the test part as it was. Without groups each
hold-out is :func:`~fseb_ft.data.splits.stratified_split`'s, the validation one exactly as
before test hold-outs existed. With groups (a patient per image) each takes whole groups,
through scikit-learn's ``StratifiedGroupKFold`` (:func:`group_split`): no group is on two sides.
These functions take arrays and plain values; the recipe is read by
:func:`fseb_ft.data.sources.hold_outs`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from fseb_ft.data.images import LabeledImages, content_hash
from fseb_ft.data.splits import Splits, stratified_split
from fseb_ft.errors import FsebError

__all__ = ["HoldOut", "HoldOutError", "group_split", "hold_out", "split_records"]

logger = logging.getLogger(__name__)

FAR = 0.25
"""A whole-group hold-out whose share of the images is off its fraction by more than this share
of the fraction (20 % asked, under 15 % or over 25 % held) is warned about."""
MAX_FOLDS = 20
"""The most folds :func:`group_split` cuts: held shares come in steps of at least 1/20."""
_TEST_STREAM = 1
"""The test hold-out's random stream, apart from the validation one's (stream 0, or the seed
itself without groups, as before test hold-outs existed)."""


class HoldOutError(FsebError, ValueError):
    """A hold-out cannot be taken: too few images or groups for its fraction."""


@dataclass(frozen=True)
class HoldOut:
    """Indices (sorted, disjoint, covering every sample) of the parts of one labelled set."""

    train: np.ndarray
    """What is left to train on, (N_train,)."""
    val: np.ndarray | None
    """The validation hold-out, (N_val,); ``None`` when none was asked for."""
    test: np.ndarray | None
    """The test hold-out, (N_test,); ``None`` when none was asked for."""


def hold_out(
    labels: np.ndarray,
    groups: np.ndarray | None,
    val_fraction: float | None,
    test_fraction: float | None,
    seed: int,
) -> HoldOut:
    """Hold out ``test_fraction`` of the samples, then ``val_fraction`` (both shares of all of
    them) from the rest; ``None`` skips one. Stratified by ``labels``, seeded by ``seed``; with
    ``groups`` (N,), whole groups only.

    Raises:
        HoldOutError: a part would be empty, or there are too few groups; the message names
            ``data.test_fraction`` or ``data.val_fraction``.
    """
    labels = np.asarray(labels)  # (N,)
    rest, test = np.arange(len(labels)), None  # (N,)
    if test_fraction is not None:
        keep, held = _split(labels, groups, test_fraction, _stream(seed), "data.test_fraction")
        rest, test = keep, held
    val = None
    if val_fraction is not None:
        fraction = val_fraction
        if test is not None:  # a share of all the samples, taken from fewer
            fraction = val_fraction * len(labels) / len(rest)
        if fraction >= 1:
            raise HoldOutError(
                f"data.val_fraction={val_fraction}: the test hold-out left {len(rest)} of "
                f"{len(labels)} images, too few to hold out a validation share of all of them "
                "and still train; lower data.val_fraction or data.test_fraction"
            )
        sub_groups = None if groups is None else np.asarray(groups)[rest]
        # Without groups and without a test hold-out this is the split runs always made.
        val_seed = seed if groups is None else _stream(seed, 0)
        keep, held = _split(labels[rest], sub_groups, fraction, val_seed, "data.val_fraction")
        rest, val = rest[keep], rest[held]
    if groups is not None:
        _warn_if_far("data.test_fraction", test_fraction, test, groups)
        _warn_if_far("data.val_fraction", val_fraction, val, groups)
    return HoldOut(train=rest, val=val, test=test)


def _warn_if_far(
    key: str, fraction: float | None, held: np.ndarray | None, groups: np.ndarray
) -> None:
    """Log a warning when the whole groups ``held`` (indices) are a share of all the images
    ``groups`` labels far (:data:`FAR`) from the ``fraction`` asked for: groups of very unequal
    sizes, or too few of them, cannot be cut at any share."""
    if fraction is None or held is None:
        return
    share = len(held) / len(groups)
    if abs(share - fraction) <= FAR * fraction:
        return
    logger.warning(
        "%s=%g: the hold-out of whole groups (group_column) holds %d of %d images (%.1f %%, "
        "%d of %d groups), far from the %.1f %% asked: the groups are few or of unequal sizes; "
        "more groups or another fraction come closer",
        key, fraction, len(held), len(groups), 100 * share,
        len(np.unique(groups[held])), len(np.unique(groups)), 100 * fraction,
    )  # fmt: skip


def group_split(
    labels: np.ndarray, groups: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split of whole groups into (kept indices, held indices), both sorted.

    ``StratifiedGroupKFold`` (shuffled with ``seed``) cuts K folds of whole groups with class
    proportions as alike as the groups allow and sizes in images as even; ``m`` of them are
    held, ``m / K`` the nearest to ``fraction`` for K no larger than :data:`MAX_FOLDS`, the
    number of groups or the largest class's image count (the fewest K wins a tie). One fold
    of ``round(1 / fraction)`` could not hold 15 % or 30 %; ``GroupShuffleSplit`` holds a
    share of the groups, not of the images, and does not stratify.

    Raises:
        ValueError: fewer than 2 groups, or a part would be empty.
    """
    labels, groups = np.asarray(labels), np.asarray(groups)  # (N,), (N,)
    n_groups = len(np.unique(groups))
    limit = min(n_groups, int(np.bincount(np.unique(labels, return_inverse=True)[1]).max()))
    if limit < 2:
        raise ValueError(
            f"{len(labels)} images in {n_groups} group(s) (group_column) cannot be split into "
            "two parts of whole groups: a hold-out needs at least 2 groups, and a class with "
            "at least 2 images"
        )
    k, m = _folds(fraction, min(limit, MAX_FOLDS))
    from sklearn.model_selection import StratifiedGroupKFold  # 2 s to import: only when grouped

    folds = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        # A class rarer than K images is simply absent from some folds.
        warnings.filterwarnings("ignore", "The least populated class", UserWarning)
        tests = [test for _, test in folds.split(np.zeros(len(labels)), labels, groups)]
    held = np.sort(np.concatenate(tests[:m])).astype(np.int64)  # (H,)
    keep = np.setdiff1d(np.arange(len(labels)), held)  # (N - H,)
    if len(held) == 0 or len(keep) == 0:
        raise ValueError(
            f"a share {fraction} of {len(labels)} images in {n_groups} groups leaves one part "
            "empty; give more groups or another fraction"
        )
    return keep, held


def split_records(splits: Splits, built: Splits) -> dict[str, Any]:
    """What ``run.json`` records of the train, validation and test splits (``None``: no test):
    ``size`` and ``groups`` (the number of distinct groups, when the images have groups) of the
    screened ``splits`` trained and reported on, and ``fingerprint`` (16 hex digits of the
    identity of the split as ``built``, before the screen: its source's content fingerprint and
    hold-out indices). The fingerprint names the hold-out, so it is the same with or without
    ``data.cache`` or images ``data.bad_images: skip`` left out; ``size`` shows the latter."""
    records: dict[str, Any] = {}
    for name, key in (("train", "train"), ("validation", "val"), ("test", "test")):
        data, source = getattr(splits, key), getattr(built, key)
        records[name] = None if data is None else _record(data, source)
    return records


def _record(data: LabeledImages, built: LabeledImages) -> dict[str, Any]:
    """``size``, ``groups`` (when known) of the screened split ``data`` and ``fingerprint`` of
    the split as ``built``."""
    record: dict[str, Any] = {"size": len(data)}
    if data.groups is not None:
        record["groups"] = len(np.unique(data.groups))
    record["fingerprint"] = content_hash(np.frombuffer(built.identity.encode(), dtype=np.uint8))
    return record


def _split(
    labels: np.ndarray, groups: np.ndarray | None, fraction: float, seed: int, key: str
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held) indices of one hold-out; an impossible one is a :class:`HoldOutError`
    naming ``key``."""
    try:
        if groups is None:
            return stratified_split(labels, fraction, seed)
        return group_split(labels, groups, fraction, seed)
    except ValueError as err:
        raise HoldOutError(f"{key}={fraction:.4g}: {err}") from err


def _folds(fraction: float, most: int) -> tuple[int, int]:
    """(K folds, m held) with ``m / K`` nearest to ``fraction``, 2 ≤ K ≤ ``most``, 1 ≤ m < K."""
    best = []
    for k in range(2, most + 1):
        m = min(max(round(fraction * k), 1), k - 1)
        best.append((abs(m / k - fraction), k, m))
    _, k, m = min(best)
    return k, m


def _stream(seed: int, stream: int = _TEST_STREAM) -> int:
    """A seed of its own for one hold-out, derived from ``seed`` (``train.seed``)."""
    return int(np.random.SeedSequence((seed, stream)).generate_state(1)[0])
