"""A package's public names imported from their modules on first use (PEP 562), so importing one
module of a layer folder loads no other; each folder's ``__init__`` maps its names to modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``names`` maps each public name to the module
    that defines it; any other name is an ``AttributeError``, as for a plain module."""

    def attribute(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute
