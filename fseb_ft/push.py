"""Share a run: a timm Hub-format model folder with a model card, and its upload to the Hub.

Every run writes ``RUN_DIR/model/``::

    config.json          timm's Hub config (architecture, model_args, pretrained_cfg with the
                         run's input size, mean, std, num_classes and label_names)
    model.safetensors    the best (validation-selected) weights, timm's state-dict layout
    fseb.json            regulariser settings, context-set provenance, data identities, source
    README.md            model card (Hub metadata, method, results table, plots, recipe, usage)
    training_recipe.yaml the resolved recipe the card says to reproduce with
    *.png                the run's own plots (``RUN_PLOTS``), when it has any

What is published names no local path: the card and ``fseb.json`` show a path's last component,
the recipe a ``PATH/TO/…`` placeholder (:mod:`fseb_ft.runs.published`); the run folder keeps the
full provenance.

``timm.create_model("local-dir:RUN_DIR/model", pretrained=True)`` loads it, and so does
``timm.create_model("hf-hub:user/name", pretrained=True)`` once pushed. Only that folder is ever
uploaded (never checkpoints, optimiser or RNG state)::

    fseb-ft push RUN_DIR user/name [--private] [--revision BRANCH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import timm
import yaml
from huggingface_hub import HfApi, get_token
from timm.models import save_for_hf
from torch import nn

from fseb_ft.cli import run_entry
from fseb_ft.data.inputs import EVAL_RESIZE
from fseb_ft.errors import FsebError
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import ConfigError, OutputConfig, Recipe, load_recipe
from fseb_ft.runs.atomic import cleaned_on_failure, publish, write_text
from fseb_ft.runs.model_card import UNKNOWN_LICENSE, model_card, published_recipe, selection
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
    runs_in,
)

__all__ = [
    "HubPushError",
    "export_run",
    "main",
    "push_folder",
    "push_run",
    "retry_command",
    "save_model_folder",
    "share_run",
    "write_model_card",
]

logger = logging.getLogger(__name__)

FOLDER_FILES = ("config.json", MODEL_WEIGHTS.name, "fseb.json", "README.md")
"""Files every model folder has; its recipe (folders exported before it had one lack it) and
plots come on top."""
_NOT_A_RUN = "{run_dir} is not a finished fseb-ft run: {missing} is missing (nothing was sent)"


class HubPushError(FsebError, RuntimeError):
    """An upload failed; the message says what failed and the command that retries it."""


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
            save_for_hf(
                model,
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

    Use it after re-evaluating a run (``results.json`` changed) or adding plots; the weights
    and ``config.json`` are left alone. Returns the card's path.
    """
    run_dir = Path(run_dir)
    folder = run_dir / MODEL_DIR
    meta_path = folder / "fseb.json"
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


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = OutputConfig.commit_message,
    token: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Upload a model folder's files (``FOLDER_FILES``, recipe and plots, nothing else) to the Hub.

    Creates the repo (``exist_ok``) and the ``revision`` branch when missing. Returns the commit
    URL. Raises whatever ``huggingface_hub`` raises; :func:`push_run` turns that into a
    :class:`HubPushError` with a retry command.
    """
    folder = Path(folder)
    missing = [name for name in FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a complete model folder: {missing} missing")
    recipe = [MODEL_RECIPE.name] if (folder / MODEL_RECIPE.name).is_file() else []
    files = [*FOLDER_FILES, *recipe, *_plots_in(folder)]
    from fseb_ft import __version__

    api = HfApi(
        endpoint=_endpoint(endpoint),
        token=token,
        library_name="fseb_ft",
        library_version=__version__,
    )
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        allow_patterns=files,
        revision=revision,
        commit_message=commit_message,
    )
    return str(getattr(info, "commit_url", info))


def push_run(
    run_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = OutputConfig.commit_message,
    token: str | None = None,
    endpoint: str | None = None,
    refresh_card: bool = True,
) -> str:
    """Push a run's model folder, exporting it first if the run has none; return the commit URL.

    ``refresh_card`` rewrites the card (and ``fseb.json``, plots) from the run's current files
    with ``repo_id`` in its usage example; ``False`` uploads the folder as it is.

    Raises:
        FileNotFoundError: ``run_dir`` is not a finished run (nothing was sent).
        HubPushError: the upload failed; the message has the cause and the retry command.
    """
    run_dir = Path(run_dir)
    folder = run_dir / MODEL_DIR
    # Local files first: a folder that is not a run is not a Hub (or token) problem.
    if not (folder / "config.json").is_file() or not (folder / "fseb.json").is_file():
        export_run(run_dir, repo_id=repo_id)
    elif refresh_card:
        write_model_card(run_dir, repo_id=repo_id)
    try:
        return push_folder(
            folder,
            repo_id,
            private=private,
            revision=revision,
            commit_message=commit_message,
            token=token,
            endpoint=endpoint,
        )
    except Exception as err:
        where = _endpoint(endpoint) or "https://huggingface.co"
        hint = ""
        if token is None and get_token() is None:
            hint = "\nNo Hugging Face token found: run `hf auth login` or set HF_TOKEN."
        retry = retry_command(run_dir, repo_id, private=private, revision=revision)
        if endpoint:
            retry += f" --endpoint {shlex.quote(endpoint)}"
        raise HubPushError(
            f"could not push {folder} to the Hub repo {repo_id!r} at {where}: "
            f"{type(err).__name__}: {err}{hint}\n"
            f"Nothing was lost: the model folder stays in {folder}. Retry with:\n  {retry}"
        ) from err


def share_run(
    model: nn.Module,
    run_dir: str | Path,
    recipe: Recipe,
    run_info: RunInfo | Mapping[str, Any],
    results: Mapping[str, Any],
) -> str | None:
    """End of a run: write the model folder, then push it if ``output.push_to_hub`` is set.

    Never raises: a failure is logged with what failed and how to retry, and the run's files
    stay on disk. Returns the commit URL when pushed.
    """
    run_dir = Path(run_dir)
    out = recipe.output
    try:
        save_model_folder(model, run_dir, recipe, run_info, results, repo_id=out.push_to_hub)
    except Exception:
        logger.exception(
            "could not write the model folder %s; the results and best weights are saved. "
            "Rebuild it (and push) with: %s",
            run_dir / MODEL_DIR,
            retry_command(run_dir, out.push_to_hub or "USER/NAME", out.private, out.revision),
        )
        return None
    if not out.push_to_hub:
        return None
    try:
        url = push_run(
            run_dir,
            out.push_to_hub,
            private=out.private,
            revision=out.revision,
            commit_message=out.commit_message,
            refresh_card=False,
        )
    except HubPushError as err:
        logger.error("%s", err)
        return None
    logger.info("pushed %s to %s", run_dir / MODEL_DIR, url)
    return url


def retry_command(
    run_dir: str | Path, repo_id: str, private: bool = False, revision: str | None = None
) -> str:
    """The ``fseb-ft push`` command line that uploads ``run_dir``'s model folder."""
    cmd = ["fseb-ft", "push", str(run_dir), repo_id]
    if private:
        cmd.append("--private")
    if revision:
        cmd += ["--revision", revision]
    return shlex.join(cmd)


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft push") -> str:
    """CLI ``fseb-ft push RUN_DIR [user/name] [--private] [--revision R]``; returns the URL."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Upload a run's model folder (RUN_DIR/model: weights, config.json, "
        "fseb.json, model card, plots) to the Hugging Face Hub. Checkpoints never leave the "
        "machine. A run without a model folder is exported first.",
    )
    parser.add_argument("run_dir", type=Path, help="a run directory written by fseb-ft")
    parser.add_argument(
        "repo_id", nargs="?", help="Hub repo user/name (default: the recipe's output.push_to_hub)"
    )
    parser.add_argument(
        "--private",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create the repo private (default: the recipe's output.private)",
    )
    parser.add_argument("--revision", help="branch to push to (created if missing)")
    parser.add_argument("--commit-message", help="commit message")
    parser.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    parser.add_argument(
        "--keep-card",
        action="store_true",
        help="upload README.md as it is instead of regenerating it from the run's files",
    )
    args = parser.parse_args(argv)
    configure_logging()
    if not (args.run_dir / RECIPE_FILE).is_file():
        parser.error(_not_a_run(args.run_dir, args.repo_id, args.private, args.revision))
    out = _saved_output(args.run_dir)
    repo_id = args.repo_id or out.push_to_hub
    if not repo_id:
        parser.error("give the Hub repo as user/name (the run's recipe sets no output.push_to_hub)")
    try:
        OutputConfig(push_to_hub=repo_id)
    except ConfigError as err:
        parser.error(str(err))
    try:
        url = push_run(
            args.run_dir,
            repo_id,
            private=out.private if args.private is None else args.private,
            revision=args.revision or out.revision,
            commit_message=args.commit_message or out.commit_message,
            endpoint=args.endpoint,
            refresh_card=not args.keep_card,
        )
    except (HubPushError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"pushed {args.run_dir / MODEL_DIR} to {url}")
    return url


# --- helpers -------------------------------------------------------------------------------


def _not_a_run(
    folder: Path, repo_id: str | None, private: bool | None, revision: str | None
) -> str:
    """Why ``folder`` cannot be pushed; for a ``--compare`` folder, the command for each run."""
    runs = runs_in(folder)
    if not runs:
        return (
            f"{folder} is not a run directory (it has no recipe.yaml): give the output.dir of "
            "a fseb-ft training run"
        )
    repo = repo_id or "USER/NAME"
    commands = "; ".join(
        retry_command(run, f"{repo}-{run.name}", bool(private), revision) for run in runs
    )
    return (
        f"{folder} holds {len(runs)} run(s) ({', '.join(run.name for run in runs)}), and a Hub "
        f"repo holds one model: push each run to its own repo: {commands}"
    )


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
    from fseb_ft import __version__

    folder = run_dir / MODEL_DIR
    plots = _copy_plots(run_dir, folder)
    if baseline is None:
        baseline = _sibling_baseline(run_dir, recipe)
    meta = {
        "fseb_ft_version": __version__,
        "method": recipe.fseb.method_name,
        "fseb": dataclasses.asdict(recipe.fseb),
        "context": run_info.context,
        "prior": run_info.prior,
        "context_config": None if recipe.fseb.is_ps_map else dataclasses.asdict(recipe.context),
        "data": run_info.data,
        "source_model": dict(source),
        "num_classes": run_info.num_classes,
        "class_names": run_info.class_names,
        "input": dataclasses.asdict(run_info.input),
        "selection": selection(recipe, results),
        # RESULTS_SPLIT: the split the numbers under "test" come from (validation without one).
        "results": {RESULTS_SPLIT: results_split(results)}
        | {k: results[k] for k in ("test", "ood", "temperature_scaled") if k in results},
    }
    if results.get("temperature_scaled"):
        # The weights stay a plain timm model's; calibrated probabilities are softmax(logits / T).
        meta["temperature"] = results["temperature_scaled"]["temperature"]
    abstention = read_abstention(run_dir)  # what `fseb-ft predict --keep` stored, if any
    if abstention is not None:
        meta["abstention"] = abstention
    meta = scrub(json.loads(json.dumps(meta, default=_jsonable)))  # published: no local path
    write_text(folder / "fseb.json", json.dumps(meta, indent=2) + "\n")
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


def _sibling_baseline(run_dir: Path, recipe: Recipe) -> dict[str, Mapping[str, Any]] | None:
    """The PS-MAP run of ``--compare`` (``../psmap``) beside this FS-EB run, if finished."""
    sibling = run_dir.parent / "psmap"
    if recipe.fseb.is_ps_map or sibling.resolve() == run_dir.resolve():
        return None
    try:
        results = read_json(sibling / RESULTS_JSON)
        other = yaml.safe_load((sibling / RECIPE_FILE).read_text())
        if other["fseb"]["reg_scale"] != 0 or other["model"]["name"] != recipe.model.name:
            return None
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
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
    return _plots_in(folder)


def _plots_in(folder: Path) -> list[str]:
    return [name for name in RUN_PLOTS if (folder / name).is_file()]


def _read_run(run_dir: Path) -> tuple[Recipe, RunInfo, dict[str, Any]]:
    needed = (RECIPE_FILE, RUN_INFO_FILE, RESULTS_JSON)
    recipe, run_info = read_run(run_dir, needed=needed, missing=_NOT_A_RUN)
    return recipe, run_info, read_json(run_dir / RESULTS_JSON)


def _saved_output(run_dir: Path) -> OutputConfig:
    """The run's ``output`` section (push defaults), or the defaults if it cannot be read."""
    try:
        return load_recipe(run_dir / RECIPE_FILE).output
    except (OSError, ValueError):
        return OutputConfig()


def _endpoint(endpoint: str | None) -> str | None:
    # HF_ENDPOINT is read here, not only when huggingface_hub is imported.
    value = endpoint or os.environ.get("HF_ENDPOINT")
    return value.rstrip("/") if value else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.push")
