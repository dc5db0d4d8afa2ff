"""The in-distribution metric registry (fseb_ft.evaluation.metric_registry): a metric is one
function and its decorator; the bundle, the tables and the metric directions all read it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from fseb_ft.evaluation import metrics as M
from fseb_ft.evaluation.metrics import (
    METRIC_REGISTRY,
    classification_metrics,
    higher_is_better,
    metric,
)
from fseb_ft.recipe import val_ood_metric
from fseb_ft.recipe.options import SELECT_METRICS
from fseb_ft.runs.tables import corruption_markdown, markdown_table


def _inputs(k: int, seed: int, n: int = 200) -> tuple[Tensor, Tensor]:
    """Fixed float64 log-probabilities (with ties in confidence) and labels."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g, dtype=torch.float64) * 3  # (n, k)
    logits[: n // 4] = logits[n // 4 : 2 * (n // 4)]  # repeated rows: tied confidences
    labels = torch.randint(0, k, (n,), generator=g)  # (n,)
    return torch.log_softmax(logits, -1), labels


def _by_hand(log_probs: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """The bundle as it was written out before the registry, from the individual functions."""
    probs = log_probs.exp()  # float64 already
    correct = probs.argmax(-1) == labels
    scores = M.confidence_scores(probs)
    by_max = M.selective_prediction(scores["max_prob"], correct)
    by_entropy = M.selective_prediction(scores["neg_entropy"], correct)
    want = {
        "accuracy": M.accuracy(probs, labels),
        "nll": M.nll(log_probs, labels),
        "brier": M.brier(probs, labels),
        "ece": M.ece(probs, labels, n_bins=15),
        "ece_10bin": M.ece(probs, labels, n_bins=10),
        "sel_pred_auc": by_max["sel_pred_auc"],
        "aurc": by_max["aurc"],
        "sel_pred_auc_entropy": by_entropy["sel_pred_auc"],
        "aurc_entropy": by_entropy["aurc"],
    }
    if probs.shape[1] == 2:
        want["auroc_positive"] = M.binary_auroc(log_probs[:, 1], labels)
    return want


@pytest.mark.parametrize("k", [2, 3, 10])
def test_the_bundle_has_the_same_keys_order_and_bits_as_the_individual_functions(k: int) -> None:
    log_probs, labels = _inputs(k, seed=k)
    got, want = classification_metrics(log_probs, labels), _by_hand(log_probs, labels)
    # A metric registered later comes after these (test_metrics pins the whole key set).
    assert list(got)[: len(want)] == list(want)
    for key in want:
        assert got[key].dtype == torch.float64 and got[key].ndim == 0, key
        assert torch.equal(got[key], want[key]), key


def test_a_binary_task_with_one_class_reports_a_nan_positive_auroc() -> None:
    log_probs, _ = _inputs(2, seed=0)
    got = classification_metrics(log_probs, torch.ones(log_probs.shape[0], dtype=torch.long))
    assert math.isnan(got["auroc_positive"].item())


def test_each_selective_curve_is_computed_once_per_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = M.selective_prediction

    def counted(confidence: Tensor, correct: Tensor) -> dict[str, Tensor]:
        calls.append(1)
        return original(confidence, correct)

    monkeypatch.setattr(M, "selective_prediction", counted)
    classification_metrics(*_inputs(3, seed=1))
    assert len(calls) == 2  # max probability and negative entropy, shared by four metrics


def test_a_registered_metric_joins_the_bundle_last_where_it_applies(fake_metric: str) -> None:
    log_probs, labels = _inputs(3, seed=4)
    got = classification_metrics(log_probs, labels)
    assert list(got)[-1] == fake_metric
    assert got[fake_metric].item() == (log_probs.argmax(-1) == 0).double().mean().item()
    assert fake_metric not in classification_metrics(*_inputs(2, seed=4))
    assert higher_is_better(fake_metric)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"title": "", "higher_is_better": True}, r"'x' needs a non-empty `title`"),
        ({"title": "X", "higher_is_better": True, "scale": 0.0}, r"'x' needs a positive `scale`"),
    ],
)
def test_a_metric_without_title_or_scale_fails_at_registration(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        metric("x", **kwargs)
    assert "x" not in METRIC_REGISTRY


def test_a_name_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"metric 'nll' is already registered"):
        metric("nll", title="NLL again", higher_is_better=False)
    assert METRIC_REGISTRY["nll"].title == "NLL"


