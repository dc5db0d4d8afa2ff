"""Recipes: every shipped recipe validates; bad keys and values fail with a message naming them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fseb_ft.engine.loop import _trackers
from fseb_ft.engine.resume import flat_keys
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import (
    ConfigError,
    DatasetSpec,
    apply_overrides,
    dump_recipe,
    load_recipe,
    load_yaml,
    recipe_from_dict,
    recipe_tree,
)
from fseb_ft.recipe.schema import RenamedKeyWarning

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))
MINIMAL = {"data": {"train": {"source": "sklearn_digits"}}}


def test_there_are_recipes() -> None:
    assert any(p.name == "quickstart.yaml" for p in RECIPES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    recipe = load_recipe(path)
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(dump_recipe(recipe))
    assert load_recipe(resolved) == recipe
    tree, loaded = flat_keys(recipe_tree(recipe)), flat_keys(load_yaml(resolved.read_text()))
    assert list(tree.items()) == list(loaded.items())  # keys in order too


def test_overrides_reach_nested_keys_and_parse_yaml_values() -> None:
    path = RECIPES[0]
    recipe = load_recipe(
        path, ["fseb.reg_scale=0", "optim.lr=1e-3", "data.ood.extra.source=sklearn_digits"]
    )
    assert recipe.fseb.reg_scale == 0.0
    assert recipe.optim.lr == pytest.approx(1e-3)  # "1e-3" is a string to PyYAML
    assert recipe.data.ood["extra"] == DatasetSpec(source="sklearn_digits")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fseb.reg_scal=1", r"unknown key 'fseb.reg_scal'; allowed keys here: \['reg_scale'"),
        ("fseb.reg_scale=-1", r"fseb.reg_scale=-1.0: must be ≥ 0"),
        ("train.epochs=ten", r"train.epochs='ten': expected an integer"),
        ("train.epochs=0", r"train.epochs=0: must be ≥ 1"),
        ("train.mixed_precision=fp8", r"train.mixed_precision='fp8': allowed values are \['no'"),
        ("data.val_fraction=1.5", r"data.val_fraction=1.5: must be in \(0, 1\)"),
        ("data.train.source=kaggle", r"data.train.source='kaggle': allowed values"),
        ("model.pretrained=yes please", r"model.pretrained='yes please': expected true or false"),
        ("optim.lr=.nan", r"optim.lr=nan: expected a finite number"),
        ("context.kind=mixture", r"context.datasets=\(\): kind='mixture' needs"),
        ("data.mean=[0.5]", r"data.mean=\(0.5,\): must have 3 values"),
        (  # a key of several types: one line giving each type's reason
            "train.class_weights=balancd",
            r"^train.class_weights='balancd': allowed values are \['none', 'balanced'\]; or "
            r"expected a list$",
        ),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_recipe(RECIPES[0], [override])


def test_missing_sections_and_malformed_overrides() -> None:
    with pytest.raises(ConfigError, match=r"missing required key\(s\) \['data'\]"):
        recipe_from_dict({})
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        apply_overrides({}, ["fseb.reg_scale"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"fseb": 1}, ["fseb.reg_scale=1"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe("no/such/recipe.yaml")
    with pytest.raises(ConfigError, match=r"data.train.path='': required for imagefolder"):
        recipe_from_dict({"data": {"train": {"source": "imagefolder"}}})


def test_recipes_are_frozen() -> None:
    recipe = recipe_from_dict(MINIMAL)
    with pytest.raises(AttributeError):
        recipe.fseb.reg_scale = 0.0  # type: ignore[misc]


def test_yaml_no_is_the_string_no_where_allowed_and_precision_defaults_to_accelerate() -> None:
    assert recipe_from_dict(MINIMAL).train.mixed_precision is None
    recipe = load_recipe(RECIPES[0], ["train.mixed_precision=no"])
    assert recipe.train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="expected true or false"):
        load_recipe(RECIPES[0], ["train.cpu=maybe"])


def test_fsvis_old_flat_keys_load_into_its_sub_section_with_one_notice() -> None:
    old = {"method": "fsvi", "fsvi_variance": "all", "fsvi_init_std": 0.01, "reg_scale": 2.0}
    with pytest.warns(RenamedKeyWarning) as caught:
        fseb = recipe_from_dict({**MINIMAL, "fseb": old}).fseb
    assert len(caught) == 1 and str(caught[0].message) == (
        "fseb.fsvi_variance is renamed fseb.fsvi.variance, fseb.fsvi_init_std is renamed "
        "fseb.fsvi.init_std; the old names still work"
    )
    assert (fseb.fsvi.variance, fseb.fsvi.init_std, fseb.fsvi.predict_samples) == ("all", 0.01, 10)
    assert "fsvi_" not in dump_recipe(recipe_from_dict({**MINIMAL, "fseb": {"method": "fsvi"}}))
    with pytest.raises(
        ConfigError, match=r"fseb.fsvi_init_std and fseb.fsvi.init_std are the same"
    ):
        recipe_from_dict({**MINIMAL, "fseb": {"fsvi_init_std": 0.1, "fsvi": {"init_std": 0.2}}})
    with (
        pytest.warns(RenamedKeyWarning),
        pytest.raises(ConfigError, match=r"^fseb.fsvi.init_std=0"),
    ):
        recipe_from_dict(apply_overrides(MINIMAL, ["fseb.fsvi_init_std=0"]))  # an old override


def test_renamed_context_key_still_works_with_a_warning_and_never_twice() -> None:
    with pytest.warns(RenamedKeyWarning, match=r"context.corrupt is renamed context.perturb"):
        recipe = recipe_from_dict({**MINIMAL, "context": {"corrupt": False}})
    assert recipe.context.perturb is False
    assert "corrupt" not in dump_recipe(recipe).split("context:")[1].split("fseb:")[0]
    with pytest.raises(ConfigError, match=r"context.corrupt and context.perturb are the same key"):
        recipe_from_dict({**MINIMAL, "context": {"corrupt": False, "perturb": True}})


@pytest.mark.parametrize(
    ("overrides", "name", "ps_map"),
    [
        (["fseb.reg_scale=0"], "PS-MAP", True),
        (["fseb.reg_scale=1"], "FS-EB", False),
        (["fseb.reg_scale=1", "fseb.method=fsvi"], "FS-VI", False),
    ],
)
def test_the_method_is_named_once_from_reg_scale_and_method(
    overrides: list[str], name: str, ps_map: bool
) -> None:
    fseb = recipe_from_dict(apply_overrides(MINIMAL, overrides)).fseb
    assert (find_method(fseb.method).title(fseb), fseb.is_ps_map) == (name, ps_map)


def test_no_tracker_by_default_so_a_run_logs_nothing_about_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tensorboard is no dependency: as the default, every run logged that it was not installed.
    recipes = [recipe_from_dict(MINIMAL), *(load_recipe(path) for path in RECIPES)]
    assert [r.train.trackers for r in recipes] == [()] * len(recipes)
    with caplog.at_level(logging.INFO, logger="fseb_ft"):
        assert _trackers(recipes[0].train.trackers) == []
    assert caplog.records == []
    named = recipe_from_dict({**MINIMAL, "train": {"trackers": ["tensorboard", "wandb"]}})
    assert named.train.trackers == ("tensorboard", "wandb")
