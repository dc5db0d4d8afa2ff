"""Predicting new images with abstention, phase by phase: the model and its inputs, the abstention
rule, the passes giving the logits (and penultimate features), the rows (with conformal sets),
keeping the rule with the run, and the files. :func:`predict_images` is ``fseb_ft.predict_images``
and what ``fseb-ft predict`` (:mod:`fseb_ft.predict`) runs; the request it takes is
:mod:`fseb_ft.prediction.requests`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.evaluation.conformal import ConformalCalibration
from fseb_ft.evaluation.feature_ood import FeatureOodFit, feature_ood_score
from fseb_ft.evaluation.temperature import temperature_warnings
from fseb_ft.method.devices import resolve_device
from fseb_ft.prediction.conformal_sets import add_set_columns, calibrate_on_run, conformal_record
from fseb_ft.prediction.feature_fit import load_feature_fit
from fseb_ft.prediction.inputs import ImageInputs, gather_inputs, outputs_and_read_errors
from fseb_ft.prediction.loading import LoadedModel, load_model
from fseb_ft.prediction.requests import LoadRequest, PredictRequest, RowRequest, RuleRequest
from fseb_ft.prediction.rows import (
    ImagePredictions,
    accuracy_record,
    check_out_file,
    image_rows,
    write_predictions,
)
from fseb_ft.prediction.thresholds import choose_rule, keep_rule
from fseb_ft.prediction.validation import validation_fetch
from fseb_ft.recipe import DatasetSpec
from fseb_ft.runs.rundir import ABSTENTION_FILE

__all__ = ["predict", "predict_images"]

Validation = Callable[[], tuple[Tensor, Tensor]]
"""Gives the run's validation logits and labels, predicted at most once per call."""


def predict_images(
    model: str | Path | LoadedModel,
    images: str | Path | Sequence[str | Path] = (),
    *,
    dataset: DatasetSpec | Mapping[str, Any] | None = None,
    request: PredictRequest | None = None,
    **options: Any,
) -> ImagePredictions:
    """Predict ``images`` (or a ``dataset``) with ``model``, abstaining below a threshold.

    Args:
        model: a run folder, a model folder, ``hf-hub:owner/name`` or a :class:`LoadedModel`.
        images: files, folders (searched recursively) and glob patterns.
        dataset: a recipe dataset spec (``{source: idx, path: …, split: t10k}``) instead.
        request: the call's options (:class:`~fseb_ft.prediction.requests.PredictRequest`);
            default: every option's default.
        **options: a section of the request by its name (``load``, ``rule``, ``rows``,
            ``output``) or any field of one by its name, replacing the request's: ``out``,
            ``fmt`` (:class:`~fseb_ft.prediction.requests.OutputRequest`); ``coverage``,
            ``max_risk``, ``threshold``, ``confidence``, ``keep``
            (:class:`~fseb_ft.prediction.requests.RuleRequest`); ``top_k``, ``ood``,
            ``conformal``, ``conformal_method``, ``class_conditional``
            (:class:`~fseb_ft.prediction.requests.RowRequest`); ``temperature``, ``device``,
            ``batch_size``, ``num_workers``, ``progress``, ``data_paths``
            (:class:`~fseb_ft.prediction.requests.LoadRequest`).

    Returns:
        The rows and the meta record (:class:`ImagePredictions`).

    Raises:
        TypeError: an option that is no section or field of the request.
        ValueError: a value the request refuses, before anything loads.
    """
    return predict(model, images, dataset, (request or PredictRequest()).replaced(**options))


def predict(
    model: str | Path | LoadedModel,
    images: str | Path | Sequence[str | Path],
    dataset: DatasetSpec | Mapping[str, Any] | None,
    request: PredictRequest,
) -> ImagePredictions:
    """:func:`predict_images` of a whole ``request``: the phases in order."""
    check_out_file(request.output.out)
    images = [images] if isinstance(images, str | Path) else list(images)
    loaded = _loaded(model, request.rule.keep, request.load.data_paths)
    call = _resolve(loaded, request.load, request.rows)
    inputs, names, labels, skipped = gather_inputs(loaded, images, dataset)
    validation = validation_fetch(loaded, call.device, request.load.loader_kw)
    rule = choose_rule(loaded, call.temperature, request.rule, validation)
    sets = _sets(loaded, call.temperature, request.rows, validation)
    rows, unreadable = _rows(loaded, call, rule, _Images(inputs, names, labels), sets)
    meta = _meta(loaded, call, rule, rows, unreadable, skipped)
    if labels is not None:
        meta |= accuracy_record(rows, loaded.class_names)
    if sets is not None:
        meta["conformal"] = conformal_record(sets, rows)
    meta |= _kept_in(loaded, request.rule, rule)
    if request.output.out is not None:
        write_predictions(Path(request.output.out), request.output.format, rows, meta)
    return ImagePredictions(rows=rows, meta=meta)


