"""Per-group results (``eval.group_by``): every in-distribution metric of the reported split on
each group of its images that shares a metadata value (a hospital, a camera).

:func:`group_metrics` is pure maths over (log-probabilities, labels, group values); the group
values of a split's images come from :func:`reported_groups`, which reads the images'
``metadata`` (:class:`~fseb_ft.data.images.LabeledImages`) and stops with one line when the
column is not there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.splits import TEST_SPLIT, VALIDATION_SPLIT, Splits
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.metric_registry import bundle
from fseb_ft.evaluation.metrics import METRIC_REGISTRY, metric_inputs

__all__ = ["GroupColumnError", "Groups", "group_metrics", "reported_groups"]


class GroupColumnError(FsebError, ValueError):
    """``eval.group_by`` names a column the reported split's images do not carry."""


@dataclass(frozen=True)
class Groups:
    """The value of one metadata column for every image of the reported split."""

    column: str
    """The column (``eval.group_by``)."""
    values: np.ndarray
    """(N,) the column's value per image, as strings, in the split's order (that of its
    predictions)."""


def reported_groups(splits: Splits, column: str | None) -> Groups | None:
    """The ``column`` values of the split the results are on (the test split, the validation
    split without one); ``None`` when ``column`` is.

    Raises:
        GroupColumnError: its images carry no such column (a source that keeps no metadata, an
            in-memory dataset without it).
    """
    if column is None:
        return None
    split, images = (
        (TEST_SPLIT, splits.test) if splits.test is not None else (VALIDATION_SPLIT, splits.val)
    )
    return split_groups(images, column, split)


def split_groups(images: LabeledImages, column: str, split: str) -> Groups:
    """``column``'s value of every image of ``images`` (the ``split`` split)."""
    if column not in images.metadata:
        raise GroupColumnError(
            f"eval.group_by={column!r}: the {split} split's images ({images.identity}) carry no "
            f"such column; they have {sorted(images.metadata)} (a csv source's "
            "metadata_columns)"
        )
    return Groups(column, np.asarray(images.metadata[column]).astype(str))


def group_metrics(
    log_probs: Tensor,
    labels: Tensor,
    groups: np.ndarray | Sequence[str],
    names: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every metric of the registry on each group's images, as the whole split's are computed.

    Args:
        log_probs: ``(N, K)`` natural-log class probabilities.
        labels: ``(N,)`` integer labels in ``[0, K)``.
        groups: ``(N,)`` the group of each sample (any values; their strings name the groups).
        names: the registered metrics to compute (those of the whole split's results);
            ``None``: the standard ones, those every run reports for ``K`` classes (no task
            metric).

    Returns:
        Group → ``{"n": size, "classes": number of classes present, metric: float or None, …,
        "undefined": {metric: reason}}``, groups sorted by name. A metric a group cannot define
        (NaN, or an error for its inputs, e.g. AUROC where one class is present) is ``None``
        with its reason; ``undefined`` is there only when some metric is.
    """
    values = np.asarray(groups).astype(str)  # (N,)
    if values.shape != (len(labels),):
        raise ValueError(
            f"`groups` must have one value per sample, shape ({len(labels)},); got {values.shape}"
        )
    k = log_probs.shape[1]
    if names is None:
        chosen = bundle(k)
    else:
        chosen = [m for m in METRIC_REGISTRY.values() if m.applies_to(k) and m.name in names]
    out: dict[str, dict[str, Any]] = {}
    for group in sorted(set(values.tolist())):
        mask = torch.as_tensor(values == group, device=log_probs.device)  # (N,)
        out[group] = _one_group(log_probs[mask], labels[mask.to(labels.device)], chosen)
    return out


def _one_group(log_probs: Tensor, labels: Tensor, chosen: Sequence[Any]) -> dict[str, Any]:
    """The metrics of one group's samples; undefined ones ``None``, with their reasons."""
    n, present = len(labels), len(torch.unique(labels))
    record: dict[str, Any] = {"n": n, "classes": present}
    undefined: dict[str, str] = {}
    inputs = metric_inputs(log_probs, labels)
    for m in chosen:
        try:
            value = m.compute(inputs)
        except ValueError as err:  # the metric's own check: say why
            record[m.name], undefined[m.name] = None, str(err)
            continue
        number = float(value) if value.numel() == 1 else value.tolist()
        if isinstance(number, float) and math.isnan(number):
            record[m.name] = None
            undefined[m.name] = f"undefined on {n} image(s) of {present} class(es)"
        else:
            record[m.name] = number
    if undefined:
        record["undefined"] = undefined
    return record
