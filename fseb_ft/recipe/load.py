"""Recipes from YAML: loading with ``key.sub=value`` overrides, dumping, and the reference.

A recipe is validated when it is loaded: an unknown key, a value of the wrong type or one out of
range raises :class:`ConfigError` naming the dotted key, the value and what is allowed. Every
run saves its resolved recipe (:func:`dump_recipe`) so it can be re-run or re-evaluated.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fseb_ft.recipe import schema
from fseb_ft.recipe.schema import ConfigError, plain_tree, set_key
from fseb_ft.recipe.sections import Recipe
from fseb_ft.recipe.sweep import override_path
from fseb_ft.recipe.yaml_text import YAMLError, dump_yaml, load_yaml

__all__ = [
    "apply_overrides",
    "dump_recipe",
    "load_recipe",
    "main",
    "read_recipe_file",
    "recipe_from_dict",
    "recipe_tree",
    "reference_markdown",
]


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe, apply ``key.sub=value`` overrides and validate everything."""
    return recipe_from_dict(apply_overrides(read_recipe_file(path), overrides))


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """The raw nested mapping of a YAML recipe file (not yet validated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe file {str(path)!r} does not exist")
    raw = _parse_yaml(path.read_text(), f"recipe file {path}") or {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: a recipe must be a mapping of sections, got {type(raw).__name__}"
        )
    return raw


def recipe_from_dict(raw: Mapping[str, Any]) -> Recipe:
    """Validate a nested mapping (as read from YAML) into a :class:`Recipe`."""
    return schema.build(Recipe, raw)


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``a.b.c=value`` set (value parsed as YAML)."""
    out: dict[str, Any] = schema.deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        value = _parse_yaml(text, f"override {item!r}: its value") if text.strip() else None
        set_key(out, override_path(key), value)
    return out


def _parse_yaml(text: str, what: str) -> Any:
    """``text`` as YAML; a syntax error is one line naming ``what``, the line and the column."""
    try:
        return load_yaml(text)
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from err


def recipe_tree(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe as the plain nested mapping its YAML (:func:`dump_recipe`) loads to."""
    tree: dict[str, Any] = plain_tree(dataclasses.asdict(recipe))
    return tree


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML (defaults filled in), loadable by :func:`load_recipe`."""
    return dump_yaml(recipe_tree(recipe))


# The smallest valid recipe; the reference shows every default by resolving it.
_MINIMAL_RECIPE = {"data": {"train": {"source": "sklearn_digits"}}}
_REFERENCE_INTRO = """\
# Recipe reference

<!-- Generated from the dataclasses in fseb_ft/recipe/sections.py by
     `python -m fseb_ft.config --reference > docs/recipes.md`: edit the docstrings there, not
     this file. tests/docs/test_docs.py fails when the two disagree. -->

A recipe is a YAML file with the sections below; only `data.train` is required, every other key
has a default. Any key can be overridden on the command line as `section.key=value`, the value
parsed as YAML (`fseb.reg_scale=0`, `data.ood.other.source=imagefolder`,
`train.trackers=[tensorboard]`). An unknown key, a value of the wrong type or one out of range
stops the run at load with a `ConfigError` naming the dotted key, the value and what is allowed.
`null` is YAML's "none"; lists are written `[a, b]`; a number such as `1e-5` is accepted although
PyYAML reads it as a string. Every run saves its resolved recipe, defaults filled in, as
`recipe.yaml` in its run directory.
"""


def reference_markdown() -> str:
    """The recipe reference (``docs/recipes.md``) generated from the recipe dataclasses.

    One table per recipe section, one row per key (see
    :func:`fseb_ft.recipe.schema.reference_markdown`);
    the defaults of the smallest valid recipe close the page. Regenerate the file with
    ``python -m fseb_ft.config --reference > docs/recipes.md``.

    Raises:
        ValueError: a field has no docstring.
    """
    return schema.reference_markdown(Recipe, _REFERENCE_INTRO, _MINIMAL_RECIPE, dump_recipe)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fseb_ft.config``: with ``--reference``, print :func:`reference_markdown`."""
    parser = argparse.ArgumentParser(
        prog="python -m fseb_ft.config",
        description="Recipe tools. --reference prints the recipe reference (docs/recipes.md).",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="print the Markdown reference of every recipe key, generated from the dataclasses",
    )
    args = parser.parse_args(argv)
    if not args.reference:
        parser.error("nothing to do: pass --reference")
    # Bytes, so the file is UTF-8 with \n line ends whatever the console's encoding.
    sys.stdout.buffer.write(reference_markdown().encode("utf-8"))
    sys.stdout.buffer.flush()
