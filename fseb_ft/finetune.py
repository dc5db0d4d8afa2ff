"""Fine-tune a timm backbone with FS-EB (or PS-MAP) from a YAML recipe, or on datasets in memory.

    python -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    accelerate launch -m fseb_ft.finetune RECIPE.yaml [section.key=value ...]
    fseb-ft RECIPE.yaml fseb.reg_scale=0          # the PS-MAP baseline

    import fseb_ft
    results = fseb_ft.finetune("recipes/cifar10.yaml", train=hf_train, test=hf_test,
                               ood={"cifar100": hf_cifar100_test}, train__epochs=5)

A run directory (``output.dir``) receives the resolved recipe, per-epoch checkpoints, the best
model (``model/model.safetensors``), ``run.json`` (inputs, classes, context provenance, history)
and ``results.json`` / ``results.md``. The module itself is callable: ``fseb_ft.finetune(...)``
is :func:`finetune`.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fseb_ft.cli import run_entry
from fseb_ft.lazy import lazy_attributes
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import ConfigError, Recipe, load_recipe
from fseb_ft.recipe.options import Method

if TYPE_CHECKING:  # the training stack's names, for type checkers: the same names as _LAZY's
    from accelerate import PartialState

    from fseb_ft.engine.callbacks import Callback, TrainingDivergedError
    from fseb_ft.engine.in_memory import in_memory_splits, resolve_recipe
    from fseb_ft.engine.loop import NonFiniteLossError
    from fseb_ft.engine.resume import RecipeMismatchError
    from fseb_ft.engine.run import run, run_with_predictions
    from fseb_ft.method.methods import find_method
    from fseb_ft.runs.atomic import DiskFullError
    from fseb_ft.runs.comparison import write_comparison
    from fseb_ft.runs.report import EvalResults
    from fseb_ft.runs.rundir import (
        MODEL_DIR,
        RESULTS_JSON,
        RESULTS_MD,
        check_output_dir,
        read_class_names,
        read_json,
    )
    from fseb_ft.runs.tables import markdown_table, method_title
    from fseb_ft.runs.upload import HubPushError

_LAZY = {
    "PartialState": "accelerate",
    "TrainingDivergedError": "fseb_ft.engine.callbacks",
    "in_memory_splits": "fseb_ft.engine.in_memory",
    "resolve_recipe": "fseb_ft.engine.in_memory",
    "NonFiniteLossError": "fseb_ft.engine.loop",
    "RecipeMismatchError": "fseb_ft.engine.resume",
    "run": "fseb_ft.engine.run",
    "run_with_predictions": "fseb_ft.engine.run",
    "find_method": "fseb_ft.method.methods",
    "DiskFullError": "fseb_ft.runs.atomic",
    "write_comparison": "fseb_ft.runs.comparison",
    "MODEL_DIR": "fseb_ft.runs.rundir",
    "RESULTS_JSON": "fseb_ft.runs.rundir",
    "RESULTS_MD": "fseb_ft.runs.rundir",
    "check_output_dir": "fseb_ft.runs.rundir",
    "read_class_names": "fseb_ft.runs.rundir",
    "read_json": "fseb_ft.runs.rundir",
    "markdown_table": "fseb_ft.runs.tables",
    "method_title": "fseb_ft.runs.tables",
    "HubPushError": "fseb_ft.runs.upload",
}
"""The training stack, imported on first use: ``python -m fseb_ft.finetune --help`` and a
recipe's error answer in a fraction of a second instead of the ~5 s torch, timm and accelerate
take to import."""

__getattr__ = lazy_attributes(__name__, _LAZY)


def _load() -> None:
    """Bind :data:`_LAZY`'s names in this module, once; a name already bound (a test's
    ``monkeypatch.setattr(fseb_ft.finetune, "run", ...)``) stays as it is."""
    for name in _LAZY:
        if name not in globals():
            globals()[name] = __getattr__(name)


__all__ = ["RecipeMismatchError", "compare", "finetune", "main", "resolve_recipe", "run"]


_CLI_USAGE = """Fine-tune a timm backbone with FS-EB (PS-MAP: fseb.reg_scale=0) from a YAML recipe.

