"""The regularisers benchmark: its arms' recipes, the strength each validation NLL chooses, its
table's paired differences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import regularisers
from fseb_ft.recipe import load_recipe

pytestmark = pytest.mark.no_figures


@pytest.fixture
def cache_out(tmp_path: Path) -> Path:
    """An ``--out`` whose cache looks built: the CIFAR-10 dataset and Tiny-ImageNet extracted."""
    (tmp_path / "cache" / "tiny-imagenet" / "tiny-imagenet-200" / "val").mkdir(parents=True)
    (tmp_path / "cache" / "cifar10-disk").mkdir()
    (tmp_path / "cache" / "cifar10-disk" / "dataset_dict.json").write_text("{}")
    return tmp_path


def test_every_arm_at_every_strength_is_a_valid_recipe_on_the_same_ood_sets(
    cache_out: Path,
) -> None:
    methods = {}
    for name, arm in regularisers.ARMS.items():
        for multiple in regularisers.GRID:
            recipe = load_recipe(
                regularisers.paper_cifar10.RECIPE, regularisers.overrides(cache_out, name, multiple)
            )
            assert set(recipe.data.ood) == {"mnist", "fmnist", "tiny_imagenet"}
            assert recipe.eval.wise_ft == arm.wise and recipe.eval.temperature_scaling
            assert recipe.eval.severities == (5,) and recipe.data.seed == 0
            weight = {
                "fseb.prior_var": 1 / recipe.fseb.prior_var,
                "fseb.reg_scale": recipe.fseb.reg_scale,
            }
            assert weight[arm.strength] == pytest.approx(multiple)  # the regulariser's weight
            methods[name] = (recipe.fseb.method, recipe.fseb.reg_scale, recipe.context.kind)
    assert methods["psmap"][:2] == ("fseb", 0.0)
    assert methods["l2sp"][0] == "l2sp" and methods["feature"][0] == "feature"
    assert methods["fseb"][::2] == ("fseb", "dataset") and methods["fsvi"][::2] == (
        "fsvi",
        "dataset",
    )


def _write(out: Path, name: str, multiple: float, seed: int, results: dict[str, Any]) -> None:
    folder = regularisers.run_dir(out, name, multiple, seed)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))


def _results(val_nll: float, accuracy: float, seconds: float = 30.0) -> dict[str, Any]:
    block = {"test": {"accuracy": accuracy}, "ood": {}}
    training = {"best_val_nll": val_nll, "seconds": seconds, "epochs": 3}
    return {**block, "training": training, "temperature_scaled": block}


def test_the_lowest_validation_nll_chooses_and_a_run_without_results_is_passed_over(
    tmp_path: Path,
) -> None:
    assert regularisers.chosen(tmp_path, "l2sp", 0) is None  # nothing has run
    _write(tmp_path, "l2sp", 0.1, 0, _results(0.9, 0.5))
    _write(tmp_path, "l2sp", 10.0, 0, _results(0.8, 0.4))  # 1.0 diverged: no results
    assert regularisers.chosen(tmp_path, "l2sp", 0) == 10.0
    _write(tmp_path, "l2sp", 1.0, 1, _results(0.1, 0.4))  # another seed does not choose
    assert regularisers.chosen(tmp_path, "l2sp", 0) == 10.0


def test_the_table_pairs_each_arm_with_ps_map_seed_by_seed(tmp_path: Path) -> None:
    for seed, (base, l2sp) in enumerate([(0.70, 0.72), (0.74, 0.73)]):
        _write(tmp_path, "psmap", 1.0, seed, _results(0.8, base, seconds=60.0))
        _write(tmp_path, "l2sp", 10.0, seed, _results(0.7, l2sp, seconds=90.0))
    _write(tmp_path, "l2sp", 1.0, 0, _results(0.75, 0.1))  # not chosen: not in the table
    lines = regularisers.table(tmp_path, [0, 1]).splitlines()
    delta = next(line for line in lines if line.startswith("| **Δ L2-SP − PS-MAP**"))
    cells = [c.strip() for c in delta.strip("|").split("|")]
    # Accuracy: +2.00 and −1.00 points, mean +0.50 ± 1.50; seconds per epoch: +10 both seeds.
    assert cells[1:3] == ["0, 1", "+0.50 ± 1.50"] and cells[-1] == "+10 ± 0"
    ts = next(line for line in lines if line.startswith("| **Δ L2-SP + TS − PS-MAP + TS**"))
    assert "+0.50 ± 1.50" in ts
    l2sp = next(line for line in lines if line.startswith("| L2-SP |"))
    assert l2sp.split("|")[3].strip() == "72.50 ± 0.50"  # the chosen strength's seeds only
    grid = regularisers.grid_table(tmp_path, 0)
    assert "**0.7000 (prior_var 0.1)**" in grid and "0.7500 (prior_var 1)" in grid
