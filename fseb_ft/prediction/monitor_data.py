"""The two sides of ``fseb-ft monitor``: the run's validation split and the incoming batch, each
as its penultimate features and logits (:class:`~fseb_ft.prediction.shift_report.Outputs`).

The batch is read as ``fseb-ft predict`` reads it (files, folders, globs or a dataset spec; an
unreadable file is left out and named), the validation split is rebuilt from the run's recipe as
predict's thresholds rebuild it, and both go through the pass that gives predict's feature
scores their features: one ``forward_features`` for the logits and the features. Validation's
logits are the run's cached ones when it has them (those the kept threshold was chosen on, and
for FS-VI its Monte-Carlo predictive's); the first monitor keeps the features beside them, and
later ones read both instead of repeating the validation pass.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from fseb_ft.errors import FsebError
from fseb_ft.prediction.inputs import ImageInputs, gather_inputs, outputs_and_read_errors
from fseb_ft.prediction.loading import LoadedModel
from fseb_ft.prediction.shift_report import Outputs
from fseb_ft.prediction.validation import validation_split
from fseb_ft.recipe import Recipe
from fseb_ft.runs.rundir import read_val_features, read_val_logits, write_val_logits

__all__ = ["Batch", "batch_outputs", "check_has_validation", "validation_outputs"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Batch:
    """The readable images of the batch: their outputs, names, and what was left out."""

    outputs: Outputs
    """Features and logits of the readable images."""
    names: list[str]
    """Their names (paths, or ``dataset[i]``)."""
    unreadable: list[str]
    """``"name: why"`` of each image that could not be read."""
    skipped: list[Path]
    """Files under the folders given that are not images."""


def check_has_validation(loaded: LoadedModel) -> None:
    """Refuse a model without a run's validation split, before any image is read.

    Raises:
        FsebError: ``loaded`` is a model folder or a Hub model.
    """
    if loaded.run_dir is None:
        raise FsebError(
            f"the monitor compares the images with the run's validation split, and MODEL is "
            f"{loaded.where}, which has none: give the run folder it was trained in"
        )


def batch_outputs(
    loaded: LoadedModel,
    images: Sequence[str | Path],
    dataset: Any,
    device: torch.device,
    loader_kw: dict[str, Any],
) -> Batch:
    """The batch's features and logits, its readable images' names and the unreadable ones
    (``"name: why"``), as ``fseb-ft predict`` reads them.

    Raises:
        ValueError: no images given, or none of them could be read.
    """
    inputs, names, _, skipped = gather_inputs(loaded, images, dataset)
    logits, features, errors = _pass(loaded, inputs, device, "batch", loader_kw)
    readable = [i for i, err in enumerate(errors) if not err]
    unreadable = [f"{names[i]}: {errors[i]}" for i in range(len(names)) if errors[i]]
    if not readable:
        raise ValueError(f"none of the {len(names)} images could be read: {unreadable[0]}")
    outputs = Outputs(features[readable], logits[readable])
    return Batch(outputs, [names[i] for i in readable], unreadable, list(skipped))


def validation_outputs(
    loaded: LoadedModel, device: torch.device, loader_kw: dict[str, Any]
) -> Outputs:
    """The features, logits and labels of the validation split of ``loaded``'s run: those the
    run keeps (:data:`~fseb_ft.runs.rundir.VAL_LOGITS`, as new as its weights) when it keeps
    features, else one pass over the split, kept with the run for the next call.

    Raises:
        FsebError: the split cannot be rebuilt (in-memory data, data changed since training).
        ValueError: some of its images cannot be read.
    """
    check_has_validation(loaded)
    run_dir = cast(Path, loaded.run_dir)
    cached = read_val_logits(run_dir)
    kept = read_val_features(run_dir) if cached is not None else None
    if cached is not None and kept is not None and len(kept) == len(cached[1]):
        return Outputs(kept, *cached)  # (N_v, D), (N_v, K), (N_v,)
    try:
        val = validation_split(cast(Recipe, loaded.recipe), loaded.info)
    except FsebError as err:  # its advice (--threshold) is predict's: the monitor needs the split
        raise FsebError(
            f"the monitor needs the run's validation split: {_without_advice(err)}"
        ) from err
    logits, features, errors = _pass(loaded, ImageInputs(None, val, loaded), device,
                                     "validation", loader_kw)  # fmt: skip
    bad = [e for e in errors if e]
    if bad:
        raise ValueError(f"{len(bad)} validation image(s) cannot be read: {bad[0]}")
    labels = torch.as_tensor(val.labels, dtype=torch.long)  # (N_v,)
    if cached is not None and len(cached[1]) == len(labels):
        logits = cached[0]  # what the kept threshold was chosen on
    try:
        write_val_logits(run_dir, logits, labels, features)
    except OSError as err:  # a cache: a read-only run folder is only read
        logger.info("validation outputs not cached in %s: %s", run_dir, err)
    return Outputs(features, logits, labels)


def _pass(
    loaded: LoadedModel, inputs: ImageInputs, device: torch.device, desc: str,
    loader_kw: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:  # fmt: skip
    """Logits (N, K), penultimate features (N, D) and read errors of ``inputs``."""
    net = loaded.model.to(device).eval()
    network = (loaded.network or net).to(device).eval()
    logits, features, errors = outputs_and_read_errors(
        net, inputs, loaded, device, desc, **loader_kw, network=network
    )
    return logits, cast(torch.Tensor, features), errors


def _without_advice(err: FsebError) -> str:
    """``err``'s message without predict's closing advice to give ``--threshold``."""
    return str(err).replace(": give --threshold", "").replace("; give --threshold", "")
