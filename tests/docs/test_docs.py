"""The docs stay true to the code: the recipe reference is generated from the dataclasses, the
own-loop example runs and trains, and links, recipe keys, YAML recipes and modules they name exist.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import math
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import yaml

from fseb_ft import recipe as config
from fseb_ft.recipe import Recipe, override_path, recipe_from_dict, reference_markdown, schema
from tests.helpers import skip_figures

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "recipes.md"
OWN_LOOP = DOCS / "examples" / "own_loop.py"
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
SECTIONS = [f.name for f in dataclasses.fields(Recipe)]
REGENERATE = "python -m fseb_ft.config --reference > docs/recipes.md"


def _recipe_dataclasses() -> list[type]:
    """Recipe and every dataclass reachable from its fields' types (sections, DatasetSpec)."""
    found: list[type] = []

    def visit(tp: Any) -> None:
        if dataclasses.is_dataclass(tp) and tp not in found:
            found.append(tp)
            for hint in get_type_hints(tp).values():
                visit(hint)
        for arg in get_args(tp):
            visit(arg)

    visit(Recipe)
    return found


def test_recipe_reference_is_the_generated_text() -> None:
    committed = REFERENCE.read_text(encoding="utf-8")
    assert committed == reference_markdown(), f"docs/recipes.md is stale: run `{REGENERATE}`"


def test_documented_regeneration_command_writes_the_committed_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fseb_ft.config", "--reference"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert out.stdout == REFERENCE.read_bytes()


def test_every_recipe_field_has_a_docstring_and_a_reference_row() -> None:
    classes = _recipe_dataclasses()
    assert {c.__name__ for c in classes} >= {"Recipe", "DataConfig", "DatasetSpec", "FSEBConfig"}
    text = reference_markdown()
    hints = get_type_hints(Recipe)
    for cls in classes:
        docs = schema._field_docs(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not undocumented, f"{cls.__name__} fields without a docstring: {undocumented}"
    for section in SECTIONS:
        for f in dataclasses.fields(hints[section]):
            assert f"| `{section}.{f.name}` |" in text
    for f in dataclasses.fields(config.DatasetSpec):
        assert f"| `{f.name}` |" in text


@dataclasses.dataclass(frozen=True)
class _HalfDocumented:
    documented: int = 1
    """This one has a docstring."""
    bare: int = 2


def test_reference_refuses_a_field_without_docstring() -> None:
    with pytest.raises(
        ValueError, match=r"_HalfDocumented field\(s\) \['bare'\] have no docstring"
    ):
        schema._field_table(_HalfDocumented, "")


def test_own_loop_example_trains(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(OWN_LOOP), run_name="__main__")
    pattern = r"epoch (\d+) loss=(\S+) nll=(\S+) fs_reg=(\S+) param_reg=(\S+)"
    rows = [[float(v) for v in m] for m in re.findall(pattern, capsys.readouterr().out)]
    assert len(rows) >= 5, rows
    _, loss, nll, fs_reg, param_reg = zip(*rows, strict=True)
    assert all(math.isfinite(v) for row in rows for v in row)
    assert loss[-1] < loss[0] and nll[-1] < 0.5 * nll[0], rows
    assert min(fs_reg) > 0 and min(param_reg) > 0  # both regularisers are active


def test_own_loop_example_has_at_most_20_lines_of_code() -> None:
    source = OWN_LOOP.read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    code = set()
    for stmt in tree.body:
        is_docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if is_docstring or isinstance(stmt, ast.Import | ast.ImportFrom):
            continue
        code.update(range(stmt.lineno, stmt.end_lineno + 1))
    code = {n for n in code if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")}
    assert 0 < len(code) <= 20, f"{len(code)} lines of code"


def _python_block(page: Path, heading: str) -> str:
    """The first ``python`` block of ``page`` under ``heading``."""
    text = page.read_text(encoding="utf-8").split(f"\n{heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S)[1]


def test_quickstarts_python_snippet_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It defines every name it uses: only its budget shrinks here (a tiny model, one epoch)."""
    code = _python_block(DOCS / "quickstart.md", "## From Python")
    budget, out = "train__epochs=5,", '"runs/from-python"'
    assert budget in code and out in code
    tiny = "train__epochs=1, model__name='test_byobnet', model__input_size=16, train__cpu=True,"
    code = code.replace(budget, tiny).replace(out, repr(str(tmp_path / "run")))
    monkeypatch.chdir(ROOT)  # the recipe's path is relative to the repository root
    skip_figures(monkeypatch)
    exec(compile(code, "docs/quickstart.md", "exec"), {"__name__": "__main__"})
    accuracy, auroc = map(float, capsys.readouterr().out.split()[-2:])
    assert 0 <= accuracy <= 1 and 0 <= auroc <= 1
    assert (tmp_path / "run" / "results.json").is_file()


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    # Code blocks hold code, not links: ``phi0[0](x_hat)`` is a call.
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: broken link {target}"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: no anchor {target}"


def _is_recipe_key(parts: list[str]) -> bool:
    """Whether ``section.key[.sub]`` names a recipe key (any name after a mapping: data.ood.x)."""
    tp: Any = Recipe
    parts = override_path(".".join(parts))  # sweep.space.optim.lr: the space's key optim.lr
    while parts:
        part = parts.pop(0)
        hints = get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in hints:
            return False
        tp = hints[part]
        if get_origin(tp) is dict:
            parts = parts[1:]  # the free name, e.g. "other" in data.ood.other.source
            tp = get_args(tp)[1]
        tp = next((a for a in (tp, *get_args(tp)) if dataclasses.is_dataclass(a)), tp)
    return True


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_recipe_keys_named_in_the_docs_exist(page: Path) -> None:
    pattern = r"(?<![\w/.-])(?:" + "|".join(SECTIONS) + r")(?:\.[A-Za-z_]\w*)+"
    files = {"py", "json", "md", "yaml", "png", "safetensors", "txt", "csv", "onnx"}
    for key in set(re.findall(pattern, page.read_text(encoding="utf-8"))):
        parts = key.split(".")
        if parts[-1] not in files:  # not a file name such as fseb.json or model.safetensors
            assert _is_recipe_key(parts), f"{page.name}: {key} is not a recipe key"


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_yaml_recipes_in_the_docs_validate(page: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    for block in blocks:
        raw = yaml.safe_load(block)
        if not isinstance(raw, dict) or not set(raw) <= set(SECTIONS):
            continue  # not a recipe
        merged: dict[str, Any] = {"data": {"train": {"source": "sklearn_digits"}}}
        for section, body in raw.items():
            if isinstance(body, dict) and isinstance(merged.get(section), dict):
                merged[section] = {**merged[section], **body}
            else:
                merged[section] = body
        recipe_from_dict(merged)  # raises ConfigError naming the bad key


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_modules_run_with_python_m_exist(page: Path) -> None:
    for module in set(re.findall(r"python -m (fseb_ft(?:\.\w+)*)", page.read_text("utf-8"))):
        assert importlib.util.find_spec(module) is not None, f"{page.name}: no module {module}"
