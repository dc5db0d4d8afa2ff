"""Task metrics (fseb_ft.evaluation.task_metrics): scikit-learn's numbers on random inputs, one
hand-worked case each, the sensitivity-at-specificity convention on ties; the recipe's
``eval.metrics``, selection on them, their place in results.json, the tables, the card and the
confusion figure."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from sklearn import metrics as skm
from torch import Tensor

from fseb_ft import cli
from fseb_ft.engine.loop import _improved
from fseb_ft.evaluation.metrics import (
    METRIC_REGISTRY,
    classification_metrics,
    higher_is_better,
    sensitivity_at_specificity,
)
from fseb_ft.finetune import run
from fseb_ft.recipe import ConfigError, options, recipe_from_dict
from fseb_ft.runs.confusion import confusion_plot
from fseb_ft.runs.tables import markdown_table
from tests.helpers import image_folders, skip_figures, tiny_recipe

TASK = list(options.TASK_METRICS)


def _random(k: int, seed: int, n: int = 300) -> tuple[Tensor, Tensor]:
    """float64 log-probabilities (N, K), some rows repeated (tied scores), and labels holding
    every class."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g, dtype=torch.float64) * 2  # (n, k)
    logits[: n // 5] = logits[n // 5 : 2 * (n // 5)]  # ties
    labels = torch.randint(0, k, (n,), generator=g)  # (n,)
    labels[:k] = torch.arange(k)  # every class labelled
    return torch.log_softmax(logits, -1), labels


def _brute_force_sensitivity(scores: np.ndarray, labels: np.ndarray, percent: int) -> float:
    """The convention written out: every distinct score (and +∞) as a threshold, positive when
    score ≥ threshold, the best sensitivity where TN / N_neg ≥ percent / 100."""
    pos, neg = labels == 1, labels == 0
    best = 0.0
    for t in np.unique(scores):
        called = scores >= t
        if 100 * int((~called & neg).sum()) >= percent * int(neg.sum()):
            best = max(best, float((called & pos).sum() / pos.sum()))
    return best


@pytest.mark.parametrize("k", [2, 3, 5])
def test_each_task_metric_is_scikit_learns_on_random_inputs(k: int) -> None:
    log_probs, labels = _random(k, seed=k)
    got = classification_metrics(log_probs, labels, TASK)
    y, probs = labels.numpy(), log_probs.exp().numpy()
    predicted = probs.argmax(-1)
    want = {
        "qwk": skm.cohen_kappa_score(y, predicted, weights="quadratic", labels=np.arange(k)),
        "balanced_accuracy": skm.balanced_accuracy_score(y, predicted),
        "macro_f1": skm.f1_score(y, predicted, average="macro"),
        "per_class_recall": skm.recall_score(y, predicted, labels=np.arange(k), average=None),
    }
    if k == 2:
        score = log_probs[:, 1].numpy()
        want["roc_auc"] = skm.roc_auc_score(y, score)
        want["average_precision"] = skm.average_precision_score(y, score)
        for percent in (90, 95):
            name = f"sensitivity_at_{percent}_specificity"
            want[name] = _brute_force_sensitivity(score, y, percent)
        assert got["roc_auc"].item() == pytest.approx(got["auroc_positive"].item(), rel=1e-12)
    else:
        want["roc_auc"] = skm.roc_auc_score(y, probs, multi_class="ovr", average="macro")
        want["average_precision"] = skm.average_precision_score(y, probs, average="macro")
    assert list(got)[-len(want) :] == [n for n in TASK if n in want]  # after the bundle, in order
    for name, value in want.items():
        assert got[name].dtype == torch.float64, name
        assert got[name].numpy() == pytest.approx(np.asarray(value), rel=1e-12, abs=1e-15), name
        assert higher_is_better(name), name


def _one_hot_log_probs(predicted: list[int], k: int) -> Tensor:
    """Log-probabilities whose arg-max is ``predicted``: 0.1 everywhere, 0.1 + 0.7 there."""
    probs = torch.full((len(predicted), k), 0.1, dtype=torch.float64)
    probs[torch.arange(len(predicted)), predicted] += 0.7
    return probs.log()


def test_the_class_metrics_on_a_hand_worked_case() -> None:
    # labels [0, 0, 1, 2, 2], predicted [0, 1, 1, 2, 0]. Confusion O (true by row):
    # [[1, 1, 0], [0, 1, 0], [1, 0, 1]]; row sums a = [2, 1, 2], column sums b = [2, 2, 1].
    # Recall 1/2, 1, 1/2: balanced accuracy 2/3. Precision 1/2, 1/2, 1: F1 1/2, 2/3, 2/3, macro
    # 11/18. QWK with w_ij = (i - j)²: Σ w O = 1·1 + 4·1 = 5; Σ w a_i b_j / N = (12 + 3 + 20) / 5
    # = 7 (rows 0, 1, 2: 1·2·2 + 4·2·1, 1·1·2 + 1·1·1, 4·2·2 + 1·2·2); κ = 1 - 5/7 = 2/7.
    labels = torch.tensor([0, 0, 1, 2, 2])
    got = classification_metrics(_one_hot_log_probs([0, 1, 1, 2, 0], 3), labels, TASK)
    assert got["qwk"].item() == pytest.approx(2 / 7)
    assert got["balanced_accuracy"].item() == pytest.approx(2 / 3)
    assert got["macro_f1"].item() == pytest.approx(11 / 18)
    assert got["per_class_recall"].tolist() == pytest.approx([0.5, 1.0, 0.5])
    assert "sensitivity_at_95_specificity" not in got  # two classes only


def test_the_ranking_metrics_on_a_hand_worked_case() -> None:
    # Positives score 0.9 and 0.3, negatives 0.6, 0.4, 0.1. AUROC: 0.9 beats all 3 negatives,
    # 0.3 beats 1: 4/6. Average precision, descending 0.9+ 0.6- 0.4- 0.3+ 0.1-: recall steps of
    # 1/2 at precision 1/1 and 2/4: 1/2 + 1/4 = 3/4.
    p1 = torch.tensor([0.9, 0.3, 0.6, 0.4, 0.1], dtype=torch.float64)
    labels = torch.tensor([1, 1, 0, 0, 0])
    got = classification_metrics(torch.stack([1 - p1, p1], 1).log(), labels, TASK)
    assert got["roc_auc"].item() == pytest.approx(2 / 3)
    assert got["average_precision"].item() == pytest.approx(3 / 4)


def test_sensitivity_at_specificity_calls_tied_scores_together() -> None:
    # 10 negatives: eight at 0.1, one at 0.5, one at 0.8; 5 positives: 0.8, 0.8, 0.6, 0.5, 0.2.
    # Threshold 0.8 calls the two positives and the tied negative at 0.8: TP 2, FP 1, spec 9/10.
    # 0.6: TP 3, FP 1, spec 9/10 → sensitivity 3/5 at 90 %. 0.5: FP 2, spec 8/10, too low for
    # 90 %; at 80 %, 0.2 calls every positive (TP 5) and still the same 2 negatives → 1.
    # 95 % allows no false positive, and the negative at 0.8 comes with the best positives: only
    # +∞ (nothing called) qualifies → 0, though breaking the tie for the positives would claim
    # 2/5 at 100 %.
    scores = torch.tensor([0.1] * 8 + [0.5, 0.8] + [0.8, 0.8, 0.6, 0.5, 0.2], dtype=torch.float64)
    labels = torch.tensor([0] * 10 + [1] * 5)
    assert sensitivity_at_specificity(scores, labels, 90).item() == pytest.approx(0.6)
    assert sensitivity_at_specificity(scores, labels, 95).item() == 0.0
    assert sensitivity_at_specificity(scores, labels, 80).item() == 1.0
    # The same through the registry: label 1's log-probability ranks as its score.
    log_probs = torch.stack([1 - scores, scores], 1).log()
    got = classification_metrics(log_probs, labels, TASK)
    assert got["sensitivity_at_90_specificity"].item() == pytest.approx(0.6)
    assert got["sensitivity_at_95_specificity"].item() == 0.0


def test_undefined_is_nan_and_says_nothing() -> None:
    log_probs, _ = _random(3, seed=7, n=12)
    no_class_2 = torch.tensor([0, 1] * 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a validation split would warn every epoch
        got = classification_metrics(log_probs, no_class_2, TASK)
        binary = classification_metrics(log_probs[:, :2].log_softmax(-1), no_class_2 * 0, TASK)
        sure = torch.tensor([[0.0, -9.0]] * 4)  # one class in labels and predictions (a group)
        one_class = classification_metrics(sure, torch.zeros(4, dtype=torch.long), TASK)
    assert one_class["balanced_accuracy"] == 1.0
    assert math.isnan(got["roc_auc"]) and math.isnan(got["average_precision"])
    assert math.isnan(got["per_class_recall"][2]) and not math.isnan(got["per_class_recall"][0])
    for name in ("roc_auc", "sensitivity_at_90_specificity", "sensitivity_at_95_specificity"):
        assert math.isnan(binary[name]), name
    with pytest.raises(ValueError, match=r"unknown task metrics \['nll'\]"):
        classification_metrics(log_probs, no_class_2, ["nll"])


def test_the_option_lists_are_the_registry() -> None:
    task = [name for name, m in METRIC_REGISTRY.items() if m.task]
    assert task == TASK
    assert [n for n in task if not METRIC_REGISTRY[n].applies_to(3)] == list(
        options.BINARY_TASK_METRICS
    )
    assert all(METRIC_REGISTRY[n].applies_to(2) for n in task)
    assert [n for n in task if METRIC_REGISTRY[n].per_class] == list(options.PER_CLASS_METRICS)
    assert set(options.SELECT_METRICS) <= set(METRIC_REGISTRY)
    assert not {n for n in options.SELECT_METRICS if METRIC_REGISTRY[n].per_class}
    assert set(TASK) - set(options.PER_CLASS_METRICS) <= set(options.SELECT_METRICS)


def _digits(**sections: dict) -> dict:
    return {"data": {"train": {"source": "sklearn_digits", "split": "train"}}, **sections}


def test_the_recipe_names_task_metrics_and_refuses_what_cannot_apply() -> None:
    recipe = recipe_from_dict(
        _digits(eval={"metrics": ["qwk", "per_class_recall", "qwk"]}, sweep={"metric": "qwk"})
    )
    assert recipe.eval.metrics == ("qwk", "per_class_recall") and recipe.sweep.metric == "qwk"
    assert recipe_from_dict(_digits()).eval.metrics == ()  # reports as before
    with pytest.raises(ConfigError, match=r"^eval.metrics.*'kappa'.*allowed values"):
        recipe_from_dict(_digits(eval={"metrics": ["kappa"]}))
    with pytest.raises(ConfigError, match=r"^train.select_metric='per_class_recall': allowed"):
        recipe_from_dict(_digits(train={"select_metric": "per_class_recall"}))
    # The class count is known from model.num_classes or data.train.classes: checked at load.
    sens = "sensitivity_at_95_specificity"
    with pytest.raises(ConfigError) as err:
        recipe_from_dict(_digits(model={"num_classes": 10}, eval={"metrics": ["qwk", sens]}))
    message = str(err.value)
    assert message.startswith("eval.metrics=['qwk', 'sensitivity_at_95_specificity']: ")
    assert "need two classes" in message and "10 (model.num_classes)" in message
    three = {"source": "sklearn_digits", "split": "train", "classes": [0, 1, 2]}
    with pytest.raises(ConfigError, match=r"^train.select_metric='sensitivity_at_90_specif"):
        recipe_from_dict(
            {"data": {"train": three}, "train": {"select_metric": sens.replace("95", "90")}}
        )
    two = {**three, "classes": [3, 8]}
    assert recipe_from_dict({"data": {"train": two}, "eval": {"metrics": [sens]}})


def test_a_nan_validation_value_never_beats_a_number() -> None:
    nan = math.nan
    assert _improved("qwk", nan, None) and _improved("qwk", 0.1, nan)
    assert not _improved("qwk", nan, 0.1) and not _improved("qwk", nan, nan)
    assert _improved("nll", 0.2, nan) and not _improved("nll", nan, 0.2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_folders(
        tmp_path_factory.mktemp("data"),
        {"cat": 12, "dog": 12, "fox": 12},
        {"cat": 5, "dog": 4, "fox": 4},
        owls=3,
    )


def test_a_run_selects_on_qwk_and_reports_its_task_metrics(
    folders: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    recipe = tiny_recipe(folders, out, epochs=2)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    recipe["train"]["select_metric"] = "qwk"
    sens = "sensitivity_at_95_specificity"  # two classes only: this run has three
    recipe["eval"]["metrics"] = ["qwk", "macro_f1", "per_class_recall", sens]
    with caplog.at_level(logging.WARNING, logger="fseb_ft"):
        results = run(recipe_from_dict(recipe))
    assert f"eval.metrics: leaving out {sens}, defined for two classes only" in caplog.text

    history = results["training"]["history"]
    qwk = [epoch["val_qwk"] for epoch in history]
    assert "val_macro_f1" in history[0] and "val_per_class_recall" not in history[0]
    best = results["training"]["best_epoch"]
    assert results["training"]["best_val_qwk"] == qwk[best - 1] == max(qwk)
    assert qwk.index(max(qwk)) == best - 1  # the first epoch with the best value

    saved = json.loads((out / "results.json").read_text())
    test = saved["test"]
    assert {"qwk", "macro_f1", "per_class_recall"} <= set(test) and sens not in test
    assert list(test)[-4:] == ["qwk", "macro_f1", "per_class_recall", "n"]
    assert len(test["per_class_recall"]) == 3
    table = (out / "results.md").read_text()
    assert "| QWK | Macro-F1 (%) |" in table
    assert "Recall (%) per class:" in table and "| cat |" in table and "| fox |" in table
    with Image.open(out / "confusion.png") as image:
        assert image.format == "PNG"
    card = (out / "model" / "README.md").read_text()
    assert "![Confusion matrix on the test split" in card and "| QWK |" in card
    assert "QWK: quadratic weighted Cohen's kappa" in card and "validation qwk" in card


def test_the_printed_per_class_table_names_the_classes(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run and its re-evaluation print the class names, as results.md has them."""
    skip_figures(monkeypatch)
    out = tmp_path / "run"
    recipe = tiny_recipe(folders, out, epochs=1)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    recipe["eval"]["metrics"] = ["per_class_recall"]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for argv in ([str(path)], ["evaluate", str(out)]):
        cli.main(argv)
        printed = capsys.readouterr().out
        assert "Recall (%) per class:" in printed, argv
        assert "| cat |" in printed and "| fox |" in printed and "| 0 |" not in printed, argv


def test_a_run_selecting_on_a_two_class_metric_with_three_stops_first(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    recipe = tiny_recipe(folders, tmp_path / "run")
    recipe["train"]["select_metric"] = "roc_auc"  # defined for any class count: accepted
    assert recipe_from_dict(recipe)
    recipe["train"]["select_metric"] = "sensitivity_at_90_specificity"
    with pytest.raises(ConfigError, match=r"^train.select_metric=.*this run has 3"):
        run(recipe_from_dict(recipe))
    assert not (tmp_path / "run").exists()


def test_the_tables_show_the_task_metrics_and_a_per_class_table() -> None:
    old = {"test": {"accuracy": 0.7, "nll": 0.5}}
    new = {"test": {**old["test"], "qwk": 0.61, "per_class_recall": [0.5, math.nan]}}
    table = markdown_table({"A": new, "B": old}, ["cat", "dog"])
    assert table.splitlines()[0].endswith("| QWK |")
    assert "| A | 70.00 | 0.5000 | – | – | – | – | – | 0.6100 |" in table
    assert table.endswith(
        "Recall (%) per class:\n\n| Class | A |\n|---|---|\n| cat | 50.00 |\n| dog | – |\n"
    )
    assert "QWK" not in markdown_table({"B": old})  # an old result reads as before


def test_a_confusion_figure_of_many_classes_is_drawn(
    tmp_path: Path,
) -> None:
    # Few classes are drawn by the run above, named and numbered; 45 are too many for either.
    log_probs, labels = _random(45, seed=2, n=200)
    path = confusion_plot(log_probs.exp(), labels, tmp_path / "wide.png", title="45 classes")
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) > 300
