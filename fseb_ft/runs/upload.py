"""A run's model folder on the Hugging Face Hub: the upload, its retry command, and the end of a
training run (export the folder, push it when the recipe asks).

Only the model folder (:mod:`fseb_ft.runs.export`) is ever uploaded, never checkpoints,
optimiser or RNG state; ``timm.create_model("hf-hub:user/name", pretrained=True)`` loads it once
pushed. ``fseb-ft push`` (:mod:`fseb_ft.push`) is the command.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, get_token
from torch import nn

from fseb_ft.errors import FsebError
from fseb_ft.recipe import OutputConfig, Recipe
from fseb_ft.runs.export import (
    FOLDER_FILES,
    export_run,
    is_exported,
    plots_in,
    save_model_folder,
    write_model_card,
)
from fseb_ft.runs.rundir import FEATURE_OOD_FIT, MODEL_DIR, MODEL_RECIPE, RunInfo

__all__ = ["HubPushError", "push_folder", "push_run", "retry_command", "share_run"]

logger = logging.getLogger(__name__)


class HubPushError(FsebError, RuntimeError):
    """An upload failed; the message says what failed and the command that retries it."""


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
    """Upload a model folder's files (``FOLDER_FILES``, recipe, feature OOD fit and plots, nothing
    else) to the Hub.

    Creates the repo (``exist_ok``) and the ``revision`` branch when missing. Returns the commit
    URL. Raises whatever ``huggingface_hub`` raises; :func:`push_run` turns that into a
    :class:`HubPushError` with a retry command.
    """
    folder = Path(folder)
    missing = [name for name in FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a complete model folder: {missing} missing")
    extra = [p.name for p in (MODEL_RECIPE, FEATURE_OOD_FIT) if (folder / p.name).is_file()]
    files = [*FOLDER_FILES, *extra, *plots_in(folder)]
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
    if not is_exported(run_dir):
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
    except Exception as err:  # whatever the Hub client raised: reported with the retry command
        where = _endpoint(endpoint) or "https://huggingface.co"
        hint = ""
        if token is None and get_token() is None:
            hint = "\nNo Hugging Face token found: run `hf auth login` or set HF_TOKEN."
        retry = retry_command(run_dir, repo_id, private=private, revision=revision)
        if endpoint:
            retry += f" --endpoint {shlex.quote(endpoint)}"
        # The retry command is not the last line: `fseb-ft: error: …` ends with a hint.
        raise HubPushError(
            f"could not push {folder} to the Hub repo {repo_id!r} at {where}: "
            f"{type(err).__name__}: {err}{hint}\n"
            f"Retry with:\n  {retry}\n"
            f"Nothing was lost: the model folder stays in {folder}."
        ) from err


def share_run(
    model: nn.Module,
    run_dir: str | Path,
    recipe: Recipe,
    run_info: RunInfo | Mapping[str, Any],
    results: Mapping[str, Any],
) -> str | None:
    """End of a run: write the model folder, then push it if ``output.push_to_hub`` is set.

    The run's results are written by then, so what the disk refuses does not fail it: an
    ``OSError`` while exporting (a full disk, a folder that cannot be written to) is logged with
    what failed and how to retry, and ``None`` returned. A failed upload is raised, once the
    folder is written: the run asked for it, so its command must not end as if it were done.
    Anything else (a bug) propagates. Returns the commit URL when pushed.

    Raises:
        HubPushError: the upload failed; the message has the cause and the retry command.
    """
    run_dir = Path(run_dir)
    out = recipe.output
    try:
        save_model_folder(model, run_dir, recipe, run_info, results, repo_id=out.push_to_hub)
    except OSError:
        logger.exception(
            "could not write the model folder %s; the results and best weights are saved. "
            "Rebuild it (and push) with: %s",
            run_dir / MODEL_DIR,
            retry_command(run_dir, out.push_to_hub or "USER/NAME", out.private, out.revision),
        )
        return None
    if not out.push_to_hub:
        return None
    url = push_run(
        run_dir,
        out.push_to_hub,
        private=out.private,
        revision=out.revision,
        commit_message=out.commit_message,
        refresh_card=False,
    )
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


def _endpoint(endpoint: str | None) -> str | None:
    # HF_ENDPOINT is read here, not only when huggingface_hub is imported.
    value = endpoint or os.environ.get("HF_ENDPOINT")
    return value.rstrip("/") if value else None
