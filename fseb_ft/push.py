"""``fseb-ft push``: upload a run's model folder to the Hugging Face Hub.

    fseb-ft push RUN_DIR user/name [--private] [--revision BRANCH]

Only ``RUN_DIR/model/`` is sent (timm's Hub format with its card: :mod:`fseb_ft.runs.export`),
never checkpoints; a run without one is exported first. The upload and its retry command are
:mod:`fseb_ft.runs.upload`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fseb_ft.cli import run_entry
from fseb_ft.logs import configure_logging
from fseb_ft.recipe import ConfigError, OutputConfig, load_recipe

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft push") -> str:
    """CLI ``fseb-ft push RUN_DIR [user/name] [--private] [--revision R]``; returns the URL.

    A failed upload raises :class:`~fseb_ft.runs.upload.HubPushError` (its message has the
    retry command), a folder that is not a finished run ``FileNotFoundError``: ``fseb-ft``
    (:func:`~fseb_ft.cli.run_entry`) prints either as ``fseb-ft: error: …``.
    """
    parser = _parser(prog)
    args = parser.parse_args(argv)
    configure_logging()
    # Here, not at the top: the export behind an upload imports torch and timm (~5 s), which
    # --help and a mistyped folder do not need.
    from fseb_ft.runs.rundir import MODEL_DIR, RECIPE_FILE
    from fseb_ft.runs.upload import push_run

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
    url = push_run(
        args.run_dir,
        repo_id,
        private=out.private if args.private is None else args.private,
        revision=args.revision or out.revision,
        commit_message=args.commit_message or out.commit_message,
        endpoint=args.endpoint,
        refresh_card=not args.keep_card,
    )
    print(f"pushed {args.run_dir / MODEL_DIR} to {url}")
    return url


def _parser(prog: str) -> argparse.ArgumentParser:
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
    return parser


def _not_a_run(
    folder: Path, repo_id: str | None, private: bool | None, revision: str | None
) -> str:
    """Why ``folder`` cannot be pushed; for a ``--compare`` folder, the command for each run."""
    from fseb_ft.runs.rundir import runs_in
    from fseb_ft.runs.upload import retry_command

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


def _saved_output(run_dir: Path) -> OutputConfig:
    """The run's ``output`` section (push defaults), or the defaults if it cannot be read."""
    from fseb_ft.runs.rundir import RECIPE_FILE

    try:
        return load_recipe(run_dir / RECIPE_FILE).output
    except (OSError, ValueError):
        return OutputConfig()


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.push")
