"""Frozen dataclasses from a YAML tree, and their Markdown reference from the field docstrings.

The generic half of recipes, knowing nothing of fseb_ft's sections: :func:`build` validates a
nested mapping into a tree of frozen dataclasses (unknown keys, wrong types and out-of-range
values raise :class:`ConfigError` naming the dotted key, the value and what is allowed), and
:func:`reference_markdown` renders one table per dataclass from the string literal written under
each field. A dataclass may declare ``RENAMED_KEYS = {"old": "new"}``: the old key is still
accepted, with a :class:`RenamedKeyWarning`; a dotted ``"section.new"`` moves it into a
sub-section.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import math
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, cast, get_args, get_origin, get_type_hints

from fseb_ft.errors import FsebError
from fseb_ft.recipe.yaml_text import load_yaml

__all__ = [
    "ConfigError",
    "RenamedKeyWarning",
    "build",
    "check",
    "deep_copy",
    "inline_yaml",
    "parent_section",
    "plain_tree",
    "reference_markdown",
    "set_key",
]


class ConfigError(FsebError, ValueError):
    """A recipe key is unknown or its value has the wrong type or range."""


class RenamedKeyWarning(FutureWarning):
    """A recipe used the old name of a renamed key; it still works, under its new name."""


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise :class:`ConfigError` ``key=value: allowed`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {allowed}")


def build(cls: type, raw: Any, path: str = "") -> Any:
    """Validate ``raw`` (a nested mapping, as read from YAML) into the dataclass ``cls``.

    ``path`` is the dotted key of ``raw`` in the whole tree, for messages (``""``: the root).
    """
    where = path or "recipe"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping of keys, got {raw!r}")
    raw = _renamed(cls, raw, path)
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            raise ConfigError(f"unknown key {_join(path, key)!r}; allowed keys here: {names}")
    kwargs = {k: _coerce(hints[k], v, _join(path, k)) for k, v in raw.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where} is missing required key(s) {[_join(path, m) for m in missing]}")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{_join(path, str(err))}") from None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        prefix = f"{key}={value!r}: "
        reasons = [e.removeprefix(prefix) for e in errors]  # one line: each alternative's reason
        raise ConfigError(prefix + "; or ".join(reasons) if len(errors) > 1 else errors[0])
    if origin is Literal:
        if isinstance(value, bool) and "no" in args:
            # YAML 1.1 reads a bare `no` (e.g. train.mixed_precision=no) as false.
            value = "yes" if value else "no"
        if value not in args:
            raise ConfigError(f"{key}={value!r}: allowed values are {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return build(cast(type, tp), value, key)  # an annotation: a class, never an instance
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{key}={value!r}: expected a list of {len(args)} values")
        return tuple(
            _coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: expected a mapping of name: value")
        return {str(k): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected an integer")
    if tp is float:
        # PyYAML reads "1e-5" (no dot) as a string; accept it as the number people mean.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r}: expected a number") from None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(f"{key}={value!r}: expected a finite number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r}: expected a string")
    raise TypeError(f"unsupported recipe field type {tp!r} at {key}")


def _renamed(cls: type, raw: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """``raw`` with the old names of ``cls.RENAMED_KEYS`` replaced by the new ones (a dotted new
    name moves the key into a sub-section), in one warning for the section."""
    renamed: Mapping[str, str] = getattr(cls, "RENAMED_KEYS", {})
    if not any(old in raw for old in renamed):
        return raw
    out = copy.deepcopy(dict(raw))  # the caller's nested sections stay as given
    moved = []
    for old, new in renamed.items():
        if old not in out:
            continue
        parts = new.split(".")
        node = parent_section(out, parts)
        if parts[-1] in node:
            raise ConfigError(
                f"{_join(path, old)} and {_join(path, new)} are the same key (renamed); give "
                f"only {_join(path, new)}"
            )
        node[parts[-1]] = out.pop(old)
        moved.append(f"{_join(path, old)} is renamed {_join(path, new)}")
    names = "the old name still works" if len(moved) == 1 else "the old names still work"
    warnings.warn(f"{', '.join(moved)}; {names}", RenamedKeyWarning, stacklevel=3)
    return out


def parent_section(tree: dict[str, Any], parts: Sequence[str]) -> dict[str, Any]:
    """The mapping of ``tree`` that holds the dotted key ``parts``, creating missing sections."""
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    return node


def set_key(tree: dict[str, Any], parts: Sequence[str], value: Any, merge: bool = False) -> None:
    """Set the dotted key ``parts`` of ``tree`` to ``value`` (a copy), creating sections.

    With ``merge``, a mapping ``value`` is merged key by key into a mapping already there
    instead of replacing it.
    """
    node = parent_section(tree, parts)
    last = parts[-1]
    if merge and isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for key, inner in value.items():
            set_key(node[last], [str(key)], inner, merge=True)
    else:
        node[last] = plain_tree(copy.deepcopy(value))


def deep_copy(node: Any) -> Any:
    """A copy of a tree of mappings and lists (leaves shared)."""
    if isinstance(node, Mapping):
        return {k: deep_copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [deep_copy(v) for v in node]
    return node


def plain_tree(node: Any) -> Any:
    """Tuples → lists and mappings → dicts with string keys, as YAML would give them."""
    if isinstance(node, Mapping):
        return {str(k): plain_tree(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [plain_tree(v) for v in node]
    return node


def reference_markdown(
    root: type, intro: str, minimal: Mapping[str, Any], dump: Callable[[Any], str]
) -> str:
    """A Markdown reference of the dataclass tree ``root``, generated from its field docstrings.

    One table per field of ``root`` (a section), one row per key: dotted name, type, default and
    the docstring written under the field. Nested dataclasses get a table of their own listing
    where they are used, and ``dump`` of the smallest valid tree ``minimal`` closes the page.
    New fields and sections appear without touching this function.

    Raises:
        ValueError: a field has no docstring.
    """
    hints = get_type_hints(root)
    used_in: dict[type, list[str]] = {}
    parts = [intro]
    for section in dataclasses.fields(root):
        cls = hints[section.name]
        _collect_nested(cls, section.name, used_in)
        required = " Required." if _is_required(section) else ""
        parts.append(f"## `{section.name}`\n\n{_markdown_text(_doc(cls))}{required}\n")
        parts.append(_field_table(cls, f"{section.name}."))
    for cls, places in used_in.items():
        where = ", ".join(f"`{p}`" for p in places)
        parts.append(f"## {cls.__name__}\n\n{_markdown_text(_doc(cls))} Used by {where}.\n")
        parts.append(_field_table(cls, ""))
    defaults = dump(build(root, minimal))
    parts.append(
        "## All defaults\n\nThe smallest valid recipe, "
        f"`{inline_yaml(minimal)}`, resolves to:\n\n```yaml\n{defaults}```\n"
    )
    return "\n".join(parts)


def _field_table(cls: type, prefix: str) -> str:
    docs = _field_docs(cls)
    hints = get_type_hints(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    if missing:
        raise ValueError(
            f"{cls.__name__} field(s) {missing} have no docstring: write one as a string literal "
            "on the line under the field"
        )
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        cells = (
            f"`{prefix}{f.name}`",
            _type_text(hints[f.name]),
            _default_text(f),
            _markdown_text(docs[f.name]),
        )
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _field_docs(cls: type) -> dict[str, str]:
    """Field name → the string literal under that field in ``cls``'s source (its docstring)."""
    module = cast(types.ModuleType, inspect.getmodule(cls))  # a class defined in a module file
    tree = ast.parse(inspect.getsource(module))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs = {}
    for stmt, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _collect_nested(tp: Any, where: str, found: dict[type, list[str]]) -> None:
    """Record every dataclass reachable from ``tp`` (below a section) and its dotted places."""
    for f in dataclasses.fields(tp) if dataclasses.is_dataclass(tp) else ():
        inner, suffix = _unwrap(get_type_hints(tp)[f.name])
        if inner is not None:
            first = inner not in found
            found.setdefault(inner, []).append(f"{where}.{f.name}{suffix}")
            if first:
                _collect_nested(inner, inner.__name__, found)


