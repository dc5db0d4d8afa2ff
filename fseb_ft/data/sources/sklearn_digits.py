"""Source ``sklearn_digits``: scikit-learn's 8×8 digits, bundled with it (no download)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fseb_ft.data.images import ArrayImages, IndexedImages, LabeledImages
from fseb_ft.data.sources.registry import source
from fseb_ft.data.splits import stratified_split
from fseb_ft.recipe import DatasetSpec

__all__ = ["DIGITS_TEST_FRACTION", "load_sklearn_digits"]

DIGITS_TEST_FRACTION = 0.3
"""scikit-learn's digits have no test split: a fixed stratified 30 % (seed 0) is ``test``."""


def load_sklearn_digits(
    classes: Sequence[int | str] | None = None, channels: int = 3
) -> ArrayImages:
    """scikit-learn's 8x8 digits (1,797 images), scaled from 0..16 to uint8 0..255.

    ``classes`` keeps only those digits (ints, or their names ``"0"``..``"9"``) and relabels them
    0..len(classes)-1 in the given order, e.g. ``[0, 1, 2, 3, 4]`` in-distribution and
    ``[5, 6, 7, 8, 9]`` as an OOD set.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    labels = digits.target.astype(np.int64)  # (1797,)
    if classes is None:
        return ArrayImages(
            images, labels, [str(d) for d in range(10)], "sklearn.load_digits", channels
        )
    wanted = [int(c) for c in classes]
    if not wanted or len(set(wanted)) != len(wanted) or not set(wanted) <= set(range(10)):
        raise ValueError(f"classes must be distinct digits in 0..9, got {wanted}")
    keep = np.isin(labels, wanted)  # (1797,)
    remap = np.full(10, -1, dtype=np.int64)
    remap[wanted] = np.arange(len(wanted))
    identity = f"sklearn.load_digits[{','.join(map(str, wanted))}]"
    return ArrayImages(
        images[keep], remap[labels[keep]], [str(c) for c in wanted], identity, channels
    )


@source("sklearn_digits", selects_classes=True)
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> LabeledImages:
    """Split ``train``, ``test`` (a fixed stratified share, the same for every run) or ``all``."""
    if spec.split not in ("train", "test", "all"):
        raise ValueError(
            f"split={spec.split!r} for sklearn_digits: allowed are 'train', 'test' (a fixed "
            f"stratified {DIGITS_TEST_FRACTION:.0%}) and 'all'"
        )
    data = load_sklearn_digits(spec.classes, channels)
    if spec.split == "all":
        return data
    train_idx, test_idx = stratified_split(data.labels, DIGITS_TEST_FRACTION, seed=0)
    return IndexedImages(data, train_idx if spec.split == "train" else test_idx)
