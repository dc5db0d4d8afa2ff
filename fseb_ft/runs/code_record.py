"""Which code made a run: fseb_ft's version and git commit, and the libraries that shape results.

A number in a results table is only as reproducible as the code it names. ``run.json`` records
this beside the data's identity so a table built from run folders can say which commit (and so
which behaviour fingerprint, ``benchmarks/fingerprint.json``) made each of its runs.
"""

from __future__ import annotations

import functools
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["RESULT_LIBRARIES", "code_record", "git_state"]

RESULT_LIBRARIES = (
    "torch",
    "timm",
    "numpy",
    "pillow",
    "opencv-python-headless",
    "albumentations",
    "albucore",
    "scikit-learn",
    "scipy",
    "datasets",
)
"""The libraries whose versions can move a run's numbers (pixels, losses, metrics)."""
TRACKED = ("fseb_ft", "recipes", "benchmarks", "pyproject.toml")
"""The checkout's paths whose uncommitted edits make a run's code differ from its commit."""


@functools.cache
def git_state(package_dir: Path) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the git checkout holding ``package_dir``.

    ``dirty`` is true when a tracked file under :data:`TRACKED` differs from the commit
    (untracked files are not code the run imported). ``None`` outside a checkout (an installed
    wheel) or without git. Read once per process: the code a process imported stays the same
    when the checkout moves on, so a later run of the process records the state of its first.
    """
    root = package_dir.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None  # the package sits in some other repository (a vendored copy)
        changed = git("status", "--porcelain", "--untracked-files=no", "--", *TRACKED)
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}
    except (OSError, subprocess.SubprocessError):
        return None


def _installed(name: str) -> str | None:
    """The installed version of one distribution, or ``None``."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def code_record() -> dict[str, Any]:
    """The ``code`` entry of ``run.json``: ``fseb_ft`` (version), ``git`` (:func:`git_state`)
    and ``libraries`` (installed versions of :data:`RESULT_LIBRARIES`)."""
    from fseb_ft import __version__

    return {
        "fseb_ft": __version__,
        "git": git_state(Path(__file__).resolve().parents[1]),
        "libraries": {name: _installed(name) for name in RESULT_LIBRARIES},
    }
