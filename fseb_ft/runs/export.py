"""A run's model folder in timm's Hub format, with its model card.

Every run writes ``RUN_DIR/model/``::

    config.json          timm's Hub config (architecture, model_args, pretrained_cfg with the
                         run's input size, mean, std, num_classes and label_names)
    model.safetensors    the best (validation-selected) weights, timm's state-dict layout
    fseb.json            regulariser settings, context-set provenance, data identities, source,
                         the feature OOD scores the folder can compute
    feature_ood.safetensors  the feature OOD scores' fit (``FEATURE_OOD_FIT``), when the run's
                         evaluation computed them (``fseb_ft.runs.feature_fit``)
    README.md            model card (Hub metadata, method, results table, plots, recipe, usage)
    training_recipe.yaml the resolved recipe the card says to reproduce with
    *.png                the run's own plots (``RUN_PLOTS``), when it has any

What is published names no local path: the card and ``fseb.json`` show a path's last component,
the recipe a ``PATH/TO/…`` placeholder (:mod:`fseb_ft.runs.published`); the run folder keeps the
full provenance. ``timm.create_model("local-dir:RUN_DIR/model", pretrained=True)`` loads it;
:mod:`fseb_ft.runs.upload` sends it to the Hub.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import save_for_hf
from torch import nn

from fseb_ft.data.inputs import EVAL_RESIZE
from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import Recipe, YAMLError, load_yaml
from fseb_ft.runs.atomic import cleaned_on_failure, publish, write_text
from fseb_ft.runs.feature_fit import feature_scores_in
from fseb_ft.runs.model_card import UNKNOWN_LICENSE, model_card, published_recipe, selection
from fseb_ft.runs.posthoc import POSTHOC_BLOCKS
from fseb_ft.runs.published import LOCAL_DIR, model_label, scrub
from fseb_ft.runs.rundir import (
    MODEL_DIR,
    MODEL_RECIPE,
    MODEL_WEIGHTS,
    RECIPE_FILE,
    RESULTS_JSON,
    RESULTS_SPLIT,
    RUN_INFO_FILE,
    RUN_PLOTS,
    RunInfo,
    read_abstention,
    read_json,
    read_run,
    results_split,
)

__all__ = [
    "FOLDER_FILES",
    "export_run",
    "is_exported",
    "plots_in",
    "save_model_folder",
    "write_model_card",
]

_POSTHOC_KEYS = tuple(block.key for block in POSTHOC_BLOCKS)
"""The post-hoc results blocks ``fseb.json`` keeps beside ``test`` and ``ood``."""
FOLDER_FILES = ("config.json", MODEL_WEIGHTS.name, "fseb.json", "README.md")
"""Files every model folder has; its recipe (folders exported before it had one lack it) and
plots come on top."""
_META = "fseb.json"
_NOT_A_RUN = "{run_dir} is not a finished fseb-ft run: {missing} is missing (nothing was sent)"


def save_model_folder(
    model: nn.Module,
    run_dir: str | Path,
    recipe: Recipe,
    run_info: RunInfo | Mapping[str, Any],
    results: Mapping[str, Any],
    *,
    baseline: Mapping[str, Mapping[str, Any]] | None = None,
    repo_id: str | None = None,
) -> Path:
    """Write ``run_dir/model/`` in timm's Hub format, with ``fseb.json``, card and plots.

    Args:
        model: the trained model holding the weights to export (unwrapped, not DDP).
        run_dir: the run directory; its ``*.png`` plots are copied into the folder.
        recipe: the run's resolved recipe.
        run_info: the run's ``run.json`` (class names, input spec, data and context provenance),
            as :class:`~fseb_ft.runs.rundir.RunInfo` or its JSON mapping.
        results: the run's results (``test``, ``ood``, ``training``).
        baseline: method title → results of other runs to show in the card's table (e.g.
            ``{"PS-MAP · resnet18": psmap_results}``); ``None`` takes the sibling PS-MAP run
            of ``--compare`` (``../psmap``) when this run is FS-EB and that one has finished.
        repo_id: the Hub repo the card's usage example names (``user/name``), if known.

    Returns:
        The model folder.
    """
    run_dir = Path(run_dir)
    if not isinstance(run_info, RunInfo):
        run_info = RunInfo.from_json(run_info)
    folder = run_dir / MODEL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    source = _source_info(model, recipe)
    num_classes = int(run_info.num_classes)
    names = [str(n) for n in run_info.class_names or []][:num_classes]
    names += [str(i) for i in range(len(names), num_classes)]
    spec = run_info.input
    data_config = {
        "input_size": (recipe.data.channels, *(int(s) for s in spec.size)),
        "mean": tuple(spec.mean),
        "std": tuple(spec.std),
        # How fseb_ft's evaluation resizes: timm's transform for this config is eval_transform.
        **EVAL_RESIZE,
    }
    model_config = {
        "label_names": names,
        "pretrained_cfg": {
            "num_classes": num_classes,
            "label_names": names,
            "license": source["license"],
        },
    }
    # Export into a scratch folder beside the model folder, then move each file into place, so
    # a killed export never leaves a half-written config or weights file.
    with tempfile.TemporaryDirectory(dir=run_dir, prefix=".model-export-") as tmp:
        with cleaned_on_failure(Path(tmp), what=f"the model folder {folder}"):
            # safetensors writes contiguous tensors only (train.channels_last trains without).
            save_for_hf(
                model.to(memory_format=torch.contiguous_format),
                tmp,
                model_config=model_config,
                data_config=data_config,
                safe_serialization=True,
            )
        for name in (MODEL_WEIGHTS.name, "config.json"):
            publish(Path(tmp) / name, folder / name)
    _write_docs(run_dir, recipe, run_info, results, source, baseline, repo_id)
    return folder


def write_model_card(
    run_dir: str | Path,
    *,
    baseline: Mapping[str, Mapping[str, Any]] | None = None,
    repo_id: str | None = None,
) -> Path:
    """Rewrite ``fseb.json``, ``README.md`` and the plots of an exported run from its files.

    Use it after re-evaluating a run (``results.json`` changed), adding plots or keeping an
    abstention threshold; the weights and ``config.json`` are left alone. Returns the card's
    path.
    """
    run_dir = Path(run_dir)
    folder = run_dir / MODEL_DIR
    meta_path = folder / _META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} is missing: export the run first (export_run)")
    recipe, run_info, results = _read_run(run_dir)
    source = json.loads(meta_path.read_text())["source_model"]
    _write_docs(run_dir, recipe, run_info, results, source, baseline, repo_id)
    return folder / "README.md"


def export_run(
    run_dir: str | Path,
    *,
    baseline: Mapping[str, Mapping[str, Any]] | None = None,
    repo_id: str | None = None,
) -> Path:
    """Build the model folder of a finished run from its recipe, ``run.json`` and best weights.

    For runs made before model folders existed, or whose export failed. Returns the folder.
    """
    # Here, not at the top: loading pulls in the data pipeline (albumentations), which
    # `fseb-ft push` of a built folder never needs.
    from fseb_ft.runs.loading import load_run_model

    run_dir = Path(run_dir)
    recipe, run_info, results = _read_run(run_dir)
    model = load_run_model(run_dir, recipe, run_info)
    return save_model_folder(
        model, run_dir, recipe, run_info, results, baseline=baseline, repo_id=repo_id
    )


def is_exported(run_dir: Path) -> bool:
    """Whether ``run_dir`` has a model folder (its config and ``fseb.json``) to upload."""
    folder = run_dir / MODEL_DIR
    return (folder / "config.json").is_file() and (folder / _META).is_file()


def plots_in(folder: Path) -> list[str]:
    """The run plots (``RUN_PLOTS``) a model folder holds, in card order."""
    return [name for name in RUN_PLOTS if (folder / name).is_file()]


def _source_info(model: nn.Module, recipe: Recipe) -> dict[str, Any]:
    """Where the starting weights came from, for ``fseb.json`` and the card's metadata."""
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    name = recipe.model.name
    hub_id = None
    if recipe.model.pretrained:
        if name.startswith("hf-hub:"):
            hub_id = name[len("hf-hub:") :].split("@")[0]
        elif not name.startswith("local-dir:"):
            hub_id = cfg.get("hf_hub_id") or None
    # A local folder's config.json is no record of the weights' terms (an older fseb_ft export
    # wrote apache-2.0 into every one); timm's and the Hub's pretrained configs are.
    inherited = None
    if recipe.model.pretrained and not name.startswith(LOCAL_DIR):
        inherited = cfg.get("license")
    return {
        "name": name,
        "pretrained": recipe.model.pretrained,
        "hub_id": hub_id,
        "architecture": cfg.get("architecture") or name,
        "license": recipe.output.license or inherited or UNKNOWN_LICENSE,
        # Architectures fseb_ft registers with timm (fseb_cnn) need `import fseb_ft` to load.
        "needs_fseb_ft": type(model).__module__.startswith("fseb_ft"),
        "timm_version": timm.__version__,
    }


