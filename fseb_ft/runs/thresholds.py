"""The abstention rule a loaded model predicts new images with: the one it keeps, one given, or
one chosen on its run's validation split; and keeping a rule with the run.

Choosing is a query: it changes nothing the run does. The validation logits are cached with the
run (:data:`~fseb_ft.runs.rundir.VAL_LOGITS`) so the next choice needs no second pass over
validation; a run folder that cannot be written to is only read. Only :func:`keep_rule` stores a
rule (``abstention.json``, and the model folder's ``fseb.json`` and card), so that later calls,
a model folder exported from the run and a pushed copy abstain the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import (
    AbstentionRule,
    certified_rule,
    given_rule,
    no_rule,
    rule_for_target,
)
from fseb_ft.evaluation.selective import top_class_log_odds
from fseb_ft.recipe import Recipe
from fseb_ft.runs.export import write_model_card
from fseb_ft.runs.loading import (
    ImageInputs,
    LoadedModel,
    first_line,
    logits_and_read_errors,
    validation_split,
)
from fseb_ft.runs.rundir import (
    ABSTENTION_FILE,
    MODEL_DIR,
    RESULTS_JSON,
    read_val_logits,
    write_json,
    write_val_logits,
)

__all__ = [
    "DEFAULT_COVERAGE",
    "choose_rule",
    "keep_rule",
    "validation_confidence",
    "validation_fetch",
    "validation_logits",
]

logger = logging.getLogger(__name__)

DEFAULT_COVERAGE = 0.9
"""The coverage a run's threshold is chosen for when nothing else is asked or kept."""


def choose_rule(
    loaded: LoadedModel,
    temperature: float | None,
    coverage: float | None,
    max_risk: float | None,
    threshold: float | None,
    validation: Callable[[], tuple[Tensor, Tensor]],
    level: float | None = None,
) -> AbstentionRule:
    """The abstention rule: ``τ``, how it was chosen, and its validation coverage and risk.

    At most one of ``coverage``, ``max_risk`` and ``threshold`` is given. Without any, the
    model's kept rule (when kept for this ``temperature``), else a run's rule for
    :data:`DEFAULT_COVERAGE`, else nothing abstains. ``level`` (with ``max_risk`` only, from
    ``--confidence``) certifies the risk with that probability (:func:`certified_rule`);
    without it, the empirical rule. ``validation`` gives the run's validation logits and labels
    (:func:`validation_fetch`), called only when the rule needs them.

    Raises:
        FsebError: ``coverage`` or ``max_risk`` for a model without a run's validation split.
    """
    # Confidence is the maximum probability of softmax(logits / T): τ holds for this T only.
    if coverage is None and max_risk is None and threshold is None:
        kept = loaded.kept
        if kept is not None and kept.temperature == temperature:
            return dataclasses.replace(kept, chosen_on="kept")
        if loaded.run_dir is None:
            return no_rule(temperature)
        coverage = DEFAULT_COVERAGE
    criterion: Literal["coverage", "max_risk"] = "coverage" if coverage is not None else "max_risk"
    if loaded.run_dir is None:
        if threshold is None:
            raise FsebError(
                f"--{criterion.replace('_', '-')} chooses the threshold on a run's "
                f"validation split, and {loaded.where} has none: predict with the run folder, "
                "or give --threshold"
            )
        return given_rule(threshold, temperature)
    try:
        confidence, correct = validation_confidence(*validation(), temperature)
    except FsebError:
        if threshold is None:
            raise
        return given_rule(threshold, temperature)  # the run's validation data is not at hand
    if threshold is not None:
        return given_rule(threshold, temperature).measured(confidence, correct)
    # No threshold here: coverage or max_risk is given (or coverage defaulted), and level comes
    # with max_risk only.
    if level is not None:
        return certified_rule(cast(float, max_risk), level, temperature, confidence, correct)
    target = cast(float, coverage if coverage is not None else max_risk)
    return rule_for_target(criterion, target, temperature, confidence, correct)


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
        logger.info("validation logits not cached in %s: %s", run_dir, _reason(err))
    return logits, labels


def keep_rule(run_dir: Path, rule: AbstentionRule) -> Path:
    """Store ``rule`` with the run (``abstention.json``) and, once the run is exported, in its
    model folder's ``fseb.json`` and card; return where it is kept.

    Raises:
        FsebError: the run folder cannot be written to (the message names the file).
    """
    kept = target = run_dir / ABSTENTION_FILE
    try:
        write_json(kept, dataclasses.replace(rule, chosen_on=None).to_json())
        target = run_dir / MODEL_DIR
        if (target / "fseb.json").is_file() and (run_dir / RESULTS_JSON).is_file():
            write_model_card(run_dir)
    except OSError as err:
        if isinstance(err, FsebError):  # a full disk: already one line naming the folder
            raise
        raise FsebError(
            f"--keep could not write {target} ({_reason(err)}): make the run folder writable, "
            "or leave out --keep"
        ) from err
    return kept


def _reason(err: OSError) -> str:
    """An OS error's reason without the temporary file it named (``Permission denied``)."""
    return err.strerror or first_line(err)
