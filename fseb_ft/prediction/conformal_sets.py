"""Conformal prediction sets for ``fseb-ft predict --conformal``: calibrated on a run's
validation split, from the validation logits the threshold is chosen on (cached with the run,
and fetched once per call: :func:`~fseb_ft.prediction.validation.validation_fetch`) at the
temperature the rows use; each row's set and its size; what the meta file and the summary say
of them.

The sets are deterministic (APS and RAPS without randomisation, RAPS with ``λ = 0.01`` and
``k_reg = 1``): the same images give the same sets every time. The maths and the guarantee are
:mod:`fseb_ft.evaluation.conformal`'s; on a run the guarantee is approximate
(:func:`calibrate_on_run`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import out_of_range
from fseb_ft.evaluation.conformal import (
    CONFORMAL_METHODS,
    ConformalCalibration,
    calibrate,
    prediction_sets,
)
from fseb_ft.prediction.loading import LoadedModel

__all__ = [
    "add_conformal_arguments",
    "add_set_columns",
    "calibrate_on_run",
    "check_conformal",
    "conformal_lines",
    "conformal_record",
]


def add_conformal_arguments(
    parser: argparse.ArgumentParser, coverage: Callable[[str], float]
) -> None:
    """``--conformal`` (parsed by ``coverage``), ``--conformal-method`` and
    ``--class-conditional``: the predict command's options of the sets."""
    parser.add_argument(
        "--conformal", type=coverage, metavar="P",
        help="add each image's conformal prediction set, covering the true class with "
        "probability ≥ P over images like the run's validation split (approximately: that "
        "split also chose the run's best epoch)",
    )  # fmt: skip
    parser.add_argument(
        "--conformal-method", choices=CONFORMAL_METHODS, default="lac",
        help="the sets' score: lac (1 − p_y, smallest sets), aps or raps (default: lac)",
    )  # fmt: skip
    parser.add_argument(
        "--class-conditional", action="store_true",
        help="one quantile per class: the coverage holds for each class, rare ones too",
    )  # fmt: skip


def check_conformal(conformal: float | None, method: str) -> None:
    """Refuse a conformal coverage or method the sets cannot use.

    Raises:
        ValueError: naming the argument and what it takes.
    """
    if conformal is not None and (problem := out_of_range("coverage", conformal)) is not None:
        raise ValueError(f"conformal {problem}")
    if method not in CONFORMAL_METHODS:
        raise ValueError(
            f"conformal_method must be one of {list(CONFORMAL_METHODS)}, got {method!r}"
        )


def calibrate_on_run(
    loaded: LoadedModel,
    temperature: float | None,
    coverage: float,
    method: str,
    class_conditional: bool,
    validation: Callable[[], tuple[Tensor, Tensor]],
) -> ConformalCalibration:
    """The conformal calibration on ``loaded``'s validation split for target ``coverage``, of
    the logits and labels ``validation`` gives (:func:`~fseb_ft.prediction.validation.
    validation_fetch`: the same the threshold was chosen on, predicted at most once).

    The guarantee needs calibration images that served for nothing else; a run's validation
    split chose its best epoch (and fitted its temperature, with temperature scaling), so on a
    run the coverage is approximate, as the certified abstention's guarantee is.

    Raises:
        FsebError: ``loaded`` is a model folder or a Hub model, which has no validation split.
    """
    if loaded.run_dir is None:
        raise FsebError(
            f"--conformal calibrates on a run's validation split, and {loaded.where} has none: "
            "predict with the run folder"
        )
    logits, labels = validation()  # (N_v, K), (N_v,)
    return calibrate(_probs(logits, temperature), labels, coverage, method, class_conditional)


def add_set_columns(
    rows: list[dict[str, Any]],
    logits: Tensor,
    temperature: float | None,
    calibration: ConformalCalibration,
    class_names: list[str],
) -> None:
    """Add ``set`` (the class names in the set, by decreasing probability) and ``set_size`` to
    each row of ``rows``, whose logits are ``logits`` ``(M, K)``."""
    probs = _probs(logits, temperature)  # (M, K)
    sets = prediction_sets(probs, calibration)  # (M, K) bool
    order = probs.argsort(dim=-1, descending=True, stable=True)  # (M, K)
    for row, members, ranked in zip(rows, sets.tolist(), order.tolist(), strict=True):
        row["set"] = [class_names[k] for k in ranked if members[k]]
        row["set_size"] = len(row["set"])


def conformal_record(
    calibration: ConformalCalibration, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """What the meta file records: the method, the target coverage, the validation images, the
    quantile(s) (``null``: every class), the mean set size and, when the rows are labelled,
    the empirical coverage."""
    record: dict[str, Any] = {
        "method": calibration.method,
        "target_coverage": calibration.coverage,
        "class_conditional": calibration.class_conditional,
        "randomized": calibration.randomized,
        "validation_images": calibration.n,
        "quantiles": [None if math.isinf(q) else q for q in calibration.quantiles.tolist()],
        "mean_set_size": sum(r["set_size"] for r in rows) / len(rows),
        "empty_sets": sum(r["set_size"] == 0 for r in rows),
    }
    if rows and "label" in rows[0]:
        record["empirical_coverage"] = sum(r["label"] in r["set"] for r in rows) / len(rows)
    return record


def conformal_lines(meta: Mapping[str, Any]) -> list[str]:
    """The summary's lines on the sets; none without them."""
    record = meta.get("conformal")
    if record is None:
        return []
    scope = "for each class" if record["class_conditional"] else "marginal"
    lines = [
        f"conformal sets: {record['method'].upper()}, target coverage "
        f"{record['target_coverage']:g} ({scope}, over images exchangeable with the "
        f"{record['validation_images']} validation images it was calibrated on; approximate, "
        f"as they also chose the run's best epoch); mean set size "
        f"{record['mean_set_size']:.3f}, {record['empty_sets']} empty"
    ]
    if "empirical_coverage" in record:
        lines.append(
            f"conformal coverage on the labelled dataset: {record['empirical_coverage']:.4f}"
        )
    return lines


def _probs(logits: Tensor, temperature: float | None) -> Tensor:
    """``softmax(logits / T)`` in float64, as the rows compute it."""
    return torch.softmax(logits.double() / (temperature or 1.0), dim=-1)
