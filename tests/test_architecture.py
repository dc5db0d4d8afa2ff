"""The package's layout, as docs/architecture.md draws it: layers, no upward imports, no circles."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "fseb_ft"
ROW = re.compile(r"^\| `(\w+)` \| (\d) [a-z]+ \| (.+) \|$")


def _layers() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return {m[1]: int(m[2]) for line in text.splitlines() if (m := ROW.match(line))}


def _imports(path: Path) -> set[str]:
    """fseb_ft modules ``path`` imports anywhere (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fseb_ft":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("fseb_ft."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("fseb_ft."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {m: _imports(PACKAGE / f"{m}.py") & modules for m in modules}


def test_every_module_is_in_the_architecture_table() -> None:
    graph, layers = _graph(), _layers()
    assert sorted(set(graph) - set(layers)) == [], "add these modules to docs/architecture.md"
    assert sorted(set(layers) - set(graph)) == [], "docs/architecture.md lists removed modules"


def test_no_module_imports_from_a_higher_layer() -> None:
    graph, layers = _graph(), _layers()
    upward = [
        f"{m} (layer {layers[m]}) imports {d} (layer {layers[d]})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layers.get(d, 0) > layers.get(m, 0)
    ]
    assert upward == []


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
    (tmp_path / "a.py").write_text("def f():\n    from fseb_ft.b import g\n")
    assert _imports(tmp_path / "a.py") == {"b"}


def test_light_modules_load_neither_accelerate_nor_albumentations() -> None:
    # One interpreter for all: importing more modules only adds to sys.modules, so none of them
    # loads either library if, together, they load neither.
    light = ("fseb_ft.hub", "fseb_ft.corruptions", "fseb_ft.cli")
    code = (
        f"import sys, {', '.join(light)}; "
        "print(sorted(m for m in ('accelerate', 'albumentations') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", f"one of {light} loads {out.stdout.strip()}"


def test_every_file_is_written_through_a_temporary_name() -> None:
    """Run files are written atomically: to a temporary name, then renamed (fseb_ft.atomic)."""
    writer = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"']w|\.savefig\(|np\.save")
    direct = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name != "atomic.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if writer.search(line) and "tmp" not in line and "lambda f:" not in line
    ]
    assert direct == [], "write through fseb_ft.atomic (or a temporary path that is renamed)"
