"""WiSE-FT (``eval.wise_ft``) in a tiny run, end to end: its results block and "+ WiSE" rows,
its weights beside the fine-tuned ones (loadable into timm's model of the folder),
``fseb-ft evaluate`` computing it again from the pretrained weights and turning it off; and the
recipe's checks of its keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file, load_model
from timm.models import save_for_hf

from fseb_ft import cli
from fseb_ft.finetune import run
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.recipe.schema import ConfigError
from tests.helpers import N_TEST, tiny_recipe

pytestmark = pytest.mark.no_figures


def _pretrained_recipe(folders: dict[str, Path], tmp_path: Path) -> dict:
    """The tiny PS-MAP recipe, started from a "pretrained" test_byobnet in a local-dir folder."""
    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_byobnet", num_classes=5), tmp_path / "start")
    recipe = tiny_recipe(folders, tmp_path / "run", epochs=1)
    recipe["model"] |= {"name": f"local-dir:{tmp_path / 'start'}", "pretrained": True}
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: no context pool, a faster run
    recipe["eval"] |= {"wise_ft": True, "wise_ft_alphas": [1.0, 0.5], "bootstrap": 0}
    return recipe


def test_wise_rows_weights_and_evaluate(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = run(recipe_from_dict(_pretrained_recipe(folders, tmp_path)))

    block = results["wise_ft"]
    assert list(block)[:3] == ["alpha", "alphas", "val_nll"]
    assert block["alphas"] == [0.5, 1.0] and block["alpha"] in block["alphas"]
    assert block["val_nll"][block["alphas"].index(block["alpha"])] == min(block["val_nll"])
    assert block["test"]["n"] == N_TEST and "owls" in block["ood"]
    assert json.loads((out / "results.json").read_text())["wise_ft"] == block
    table = (out / "results.md").read_text()
    assert "| PS-MAP · start + WiSE |" in table
    card = (out / "model" / "README.md").read_text()
    assert "| PS-MAP · start + WiSE |" in card and "wise_ft.safetensors" in card
    front = yaml.safe_load(card.split("---")[1])
    names = [m["name"] for r in front["model-index"][0]["results"] for m in r["metrics"]]
    assert "Acc. (%), WiSE-FT" in names

    # The kept weights load into timm's model of the folder; the head is the fine-tuned one.
    model = timm.create_model(f"local-dir:{out / 'model'}", pretrained=True)
    fine_tuned = load_file(str(out / "model" / "model.safetensors"))
    wise = load_file(str(out / "model" / "wise_ft.safetensors"))
    assert set(wise) == set(fine_tuned)
    assert all(torch.equal(wise[k], fine_tuned[k]) for k in wise if k.startswith("head."))
    load_model(model, str(out / "model" / "wise_ft.safetensors"))
    assert (block["alpha"] == 1.0) == all(torch.equal(wise[k], fine_tuned[k]) for k in wise)

    # Re-evaluated, φ0 is created again from model.name: the same choice on the same images.
    (out / "model" / "wise_ft.safetensors").unlink()
    cli.main(["evaluate", str(out), "--cpu"])
    again = json.loads((out / "results.json").read_text())["wise_ft"]
    assert again["alpha"] == block["alpha"]
    assert again["val_nll"] == pytest.approx(block["val_nll"], rel=1e-9)
    assert (out / "model" / "wise_ft.safetensors").is_file()

    cli.main(["evaluate", str(out), "--cpu", "eval.wise_ft=false"])
    assert "wise_ft" not in json.loads((out / "results.json").read_text())
    assert "+ WiSE" not in (out / "results.md").read_text()
    assert not (out / "model" / "wise_ft.safetensors").exists()


def test_wise_ft_needs_a_pretrained_start_and_alphas_in_0_1(tmp_path: Path) -> None:
    recipe = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "run")
    recipe["eval"] |= {"wise_ft": True}
    with pytest.raises(ConfigError, match=r"eval.wise_ft=True: needs model.pretrained=true"):
        recipe_from_dict(recipe)
    recipe["eval"] = {"wise_ft_alphas": [0.5, 1.5]}
    with pytest.raises(ConfigError, match=r"wise_ft_alphas=\(0.5, 1.5\): must be a non-empty"):
        recipe_from_dict(recipe)
    recipe["eval"] = {"wise_ft_alphas": [1.0, 0.5, 1.0]}
    assert recipe_from_dict(recipe).eval.wise_ft_alphas == (0.5, 1.0)