@dataclasses.dataclass(frozen=True)
class _Call:
    """How one call predicts once the request's defaults are resolved against the model."""

    temperature: float | None
    """The temperature applied to the logits (the model's unless overridden; None: none)."""
    overridden: bool
    """Whether the caller chose the temperature (its fitted range then says nothing of it)."""
    ood: str
    """The OOD score each row reports."""
    fit: FeatureOodFit | None
    """The fit the model keeps when ``ood`` is a feature score."""
    top_k: int
    """How many classes each row ranks."""
    device: torch.device
    """Where the network runs."""
    loader_kw: dict[str, Any]
    """``batch_size``, ``num_workers``, ``progress`` of every loader."""


@dataclasses.dataclass(frozen=True)
class _Images:
    """The inputs of one call: what the passes read, their names and labels (datasets)."""

    inputs: ImageInputs
    """What the passes read."""
    names: Sequence[str]
    """Each input's name in the rows."""
    labels: Sequence[str] | None
    """Each input's label's class name (a dataset), else ``None``."""


def _loaded(
    model: str | Path | LoadedModel, keep: bool, data_paths: Sequence[str] = ()
) -> LoadedModel:
    """``model`` loaded (its data where ``data_paths`` say); ``keep`` refused before anything
    predicts when it is not a run."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model, data_paths)
    if keep and loaded.run_dir is None:
        raise FsebError(
            f"--keep stores the threshold in a run folder ({ABSTENTION_FILE}), and MODEL is "
            f"{loaded.where}: predict with the run folder, or leave out --keep"
        )
    return loaded


def _resolve(loaded: LoadedModel, load: LoadRequest, rows: RowRequest) -> _Call:
    """The call's temperature, OOD score (its fit loaded before any pass: a model without one
    stops here), device and loaders."""
    ood = rows.ood or loaded.default_ood_score
    return _Call(
        temperature=loaded.temperature if load.temperature is None else float(load.temperature),
        overridden=load.temperature is not None,
        ood=ood,
        fit=load_feature_fit(loaded, ood),
        top_k=rows.top_k,
        device=resolve_device(load.device),
        loader_kw=load.loader_kw,
    )


def _sets(
    loaded: LoadedModel, temperature: float | None, rows: RowRequest, validation: Validation
) -> ConformalCalibration | None:
    """The conformal calibration ``rows`` asks for, on the validation logits the rule used."""
    if rows.conformal is None:
        return None
    return calibrate_on_run(
        loaded, temperature, rows.conformal, rows.conformal_method, rows.class_conditional,
        validation,
    )  # fmt: skip


def _rows(
    loaded: LoadedModel,
    call: _Call,
    rule: AbstentionRule,
    images: _Images,
    sets: ConformalCalibration | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the readable images (with their conformal ``sets``), and ``"name: why"`` for
    each unreadable one.

    Raises:
        ValueError: none of the images could be read.
    """
    net = loaded.model.to(call.device).eval()
    network = None if call.fit is None else (loaded.network or net)
    logits, features, errors = outputs_and_read_errors(
        net, images.inputs, loaded, call.device, "predict", **call.loader_kw, network=network
    )
    names, labels = images.names, images.labels
    readable = [i for i, err in enumerate(errors) if not err]
    unreadable = [f"{names[i]}: {errors[i]}" for i in range(len(names)) if errors[i]]
    if not readable:
        raise ValueError(f"none of the {len(names)} images could be read: {unreadable[0]}")
    fit = cast(FeatureOodFit, call.fit)  # loaded for a feature score, the one features serve
    rows = image_rows(
        [names[i] for i in readable],
        None if labels is None else [labels[i] for i in readable],
        logits[readable], call.temperature, rule.log_odds_threshold, call.ood,
        loaded.class_names, call.top_k,
        None if features is None else feature_ood_score(call.ood, fit, features[readable]),
    )  # fmt: skip
    if sets is not None:
        add_set_columns(rows, logits[readable], call.temperature, sets, loaded.class_names)
    return rows, unreadable


def _meta(
    loaded: LoadedModel,
    call: _Call,
    rule: AbstentionRule,
    rows: list[dict[str, Any]],
    unreadable: list[str],
    skipped: Sequence[Path],
) -> dict[str, Any]:
    """The meta record of the predictions: model, temperature and its warnings, rule, counts,
    files unreadable or left out, device."""
    return {
        "model": loaded.where,
        "temperature": call.temperature,
        # A temperature the caller chose is not the fit's, so its range says nothing of it.
        "warnings": [] if call.overridden else temperature_warnings(call.temperature),
        "abstention": rule.to_json(),
        "ood_score": call.ood,
        "images": len(rows),
        "abstained": sum(row["abstain"] for row in rows),
        "unreadable": unreadable,
        "left_out": [str(p) for p in skipped],
        "device": str(call.device),
    }


def _kept_in(loaded: LoadedModel, request: RuleRequest, rule: AbstentionRule) -> dict[str, str]:
    """Keep ``rule`` with the run when ``request`` asks to (a kept rule is kept already):
    ``{"kept_in": file}``, else nothing."""
    if not request.keep or loaded.run_dir is None or rule.chosen_on == "kept":
        return {}
    return {"kept_in": str(keep_rule(loaded.run_dir, rule))}