def _unwrap(tp: Any) -> tuple[type | None, str]:
    """(dataclass inside ``tp`` or None, how one is addressed: ``""``, ``[i]`` or ``.<name>``)."""
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp):
        return cast(type, tp), ""  # an annotation: a class, never an instance
    if origin in (Union, types.UnionType):
        for arg in args:
            found = _unwrap(arg)
            if found[0] is not None:
                return found
    if origin is tuple and args:
        return _unwrap(args[0])[0], "[i]"
    if origin is dict:
        return _unwrap(args[1])[0], ".<name>"
    return None, ""


def _type_text(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        text = " or ".join(_type_text(a) for a in args if a is not type(None))
        return f"{text} or null" if type(None) in args else text
    if origin is Literal:
        values = [f"`{inline_yaml(a)}`" for a in args]
        return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type_text(args[0])}"
        return f"list of {len(args)} {' / '.join(sorted({_type_text(a) for a in args}))}"
    if origin is dict:
        return f"mapping of name to {_type_text(args[1])}"
    if dataclasses.is_dataclass(tp):
        name = cast(type, tp).__name__  # an annotation: a class, never an instance
        return f"[{name}](#{name.lower()})"
    return {bool: "bool", int: "int", float: "float", str: "string"}.get(tp, str(tp))


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _default_text(f: dataclasses.Field) -> str:
    if _is_required(f):
        return "required"
    # Not required: a default, or else a factory (mypy cannot tie the two MISSING checks).
    factory = cast(Callable[[], Any], f.default_factory)
    value = f.default if f.default is not dataclasses.MISSING else factory()
    return f"`{inline_yaml(value)}`"


def inline_yaml(value: Any) -> str:
    """``value`` as one line of flow-style YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {inline_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(inline_yaml(v) for v in value) + "]"
    if isinstance(value, str) and load_yaml(value) != value:
        return repr(value)  # "no" would read as false, "" as null: quote them
    return str(value)


def _doc(cls: type) -> str:
    return inspect.cleandoc(cls.__doc__ or "")


def _markdown_text(doc: str) -> str:
    """A docstring as one Markdown line: reST ````code```` becomes ```code```."""
    return " ".join(doc.split()).replace("``", "`")
