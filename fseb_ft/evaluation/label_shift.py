"""What a labelled reference split says about an unlabelled batch: its accuracy (ATC) and its
class proportions under label shift (BBSE). Pure functions of arrays, for ``fseb-ft monitor``.

- **ATC**, average thresholded confidence (Garg et al., ICLR 2022): the threshold ``t`` on a
  confidence score such that the share of reference images above ``t`` equals the reference
  accuracy; the batch's estimated accuracy is its share above ``t``. It assumes the shift keeps
  the score's relation to correctness (it is exact when the shift changes how many images are
  hard, not what a confident error looks like), and it is an estimate with no test behind it.
- **BBSE**, black-box shift estimation (Lipton et al., ICML 2018): under label shift (p(x | y)
  fixed, p(y) changed) the batch's predicted-class proportions μ satisfy ``μ = C w`` with
  ``C[i, j] = P(ŷ = i, y = j)`` on the reference and ``w_j = q(y = j) / p(y = j)``. Solving it
  gives the batch's class proportions ``q_j ∝ w_j p_j`` and the re-weighted probabilities
  ``p(y | x) ∝ w_y p(y | x)``. C is singular when a class is never predicted or never present
  in the reference (or two classes are predicted alike): then the least-squares solution of
  smallest norm is taken and the estimate is marked not identifiable.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["LabelShift", "atc_estimate", "atc_threshold", "bbse", "reweight"]


def atc_threshold(confidence: np.ndarray, correct: np.ndarray) -> float:
    """The ATC threshold of reference ``confidence`` (n,) and ``correct`` (n,) bool: the
    (k + 1)-th largest confidence, k = round(accuracy · n), so that the k largest lie above it
    (ties aside); ``-inf`` when every image is correct."""
    conf = np.sort(np.asarray(confidence, dtype=np.float64))  # ascending
    above = round(float(np.mean(np.asarray(correct, dtype=bool))) * len(conf))
    return -np.inf if above >= len(conf) else float(conf[len(conf) - above - 1])


def atc_estimate(threshold: float, confidence: np.ndarray) -> float:
    """The estimated accuracy of a batch: the share of its ``confidence`` (n,) above
    ``threshold`` (:func:`atc_threshold`)."""
    return float(np.mean(np.asarray(confidence, dtype=np.float64) > threshold))


@dataclasses.dataclass(frozen=True)
class LabelShift:
    """BBSE's estimate of a batch's class proportions."""

    weights: np.ndarray
    """``w`` (K,): q(y) / p(y), clipped at 0."""
    proportions: np.ndarray
    """The batch's estimated class proportions q (K,), summing to 1."""
    reference: np.ndarray
    """The reference's class proportions p (K,)."""
    identifiable: bool
    """Whether C has full rank, so w is determined by the predicted proportions."""
    condition: float
    """C's condition number (``inf`` when singular): how much sampling noise in μ is amplified."""


def bbse(
    reference_predicted: np.ndarray,
    reference_labels: np.ndarray,
    batch_predicted: np.ndarray,
    num_classes: int,
) -> LabelShift:
    """BBSE from the reference's predicted classes and labels (n_ref,) and the batch's
    predicted classes (n,): solve ``C w = μ`` (least squares of smallest norm where C is
    singular), clip w at 0, ``q_j = w_j p_j`` normalised (p where every w is 0)."""
    k = int(num_classes)
    joint = np.zeros((k, k))
    np.add.at(joint, (np.asarray(reference_predicted), np.asarray(reference_labels)), 1.0)
    joint /= joint.sum()  # C[i, j] = P(ŷ = i, y = j)
    mu = np.bincount(np.asarray(batch_predicted), minlength=k)[:k] / len(batch_predicted)
    p = joint.sum(axis=0)  # P(y = j)
    rank = int(np.linalg.matrix_rank(joint))
    # A singular C: the least-squares solution of smallest norm.
    solved = np.linalg.solve(joint, mu) if rank == k else np.linalg.lstsq(joint, mu)[0]
    w = np.clip(solved, 0.0, None)
    q = w * p
    q = q / q.sum() if q.sum() > 0 else p.copy()
    return LabelShift(w, q, p, rank == k, float(np.linalg.cond(joint)) if rank == k else np.inf)


def reweight(probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``p(y | x) ∝ w_y p(y | x)`` of ``probs`` (n, K) under the label-shift ``weights`` (K,);
    a row every weight zeroes keeps its probabilities."""
    probs = np.asarray(probs, dtype=np.float64)
    scaled = probs * np.asarray(weights, dtype=np.float64)[None, :]
    total = scaled.sum(axis=1, keepdims=True)
    return np.where(total > 0, scaled / np.where(total > 0, total, 1.0), probs)