def _write_docs(
    run_dir: Path,
    recipe: Recipe,
    run_info: RunInfo,
    results: Mapping[str, Any],
    source: Mapping[str, Any],
    baseline: Mapping[str, Mapping[str, Any]] | None,
    repo_id: str | None,
) -> None:
    """Write the model folder's ``fseb.json``, card, recipe and plots from the run's files."""
    folder = run_dir / MODEL_DIR
    plots = _copy_plots(run_dir, folder)
    if baseline is None:
        baseline = _sibling_baseline(run_dir, recipe)
    kept = read_abstention(run_dir)  # what `fseb-ft predict --keep` stored, if any
    abstention = None if kept is None else AbstentionRule.from_json(kept)
    meta = _folder_meta(recipe, run_info, results, source, abstention) | {
        "feature_ood_scores": feature_scores_in(folder)  # what `predict --ood-score` can ask
    }
    write_text(folder / _META, json.dumps(meta, indent=2) + "\n")
    write_text(run_dir / MODEL_RECIPE, published_recipe(recipe))
    card = model_card(
        recipe,
        run_info,
        results,
        source=source,
        baseline=baseline,
        plots=plots,
        repo_id=repo_id,
        local_dir=folder,
        abstention=abstention,
    )
    write_text(folder / "README.md", card)


