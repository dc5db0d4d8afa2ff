"""A run's validation split, rebuilt from its recipe as training built it, and its logits,
cached with the run (:data:`~fseb_ft.runs.rundir.VAL_LOGITS`) so the next threshold or
conformal calibration needs no second pass over validation; a run folder that cannot be written
to is only read. One call of :func:`fseb_ft.prediction.pipeline.predict` predicts the split at
most once (:func:`validation_fetch`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.screening import screen
from fseb_ft.data.sources import hold_outs, load_split
from fseb_ft.errors import FsebError, first_line
from fseb_ft.evaluation.selective import top_class_log_odds
from fseb_ft.prediction.inputs import ImageInputs, logits_and_read_errors
from fseb_ft.prediction.loading import LoadedModel
from fseb_ft.recipe import Recipe
from fseb_ft.recipe.datasets import IN_MEMORY
from fseb_ft.runs.rundir import RunInfo, read_val_logits, write_val_logits

__all__ = [
    "os_reason",
    "validation_confidence",
    "validation_fetch",
    "validation_logits",
    "validation_split",
]

logger = logging.getLogger(__name__)


def validation_split(recipe: Recipe, info: RunInfo | None) -> LabeledImages:
    """The run's validation split, rebuilt from its recipe as
    :func:`~fseb_ft.data.sources.build_splits` built it (``data.val``, or the seeded stratified
    ``data.val_fraction`` of ``data.train``, after its ``data.test_fraction``), then screened as
    training screened it: served from the resized-image cache with ``data.cache`` (the pixels the
    run validated on) and without the images ``data.bad_images: skip`` left out.

    Raises:
        FsebError: the run was trained on in-memory data (``fseb_ft.finetune``), which the
            recipe only names; or the rebuilt split is not the one ``run.json`` records.
    """
    cfg = recipe.data
    seed = cfg.draw_seed(recipe.train.seed)
    spec = cfg.val if cfg.val is not None else cfg.train
    if spec.path.startswith(IN_MEMORY):
        raise FsebError(
            "the run was trained on in-memory data (fseb_ft.finetune), so its validation split "
            "cannot be rebuilt: give --threshold"
        )
    if cfg.val is not None:
        val = load_split("data.val", cfg.val, cfg.channels, seed)
    else:
        full = load_split("data.train", cfg.train, cfg.channels, seed)
        # Without data.val the recipe's rules give a val_fraction: a hold-out.
        val = cast(LabeledImages, hold_outs(full, cfg, seed)[1])
    val = screen({"data.val": val}, cfg.bad_images, progress=False, cache=cfg.cache)[0]["data.val"]
    recorded = ((info.data if info else None) or {}).get("val")
    if recorded is not None and recorded != val.identity:
        raise FsebError(
            f"the validation split rebuilt from the recipe ({val.identity}) is not the one the "
            f"run validated on ({recorded}): the data changed since training; give --threshold"
        )
    return val


def validation_confidence(
    logits: Tensor, labels: Tensor, temperature: float | None
) -> tuple[Tensor, Tensor]:
    """Confidences (top-class log-odds, (N_v,)) at ``temperature`` and correctness (N_v,) of
    the validation ``logits`` (N_v, K) and ``labels`` (N_v,)."""
    return top_class_log_odds(logits, temperature or 1.0), logits.argmax(dim=-1) == labels


def validation_fetch(
    loaded: LoadedModel, device: torch.device, loader_kw: dict[str, Any]
) -> Callable[[], tuple[Tensor, Tensor]]:
    """:func:`validation_logits` of ``loaded``'s run, fetched at the first call and kept: a
    call that needs them twice (a threshold and conformal sets) predicts the validation split
    at most once, whether or not the run folder can cache them."""
    return functools.cache(functools.partial(validation_logits, loaded, device, loader_kw))


def validation_logits(
    loaded: LoadedModel, device: torch.device, loader_kw: dict[str, Any]
) -> tuple[Tensor, Tensor]:
    """Logits (N_v, K) and labels (N_v,) of the validation split of ``loaded``'s run
    (``loaded.run_dir`` is set).

    They come from the run's :data:`~fseb_ft.runs.rundir.VAL_LOGITS` when they are as new
    as its weights; otherwise they are predicted (the whole validation split) and cached there
    when the folder can be written to.
    """
    run_dir = cast(Path, loaded.run_dir)  # a run's model has its folder and recipe
    cached = read_val_logits(run_dir)
    if cached is not None:
        return cached  # (N_v, K), (N_v,)
    val = validation_split(cast(Recipe, loaded.recipe), loaded.info)
    logits, errors = logits_and_read_errors(
        loaded.model, ImageInputs(None, val, loaded), loaded, device, "validation", **loader_kw
    )
    bad = [e for e in errors if e]
    if bad:
        raise ValueError(f"{len(bad)} validation image(s) cannot be read: {bad[0]}")
    labels = torch.as_tensor(val.labels, dtype=torch.long)  # (N_v,)
    try:
        write_val_logits(run_dir, logits, labels)
    except OSError as err:  # a cache: a read-only run folder (or a full disk) is only read
        logger.info("validation logits not cached in %s: %s", run_dir, os_reason(err))
    return logits, labels


def os_reason(err: OSError) -> str:
    """An OS error's reason without the temporary file it named (``Permission denied``)."""
    return err.strerror or first_line(err)
