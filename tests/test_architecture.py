"""The package's layout, as docs/architecture.md draws it: layers, no upward imports, no circles."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from fseb_ft.cli import COMMANDS

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "fseb_ft"
LAYERS = ("recipe", "data", "method", "evaluation", "runs", "prediction", "engine")
"""The package's folders, lowest first: a module imports only from its own folder or lower ones."""
BASE = ("errors", "lazy", "logs")
"""Top-level modules every layer may import; they import nothing from fseb_ft."""
ENTRY_POINTS = (
    "__init__",
    "__main__",
    "api",
    "cli",
    "config",
    *(command.module.removeprefix("fseb_ft.") for command in COMMANDS.values()),
)
"""Top-level modules above every folder: the package, its kept names, and each command of
``fseb-ft`` (``cli.COMMANDS``: a new command is its module and its row there, nothing here)."""


def _name(path: Path) -> str:
    """``fseb_ft/data/images.py`` → ``data.images``; ``fseb_ft/data/__init__.py`` → ``data``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, modules: Iterable[str] = ()) -> set[str]:
    """fseb_ft modules ``path`` imports anywhere (top level or inside functions).

    ``from fseb_ft.data import images`` is the module ``data.images`` when that is a module,
    else the package ``data``.
    """
    known, found = set(modules), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fseb_ft" or node.module.startswith("fseb_ft."):
                base = node.module.removeprefix("fseb_ft").lstrip(".")
                for alias in node.names:
                    full = f"{base}.{alias.name}".lstrip(".")
                    found.add(full if full in known or not base else base)
        elif isinstance(node, ast.Import):
            found.update(
                a.name[len("fseb_ft.") :] for a in node.names if a.name.startswith("fseb_ft.")
            )
    return found


@functools.cache  # parsing every module takes ~0.4 s; the tests only read the graph
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    return {m: frozenset(_imports(p, modules) & set(modules) - {m}) for m, p in modules.items()}


def _layer(module: str) -> int:
    """0 for the base modules, 1… for the folders in :data:`LAYERS` order, above them the
    entries."""
    top = module.split(".")[0]
    if top in LAYERS:
        return 1 + LAYERS.index(top)
    return 0 if module in BASE else len(LAYERS) + 1


def test_every_module_is_in_a_folder_or_named_as_base_or_entry_point() -> None:
    stray = [m for m in _modules() if "." not in m and m not in (*LAYERS, *BASE, *ENTRY_POINTS)]
    assert stray == [], "put these modules in a layer folder (or name a new command here)"
    folders = sorted({p.parent.name for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE})
    assert set(folders) <= {*LAYERS, "sources", "methods"}, f"{folders}: name new folders in LAYERS"


def _mapped() -> set[str]:
    """The modules docs/architecture.md lists: ``- `name`:`` under a folder's ``### `folder/```
    heading (top-level modules under the other ``###`` headings), a package's modules indented
    under its ``- `package/`:`` line."""
    found: set[str] = set()
    folder: str | None = None
    package: str | None = None
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        if heading := re.match(r"### `(\w+)/`", line):
            folder, package = heading[1], None
            found.add(folder)
        elif line.startswith("#"):
            folder = "" if line.startswith("### ") else None
        elif folder is not None and (item := re.match(r"- `(\w+)(/?)`:", line)):
            name = f"{folder}.{item[1]}".lstrip(".")
            found.add(name)
            package = name if item[2] else None
        elif package and (item := re.match(r"  - `(\w+)`:", line)):
            found.add(f"{package}.{item[1]}")
    return found


def test_the_architecture_map_lists_every_module_once_under_its_folder() -> None:
    modules, mapped = set(_modules()) - {"__init__"}, _mapped()
    assert sorted(modules - mapped) == [], "add these modules to docs/architecture.md"
    assert sorted(mapped - modules) == [], "docs/architecture.md lists modules that do not exist"


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [
        f"{m} imports {d}"
        for m, deps in sorted(_graph().items())
        for d in sorted(deps)
        if _layer(d) > _layer(m) or (m in BASE and d not in BASE)
    ]
    assert upward == []


def test_a_command_imports_the_folders_not_another_command() -> None:
    """What two commands share lives in a folder; ``cli`` (``run_entry``) is the one exception,
    and ``api`` exists to re-export two commands' functions."""
    commands = {c.module.removeprefix("fseb_ft.") for c in COMMANDS.values()}
    crossing = [
        f"{m} imports {d}" for m in sorted(commands) for d in sorted(_graph()[m] & commands)
    ]
    assert crossing == []


def test_the_import_graph_has_no_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                circles.append(" → ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_an_import_inside_a_function_counts(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "def f():\n    from fseb_ft.data.images import g\n    from fseb_ft.runs import plots\n"
    )
    assert _imports(tmp_path / "a.py", {"runs.plots"}) == {"data.images", "runs.plots"}


def test_layers_rank_base_then_the_folders_in_order_then_the_commands() -> None:
    assert _layer("recipe.options") < _layer("data.images") < _layer("engine.loop")
    assert _layer("errors") < _layer("recipe.schema") and _layer("sweep") > _layer("engine.loop")


def test_light_modules_load_neither_accelerate_nor_albumentations_nor_sklearn() -> None:
    # One interpreter for all: importing more modules only adds to sys.modules, so none of them
    # loads either library if, together, they load neither.
    light = ("fseb_ft.push", "fseb_ft.data.corruptions", "fseb_ft.cli")
    code = (
        f"import sys, {', '.join(light)}; "
        "print(sorted(m for m in ('accelerate', 'albumentations', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", f"one of {light} loads {out.stdout.strip()}"


def test_no_module_imports_scipy_stats_or_sklearn_at_its_top_level() -> None:
    # Each costs every command's start 0.6 s (scipy.stats) to 2 s (sklearn) of CPU: the
    # functions that use them import them.
    heavy = ("scipy.stats", "sklearn")
    found = []
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:  # the top level only
            if isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found += [f"{name}: {i}" for i in imported if i.startswith(heavy)]
    assert found == []


def test_every_file_is_written_through_a_temporary_name() -> None:
    """Run files are written atomically: to a temporary name, then renamed (fseb_ft.runs.atomic)."""
    writer = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"']w|\.savefig\(|np\.save")
    direct = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "atomic.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if writer.search(line) and "tmp" not in line and "lambda f:" not in line
    ]
    assert direct == [], "write through fseb_ft.runs.atomic (or a temporary path that is renamed)"


