"""OOD score columns and temperature-scaled rows of the results and their tables (no training)."""

from __future__ import annotations

import pytest
import torch

from fseb_ft.evaluation.conformal import ConformalTarget, conformal_coverage
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.evaluation.temperature import (
    TEMPERATURE_RANGE,
    fit_temperature,
    temperature_identified,
)
from fseb_ft.runs.report import eval_results
from fseb_ft.runs.tables import markdown_table

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def _predictions(with_logits: bool = True, with_val: bool = False) -> Predictions:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, 3, generator=g) * 4  # (N, K) over-confident logits
    labels = torch.randint(0, 3, (40,), generator=g)
    z_ood = torch.randn(20, 3, generator=g)  # (N_o, K)
    val = (torch.randn(30, 3, generator=g) * 4, torch.randint(0, 3, (30,), generator=g))
    return Predictions(
        test=(torch.log_softmax(z, -1), labels),
        ood={"owls": torch.log_softmax(z_ood, -1)},
        test_logits=z if with_logits else None,
        ood_logits={"owls": z_ood} if with_logits else {},
        val=val if with_val else None,
    )


def test_default_keeps_the_entropy_keys_and_the_table_titles() -> None:
    results = eval_results(_predictions())
    assert set(results["ood"]["owls"]) == {"entropy_auroc", "entropy_aupr", "entropy_fpr95", "n"}
    assert "temperature_scaled" not in results
    header = markdown_table({"FS-EB": results}).splitlines()[0]
    assert header.endswith("| owls AUROC (%) | owls AUPR (%) | owls FPR95 (%) |")


def test_chosen_scores_are_columns_named_by_score_and_absent_without_logits() -> None:
    scores = ("msp", "energy", "max_logit")
    single = eval_results(_predictions(), scores)
    ensemble = eval_results(_predictions(with_logits=False), scores)
    assert {"msp_auroc", "energy_auroc", "max_logit_fpr95"} <= set(single["ood"]["owls"])
    assert set(ensemble["ood"]["owls"]) == {"msp_auroc", "msp_aupr", "msp_fpr95", "n"}
    lines = markdown_table({"one": single, "ensemble": ensemble}).splitlines()
    header = lines[0].split(" | ")
    # Options order, not the order asked for; each score has AUROC, AUPR and FPR95.
    ood_titles = [t.strip(" |") for t in header if t.startswith("owls")]
    assert ood_titles[::3] == ["owls msp AUROC (%)", "owls max_logit AUROC (%)",
                               "owls energy AUROC (%)"]  # fmt: skip
    ensemble_cells = lines[3].split(" | ")
    assert ensemble_cells[-6:] == ["–"] * 5 + ["– |"]


def test_temperature_scaled_block_and_row() -> None:
    preds = _predictions(with_val=True)
    results = eval_results(preds, ("entropy", "energy"))
    ts = results["temperature_scaled"]
    assert ts["temperature"] == pytest.approx(float(fit_temperature(*preds.val)))
    assert ts["temperature"] > 1  # the logits were made over-confident
    assert ts["test"]["accuracy"] == results["test"]["accuracy"]
    assert ts["test"]["nll"] != results["test"]["nll"]
    assert {"entropy_auroc", "energy_auroc"} <= set(ts["ood"]["owls"])
    assert list(results)[:4] == ["split", "test", "ood", "temperature_scaled"]
    rows = [line.split(" | ")[0] for line in markdown_table({"PS-MAP": results}).splitlines()]
    assert rows[2:] == ["| PS-MAP", "| PS-MAP + TS"]


def test_a_perfectly_predicted_validation_split_leaves_temperature_scaling_off() -> None:
    preds = _predictions(with_val=True)
    val_labels = torch.tensor([0, 1, 2] * 10)  # (30,)
    separated = torch.nn.functional.one_hot(val_labels, 3).double() * 6.0 - 3.0  # all correct
    preds.val = (separated, val_labels)
    fitted = float(fit_temperature(*preds.val))
    assert fitted == pytest.approx(TEMPERATURE_RANGE[0], rel=1e-6)  # ran into the lower end
    assert not temperature_identified(fitted) and temperature_identified(1.0)
    results = eval_results(preds, ("entropy",))
    ts = results["temperature_scaled"]
    assert ts["temperature"] == 1.0 and ts["fitted_temperature"] == pytest.approx(fitted)
    assert "validation predicted perfectly" in ts["note"]
    assert ts["test"]["nll"] == pytest.approx(results["test"]["nll"])  # the raw outputs


def test_conformal_coverage_in_each_block_on_its_own_validation_logits() -> None:
    preds = _predictions(with_val=True)
    target = ConformalTarget(0.8, "aps")
    results = eval_results(preds, temperature_scaling=True, conformal=target)

    def by_hand(val_logits: torch.Tensor, test_logits: torch.Tensor) -> dict[str, float]:
        val_probs = torch.softmax(val_logits.double(), -1)
        test_probs = torch.softmax(test_logits.double(), -1)
        return conformal_coverage(val_probs, preds.val[1], test_probs, preds.test[1], target)

    def reported(block: dict) -> dict[str, float]:
        return {k: block["test"][k] for k in ("conformal_coverage", "conformal_set_size")}

    z, (z_val, _) = preds.test_logits, preds.val
    assert reported(results) == by_hand(z_val, z)
    t = results["temperature_scaled"]["temperature"]
    assert reported(results["temperature_scaled"]) == by_hand(z_val / t, z / t)
    assert by_hand(z_val / t, z / t) != by_hand(z_val, z)  # T moved the sets: a real check
    header, _, plain = markdown_table({"PS-MAP": results}).splitlines()[:3]
    assert "| Cov. (%) | Set size |" in header
    shown = plain.split(" | ")[header.split(" | ").index("Cov. (%)")]
    assert shown == f"{results['test']['conformal_coverage'] * 100:.2f}"
    # Off: neither the keys nor the columns, and validation logits alone fit no temperature.
    off = eval_results(preds, temperature_scaling=False)
    assert "conformal_coverage" not in off["test"] and "temperature_scaled" not in off
    assert "Cov. (%)" not in markdown_table({"PS-MAP": off})
