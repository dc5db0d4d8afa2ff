"""A validation OOD set: its AUROC each epoch, selectable, and never the test-time OOD images."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fseb_ft.engine.callbacks import _val_ood_auroc
from fseb_ft.evaluation.metrics import higher_is_better
from fseb_ft.recipe import ConfigError, recipe_from_dict

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

DIGITS_0_4 = {"source": "sklearn_digits", "split": "test", "classes": [0, 1, 2, 3, 4]}


def _recipe(val_ood: dict, **sections: dict) -> dict:
    ood = {"source": "sklearn_digits", "split": "test", "classes": [5, 6, 7, 8, 9]}
    return {"data": {"train": DIGITS_0_4, "ood": {"far": ood}, "val_ood": val_ood}, **sections}


def test_a_validation_ood_set_must_not_be_a_test_ood_set() -> None:
    same = {"source": "sklearn_digits", "split": "test", "classes": [5, 6, 7, 8, 9]}
    # Class "9" is label 9 of the digits: a name and a label cannot be told apart unread.
    for val_ood in (
        same,
        {**same, "limit": 10},
        {**same, "classes": [9]},
        {**same, "classes": ["9"]},
    ):
        with pytest.raises(ConfigError) as err:
            recipe_from_dict(_recipe({"mine": val_ood}))
        message = str(err.value)
        assert message.startswith("data.val_ood.mine=") and "\n" not in message
        assert "the same images as the test-time OOD set data.ood.far" in message
    # Another split, or other classes of the same split: other images.
    for val_ood in ({**same, "split": "train"}, {**same, "classes": [0, 1]}):
        assert recipe_from_dict(_recipe({"mine": val_ood})).data.val_ood["mine"].source


def test_only_a_configured_validation_ood_set_can_be_selected_on() -> None:
    near = {"source": "sklearn_digits", "split": "train", "classes": [5, 6]}
    recipe = recipe_from_dict(
        _recipe({"near": near}, train={"select_metric": "ood_near_auroc"}, sweep={"metric": "ece"})
    )
    assert recipe.train.select_metric == "ood_near_auroc"
    assert higher_is_better("ood_near_auroc") and higher_is_better("accuracy")
    assert not higher_is_better("nll")
    for section, key in (("train", "select_metric"), ("sweep", "metric")):
        with pytest.raises(ConfigError) as err:
            recipe_from_dict(_recipe({"near": near}, **{section: {key: "ood_far_auroc"}}))
        message = str(err.value)
        assert message.startswith(f"{section}.{key}='ood_far_auroc': allowed values are [")
        assert "'ood_near_auroc'" in message and "\n" not in message


def test_val_ood_auroc_is_the_hand_worked_mann_whitney_value() -> None:
    # The model is the identity, so the inputs are the logits. Entropies: validation
    # {≈0 (10, 0), ln 2 (0, 0)}, OOD {ln 2 (0, 0), small (5, 0)}. Pairs (OOD, val) with the OOD
    # score higher: (ln 2, ≈0) 1, (ln 2, ln 2) ½, (small, ≈0) 1, (small, ln 2) 0 → 2.5 / 4.
    val_logits = torch.tensor([[10.0, 0.0], [0.0, 0.0]])
    ood = TensorDataset(torch.tensor([[0.0, 0.0], [5.0, 0.0]]), torch.zeros(2, dtype=torch.long))
    accelerator = Accelerator(cpu=True)
    for score in ("entropy", "msp", "max_logit", "energy"):  # the same order on these logits
        auroc = _val_ood_auroc(nn.Identity(), DataLoader(ood), accelerator, score, val_logits)
        assert math.isclose(auroc, 0.625), score