def _imported_across_folders() -> dict[str, set[str]]:
    """Per folder, the names that modules outside it (other folders, commands) import from its
    modules: ``from fseb_ft.data.images import LabeledImages`` in ``runs/`` is ``data``'s
    ``LabeledImages``. Submodules, a name that is also a submodule's (the package attribute is
    the module once imported: ``method.posterior``'s ``posterior``), and a command's ``main``
    are not names to export."""
    modules = _modules()
    found: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            parts = node.module.split(".")
            if parts[0] != "fseb_ft" or len(parts) < 3 or parts[1] not in LAYERS:
                continue  # the folder package itself, or not a folder's module
            if name.split(".")[0] == parts[1]:
                continue  # within the folder
            base = ".".join(parts[1:])
            found[parts[1]] |= {
                a.name
                for a in node.names
                if not {f"{base}.{a.name}", f"{parts[1]}.{a.name}"} & set(modules)
                and a.name != "main"
            }
    return found


def test_each_folder_exports_what_the_others_import_from_it() -> None:
    import importlib

    across = _imported_across_folders()
    for layer in LAYERS:
        package = importlib.import_module(f"fseb_ft.{layer}")
        missing = sorted(across[layer] - set(package.__all__))
        assert missing == [], f"fseb_ft/{layer}/__init__.py: add {missing} to __all__"
        for name in package.__all__:  # each resolves, lazily or not, to its home's object
            assert getattr(package, name) is not None, f"fseb_ft.{layer}.{name}"


def test_a_lazy_folder_types_the_names_it_exports() -> None:
    """A folder that imports its names on first use (``_LAZY``) imports the same names under
    ``TYPE_CHECKING``, from the same modules, for type checkers."""
    for layer in LAYERS:
        tree = ast.parse((PACKAGE / layer / "__init__.py").read_text())
        lazy = next(
            (
                ast.literal_eval(node.value)
                for node in tree.body
                if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
            ),
            None,
        )
        if lazy is None:
            continue  # imports its names eagerly (recipe)
        typed = {
            alias.name: f"{node.module}"
            for block in tree.body
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for node in block.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert typed == lazy, f"fseb_ft/{layer}/__init__.py: TYPE_CHECKING imports ≠ _LAZY"
