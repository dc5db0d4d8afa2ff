"""What a published file may say about the machine it was made on: no absolute local path.

A run's model folder leaves the machine when it is pushed, so its card, ``fseb.json`` and recipe
name a local path by its last component (``/home/alice/data/my_data`` → ``my_data``), and the
recipe by a placeholder the user fills in (``PATH/TO/my_data``). The run folder itself
(``recipe.yaml``, ``run.json``) keeps the full paths.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from fseb_ft.runs.rundir import MODEL_DIR

__all__ = ["LOCAL_DIR", "PLACEHOLDER", "folder_name", "model_label", "placeholders", "scrub"]

LOCAL_DIR = "local-dir:"
"""timm's prefix of a model loaded from a local folder."""
PLACEHOLDER = "PATH/TO/"
"""Stands for the local folders of a published recipe: ``PATH/TO/my_data``."""

# An absolute POSIX path, a home-relative one or a Windows drive path inside free text. It may
# follow ":" (identities such as "imagefolder:/data/x:train#…") but not "/" or "<", so URLs and
# closing HTML tags are not paths; it ends where identities and Markdown put a separator.
_PATH = re.compile(r"(?<![\w/.<>~-])(?:~?/(?!/)|[A-Za-z]:\\)[^\s'\"`:#|,;()\[\]<>]+")
_PURE_PATHS = (PurePosixPath, PureWindowsPath)


def folder_name(path: str) -> str:
    """The last component of a local path, POSIX or Windows (``/data/my_data/`` → ``my_data``)."""
    return PureWindowsPath(path).name or path.strip("/\\~") or path


def model_label(name: str) -> str:
    """A model as titles and tables show it: a ``local-dir:`` folder by its name, a run's model
    folder (``RUN/model``, every run's is named so) as ``<run>/model``, which says whose it is."""
    if not name.startswith(LOCAL_DIR):
        return name
    path = PureWindowsPath(name.removeprefix(LOCAL_DIR))  # either separator
    label = folder_name(str(path))
    if label == MODEL_DIR and path.parent.name:
        return f"{path.parent.name}/{label}"
    return label


def scrub(value: Any) -> Any:
    """``value`` (text, or mappings and lists of it) with each local path as its last component."""
    return _walk(value, lambda text: _PATH.sub(lambda m: folder_name(m.group()), text))


def placeholders(value: Any) -> Any:
    """``value`` with each local path as ``PATH/TO/<last component>``, for a published recipe.

    A string that is a path as a whole (``local-dir:`` allowed) is replaced whole, so a folder
    name with spaces stays one name.
    """

    def replace(text: str) -> str:
        prefix = LOCAL_DIR if text.startswith(LOCAL_DIR) else ""
        path = text.removeprefix(prefix)
        if path.startswith("~") or any(p(path).is_absolute() for p in _PURE_PATHS):
            return prefix + PLACEHOLDER + folder_name(path)
        return _PATH.sub(lambda m: PLACEHOLDER + folder_name(m.group()), text)

    return _walk(value, replace)


def _walk(value: Any, replace: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return replace(value)
    if isinstance(value, Mapping):
        return {key: _walk(item, replace) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(item, replace) for item in value]
    return value