def _folder_meta(
    recipe: Recipe,
    run_info: RunInfo,
    results: Mapping[str, Any],
    source: Mapping[str, Any],
    abstention: AbstentionRule | None,
) -> dict[str, Any]:
    """``fseb.json``: what the weights are (method, prior, context, data, source, classes,
    input, selection, results, temperature, abstention), as published: no local path."""
    from fseb_ft import __version__

    method = find_method(recipe.fseb.method)
    uses_context = method.uses_context(recipe.fseb)
    meta = {
        "fseb_ft_version": __version__,
        "method": method.title(recipe.fseb),
        "fseb": dataclasses.asdict(recipe.fseb),
        "context": run_info.context,
        "prior": run_info.prior,
        "context_config": dataclasses.asdict(recipe.context) if uses_context else None,
        "data": run_info.data,
        "source_model": dict(source),
        "num_classes": run_info.num_classes,
        "class_names": run_info.class_names,
        "input": dataclasses.asdict(run_info.input),
        "selection": selection(recipe, results),
        # RESULTS_SPLIT: the split the numbers under "test" come from (validation without one).
        "results": {RESULTS_SPLIT: results_split(results)}
        | {k: results[k] for k in ("test", "ood", *_POSTHOC_KEYS) if k in results},
    }
    if results.get("temperature_scaled"):
        # The weights stay a plain timm model's; calibrated probabilities are softmax(logits / T).
        meta["temperature"] = results["temperature_scaled"]["temperature"]
    if abstention is not None:
        meta["abstention"] = abstention.to_json()
    return scrub(json.loads(json.dumps(meta, default=_jsonable)))


def _sibling_baseline(run_dir: Path, recipe: Recipe) -> dict[str, Mapping[str, Any]] | None:
    """The PS-MAP run of ``--compare`` (``../psmap``) beside this FS-EB run, if finished."""
    sibling = run_dir.parent / "psmap"
    if recipe.fseb.is_ps_map or sibling.resolve() == run_dir.resolve():
        return None
    try:
        results = read_json(sibling / RESULTS_JSON)
        other = load_yaml((sibling / RECIPE_FILE).read_text())
        if other["fseb"]["reg_scale"] != 0 or other["model"]["name"] != recipe.model.name:
            return None
    except (OSError, ValueError, KeyError, TypeError, YAMLError):
        return None
    return {f"PS-MAP · {model_label(recipe.model.name)}": results}


def _copy_plots(run_dir: Path, folder: Path) -> list[str]:
    """Copy the run's own plots into the model folder (dropping others); return them in order.

    Only ``RUN_PLOTS``: a run trained into a ``--compare`` folder sits beside the comparison's.
    """
    found = {name for name in RUN_PLOTS if (run_dir / name).is_file()}
    for stale in folder.glob("*.png"):
        if stale.name not in found:
            stale.unlink()
    for name in found:
        tmp = folder / f".{name}.tmp"
        shutil.copyfile(run_dir / name, tmp)
        os.replace(tmp, folder / name)
    return plots_in(folder)


def _read_run(run_dir: Path) -> tuple[Recipe, RunInfo, dict[str, Any]]:
    needed = (RECIPE_FILE, RUN_INFO_FILE, RESULTS_JSON)
    recipe, run_info = read_run(run_dir, needed=needed, missing=_NOT_A_RUN)
    return recipe, run_info, read_json(run_dir / RESULTS_JSON)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)
