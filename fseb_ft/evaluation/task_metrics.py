"""Task metrics, computed with scikit-learn: the numbers a task is judged by (APTOS' quadratic
weighted kappa, melanoma's AUROC and sensitivity at a fixed specificity, Cassava's macro-F1).

Each is registered with ``@metric(..., task=True)``: a bundle
(:func:`fseb_ft.evaluation.metrics.classification_metrics`) computes it only when it is asked for
by name, as a recipe's ``eval.metrics`` or ``train.select_metric`` does. Definitions
(docs/method.md, "Task metrics"):

- The predicted class is the arg-max of the probabilities, ties to the lowest index (as for
  accuracy); ``qwk``, ``balanced_accuracy``, ``macro_f1`` and ``per_class_recall`` read it.
- A binary task's (K = 2) ranking metrics score each image by the log-probability of label 1,
  the positive class (the same ranking as its probability, with underflowed ones kept apart).
- Undefined is NaN, never an exception or a warning: ``roc_auc`` and ``average_precision``
  when some class of the task has no label, the sensitivities when a binary task's labels hold
  one class, ``qwk`` when the labels and predictions share fewer than two classes, a class's
  ``per_class_recall`` when it has no label.

scikit-learn is imported when a task metric is computed, not with this module: importing it
takes about a second, and most runs ask for no task metric.

Every function here is pure: tensors in, a float64 tensor on the inputs' device out.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fseb_ft.evaluation.checks import check_float_vector, check_labels, to_float64
from fseb_ft.evaluation.metric_registry import MetricInputs, metric

__all__ = ["sensitivity_at_specificity"]


def _binary(k: int) -> bool:
    return k == 2


@contextmanager
def _undefined_as_nan() -> Iterator[None]:
    """Without scikit-learn's warnings for what these metrics define as NaN or leave out (a
    class without labels or predictions): a validation split warns every epoch otherwise."""
    from sklearn.exceptions import UndefinedMetricWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        warnings.filterwarnings("ignore", "y_pred contains classes not in y_true", UserWarning)
        # One class in both (a group of eval.group_by): the mean recall is that class's recall.
        warnings.filterwarnings("ignore", "A single label was found", UserWarning)
        yield


def _value(x: MetricInputs, value: Any) -> Tensor:
    """A scikit-learn result as a float64 tensor on the inputs' device."""
    return torch.as_tensor(np.asarray(value, dtype=np.float64), device=x.probs.device)


def _labels_and_predictions(x: MetricInputs) -> tuple[np.ndarray, np.ndarray]:
    """``(labels (N,), arg-max classes (N,))`` as int64 numpy arrays."""
    return x.labels.cpu().numpy(), x.probs.argmax(dim=-1).cpu().numpy()


def _positive_scores(x: MetricInputs) -> Tensor:
    """``(N,)`` float64 log-probabilities of label 1 (a binary task's scores)."""
    return to_float64(x.log_probs[:, 1])


def _finite(scores: Tensor) -> np.ndarray:
    """``scores`` as a float64 numpy array, ``-inf`` (p = 0) as the lowest float: the same
    ranking, which scikit-learn accepts (it refuses infinities)."""
    return torch.nan_to_num(to_float64(scores), neginf=torch.finfo(torch.float64).min).cpu().numpy()


def _every_class_labelled(x: MetricInputs) -> bool:
    """Whether each of the K classes has at least one label (one-vs-rest needs both sides)."""
    return int(torch.unique(x.labels).numel()) == x.num_classes


def _nan(x: MetricInputs) -> Tensor:
    return torch.tensor(math.nan, dtype=torch.float64, device=x.probs.device)


@metric("qwk", title="QWK", higher_is_better=True, task=True)
def _qwk(x: MetricInputs) -> Tensor:
    """Quadratic weighted Cohen's kappa of the predicted classes against the labels, the class
    indices as the grades (``cohen_kappa_score(weights="quadratic", labels=range(K))``)."""
    from sklearn.metrics import cohen_kappa_score

    labels, predicted = _labels_and_predictions(x)
    with _undefined_as_nan():
        kappa = cohen_kappa_score(
            labels, predicted, weights="quadratic", labels=np.arange(x.num_classes)
        )
    return _value(x, kappa)


@metric("balanced_accuracy", title="Bal. acc. (%)", scale=100.0, higher_is_better=True, task=True)
def _balanced_accuracy(x: MetricInputs) -> Tensor:
    """The mean recall over the classes that have labels (``balanced_accuracy_score``)."""
    from sklearn.metrics import balanced_accuracy_score

    labels, predicted = _labels_and_predictions(x)
    with _undefined_as_nan():
        return _value(x, balanced_accuracy_score(labels, predicted))


@metric("macro_f1", title="Macro-F1 (%)", scale=100.0, higher_is_better=True, task=True)
def _macro_f1(x: MetricInputs) -> Tensor:
    """The mean F1 over the classes found in the labels or the predictions, a class never
    predicted scoring 0 (``f1_score(average="macro", zero_division=0)``)."""
    from sklearn.metrics import f1_score

    labels, predicted = _labels_and_predictions(x)
    with _undefined_as_nan():
        return _value(x, f1_score(labels, predicted, average="macro", zero_division=0.0))


