"""ATC and BBSE on hand-worked cases: BBSE recovers known proportions exactly from a confusion
matrix of integer counts."""

from __future__ import annotations

import numpy as np
import pytest

from fseb_ft.evaluation.label_shift import atc_estimate, atc_threshold, bbse, reweight


def test_atc_threshold_leaves_the_validation_accuracy_above_it() -> None:
    confidence = np.arange(1, 11) / 10  # 0.1 … 1.0
    correct = np.array([0, 1, 0, 1, 1, 0, 1, 1, 1, 1], dtype=bool)  # accuracy 0.7
    t = atc_threshold(confidence, correct)
    assert t == pytest.approx(0.3)  # 0.4 … 1.0 above it: 7 of 10
    assert atc_estimate(t, np.array([0.25, 0.35, 0.5, 0.9])) == pytest.approx(0.75)
    assert atc_threshold(confidence, np.ones(10, bool)) == -np.inf
    assert atc_estimate(atc_threshold(confidence, np.zeros(10, bool)), confidence) == 0.0


def labels_and_predictions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Images with ``counts[i, j]`` predicted i of class j."""
    pairs = [(i, j) for i in range(len(counts)) for j in range(len(counts)) for _ in
             range(int(counts[i, j]))]  # fmt: skip
    predicted, labels = zip(*pairs, strict=True)
    return np.array(predicted), np.array(labels)


def test_bbse_recovers_the_proportions_of_a_batch_with_the_same_confusions() -> None:
    # Validation: 10, 20 and 10 images of the classes; column j is P(ŷ | y = j) times its count.
    val_counts = np.array([[7, 4, 1], [2, 12, 1], [1, 4, 8]])
    val_pred, val_labels = labels_and_predictions(val_counts)
    # A batch of 50, 30 and 20 images of the three classes confused exactly as validation does.
    batch_counts = (val_counts * np.array([5, 1.5, 2])[None, :]).astype(int)
    assert (batch_counts.sum(axis=0) == [50, 30, 20]).all()
    batch_pred, _ = labels_and_predictions(batch_counts)
    found = bbse(val_pred, val_labels, batch_pred, 3)
    assert found.identifiable and np.isfinite(found.condition)
    np.testing.assert_allclose(found.reference, [0.25, 0.5, 0.25], rtol=1e-12)
    np.testing.assert_allclose(found.weights, [2.0, 0.6, 0.8], rtol=1e-12)
    np.testing.assert_allclose(found.proportions, [0.5, 0.3, 0.2], rtol=1e-12)


def test_bbse_without_label_shift_gives_weights_one() -> None:
    val_pred, val_labels = labels_and_predictions(np.array([[8, 3], [2, 7]]))
    found = bbse(val_pred, val_labels, val_pred, 2)
    np.testing.assert_allclose(found.weights, [1.0, 1.0], rtol=1e-12)


def test_bbse_with_a_class_never_predicted_is_marked_not_identifiable() -> None:
    # Class 2 is never predicted: C's last row is zero.
    val_pred, val_labels = labels_and_predictions(np.array([[5, 1, 3], [1, 5, 3], [0, 0, 0]]))
    found = bbse(val_pred, val_labels, np.array([0, 0, 1, 0]), 3)
    assert not found.identifiable and found.condition == np.inf
    assert (found.weights >= 0).all() and found.proportions.sum() == pytest.approx(1.0)


def test_reweighting_multiplies_by_the_weights_and_normalises() -> None:
    probs = np.array([[0.5, 0.5], [0.2, 0.8]])
    np.testing.assert_allclose(
        reweight(probs, np.array([3.0, 1.0])), [[0.75, 0.25], [0.6 / 1.4, 0.8 / 1.4]]
    )
    np.testing.assert_allclose(reweight(probs, np.zeros(2)), probs)
