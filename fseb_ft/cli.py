"""The ``fseb-ft`` command: one table of subcommands, each the ``main`` of its entry module.

    fseb-ft RECIPE.yaml [section.key=value ...] [--compare]   # = fseb-ft train RECIPE.yaml ...
    fseb-ft evaluate RUN_DIR [RUN_DIR ...] [eval.key=value ...] [--ensemble]
    fseb-ft push RUN_DIR [user/name]
    fseb-ft sweep RECIPE.yaml [section.key=value ...] --trials N [--compare]
    fseb-ft predict MODEL IMAGES... [--out predictions.csv] [--coverage 0.9 | --max-risk 0.02]
    fseb-ft export MODEL --onnx model.onnx [--coverage 0.9 | --max-risk 0.02 | --threshold T]
    fseb-ft demo RUN [--port P] [--share] [--coverage 0.9 | --max-risk 0.02]
    fseb-ft monitor RUN IMAGES... [--out DIR] [--level 0.01]
    fseb-ft cache RECIPE.yaml [section.key=value ...]

Each command's module is imported only when it runs, so ``fseb-ft --help`` and ``fseb-ft push``
do not load the training stack. An error the user can fix (a bad recipe, a missing path, a full
disk, a diverged run: :class:`~fseb_ft.errors.FsebError`, ``OSError``, ``ValueError``) prints
``fseb-ft: error: …`` and exits 1 (2 for a bad command line); ``--debug`` (or
``FSEB_FT_DEBUG=1``) shows the traceback instead. An interrupted run (Ctrl-C, or SIGTERM, which
``timeout`` and job schedulers send) says what is kept and the command that continues it.
:func:`run_entry` does this, for these commands and for each entry module run as
``python -m fseb_ft.MODULE`` (or ``accelerate launch -m fseb_ft.finetune``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fseb_ft.recipe.options import METHOD_SUMMARIES

__all__ = [
    "COMMANDS",
    "Command",
    "Terminated",
    "device_argument",
    "fraction_argument",
    "help_text",
    "main",
    "run_entry",
]


@dataclass(frozen=True)
class Command:
    """A subcommand: ``module.main(argv, prog=...)`` runs it."""

    module: str
    """The entry module whose ``main(argv, prog)`` runs the command."""
    summary: str
    """One line for ``fseb-ft --help``."""


COMMANDS: dict[str, Command] = {
    "train": Command(
        "fseb_ft.finetune",
        "fine-tune from a YAML recipe (also `fseb-ft RECIPE.yaml`); --compare adds PS-MAP",
    ),
    "evaluate": Command(
        "fseb_ft.evaluate", "re-evaluate finished runs, or evaluate their ensemble (--ensemble)"
    ),
    "push": Command("fseb_ft.push", "upload a run's model folder to the Hugging Face Hub"),
    "sweep": Command(
        "fseb_ft.sweep", "search a recipe's hyper-parameters on validation data (Optuna)"
    ),
    "predict": Command(
        "fseb_ft.predict", "predict new images, abstaining below a threshold chosen on validation"
    ),
    "export": Command(
        "fseb_ft.export", "write a model as one ONNX file that abstains by itself (--onnx FILE)"
    ),
    "demo": Command(
        "fseb_ft.demo", "a local web page: drop an image, see the decision, its reason and set"
    ),
    "monitor": Command(
        "fseb_ft.monitor",
        "check a batch of images against a run's validation split; exit 3 when it shifted",
    ),
    "cache": Command(
        "fseb_ft.cache", "decode and shrink a recipe's images once, ahead of training (data.cache)"
    ),
}
"""Every ``fseb-ft`` subcommand, in help order. A new command is one entry here."""

_RECIPE_SUFFIXES = (".yaml", ".yml")
DEBUG_ENV = "FSEB_FT_DEBUG"
"""Set to anything to see the traceback of an error instead of its one-line message."""
_DEBUG_FLAG = "--debug"


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``fseb-ft``: dispatch to a command, or train when given a recipe file.

    Returns nothing: the console-script wrapper passes the return value to ``sys.exit``, which
    would print a results dict and exit with status 1. Errors exit through ``SystemExit``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    words = [a for a in args if a != _DEBUG_FLAG]
    if not words or words[0] in ("-h", "--help"):
        print(_help())
        return
    if words[0] == "--version":
        from fseb_ft import __version__

        print(f"fseb-ft {__version__}")
        return
    name = words[0]
    if name in COMMANDS:
        at = args.index(name)
        _run(name, args[:at] + args[at + 1 :])  # without the command; --debug stays for run_entry
        return
    if name.endswith(_RECIPE_SUFFIXES) or Path(name).is_file():
        _run("train", args)
        return
    sys.stderr.write(
        f"fseb-ft: error: unknown command or recipe {name!r}; commands are "
        f"{', '.join(COMMANDS)}, or give a recipe file (fseb-ft RECIPE.yaml ...)\n"
    )
    raise SystemExit(2)


def _run(name: str, argv: list[str]) -> None:
    """Import a command's module and run its ``main``."""
    module = importlib.import_module(COMMANDS[name].module)
    run_entry(module.main, argv, prog=f"fseb-ft {name}" if name != "train" else "fseb-ft")


