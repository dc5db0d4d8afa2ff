"""Post-hoc evaluation in a tiny run, end to end: the last-layer Laplace's results block, its
"+ LLLA" rows in every table, ``fseb-ft evaluate`` turning it off, on and to another prior; and
the conformal sets' coverage in every block, equal to a hand computation from the logits."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fseb_ft import cli
from fseb_ft.engine.reevaluate import evaluate_run_with_predictions
from fseb_ft.errors import FsebError
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.recipe.schema import ConfigError
from tests.helpers import N_OOD, N_TEST, tiny_recipe

pytestmark = pytest.mark.no_figures


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_laplace_rows_after_training_and_on_evaluate(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    recipe = tiny_recipe(folders, out, epochs=1)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    recipe["eval"] |= {
        "temperature_scaling": True,
        "laplace": True,
        "corruptions": ["gaussian_noise"],
        "severities": [2],
        "bootstrap": 0,
    }
    results = run(recipe_from_dict(recipe))

    assert "conformal_coverage" not in results["test"]  # eval.conformal is null by default
    block = results["laplace"]
    assert list(block)[:3] == ["hessian", "prior_method", "prior_precision"]
    assert block["hessian"] == "kron" and block["prior_method"] == "marglik"
    assert block["prior_precision"] > 0
    assert block["test"]["n"] == N_TEST and block["ood"]["owls"]["n"] == N_OOD
    assert set(block["corruptions"]["gaussian_noise"]) == {"2"}
    assert list(results)[:8] == [
        "split", "test", "ood", "corruptions", "corruption_summary", "corruption_clean",
        "temperature_scaled", "laplace",
    ]  # fmt: skip
    assert block["corruption_clean"]["n"] == N_TEST
    assert block["test"]["nll"] != results["test"]["nll"]  # the probit predictive, not the MAP
    assert _results(out)["laplace"]["prior_precision"] == block["prior_precision"]
    table = (out / "results.md").read_text()
    assert "| PS-MAP · test_byobnet + TS |" in table
    assert "| PS-MAP · test_byobnet + LLLA |" in table
    assert "| clean + LLLA |" in table and "| 2 + LLLA |" in table
    card = (out / "model" / "README.md").read_text()
    assert "| PS-MAP · test_byobnet + LLLA |" in card and "Evaluation only" in card
    front = yaml.safe_load(card.split("---")[1])
    names = [m["name"] for r in front["model-index"][0]["results"] for m in r["metrics"]]
    assert "Acc. (%), last-layer Laplace" in names
    folder_meta = json.loads((out / "model" / "fseb.json").read_text())
    assert folder_meta["results"]["laplace"]["hessian"] == "kron"

    cli.main(["evaluate", str(out), "--cpu", "eval.laplace=false"])
    assert "laplace" not in _results(out)
    assert "+ LLLA" not in (out / "results.md").read_text()

    overrides = ["eval.laplace_prior=validation", "eval.laplace_hessian=diag"]
    cli.main(["evaluate", str(out), "--cpu", *overrides])
    again = _results(out)["laplace"]
    assert again["hessian"] == "diag" and again["prior_method"] == "validation"
    assert "| PS-MAP · test_byobnet + LLLA |" in (out / "results.md").read_text()

    # Conformal sets, calibrated in each block on its own validation logits.
    conformal = ["eval.conformal=0.8", "eval.conformal_method=lac"]
    evaluated = evaluate_run_with_predictions(out, cpu=True, overrides=conformal)
    results, predictions = evaluated.results, evaluated.predictions
    t = results["temperature_scaled"]["temperature"]
    (z_val, y_val), z, y = predictions.val, predictions.test_logits, predictions.test[1]
    laplace = predictions.laplace
    assert _reported(results) == _by_hand((z_val, y_val), (z, y))
    assert _reported(results["temperature_scaled"]) == _by_hand((z_val / t, y_val), (z / t, y))
    assert _reported(results["laplace"]) == _by_hand(laplace.val, (laplace.test_logits, y))
    assert _reported(_results(out)["laplace"]) == _reported(results["laplace"])
    assert "| Cov. (%) | Set size |" in (out / "results.md").read_text()


def _by_hand(
    val: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor]
) -> list:
    """LAC at 0.8 from logits (or log-probabilities) ``val`` and ``test`` with their labels: q̂ the
    ⌈0.8 (n + 1)⌉-th smallest 1 − p_y on validation; a class is in a set when 1 − p ≤ q̂."""
    val_probs = torch.softmax(val[0].double(), -1)
    scores = (1 - val_probs.gather(1, val[1].reshape(-1, 1))).flatten().sort().values
    q = scores[math.ceil(0.8 * (len(scores) + 1)) - 1]
    sets = 1 - torch.softmax(test[0].double(), -1) <= q  # (N, K)
    covered = sets[torch.arange(len(test[1])), test[1]]
    return [covered.double().mean().item(), sets.sum(1).double().mean().item()]


def _reported(block: dict) -> list:
    return [block["test"]["conformal_coverage"], block["test"]["conformal_set_size"]]


def test_laplace_is_refused_for_fsvi(tmp_path: Path) -> None:
    recipe = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "run")
    recipe["fseb"] |= {"method": "fsvi"}
    recipe["eval"] |= {"laplace": True}
    with pytest.raises(ConfigError, match=r"eval.laplace=True: needs a MAP network"):
        recipe_from_dict(recipe)


def test_without_laplace_torch_a_run_stops_before_training(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tiny_recipe(folders, tmp_path / "run")
    recipe["eval"] |= {"laplace": True}
    monkeypatch.setitem(sys.modules, "laplace", None)  # import laplace → ImportError
    with pytest.raises(FsebError, match=r"^eval.laplace needs laplace-torch: pip install"):
        run(recipe_from_dict(recipe))
    assert not (tmp_path / "run" / "checkpoints").exists()