Any section.key=value overrides the recipe. The run directory (output.dir) receives the resolved
recipe, checkpoints, the best model in timm's Hub format (model/), run.json and the results.
Rerunning the same command continues a killed run."""


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft") -> dict[str, Any]:
    """Parse ``RECIPE [key=value ...] [--compare]``, run it and print the results table."""
    parser = argparse.ArgumentParser(
        prog=prog, description=_CLI_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", type=Path, help="YAML recipe (see recipes/)")
    # A default: argparse names a "*" positional without one as required when another is missing.
    parser.add_argument("overrides", nargs="*", default=[], help="section.key=value overrides")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="train the PS-MAP baseline (fseb.reg_scale=0) and the recipe's FS-EB into "
        "OUTPUT/psmap and OUTPUT/fseb, and print them side by side",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' INFO lines"
    )
    # Intermixed: overrides may come before or after --compare.
    args = parser.parse_intermixed_args(argv)
    configure_logging(args.verbose)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except ConfigError as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    _load()
    try:
        if args.compare:
            return compare(recipe)
        results = run(recipe)
    except (ConfigError, RecipeMismatchError, NonFiniteLossError, TrainingDivergedError) as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    except DiskFullError as err:
        parser.exit(1, f"{prog}: error: {err}\n")
    except HubPushError:  # the run is complete: its table, then the error and its retry command
        if not args.compare:  # a --compare stops at the run whose push failed: no table yet
            _print_results(recipe, read_json(Path(recipe.output.dir) / RESULTS_JSON))
        raise
    if PartialState().is_main_process:
        _print_results(recipe, results)
    return results


def _print_results(recipe: Recipe, results: dict[str, Any]) -> None:
    """The run's results table and where its files are."""
    run_dir = Path(recipe.output.dir)
    print(markdown_table({method_title(recipe): results}, read_class_names(run_dir)))
    print(_written(run_dir))


def _written(run_dir: Path) -> str:
    """The line that tells a person where a run's results, plots and model are."""
    plots = ", ".join(p.name for p in sorted(run_dir.glob("*.png")))
    return (
        f"written to {run_dir}: {RESULTS_MD} (this table), {RESULTS_JSON}, "
        + (f"{plots}, " if plots else "")
        + f"{MODEL_DIR}/ (the best model, timm's Hub format)"
    )


