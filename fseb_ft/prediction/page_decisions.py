"""What the demo page (``fseb-ft demo``) says of one image: ``fseb-ft predict``'s row for it (the
temperature-scaled top classes, the abstention at the rule's threshold, the OOD score and the
conformal set), the OOD flag, and the decision with its reasons, as Markdown.

The row comes from the functions :func:`fseb_ft.predict_images` composes (the same rule, the same
sets, the same OOD score), set up once when the page starts: the rule is chosen and the sets are
calibrated on the run's validation split once, not at each image. The OOD flag is the page's
one addition: the image's OOD score (the run's, as ``predict`` reports it) is above
:data:`OOD_VALIDATION_RATE`'s quantile of the same score on the validation split, so about 5 % of
images like the validation split's are flagged. A model folder or a Hub model has no validation
split: it abstains at the threshold it keeps, and shows no set and no flag.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import AbstentionRule, out_of_range
from fseb_ft.evaluation.conformal import ConformalCalibration
from fseb_ft.evaluation.ood import ood_score
from fseb_ft.method.devices import resolve_device
from fseb_ft.prediction.conformal_sets import add_set_columns, calibrate_on_run, check_conformal
from fseb_ft.prediction.inputs import gather_inputs, outputs_and_read_errors
from fseb_ft.prediction.loading import LoadedModel, load_model
from fseb_ft.prediction.requests import RuleRequest
from fseb_ft.prediction.rows import image_rows
from fseb_ft.prediction.thresholds import choose_rule
from fseb_ft.prediction.validation import validation_fetch

__all__ = [
    "OOD_VALIDATION_RATE",
    "PageDecision",
    "PagePredictor",
    "PageSettings",
    "decision_markdown",
    "keeps_rule",
]

OOD_VALIDATION_RATE = 0.05
"""The fraction of the validation split whose OOD score the page's OOD flag would raise."""


@dataclasses.dataclass(frozen=True)
class PageSettings:
    """How the page chooses its abstention rule and its sets; checked when made."""

    coverage: float | None = None
    """Choose ``τ`` on the run's validation split to accept this fraction, in (0, 1]."""
    max_risk: float | None = None
    """Or choose it for at most this error rate among accepted images, in [0, 1)."""
    conformal: float = 0.9
    """The conformal sets' target coverage, in (0, 1] (a run only)."""
    top_k: int = 3
    """How many classes the page ranks."""
    device: str | None = None
    """Where the network runs; ``None``: CUDA when there is one."""

    def __post_init__(self) -> None:
        if self.coverage is not None and self.max_risk is not None:
            raise ValueError("give at most one of coverage and max_risk")
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        for name, value in (("coverage", self.coverage), ("max_risk", self.max_risk)):
            if value is not None and (problem := out_of_range(name, value)) is not None:
                raise ValueError(f"{name} {problem}")
        check_conformal(self.conformal, "lac")


@dataclasses.dataclass(frozen=True)
class PageDecision:
    """The page's answer for one image."""

    row: dict[str, Any]
    """``fseb-ft predict``'s row: ``prediction``, ``probability``, ``abstain`` (confidence
    below ``τ``), ``entropy``, ``ood_<score>``, ``topN``/``topN_probability`` and, for a run,
    ``set`` and ``set_size``."""
    rule: AbstentionRule
    """The abstention rule the row's ``abstain`` applied."""
    ood: str
    """The OOD score of the row and the flag."""
    ood_threshold: float | None
    """The flag's threshold on that score; ``None``: no validation split, no flag."""
    set_coverage: float | None
    """The conformal sets' target coverage; ``None``: no validation split, no set."""

    @property
    def ood_flagged(self) -> bool:
        """Whether the OOD score is above the flag's threshold (never without one)."""
        return self.ood_threshold is not None and self.row[f"ood_{self.ood}"] > self.ood_threshold

    @property
    def abstain(self) -> bool:
        """The page's decision: abstain for low confidence or for an OOD flag."""
        return bool(self.row["abstain"]) or self.ood_flagged

    def top_classes(self) -> dict[str, float]:
        """The ranked classes and their temperature-scaled probabilities."""
        k = sum(key.endswith("_probability") for key in self.row)
        return {self.row[f"top{j}"]: self.row[f"top{j}_probability"] for j in range(1, k + 1)}

    def reasons(self) -> list[str]:
        """Why the page abstains, one sentence a reason; none when it predicts."""
        found = []
        if self.row["abstain"]:
            found.append(
                f"low confidence: {self.row['probability']:.3f} is below the threshold "
                f"{self.rule.threshold:.3f}"
            )
        if self.ood_flagged:
            found.append(
                f"out of distribution: its {self.ood} score {self.row[f'ood_{self.ood}']:.3f} is "
                f"above {self.ood_threshold:.3f}, which at most {OOD_VALIDATION_RATE:.0%} of "
                "the validation images exceed"
            )
        return found