def test_every_registered_metric_has_a_title_and_every_selectable_one_is_registered() -> None:
    assert all(m.title.strip() and m.scale > 0 for m in METRIC_REGISTRY.values())
    assert set(SELECT_METRICS) <= set(METRIC_REGISTRY)


def test_directions_of_the_validation_metrics() -> None:
    assert {name: higher_is_better(name) for name in SELECT_METRICS} == {
        "nll": False,
        "accuracy": True,
        "ece": False,
        "brier": False,
        "qwk": True,
        "balanced_accuracy": True,
        "macro_f1": True,
        "roc_auc": True,
        "average_precision": True,
        "sensitivity_at_90_specificity": True,
        "sensitivity_at_95_specificity": True,
    }
    assert higher_is_better("sel_pred_auc") and not higher_is_better("aurc")
    assert higher_is_better(val_ood_metric("near"))  # a data.val_ood set's AUROC
    with pytest.raises(
        ValueError, match=r"unknown metric 'acuracy': registered are \[.*'accuracy', 'nll'"
    ):
        higher_is_better("acuracy")


_RESULTS = {
    "test": {
        "accuracy": 0.9,
        "nll": 0.3,
        "ece": 0.05,
        "ece_10bin": 0.04,
        "brier": 0.2,
        "sel_pred_auc": 0.95,
        "aurc": 0.05,
        "auroc_positive": 0.88,
    },
    "corruptions": {
        "fog": {"1": {"accuracy": 0.8, "nll": 0.5, "ece": 0.1, "sel_pred_auc": 0.9, "n": 10}}
    },
}
_OLD_RUN = {"test": {"accuracy": 0.7, "nll": math.nan, "ece": 0.05, "brier": 0.2}}


def test_tables_take_titles_and_scales_from_the_registry_and_read_as_before() -> None:
    assert markdown_table({"A": _RESULTS, "B": _OLD_RUN}) == (
        "| Method | Acc. (%) | NLL | ECE (%) | ECE-10 (%) | Brier | Sel. Pred. (%) | AURC (%) "
        "| AUROC pos. (%) |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        "| A | 90.00 | 0.3000 | 5.00 | 4.00 | 0.2000 | 95.00 | 5.00 | 88.00 |\n"
        "| B | 70.00 | – | 5.00 | – | 0.2000 | – | – | – |\n"
    )
    # A binary task naming roc_auc shows that AUROC once, under the name it asked for.
    binary = {"test": {**_RESULTS["test"], "roc_auc": 0.88}}
    header = markdown_table({"A": binary}).splitlines()[0]
    assert header.endswith("| AURC (%) | ROC-AUC (%) |") and "AUROC pos." not in header
    # Without a binary result the AUROC pos. column (applies to K = 2 only) is left out.
    assert markdown_table({"B": _OLD_RUN}).splitlines()[0] == (
        "| Method | Acc. (%) | NLL | ECE (%) | ECE-10 (%) | Brier | Sel. Pred. (%) | AURC (%) |"
    )
    assert corruption_markdown(_RESULTS) == (
        "## Covariate shift: corrupted test split\n\n"
        "Mean over 1 corruption(s): fog.\n\n"
        "| Severity | Acc. (%) | NLL | ECE (%) | Sel. Pred. (%) |\n"
        "|---|---|---|---|---|\n"
        "| clean | 90.00 | 0.3000 | 5.00 | 95.00 |\n"
        "| 1 | 80.00 | 0.5000 | 10.00 | 90.00 |\n"
        "| all severities | 80.00 | 0.5000 | 10.00 | 90.00 |\n\n"
        "Acc. (%) / ECE (%) per corruption and severity:\n\n"
        "| Corruption | 1 |\n"
        "|---|---|\n"
        "| fog | 80.00 / 10.00 |\n"
    )
