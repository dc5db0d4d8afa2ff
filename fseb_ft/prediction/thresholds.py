"""The abstention rule a loaded model predicts new images with: the one it keeps, one given, or
one chosen on its run's validation split; and keeping a rule with the run.

Choosing is a query: it changes nothing the run does. The validation logits it is chosen on are
cached with the run (:mod:`fseb_ft.prediction.validation`). Only :func:`keep_rule` stores a
rule (``abstention.json``, and the model folder's ``fseb.json`` and card), so that later calls,
a model folder exported from the run and a pushed copy abstain the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Literal, cast

from torch import Tensor

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import (
    AbstentionRule,
    certified_rule,
    given_rule,
    no_rule,
    rule_for_target,
)
from fseb_ft.prediction.loading import LoadedModel
from fseb_ft.prediction.requests import RuleRequest
from fseb_ft.prediction.validation import os_reason, validation_confidence
from fseb_ft.runs.export import write_model_card
from fseb_ft.runs.rundir import ABSTENTION_FILE, MODEL_DIR, RESULTS_JSON, write_json

__all__ = ["DEFAULT_COVERAGE", "choose_rule", "keep_rule"]

DEFAULT_COVERAGE = 0.9
"""The coverage a run's threshold is chosen for when nothing else is asked or kept."""


def choose_rule(
    loaded: LoadedModel,
    temperature: float | None,
    request: RuleRequest,
    validation: Callable[[], tuple[Tensor, Tensor]],
) -> AbstentionRule:
    """The abstention rule ``request`` asks for: ``τ``, how it was chosen, and its validation
    coverage and risk.

    Without a coverage, a max-risk or a threshold, the model's kept rule (when kept for this
    ``temperature``), else a run's rule for :data:`DEFAULT_COVERAGE`, else nothing abstains.
    ``request.confidence`` (with ``max_risk`` only) certifies the risk with that probability
    (:func:`certified_rule`); without it, the empirical rule. ``validation`` gives the run's
    validation logits and labels (:func:`~fseb_ft.prediction.validation.validation_fetch`),
    called only when the rule needs them.

    Raises:
        FsebError: ``coverage`` or ``max_risk`` for a model without a run's validation split.
    """
    coverage, max_risk, threshold = request.coverage, request.max_risk, request.threshold
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
    # No threshold here: coverage or max_risk is given (or coverage defaulted), and a confidence
    # comes with max_risk only.
    if request.confidence is not None:
        return certified_rule(
            cast(float, max_risk), request.confidence, temperature, confidence, correct
        )
    target = cast(float, coverage if coverage is not None else max_risk)
    return rule_for_target(criterion, target, temperature, confidence, correct)


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
            f"--keep could not write {target} ({os_reason(err)}): make the run folder writable, "
            "or leave out --keep"
        ) from err
    return kept