class PagePredictor:
    """A model with its rule, sets and OOD flag set up once, deciding one image at a time."""

    def __init__(self, model: str | Path | LoadedModel, settings: PageSettings) -> None:
        """Load ``model`` (a run, a model folder, ``hf-hub:``), choose its rule (the kept one
        unless ``settings`` ask for a coverage or a risk) and, for a run, calibrate the sets and
        the OOD flag on its validation split.

        Raises:
            FsebError: no kept threshold and neither a coverage nor a risk asked for.
        """
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model)
        self.settings = settings
        self.device = resolve_device(settings.device)
        self.loader_kw: dict[str, Any] = {"batch_size": 1, "num_workers": 0, "progress": False}
        loaded, temperature = self.loaded, self.loaded.temperature
        if settings.coverage is None and settings.max_risk is None and not keeps_rule(loaded):
            raise FsebError(
                f"{loaded.where} keeps no abstention threshold: give --coverage C or "
                "--max-risk R (or keep one: fseb-ft predict RUN IMAGES --coverage 0.9 --keep)"
            )
        validation = validation_fetch(loaded, self.device, self.loader_kw)
        asked = RuleRequest(coverage=settings.coverage, max_risk=settings.max_risk)
        self.rule = choose_rule(loaded, temperature, asked, validation)
        self.ood = loaded.default_ood_score  # a score of the outputs: no feature fit needed
        self.sets: ConformalCalibration | None = None
        self.ood_threshold: float | None = None
        if loaded.run_dir is not None:
            self.sets = calibrate_on_run(
                loaded, temperature, settings.conformal, "lac", False, validation
            )
            self.ood_threshold = _ood_threshold(validation()[0], temperature, self.ood)

    def decide(self, image: str | Path) -> PageDecision:
        """The page's decision for the image file ``image``.

        Raises:
            ValueError: the file cannot be read as an image.
        """
        loaded = self.loaded
        inputs, names, _, _ = gather_inputs(loaded, [image], None)
        net = loaded.model.to(self.device).eval()
        logits, _, errors = outputs_and_read_errors(
            net, inputs, loaded, self.device, "demo", **self.loader_kw
        )
        if errors[0]:
            raise ValueError(f"{Path(image).name} cannot be read as an image: {errors[0]}")
        rows = image_rows(
            names, None, logits, loaded.temperature, self.rule.log_odds_threshold, self.ood,
            loaded.class_names, self.settings.top_k,
        )  # fmt: skip
        if self.sets is not None:
            add_set_columns(rows, logits, loaded.temperature, self.sets, loaded.class_names)
        coverage = None if self.sets is None else self.settings.conformal
        return PageDecision(rows[0], self.rule, self.ood, self.ood_threshold, coverage)


def keeps_rule(loaded: LoadedModel) -> bool:
    """Whether :func:`choose_rule` uses the model's kept rule when nothing is asked for: one is
    kept, for the temperature the model predicts with."""
    return loaded.kept is not None and loaded.kept.temperature == loaded.temperature


def _ood_threshold(logits: torch.Tensor, temperature: float | None, ood: str) -> float:
    """The value of the OOD score ``ood`` that :data:`OOD_VALIDATION_RATE` of the validation
    ``logits`` (N_v, K) exceed, at most: an observed score (the ``higher`` quantile), as the
    rows compute the score (float64, at ``temperature``)."""
    z = logits.double() / (temperature or 1.0)  # (N_v, K)
    scores = ood_score(ood, torch.softmax(z, dim=-1), z)  # (N_v,)
    return float(torch.quantile(scores, 1 - OOD_VALIDATION_RATE, interpolation="higher"))


def decision_markdown(decision: PageDecision) -> str:
    """The decision as the page shows it: the verdict and its reasons, the conformal set, the
    OOD score and how the threshold was set."""
    row = decision.row
    if decision.abstain:
        lines = ["### Decision: abstain", *(f"- {reason}" for reason in decision.reasons())]
    else:
        lines = [f"### Decision: {row['prediction']} (probability {row['probability']:.3f})"]
    score = f"**OOD score** ({decision.ood}): {row[f'ood_{decision.ood}']:.3f}"
    if decision.set_coverage is None or decision.ood_threshold is None:
        lines += ["", f"{score}", "", "Conformal set and OOD flag: they need the run's "
                  "validation split (give the run folder)."]  # fmt: skip
    else:
        members = f"{{{', '.join(row['set'])}}}" if row["set"] else "empty (no class is likely)"
        lines += ["", f"**Conformal set** (coverage {decision.set_coverage:g} over images like "
                  f"the validation split's): {members}", "",
                  f"{score}, flagged above {decision.ood_threshold:.3f}"]  # fmt: skip
    return "\n".join([*lines, "", _rule_line(decision.rule)])


def _rule_line(rule: AbstentionRule) -> str:
    """How the threshold was set, in one line."""
    how = {
        "kept": "kept with the model",
        "validation": f"chosen on the validation split for {rule.criterion} {rule.target:g}",
    }.get(str(rule.chosen_on), "given")
    return f"Threshold τ = {rule.threshold:.3f} on the temperature-scaled probability ({how})."