@metric("roc_auc", title="ROC-AUC (%)", scale=100.0, higher_is_better=True, task=True)
def _roc_auc(x: MetricInputs) -> Tensor:
    """``roc_auc_score``: of label 1's score for K = 2 (``auroc_positive``'s number), the macro
    mean of the one-vs-rest AUROCs of the probabilities for K > 2."""
    from sklearn.metrics import roc_auc_score

    if not _every_class_labelled(x):
        return _nan(x)
    labels = x.labels.cpu().numpy()
    if x.num_classes == 2:
        return _value(x, roc_auc_score(labels, _finite(_positive_scores(x))))
    probs = x.probs.cpu().numpy()
    return _value(x, roc_auc_score(labels, probs, multi_class="ovr", average="macro"))


@metric("average_precision", title="AP (%)", scale=100.0, higher_is_better=True, task=True)
def _average_precision(x: MetricInputs) -> Tensor:
    """``average_precision_score``: of label 1's score for K = 2, the macro mean of the
    one-vs-rest average precisions of the probabilities for K > 2."""
    from sklearn.metrics import average_precision_score

    if not _every_class_labelled(x):
        return _nan(x)
    labels = x.labels.cpu().numpy()
    if x.num_classes == 2:
        return _value(x, average_precision_score(labels, _finite(_positive_scores(x))))
    return _value(x, average_precision_score(labels, x.probs.cpu().numpy(), average="macro"))


def sensitivity_at_specificity(scores: Tensor, labels: Tensor, percent: int) -> Tensor:
    """The largest sensitivity (true-positive rate) at a threshold whose specificity is at least
    ``percent`` %, on scikit-learn's ROC curve (``roc_curve(drop_intermediate=False)``).

    Convention: an image is called positive when its score is ≥ the threshold, and the
    thresholds are the distinct scores (and +∞, which calls none positive: sensitivity 0 at
    specificity 1). Tied scores are therefore called together: a negative tied with positives
    is called with them, so its false positive counts at every threshold that calls them. No
    interpolation between the curve's points. Specificity is compared exactly, in counts:
    ``100 · TN ≥ percent · N_neg``.

    Args:
        scores: ``(N,)`` floating scores, larger = more likely positive (``-inf`` ranks lowest).
        labels: ``(N,)`` integer labels, 1 positive and 0 negative.
        percent: the specificity to reach, in percent (e.g. 95).

    Returns:
        0-dim float64 tensor in ``[0, 1]`` on the device of ``scores``; NaN when ``labels``
        hold one class.
    """
    from sklearn.metrics import roc_curve

    scores = check_float_vector(scores, "scores")
    labels = check_labels(labels, scores.shape[0], 2)
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 < percent <= 100:
        raise ValueError(f"`percent` must be an int in (0, 100], got {percent!r}")
    device = scores.device
    n_pos = int(labels.sum())
    n_neg = labels.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return torch.tensor(math.nan, dtype=torch.float64, device=device)
    fpr, tpr, _ = roc_curve(
        labels.cpu().numpy(), _finite(scores), drop_intermediate=False
    )  # (T,) each, from +∞ down
    false_positives = np.rint(fpr * n_neg)  # (T,) the counts behind fpr = FP / N_neg
    specific = 100 * (n_neg - false_positives) >= percent * n_neg  # (T,)
    return torch.tensor(float(tpr[specific].max()), dtype=torch.float64, device=device)


@metric(
    "sensitivity_at_90_specificity",
    title="Sens. @90% spec. (%)",
    scale=100.0,
    higher_is_better=True,
    applies=_binary,
    task=True,
)
def _sensitivity_at_90_specificity(x: MetricInputs) -> Tensor:
    """:func:`sensitivity_at_specificity` of label 1's score at 90 % specificity."""
    return sensitivity_at_specificity(_positive_scores(x), x.labels, 90)


@metric(
    "sensitivity_at_95_specificity",
    title="Sens. @95% spec. (%)",
    scale=100.0,
    higher_is_better=True,
    applies=_binary,
    task=True,
)
def _sensitivity_at_95_specificity(x: MetricInputs) -> Tensor:
    """:func:`sensitivity_at_specificity` of label 1's score at 95 % specificity."""
    return sensitivity_at_specificity(_positive_scores(x), x.labels, 95)


@metric(
    "per_class_recall",
    title="Recall (%)",
    scale=100.0,
    higher_is_better=True,
    task=True,
    per_class=True,
)
def _per_class_recall(x: MetricInputs) -> Tensor:
    """``(K,)``: each class's recall, the fraction of its images predicted as it; NaN for a
    class without labels (``recall_score(average=None, labels=range(K))``)."""
    from sklearn.metrics import recall_score

    labels, predicted = _labels_and_predictions(x)
    with _undefined_as_nan():
        recall = recall_score(
            labels,
            predicted,
            labels=np.arange(x.num_classes),
            average=None,
            zero_division=np.nan,
        )
    return _value(x, recall)
