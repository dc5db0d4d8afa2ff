"""Build a recipe's resized-image cache ahead of training: the ``fseb-ft cache`` command.

    fseb-ft cache RECIPE.yaml [section.key=value ...] [--workers N]
    fseb-ft cache recipes/aptos.yaml data.cache.size=256

Every dataset the recipe names (``data.train``, ``data.val``, ``data.test``, ``data.ood``,
``data.val_ood`` and ``context.datasets``) whose images are held encoded is decoded once, shrunk
so its shorter side is ``data.cache.size`` and stored under ``data.cache.dir``
(:mod:`fseb_ft.data.image_cache`); a run, sweep trial or evaluation of the same recipe then
finds it and decodes nothing. One line per cache entry gives the recipe keys it serves, its
images, bytes and seconds, and whether it was built or reused. Unreadable images are found by
the same decode and handled as a run would (``data.bad_images``): ``stop`` ends with one error
naming them, after the table; ``skip`` warns.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fseb_ft.cli import help_text, run_entry
from fseb_ft.data.image_cache import CacheReport, cache_dir, cache_images, check_cache_size
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.screening import BadImage, apply_policy
from fseb_ft.data.sources import build_splits, load_split
from fseb_ft.logs import configure_logging
from fseb_ft.method.models import planned_input_size
from fseb_ft.recipe import ConfigError, Recipe, load_recipe

__all__ = ["main"]


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.cache"
) -> list[CacheReport]:
    """CLI ``fseb-ft cache RECIPE [key=value ...]``: build (or find) the recipe's cache and
    print one line per entry; returns the entries' reports."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", type=Path, help="YAML recipe (see recipes/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="section.key=value overrides, e.g. data.cache.size=256",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes that decode (default: one per CPU core this process may use)",
    )
    args = parser.parse_intermixed_args(argv)  # options before, between or after the overrides
    configure_logging()
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        return _build(recipe, args.workers)
    except ConfigError as err:
        parser.exit(2, f"{prog}: error: {err}\n")


def _build(recipe: Recipe, workers: int | None) -> list[CacheReport]:
    """Build or find every entry of ``recipe``'s cache, print the table, apply
    ``data.bad_images``."""
    cache = recipe.data.cache
    if cache is None:
        raise ConfigError(
            "data.cache is null: give the shorter side of the cached images in pixels, at least "
            "the model's input size, e.g. data.cache.size=256"
        )
    input_size = planned_input_size(recipe.model)
    check_cache_size(cache, input_size, recipe.model.name)
    named = _named_sets(recipe)
    cached = cache_images(named, cache, progress=True, workers=workers)
    print(f"image cache {cache_dir(cache)} ({cache.size} px, {cache.resize}):")
    for report in cached.reports:
        print(_line(report))
    served = {key for report in cached.reports for key in report.keys}
    for key in (key for key in named if key not in served):
        print(f"  {key}: held decoded already, not cached")
    if input_size is None:
        print(
            f"model.name={recipe.model.name!r}: its input size is read when it loads; a run "
            "checks data.cache.size against it then"
        )
    bad = {key: [BadImage(key, *b) for b in found] for key, found in cached.bad.items()}
    apply_policy(cached.sets, bad, recipe.data.bad_images)
    return cached.reports


def _named_sets(recipe: Recipe) -> dict[str, LabeledImages]:
    """Every dataset of the recipe by its key, as a run loads them (the context datasets too,
    which a PS-MAP run does not draw but its ``--compare`` partner does)."""
    data, seed = recipe.data, recipe.train.seed
    splits = build_splits(data, seed)
    named = {"data.train": splits.train, "data.val": splits.val}
    if splits.test is not None:
        named["data.test"] = splits.test
    named |= {f"data.ood.{name}": images for name, images in splits.ood.items()}
    named |= {
        f"data.val_ood.{name}": load_split(
            f"data.val_ood.{name}", spec, data.channels, data.draw_seed(seed)
        )
        for name, spec in data.val_ood.items()
    }
    named |= {
        f"context.datasets[{i}]": load_split(f"context.datasets[{i}]", spec, data.channels, seed)
        for i, spec in enumerate(recipe.context.datasets)
    }
    return named


def _line(report: CacheReport) -> str:
    """One entry: its keys, images, megabytes, seconds, built or reused, file."""
    what = "reused" if report.reused else "built"
    return (
        f"  {', '.join(report.keys)}: {report.images:,} images, {report.bytes / 1e6:,.1f} MB, "
        f"{report.seconds:.1f} s, {what} ({report.path.name})"
    )


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.cache")