def run_entry(
    main: Callable[..., object], argv: Sequence[str] | None = None, prog: str = "fseb-ft"
) -> None:
    """Run an entry module's ``main(argv, prog=prog)``; a user's error becomes one line on stderr.

    Every form runs through here: ``fseb-ft COMMAND`` and ``python -m fseb_ft.MODULE`` (``argv``
    None: the command line), so an error reads the same whichever started the command.
    ``--debug`` anywhere in ``argv`` (or ``FSEB_FT_DEBUG``) lets the traceback through instead.
    """
    from fseb_ft.errors import FsebError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = _DEBUG_FLAG in args or bool(os.environ.get(DEBUG_ENV))
    words = [a for a in args if a != _DEBUG_FLAG]
    previous = _terminate_as_interrupt()
    try:
        main(words, prog=prog)
    except KeyboardInterrupt as stop:
        if debug:
            raise
        terminated = isinstance(stop, Terminated)
        sys.stderr.write(
            f"fseb-ft: {'terminated (SIGTERM)' if terminated else 'interrupted'}; nothing "
            "complete was lost (a training keeps its last complete epoch): rerun the same "
            f"command to continue: {shlex.join([*shlex.split(prog), *words])}\n"
        )
        raise SystemExit(128 + signal.SIGTERM if terminated else 130) from None
    except (FsebError, OSError, ValueError) as err:
        if debug:
            raise
        sys.stderr.write(f"fseb-ft: error: {err} (--debug shows where)\n")
        raise SystemExit(1) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C raises ``KeyboardInterrupt``: what an
    interruption cleans up (temporary files, a half-written checkpoint) is cleaned up alike."""


def _terminate_as_interrupt() -> Any:
    """Make SIGTERM raise :class:`Terminated`; the handler it replaces (``None``: not replaced,
    outside the main thread, where Python cannot set one)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    # None: a handler not set from Python, which Python cannot set back; the default instead.
    previous = signal.getsignal(signal.SIGTERM) or signal.SIG_DFL

    def terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, previous)  # a second SIGTERM ends the process at once
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    return previous


def _help() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items())
    return (
        "usage: fseb-ft RECIPE.yaml [section.key=value ...] [--compare]\n"
        "       fseb-ft COMMAND [args ...]\n\n"
        "Fine-tune timm backbones with function-space empirical Bayes (FS-EB) regularisation.\n\n"
        f"commands:\n{rows}\n\n"
        f"methods (fseb.method=NAME; docs/method.md):\n{_method_rows()}\n\n"
        "`fseb-ft COMMAND --help` describes each; --version prints the version; --debug shows "
        "the traceback of an error."
    )


def _method_rows() -> str:
    width = max(map(len, METHOD_SUMMARIES))
    return "\n".join(f"  {name:<{width}}  {line}" for name, line in METHOD_SUMMARIES.items())


def device_argument(text: str) -> str:
    """The argparse type of a command's ``--device``: a device of this machine, so a missing
    one is a usage error naming those it has, before anything loads."""
    from fseb_ft.method.devices import DeviceError, resolve_device  # torch: only when parsed

    try:
        resolve_device(text)
    except DeviceError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def fraction_argument(name: str) -> Callable[[str], float]:
    """The argparse type of the abstention option ``name`` (``coverage``, ``max_risk``,
    ``threshold``): a number in its range, or a usage error saying which."""

    def parse(text: str) -> float:
        from fseb_ft.evaluation.abstention import out_of_range  # torch: only when parsed

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if (problem := out_of_range(name, value)) is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


def dataset_argument(text: str) -> dict[str, Any]:
    """The argparse type of a command's ``--dataset``: a recipe dataset spec as a YAML mapping,
    or a usage error saying what it takes."""
    from fseb_ft.errors import first_line
    from fseb_ft.recipe import YAMLError, load_yaml

    try:
        spec = load_yaml(text)
    except YAMLError as err:
        raise argparse.ArgumentTypeError(f"not a YAML mapping: {first_line(err)}") from None
    if not isinstance(spec, dict):
        raise argparse.ArgumentTypeError(
            f'takes a YAML mapping like "{{source: idx, path: data, split: t10k}}", got {text!r}'
        )
    return spec


HELP_WIDTH = 79
"""Columns a command's ``--help`` description is filled to (an 80-column terminal)."""
_REST_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")  # :func:`name`, :data:`~module.NAME`


def help_text(doc: str) -> str:
    """A reST docstring as a command's ``--help`` description (with argparse's
    ``RawDescriptionHelpFormatter``): roles and double-backtick literals as plain text, and
    paragraphs refilled to :data:`HELP_WIDTH`; indented blocks (usage examples) stay as written."""
    text = _REST_ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], doc)
    paragraphs = text.replace("``", "").strip("\n").split("\n\n")
    return "\n\n".join(
        p if p.startswith(" ") else textwrap.fill(" ".join(p.split()), HELP_WIDTH)
        for p in paragraphs
    )


if __name__ == "__main__":
    main()
