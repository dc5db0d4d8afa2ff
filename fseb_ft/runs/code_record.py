"""Which code made a run: fseb_ft's version and git commit, and the libraries that shape results.

A number in a results table is only as reproducible as the code it names. ``run.json`` records
this beside the data's identity so a table built from run folders can say which commit (and so
which behaviour fingerprint, ``benchmarks/fingerprint.json``) made each of its runs.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["RESULT_LIBRARIES", "code_record", "git_state", "machine_record"]

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
    """The ``code`` entry of ``run.json``: ``fseb_ft`` (version), ``git`` (:func:`git_state`),
    ``libraries`` (installed versions of :data:`RESULT_LIBRARIES`) and ``machine``
    (:func:`machine_record`)."""
    from fseb_ft import __version__

    return {
        "fseb_ft": __version__,
        "git": git_state(Path(__file__).resolve().parents[1]),
        "libraries": {name: _installed(name) for name in RESULT_LIBRARIES},
        "machine": machine_record(),
    }


def _cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_record() -> dict[str, Any]:
    """Where a run ran, as far as it moves the numbers: the CPU, the vector instructions torch's
    kernels use (``cpu_capability``: AVX512, AVX2, …), torch's thread count and the GPU.

    A float32 training run repeats to the last digit only on the same kernels: on one thread
    with the same seed, the CIFAR-10 protocol's accuracy moved by a point between torch's AVX-512
    and AVX2 kernels (docs/results.md, "Reproducing a number").
    """
    import torch

    return {
        "cpu": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
