"""What a prediction writes (``fseb-ft predict``, :mod:`fseb_ft.prediction.pipeline`): one row
per image, as CSV or JSON Lines, and the meta record beside it (``<out stem>.meta.json``), both
written atomically.

A row holds the image, its label (datasets), the predicted class and probability, the top-class
log-odds the abstention threshold applies to, the ``abstain`` flag, the predictive entropy, an
OOD score (:mod:`fseb_ft.evaluation.ood`: of the outputs, or a feature score's values given) and
the top-k classes with their probabilities; with ``--conformal``, the conformal prediction
``set`` (a list in JSON Lines, its class names joined by ``|`` in CSV) and ``set_size``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fseb_ft.evaluation.metrics import predictive_entropy
from fseb_ft.evaluation.ood import ood_score
from fseb_ft.evaluation.selective import top_class_log_odds
from fseb_ft.recipe import ConfigError
from fseb_ft.runs.atomic import write_text
from fseb_ft.runs.rundir import check_output_dir, write_json

if TYPE_CHECKING:
    import pandas

__all__ = [
    "FORMATS",
    "ImagePredictions",
    "accuracy",
    "accuracy_record",
    "check_out_file",
    "format_rows",
    "image_rows",
    "meta_path",
    "output_format",
    "write_predictions",
]


@dataclasses.dataclass
class ImagePredictions:
    """What :func:`fseb_ft.prediction.pipeline.predict_images` returns: the rows written to
    ``out`` and the meta record."""

    rows: list[dict[str, Any]]
    """One mapping per readable image, in input order (the CSV / JSON Lines rows)."""
    meta: dict[str, Any]
    """Model, temperature, threshold with its validation coverage and risk, counts, files left
    out: what ``<out stem>.meta.json`` holds."""

    def __len__(self) -> int:
        """The number of rows: the images predicted."""
        return len(self.rows)

    def to_pandas(self) -> pandas.DataFrame:
        """The rows as a ``pandas.DataFrame``, one row per image, the columns of the CSV."""
        import pandas  # only for this call: it is not needed to predict

        return pandas.DataFrame(self.rows)


FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
"""The formats of the predictions file, by its extension."""


def image_rows(
    names: list[str],
    labels: list[str] | None,
    logits: Tensor,
    temperature: float | None,
    log_odds_threshold: float,
    ood: str,
    class_names: list[str],
    top_k: int,
    feature_scores: Tensor | None = None,
) -> list[dict[str, Any]]:
    """One row per image of ``logits`` ``(M, K)`` (named ``names``, labelled ``labels``): the
    temperature-scaled prediction, abstaining below ``log_odds_threshold``; the OOD score
    ``ood``, a feature score's ``(M,)`` values being ``feature_scores``."""
    z = logits.double() / (temperature or 1.0)  # (M, K) temperature-scaled logits
    probs = torch.softmax(z, dim=-1)  # (M, K)
    log_odds = top_class_log_odds(z)  # (M,) the confidence τ applies to, never rounded to 1
    abstain = log_odds < log_odds_threshold  # (M,)
    given = None if feature_scores is None else {ood: feature_scores}
    columns = {
        "entropy": predictive_entropy(probs),  # (M,)
        f"ood_{ood}": ood_score(ood, probs, z, given),  # (M,)
    }
    k = min(top_k, probs.shape[1])
    top_p, top_i = probs.topk(k, dim=-1)  # (M, k) each
    rows = []
    for i, name in enumerate(names):
        row: dict[str, Any] = {"image": name}
        if labels is not None:
            row["label"] = labels[i]
        row |= {
            "prediction": class_names[int(top_i[i, 0])],
            "probability": float(top_p[i, 0]),
            "log_odds": float(log_odds[i]),
            "abstain": bool(abstain[i]),
            **{key: float(values[i]) + 0.0 for key, values in columns.items()},  # no -0.0
        }
        for j in range(k):
            row[f"top{j + 1}"] = class_names[int(top_i[i, j])]
            row[f"top{j + 1}_probability"] = float(top_p[i, j])
        rows.append(row)
    return rows


def accuracy(rows: list[dict[str, Any]]) -> float | None:
    """The fraction of labelled ``rows`` predicted right; ``None`` without rows."""
    return sum(r["prediction"] == r["label"] for r in rows) / len(rows) if rows else None


def accuracy_record(rows: list[dict[str, Any]], class_names: Sequence[str]) -> dict[str, Any]:
    """The meta record's accuracies of labelled ``rows``, on all and on the accepted ones, over
    the rows whose label is one of the model's ``class_names``: an image of a class the model
    does not know cannot be predicted right, so counting it would measure the dataset, not the
    model. ``unknown_labels``: how many rows were left out, and their labels."""
    known = set(class_names)
    scored = [r for r in rows if r["label"] in known]
    return {
        "accuracy_accepted": accuracy([r for r in scored if not r["abstain"]]),
        "accuracy_all": accuracy(scored),
        "unknown_labels": {
            "images": len(rows) - len(scored),
            "labels": sorted({r["label"] for r in rows if r["label"] not in known}),
        },
    }


def check_out_file(out: str | Path | None) -> None:
    """Refuse an ``--out`` that is a folder, or whose folder cannot be written to, before any
    image is read (an existing file is replaced: it is a file of predictions).

    Raises:
        ConfigError: naming ``--out`` and why.
    """
    if out is None:
        return
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder: give a file (.csv or .jsonl) to write")
    check_output_dir(out.parent, f"--out {out}: its folder")


def output_format(out: str | Path | None, fmt: str | None) -> str:
    """``fmt`` (``csv`` or ``jsonl``), or the format :data:`FORMATS` gives ``out``'s extension;
    ``csv`` without either."""
    if fmt is not None:
        if fmt not in ("csv", "jsonl"):
            raise ValueError(f"format must be csv or jsonl, got {fmt!r}")
        return fmt
    if out is None:
        return "csv"
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"cannot tell the format of --out {out} from its extension: use .csv or .jsonl, "
            "or give --format"
        )
    return FORMATS[suffix]


def meta_path(out: str | Path) -> Path:
    """The meta file beside ``out``: ``predictions.csv`` → ``predictions.meta.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.meta.json")


def format_rows(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows as CSV (with a header) or JSON Lines text."""
    if fmt != "csv":
        # Names and labels as written (UTF-8 files), not \u escapes.
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    # A list (a conformal set) is one CSV cell: its items joined by "|".
    writer.writerows(
        {key: "|".join(value) if isinstance(value, list) else value for key, value in row.items()}
        for row in rows
    )
    return buffer.getvalue()


def write_predictions(
    out: Path, fmt: str, rows: list[dict[str, Any]], meta: Mapping[str, Any]
) -> None:
    """Write the rows to ``out`` and ``meta`` (with the file and its format) beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, format_rows(rows, fmt))
    write_json(meta_path(out), {**meta, "predictions": str(out), "format": fmt})
