"""YAML text in and out, through libyaml's C parser and emitter where PyYAML has them.

PyYAML's pure-Python ``safe_load``/``safe_dump`` cost a run a noticeable share of its
bookkeeping: each run dumps its recipe, its card re-reads and re-dumps it, and every
``section.key=value`` override is parsed. The C classes build the same objects and write the
same text (tests/recipe/test_yaml_text.py pins that on every recipe in ``recipes/``); a PyYAML
built without libyaml falls back to the Python ones.
"""

from __future__ import annotations

from typing import Any

import yaml

try:
    from yaml import CSafeDumper as _Dumper
    from yaml import CSafeLoader as _Loader
except ImportError:  # a PyYAML built without libyaml: the same results, slower
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]  # the same interface
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]  # the same interface

__all__ = ["YAMLError", "dump_yaml", "load_yaml"]

YAMLError = yaml.YAMLError


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``: plain Python objects, no arbitrary tags.

    A syntax error is the Python parser's: libyaml marks the end of a one-line value such as an
    override's ``[1`` at "line 2, column 1", past the text, where PyYAML names line 1, column 3.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # C or Python SafeLoader: no arbitrary tags
    except yaml.YAMLError:
        return yaml.safe_load(text)  # raises again, with the marks and words of PyYAML's parser


def dump_yaml(data: Any) -> str:
    """``yaml.safe_dump(data, sort_keys=False)``: block style, keys in their given order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