def compare(recipe: Recipe | str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train PS-MAP and FS-EB from one recipe and write ``comparison.md`` / ``.json``.

    The two runs differ only in ``fseb.reg_scale`` (0 for PS-MAP): same data, seed, backbone,
    optimiser and schedule — one loop, two configurations. ``recipe`` is a :class:`Recipe` or a
    YAML file (read with ``overrides``); its runs go to ``output.dir``/psmap and /fseb (/fsvi
    with ``fseb.method=fsvi``, /l2sp with ``l2sp``: the method's name; the PS-MAP run has
    ``method=fseb``), labelled by the method's title.

    Raises:
        ConfigError: the recipe's ``fseb.reg_scale`` is 0, so it has no FS-EB setting.
    """
    _load()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)
    if recipe.fseb.is_ps_map:
        raise ConfigError(
            "fseb.reg_scale=0: --compare trains PS-MAP (reg_scale 0) beside the recipe's FS-EB, "
            "so the recipe must set fseb.reg_scale > 0"
        )
    out = Path(recipe.output.dir)
    check_output_dir(out)
    evaluated: dict[str, EvalResults] = {}
    title = find_method(recipe.fseb.method).title(recipe.fseb)
    for label, slug, reg_scale, method in (
        ("PS-MAP", "psmap", 0.0, "fseb"),
        (title, recipe.fseb.method, recipe.fseb.reg_scale, recipe.fseb.method),
    ):
        sub = dataclasses.replace(
            recipe,
            fseb=dataclasses.replace(recipe.fseb, reg_scale=reg_scale, method=cast(Method, method)),
            output=dataclasses.replace(recipe.output, dir=str(out / slug)),
        )
        evaluated[label] = run_with_predictions(sub)
    results = {label: e.results for label, e in evaluated.items()}
    if PartialState().is_main_process:
        table = write_comparison(out, evaluated, f"{recipe.model.name}: PS-MAP vs {title}")
        seconds = {k: round(v["training"]["seconds"], 1) for k, v in results.items()}
        print(f"\n{table}\ntraining seconds: {seconds}; written to {out}")
    return results


def finetune(
    recipe: str | Path | Recipe | Mapping[str, Any] | None = None,
    train: Any = None,
    val: Any = None,
    test: Any = None,
    ood: Mapping[str, Any] | None = None,
    *,
    class_names: Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    callbacks: Sequence[Callback] = (),
    **overrides: Any,
) -> dict[str, Any]:
    """Fine-tune with FS-EB (or PS-MAP, ``fseb__reg_scale=0``) on in-memory datasets.

    Args:
        recipe: a YAML recipe path, a :class:`~fseb_ft.recipe.Recipe`, a mapping of sections as
            in a YAML file, or ``None`` for all defaults (ImageNet-pretrained ResNet-18).
        train: the training data: a ``datasets.Dataset`` (image and label columns found from
            their ``Image`` / ``ClassLabel`` features, else ``image``/``img`` and
            ``label``/``labels``), any map-style torch ``Dataset`` of ``(image, label)`` pairs
            (image: PIL, numpy (H, W[, C]) or a (C, H, W) tensor, in uint8, uint16 (16-bit,
            scaled ``>> 8``) or float in [0, 1]; :func:`fseb_ft.data.pixels.as_uint8`), or a
            :class:`fseb_ft.data.images.LabeledImages`.
        val: validation data for model selection; ``None`` holds out a stratified, seeded
            ``data.val_fraction`` of ``train``.
        test: the in-distribution test data the results are reported on; ``None``: they are
            reported on the validation data, which selected the checkpoint, so they are
            optimistic (``results.json`` says ``"split": "validation"``).
        ood: named semantic-shift sets scored against ``test`` (labels are not used).
        class_names: class names, index = label; default: the ``ClassLabel`` names, the
            dataset's ``classes`` attribute, else ``"0" .. "K-1"``.
        image_column: image column (HF) or item key (torch datasets yielding mappings).
        label_column: label column (HF) or item key.
        callbacks: hooks into the training loop (:class:`fseb_ft.engine.callbacks.Callback`
            subclasses), called after the built-in ones.
        **overrides: recipe overrides, in any of three spellings (values are Python objects,
            not YAML text): a section mapping, merged into the recipe (``fseb={"reg_scale": 0}``);
            ``section__key=value``, a double underscore for each dot (``fseb__reg_scale=0``,
            ``output__dir="runs/mine"``); dotted keys through a dict (``**{"fseb.reg_scale":
            0}``). ``train=`` is the training dataset, so the ``train`` *section* takes the
            second or third spelling (``train__epochs=5``), never ``train={...}``.

    Returns:
        The results dict of :func:`fseb_ft.engine.run.run` (``test``, ``ood``, ``training``),
        also written to ``output.dir/results.json``. The run directory gets everything a CLI
        run writes; its ``recipe.yaml`` names the data ``in-memory:<split>`` and ``run.json``
        records the datasets' provenance, so re-evaluating it with ``fseb-ft evaluate`` needs
        the data saved to disk and the recipe's ``data`` pointing at it.
    """
    if train is None:
        raise TypeError("finetune() needs train=: the training dataset")
    _load()
    resolved = resolve_recipe(
        recipe, overrides, has_val=val is not None, ood_names=ood or {}, has_test=test is not None
    )
    splits = in_memory_splits(
        resolved, train, val, test, ood,
        class_names=class_names, image_column=image_column, label_column=label_column,
    )  # fmt: skip
    return run(resolved, splits=splits, callbacks=callbacks)


class _CallableModule(types.ModuleType):
    """This module, callable: ``fseb_ft.finetune(recipe, train=..., ...)`` is the Python API.

    ``fseb_ft.finetune`` has to be two things at once: the CLI module that ``python -m
    fseb_ft.finetune`` runs, and the Python API's entry point. A module object cannot be
    called, so its class is swapped for this ``ModuleType`` subclass, whose ``__call__`` is
    :func:`finetune` and whose signature is its signature. Attribute access, ``from
    fseb_ft.finetune import run``, pickling by reference and ``python -m`` behave exactly as for
    a plain module.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Same as :func:`finetune`."""
        return finetune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
cast(Any, sys.modules[__name__]).__signature__ = inspect.signature(finetune)  # a module's own


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.finetune")
