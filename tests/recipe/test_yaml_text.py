"""The C-backed YAML functions give what PyYAML's pure-Python safe_load and safe_dump give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fseb_ft.recipe import (
    ConfigError,
    YAMLError,
    apply_overrides,
    dump_recipe,
    dump_yaml,
    load_yaml,
    read_recipe_file,
    recipe_from_dict,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))

# Values whose YAML spelling is easy to get wrong: booleans spelled as words, null, floats in
# exponent form, strings that look like numbers or dates, non-ASCII text, long lines, nesting.
AWKWARD = {
    "no": "no",
    "yes": True,
    "empty": "",
    "none": None,
    "exponent": 1e-5,
    "inf": float("inf"),
    "numeric string": "0123",
    "date-like": "2026-11-28",
    "colon": "a: b",
    "unicode": "Ünïcødé — ☂",
    "long": " ".join(["word"] * 40),
    "multi\nline": "first\nsecond\n",
    "nested": {"list": [1, 2.5, [3, {"k": "v"}]], "tuple-like": [[]], "map": {}},
}


def test_the_c_classes_are_used_where_pyyaml_has_libyaml() -> None:
    from fseb_ft.recipe import yaml_text

    if not yaml.__with_libyaml__:
        pytest.skip("this PyYAML was built without libyaml: the Python classes are the fallback")
    assert yaml_text._Loader is yaml.CSafeLoader
    assert yaml_text._Dumper is yaml.CSafeDumper


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_reads_and_resolves_to_the_same_text(path: Path) -> None:
    text = path.read_text()
    assert load_yaml(text) == yaml.safe_load(text)
    resolved = dump_recipe(recipe_from_dict(read_recipe_file(path)))
    python = yaml.safe_dump(yaml.safe_load(resolved), sort_keys=False)
    assert dump_yaml(load_yaml(resolved)) == python == resolved


def test_awkward_values_dump_and_load_as_the_python_classes_do() -> None:
    text = dump_yaml(AWKWARD)
    assert text == yaml.safe_dump(AWKWARD, sort_keys=False)
    assert load_yaml(text) == yaml.safe_load(text) == AWKWARD


def test_arbitrary_tags_are_refused_as_safe_load_refuses_them() -> None:
    text = "!!python/object/apply:os.system ['true']"
    with pytest.raises(YAMLError):
        load_yaml(text)
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(text)


def _where(err: BaseException) -> tuple[int, int]:
    assert isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None
    return err.problem_mark.line, err.problem_mark.column


@pytest.mark.parametrize(
    "text",
    ["data:\n  train: {source: idx\nmodel: x\n", "[1", "a: [1, 2"],
    ids=["inner", "one-line", "open"],
)
def test_a_syntax_error_is_the_python_parsers_with_its_line_and_column(text: str) -> None:
    with pytest.raises(YAMLError) as ours:
        load_yaml(text)
    with pytest.raises(yaml.YAMLError) as python:
        yaml.safe_load(text)
    assert str(ours.value) == str(python.value)
    assert _where(ours.value) == _where(python.value)


def test_an_override_that_is_not_yaml_names_where_in_its_value() -> None:
    with pytest.raises(ConfigError, match=r"not valid YAML at line 1, column 3: expected ','"):
        apply_overrides({}, ["train.epochs=[1"])
