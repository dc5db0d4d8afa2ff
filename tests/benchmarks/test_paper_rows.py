"""benchmarks.paper_rows: the transcription matches the paper's tables; the rows it renders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import paper_rows
from benchmarks.paper_rows import Ours, Pairing

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

ROOT = Path(__file__).parents[2]
PAPER_TABLES = ROOT.parent / "shared" / "paper-tables.md"

METRIC_TITLES = {"Acc.": "acc", "Sel. Pred.": "sel_pred", "NLL": "nll", "ECE": "ece",
                 "OOD": "ood_auroc", "OOD AUROC": "ood_auroc", "Step (ms)": "step_ms",
                 "Epoch (s)": "epoch_s"}  # fmt: skip
KEY_TITLES = {"Method": "method", "Fraction": "fraction", "Context": "context",
              "Context batch": "context_batch", "Data": "data"}  # fmt: skip
PART_PREFIXES = {"FMNIST ": "FashionMNIST", "CIFAR-10 ": "CIFAR-10"}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _printed(text: str) -> dict[tuple, tuple[dict[str, str], dict[str, str]]]:
    """Every printed row: (heading, part, keys) → (values, setup named in the row's labels).

    A part is one dataset's half of a table: a "FashionMNIST:" line above it, a column prefix
    ("FMNIST Acc."), or Table 3's "Data (OOD)" column. Empty key cells repeat the row above.
    """
    found: dict[tuple, tuple[dict[str, str], dict[str, str]]] = {}
    heading = part = header = None
    above: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("## "):
            heading, part, header = line[3:], None, None
        elif re.fullmatch(r"[\w-]+:", line):
            part = line[:-1]
        elif not line.startswith("|"):
            header = None
        elif header is None:
            header, above = _cells(line), {}
        elif not set(line) <= set("|-"):
            keys, setup, values, column_part = {}, {}, {}, part
            for title, cell in zip(header, _cells(line), strict=True):
                cell = cell or above.get(title, "")
                above[title] = cell
                prefix = next((p for p in PART_PREFIXES if title.startswith(p)), None)
                if prefix:
                    column_part, title = PART_PREFIXES[prefix], title.removeprefix(prefix)
                if title == "Data (OOD)":
                    column_part, setup["ood"] = re.fullmatch(r"(.+) \((.+)\)", cell).groups()
                elif title in KEY_TITLES:
                    if m := re.fullmatch(r"(.+) \(context (.+)\)", cell):
                        cell, setup["context"] = m.groups()
                    keys[KEY_TITLES[title]] = cell
                elif title in METRIC_TITLES:
                    values.setdefault(column_part, {})[METRIC_TITLES[title]] = cell
            if "method" not in keys:  # "Appendix — context batch size (FS-EB)"
                keys["method"] = re.fullmatch(r".+ \((.+)\)", heading)[1]
            for where, metrics in values.items():
                found[(heading, where, tuple(sorted(keys.items())))] = (metrics, setup)
    return found


@pytest.mark.skipif(not PAPER_TABLES.is_file(), reason="../shared/paper-tables.md is absent")
def test_every_number_is_the_papers_as_transcribed_in_shared() -> None:
    printed = _printed(PAPER_TABLES.read_text(encoding="utf-8"))
    headings = {key[0] for key in printed}
    assert len(printed) > 60 and "Table 1 — FashionMNIST (context KMNIST)" in headings
    ours = {}
    for table in paper_rows.load().tables.values():
        (heading,) = [h for h in headings if re.match(re.escape(table.cite) + r"\b", h)]
        for row in table.rows:
            key = (heading, table.part, tuple(sorted(row.keys.items())))
            assert key in printed, f"{table.id}: {row.keys} is not in paper-tables.md"
            values, setup = printed[key]
            assert dict(row.values) == values, f"{table.id}: {row.keys}"
            assert setup.get("context", table.context) == table.context
            assert setup.get("ood", table.ood) == table.ood
            with_se = all("±" in v for v in row.values.values())
            assert with_se == (table.seeds is not None and table.seeds > 1), table.id
            ours[key] = values
    # And nothing left out: every printed result row of every table is in the file.
    results = {k for k in printed if not k[0].startswith("Appendix — hyper-parameter")}
    assert sorted(results - set(ours)) == []


TOY = """
short: Toy et al.
tables:
  t1:
    cite: Table 1
    data: D
    backbone: Net
    epochs: null
    context: C
    ood: null
    seeds: 5
    rows:
      - {method: PS-MAP, acc: "90.0 ± 0.1", nll: "0.30 ± 0.00"}
      - {method: FS-EB, acc: "91.0 ± 0.2", nll: "0.25 ± 0.01"}
  t3:
    cite: Table 3
    data: D
    backbone: Net
    epochs: null
    context: C
    ood: SVHN
    seeds: 5
    rows:
      - {method: PS-MAP, ood_auroc: "93.0 ± 0.4"}
      - {method: FS-EB, ood_auroc: "99.4 ± 0.1"}
  ctx:
    cite: Appendix — context
    data: D
    backbone: Net
    epochs: 200
    context: C
    ood: MNIST
    seeds: 5
    rows:
      - {context: train, method: FS-EB, acc: "89.0 ± 0.3", ood_auroc: "97.0 ± 0.5"}
      - {context: other, method: FS-EB, acc: "88.0 ± 0.3"}
"""
TOY_OURS = Ours("our net", "3 epochs", "ours", "MNIST")


def _toy(tmp_path: Path) -> Path:
    path = tmp_path / "numbers.yaml"
    path.write_text(TOY, encoding="utf-8")
    return path


def test_rows_merge_tables_fill_our_columns_and_name_a_different_ood_set(tmp_path: Path) -> None:
    paper = paper_rows.load(_toy(tmp_path))
    pairing = Pairing((("t1", {}), ("t3", {}), ("ctx", {"context": "train"})), TOY_OURS)
    columns = ["Method", "seeds", "val NLL", "Acc. (%)", "NLL", "MNIST AUROC (%)", "X AUROC (%)"]
    assert paper_rows.rows(pairing, columns, paper.tables) == [
        # Table 3's SVHN is neither MNIST nor X: shown once, in the first AUROC column, named.
        "| paper: PS-MAP (Net; Tables 1, 3) | 5 | — | 90.0 ± 0.1 | 0.30 ± 0.00 "
        "| 93.0 ± 0.4 (SVHN) | — |",
        "| paper: FS-EB (Net; context: C; Tables 1, 3) | 5 | — | 91.0 ± 0.2 | 0.25 ± 0.01 "
        "| 99.4 ± 0.1 (SVHN) | — |",
        # The appendix's OOD set is the column's: the value stands there unannotated.
        "| paper: FS-EB (Net; context: train; Appendix — context) | 5 | — | 89.0 ± 0.3 | — "
        "| 97.0 ± 0.5 | — |",
    ]


def test_extend_appends_rows_and_the_differs_line_once(tmp_path: Path) -> None:
    path = _toy(tmp_path)
    paper_rows.PAIRINGS["toy"] = Pairing((("ctx", {}),), TOY_OURS)
    try:
        ours = "Header line.\n\n| Method | seeds | Acc. (%) | FMNIST AUROC (%) |\n"
        ours += "|---|---|---|---|\n| PS-MAP | 3 | 91.00 ± 0.10 | 80.00 ± 1.00 |\n\nA note.\n"
        once = paper_rows.extend(ours, "toy", path)
        assert paper_rows.extend(once, "toy", path) == once
    finally:
        del paper_rows.PAIRINGS["toy"]
    lines = once.splitlines()
    assert lines[4:7] == [
        "| PS-MAP | 3 | 91.00 ± 0.10 | 80.00 ± 1.00 |",
        "| paper: FS-EB (Net; context: train; Appendix — context) | 5 | 89.0 ± 0.3 "
        "| 97.0 ± 0.5 (MNIST) |",
        "| paper: FS-EB (Net; context: other; Appendix — context) | 5 | 88.0 ± 0.3 | — |",
    ]
    assert lines[7] == "" and lines[9:] == ["", "A note."]
    assert lines[8] == (
        "Paper rows: Toy et al., Appendix — context, as printed (± standard error over 5 seeds), "
        "from `benchmarks/paper_numbers.yaml`. What differs — backbone: paper Net; here our net. "
        "Budget: paper 200 epochs; here 3 epochs. Context: paper C; here ours. OOD set: MNIST in "
        "both."
    )


def test_a_value_not_as_printed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "numbers.yaml"
    path.write_text(TOY.replace('"90.0 ± 0.1"', '"90.0 +- 0.1"'), encoding="utf-8")
    with pytest.raises(ValueError, match=r"table t1: bad row"):
        paper_rows.load(path)


def test_write_fills_known_sections_and_leaves_the_rest(tmp_path: Path) -> None:
    ratios = {"cnn/cached/M=128": 1.919, "resnet18/cached/M=128": 1.706}
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n<!-- fmnist:begin -->\nOurs.\n\n"
        "| Method | seeds | Acc. (%) | MNIST AUROC (%) |\n|---|---|---|---|\n"
        "| PS-MAP | 3 | 90.68 ± 0.07 | 77.54 ± 2.10 |\n<!-- fmnist:end -->\n\n"
        "<!-- other:begin -->\n| Method | Acc. (%) |\n|---|---|\n<!-- other:end -->\n\n"
        f"```json\n{json.dumps(ratios)}\n```\n\n<!-- paper-runtimes:begin -->\n"
        "<!-- paper-runtimes:end -->\n<!-- paper-claims:begin -->\n<!-- paper-claims:end -->\n",
        encoding="utf-8",
    )
    assert paper_rows.write_page(page) == ["fmnist", "paper-claims", "paper-runtimes"]
    once = page.read_text(encoding="utf-8")
    assert paper_rows.write_page(page) and page.read_text(encoding="utf-8") == once
    fmnist = once.split("<!-- fmnist:begin -->")[1].split("<!-- fmnist:end -->")[0]
    assert (
        "| paper: FS-EB (ResNet-18, from scratch; context: KMNIST; Tables 1, 3) | 5 | 94.1 ± 0.1 "
        "| 99.9 ± 0.0 |"
    ) in fmnist
    assert "<!-- other:begin -->\n| Method | Acc. (%) |\n|---|---|\n<!-- other:end -->" in once
    # 129 ms / 40 ms and 60 s / 18 s in the paper; ours from the JSON on the page.
    assert "| FashionMNIST | FS-EB | 129 | 60 | 3.2 | 3.3 | 1.92 (" in once
    assert "| better NLL | NLL | 0.26 ± 0.00 → 0.19 ± 0.00 | 0.13 ± 0.01 → 0.11 ± 0.00 |" in once


@pytest.mark.parametrize("page", ["results.md", "performance.md"])
def test_the_docs_carry_the_paper_rows_the_data_file_gives(page: str, tmp_path: Path) -> None:
    copy = tmp_path / page
    copy.write_text((ROOT / "docs" / page).read_text(encoding="utf-8"), encoding="utf-8")
    assert paper_rows.write_page(copy), f"docs/{page} has no paper sections"
    committed = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert copy.read_text(encoding="utf-8") == committed, f"run `{paper_rows.COMMAND}`"
