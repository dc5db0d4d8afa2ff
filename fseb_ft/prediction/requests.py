"""What one prediction call is asked to do, as frozen dataclasses validated at once: what to load
and where to run it (:class:`LoadRequest`), the abstention rule (:class:`RuleRequest`), what each
row holds (:class:`RowRequest`) and where the rows go (:class:`OutputRequest`), together a
:class:`PredictRequest`. A bad value fails when the request is made, before any model loads,
with a ``ValueError`` naming the argument, the value and what is allowed.

``fseb_ft.predict_images(model, images, coverage=0.9, top_k=5)`` takes the same fields as
keyword arguments (:meth:`PredictRequest.replaced`), so both spellings are one request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fseb_ft.evaluation.abstention import out_of_range
from fseb_ft.prediction.conformal_sets import check_conformal
from fseb_ft.prediction.rows import output_format
from fseb_ft.recipe.options import OOD_SCORES

__all__ = ["LoadRequest", "OutputRequest", "PredictRequest", "RowRequest", "RuleRequest"]


@dataclasses.dataclass(frozen=True)
class LoadRequest:
    """What to load besides the model itself, and where and how its passes run."""

    data_paths: Sequence[str] = ()
    """Where a run's data are now when they moved since training (``data.train.path=DIR``,
    ``data.val.path=DIR``), for its validation split."""
    temperature: float | None = None
    """Overrides the model's temperature, > 0 (1: raw outputs); ``None``: the model's."""
    device: str | None = None
    """``cpu``, ``cuda``, ``cuda:1``, …; ``None``: CUDA when there is one."""
    batch_size: int = 64
    """Images per batch of every pass, ≥ 1."""
    num_workers: int = 0
    """Image-reading processes of every loader, ≥ 0."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_paths", tuple(self.data_paths))
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be at least 0, got {self.num_workers}")

    @property
    def loader_kw(self) -> dict[str, Any]:
        """``batch_size``, ``num_workers`` and ``progress``, as every pass takes them."""
        return {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "progress": self.progress,
        }


@dataclasses.dataclass(frozen=True)
class RuleRequest:
    """The abstention rule: at most one of ``coverage``, ``max_risk`` and ``threshold``;
    without any, the model's kept rule, else a run's for coverage 0.9, else none."""

    coverage: float | None = None
    """Choose ``τ`` on the run's validation split to accept this fraction, in (0, 1]."""
    max_risk: float | None = None
    """Choose ``τ`` there for at most this error rate among accepted predictions, in [0, 1)."""
    threshold: float | None = None
    """``τ`` itself, in [0, 1] (a run still reports its validation coverage and risk)."""
    confidence: float | None = None
    """With ``max_risk`` only, in [0.5, 1): certify the risk with this probability over the
    validation draw (:mod:`fseb_ft.evaluation.certified`); ``None``: the empirical rule."""
    keep: bool = False
    """Store the threshold with the run (its ``abstention.json``, model card and ``fseb.json``):
    later calls and the model's card use it. Without it nothing the run does changes."""

    def __post_init__(self) -> None:
        given = {
            name: value
            for name, value in (
                ("coverage", self.coverage),
                ("max_risk", self.max_risk),
                ("threshold", self.threshold),
            )
            if value is not None
        }
        if len(given) > 1:
            raise ValueError(f"give at most one of coverage, max_risk and threshold, got {given}")
        if self.confidence is not None and self.max_risk is None:
            raise ValueError(
                f"confidence certifies a max_risk: give max_risk too (confidence={self.confidence})"
            )
        for name, value in (*given.items(), ("confidence", self.confidence)):
            if value is not None and (problem := out_of_range(name, value)) is not None:
                raise ValueError(f"{name} {problem}")


@dataclasses.dataclass(frozen=True)
class RowRequest:
    """What each image's row holds besides its prediction, probability and abstain flag."""

    top_k: int = 3
    """How many classes each row ranks, ≥ 1."""
    ood: str | None = None
    """The OOD score reported (:data:`~fseb_ft.recipe.options.OOD_SCORES`); a feature score
    needs the fit the model keeps (``fseb-ft evaluate RUN eval.ood_scores=[mahalanobis]``
    writes it); ``None``: the run's first score of the outputs, else entropy."""
    conformal: float | None = None
    """Add each image's conformal prediction set for this target coverage in (0, 1],
    calibrated on the run's validation split; ``None``: no sets."""
    conformal_method: str = "lac"
    """The sets' score: ``lac``, ``aps`` or ``raps``."""
    class_conditional: bool = False
    """One conformal quantile per class: the coverage holds for each class."""

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.ood is not None and self.ood not in OOD_SCORES:
            raise ValueError(f"ood score must be one of {list(OOD_SCORES)}, got {self.ood!r}")
        check_conformal(self.conformal, self.conformal_method)


@dataclasses.dataclass(frozen=True)
class OutputRequest:
    """Where the rows are written; nothing is written without ``out``."""

    out: str | Path | None = None
    """The rows' file (``.csv`` or ``.jsonl``), with ``<stem>.meta.json`` beside it."""
    fmt: str | None = None
    """``csv`` or ``jsonl``; ``None``: by the extension of ``out`` (csv without ``out``)."""

    def __post_init__(self) -> None:
        output_format(self.out, self.fmt)  # refuses a format it cannot tell, naming it

    @property
    def format(self) -> str:
        """The format the rows are written (or printed) in."""
        return output_format(self.out, self.fmt)


_SECTIONS: dict[str, type] = {
    "load": LoadRequest,
    "rule": RuleRequest,
    "rows": RowRequest,
    "output": OutputRequest,
}
""":class:`PredictRequest`'s sections, by field name."""


@dataclasses.dataclass(frozen=True)
class PredictRequest:
    """One prediction call's options, in sections; each internal step takes the section it
    needs."""

    load: LoadRequest = LoadRequest()
    """What to load and where to run it."""
    rule: RuleRequest = RuleRequest()
    """The abstention rule."""
    rows: RowRequest = RowRequest()
    """What each row holds."""
    output: OutputRequest = OutputRequest()
    """Where the rows go."""

    def __post_init__(self) -> None:
        for name, section in _SECTIONS.items():
            if not isinstance(getattr(self, name), section):
                raise TypeError(
                    f"{name} must be a {section.__name__}, got {type(getattr(self, name)).__name__}"
                )

    def replaced(self, **options: Any) -> PredictRequest:
        """This request with ``options`` replacing its own: a section by its name (``rule=
        RuleRequest(coverage=0.9)``), a field by its name (``coverage=0.9``, ``top_k=5``: the
        keyword arguments of ``fseb_ft.predict_images``), fields after sections.

        Raises:
            TypeError: an option that is neither a section nor a field of one.
            ValueError: a value a section refuses (see each section).
        """
        sections = {name: options.pop(name) for name in _SECTIONS if name in options}
        fields = {
            name: {f.name for f in dataclasses.fields(section)}
            for name, section in _SECTIONS.items()
        }
        unknown = sorted(set(options) - set().union(*fields.values()))
        if unknown:
            allowed = sorted([*_SECTIONS, *set().union(*fields.values())])
            raise TypeError(f"unknown prediction option(s) {unknown}: choose from {allowed}")
        request = dataclasses.replace(self, **sections)
        for name, names in fields.items():
            changed = {key: value for key, value in options.items() if key in names}
            if changed:
                request = dataclasses.replace(
                    request, **{name: dataclasses.replace(getattr(request, name), **changed)}
                )
        return request
