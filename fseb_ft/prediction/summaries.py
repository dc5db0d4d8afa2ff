"""What ``fseb-ft predict`` prints: the model, the abstention threshold with how it was chosen and
its validation outcome (and guarantee, when certified), the counts, a feature OOD score, conformal
sets, notes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from fseb_ft.evaluation.abstention import AbstentionRule, Certificate, ValidationOutcome
from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY
from fseb_ft.prediction.conformal_sets import conformal_lines
from fseb_ft.prediction.rows import meta_path
from fseb_ft.recipe.options import FEATURE_OOD_SCORES

__all__ = ["summary"]

_SHOWN = 10  # files named in a note before "… and N more"


def summary(meta: Mapping[str, Any], out: str | Path | None) -> str:
    """The lines the command prints: model, threshold and its validation numbers, counts."""
    rule = AbstentionRule.from_json(meta["abstention"])
    temp = meta["temperature"]
    lines = [f"model: {meta['model']}" + ("" if temp is None else f" (temperature T = {temp:.4g})")]
    how = {
        "coverage": f"chosen on the validation split for coverage {rule.target}",
        "max_risk": f"chosen on the validation split for risk ≤ {rule.target}"
        + ("" if rule.certified is None else f" with probability ≥ {rule.certified.confidence}"),
        "threshold": "given",
    }.get(rule.criterion)
    if rule.chosen_on == "kept":
        how = f"kept with the model ({how})"
    if how is None:
        lines.append("threshold: none kept or given, so nothing abstains (give --threshold)")
    else:
        lines.append(
            f"threshold: abstain when max probability < {rule.threshold:.6g} (top-class log-odds "
            f"< {rule.log_odds_threshold:.4g}), {how}"
        )
    val = rule.validation
    if val is not None:
        risk = "n/a" if val.risk is None else f"{val.risk:.4f}"
        lines.append(
            f"validation: coverage {val.coverage:.4f} ({val.accepted}/{val.n} images), "
            f"risk {risk} (error rate among accepted)"
        )
    elif rule.criterion != "none":
        lines.append("validation: coverage and risk unknown (no validation data with this model)")
    if rule.certified is not None:
        lines.append(_guarantee(rule))
    n, abstained = meta["images"], meta["abstained"]
    lines.append(f"predicted {n} image(s): {n - abstained} accepted, {abstained} abstained")
    lines += _accuracy_lines(meta)
    if meta.get("ood_score") in FEATURE_OOD_SCORES:  # what the column holds, and its fit
        name = meta["ood_score"]
        lines.append(
            f"OOD score: ood_{name}, {OOD_SCORE_REGISTRY[name].title}, fitted on the model's "
            "training split (larger = more likely out of distribution)"
        )
    lines += conformal_lines(meta)
    lines += [f"warning: {text}" for text in meta.get("warnings", [])]
    for key, what in (
        ("unreadable", "unreadable image(s) left out"),
        ("left_out", "file(s) without an image extension left out"),
    ):
        if meta[key]:
            shown = "; ".join(meta[key][:_SHOWN])
            more = f"; … and {len(meta[key]) - _SHOWN} more" if len(meta[key]) > _SHOWN else ""
            lines.append(f"note: {len(meta[key])} {what}: {shown}{more}")
    if meta.get("kept_in"):
        lines.append(f"kept in {meta['kept_in']}: later `predict` calls and the model card use it")
    if out is not None:
        lines.append(f"written to {out} and {meta_path(out)}")
    return "\n".join(lines)


def _guarantee(rule: AbstentionRule) -> str:
    """The summary's line of a certified rule: what it guarantees and the coverage it costs."""
    # A certified rule has its certificate, its target risk and its validation outcome.
    cert = cast(Certificate, rule.certified)
    validation = cast(ValidationOutcome, rule.validation)
    cost = (
        f"validation coverage {_percent(validation.coverage)} "
        f"(empirical rule: {_percent(cert.empirical_coverage)})"
    )
    asked = (
        f"risk ≤ {_percent(cast(float, rule.target), None)} among accepted with probability ≥ "
        f"{_percent(cert.confidence, None)}"
    )
    if cert.risk_bound is None:
        return (
            f"guarantee: no threshold is certified for {asked} on the validation split, so the "
            f"model abstains on everything ({cert.method}); {cost}"
        )
    return (
        f"guarantee: {asked} ({cert.method}; bound at the threshold "
        f"{_percent(cert.risk_bound, 2)}); {cost}"
    )


def _percent(fraction: float, digits: int | None = 1) -> str:
    """``fraction`` in percent, to ``digits`` decimals (``None``: as given, 0.975 → 97.5 %)."""
    return f"{100 * fraction:.4g} %" if digits is None else f"{100 * fraction:.{digits}f} %"


def _accuracy_lines(meta: Mapping[str, Any]) -> list[str]:
    """The accuracy on a labelled dataset, over the images of classes the model knows, and how
    many images had labels it does not know (left out of it)."""
    unknown = meta.get("unknown_labels") or {"images": 0, "labels": []}
    lines = []
    if meta.get("accuracy_all") is not None:
        acc = meta.get("accuracy_accepted")
        over = (
            f" (its {meta['images'] - unknown['images']} of known classes)"
            if unknown["images"]
            else ""
        )
        lines.append(
            f"accuracy on the labelled dataset{over}: {meta['accuracy_all']:.4f} on all, "
            + ("n/a" if acc is None else f"{acc:.4f}")
            + " on the accepted"
        )
    if unknown["images"]:
        shown = ", ".join(unknown["labels"][:_SHOWN])
        more = ", …" if len(unknown["labels"]) > _SHOWN else ""
        lines.append(
            f"note: {unknown['images']} image(s) with labels the model does not know ({shown}"
            f"{more}): left out of the accuracy"
        )
    return lines
