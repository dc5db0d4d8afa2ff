"""The paper's numbers as rows of their own beside our tables, from one transcription.

    python -m benchmarks.paper_rows --write docs/results.md docs/performance.md

``benchmarks/paper_numbers.yaml`` transcribes every numeric table of Rudner et al. (ICML 2023),
as printed (mean ± standard error over five seeds, percentages). This module renders them for a
table of ours: given the table's Markdown header, one "paper: …" row per paper method with a
cell under each column the paper reports ("—" under the others), and one line saying what
differs between the paper's setup and ours (backbone, budget, context, OOD set).

The benchmark drivers call :func:`extend` on the tables they write, and ``--write`` applies the
same :func:`extend` to the marked sections already in a page (``<!-- NAME:begin -->`` with NAME
in :data:`SECTIONS`), so a page gets the same rows whether a driver rewrote its section or not,
and running either again changes nothing. ``--write`` also fills two sections of its own: the
paper's numbers for each claim (``paper-claims``) and its runtimes beside the step-time ratios
of ``benchmarks.overhead`` (``paper-runtimes``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from fseb_ft.runs.atomic import write_text

NUMBERS = Path(__file__).with_name("paper_numbers.yaml")
COMMAND = "python -m benchmarks.paper_rows --write docs/results.md docs/performance.md"
PAPER_ROW = "| paper: "  # how every rendered paper row starts
DIFFERS = "Paper rows:"  # how the line on what differs starts
MISSING = "—"
METRICS = ("acc", "sel_pred", "nll", "ece", "ood_auroc", "step_ms", "epoch_s")
ROW_KEYS = ("method", "fraction", "context", "context_batch", "data")
VALUE = re.compile(r"^\d+(\.\d+)?( ± \d+(\.\d+)?)?$")  # as printed: "93.8 ± 0.0" or "94.5"
# Our column titles → the paper's metric; "<set> AUROC (%)" columns are matched by OOD set.
COLUMN_METRICS = {"Acc. (%)": "acc", "NLL": "nll", "ECE (%)": "ece", "Sel. Pred. (%)": "sel_pred"}
AUROC_COLUMN = re.compile(r"^(?P<set>.+) AUROC \(%\)$")
OOD_ALIASES = {"fmnist": "fashionmnist"}
# Our OOD sets' recipe names → the titles of their "<title> AUROC (%)" columns in our tables.
OOD_TITLES = {
    "mnist": "MNIST",
    "fmnist": "FMNIST",
    "held_out": "4 held-out classes",
    "cifar100": "CIFAR-100",
    "tiny_imagenet": "Tiny-ImageNet",
}


@dataclass(frozen=True)
class PaperRow:
    """One printed row: what identifies it (method, fraction, …) and its values as printed."""

    keys: Mapping[str, str]
    values: Mapping[str, str]


@dataclass(frozen=True)
class PaperTable:
    """One table of the paper (or one dataset's half of it) and the setup it was measured in."""

    id: str
    cite: str  # "Table 1", "Appendix — context distribution": the paper's heading
    part: str | None  # the dataset's half of a table printed for two datasets
    data: str
    backbone: str | None
    epochs: int | None  # None: the paper's tables do not state it
    context: str | None
    ood: str | None  # the OOD set of its AUROC column
    seeds: int | None  # the "±" is the standard error over this many seeds
    rows: tuple[PaperRow, ...]


@dataclass(frozen=True)
class Transcription:
    """The data file: how to cite the paper in a line, and its tables by id."""

    short: str  # "Rudner et al. (ICML 2023)"
    tables: Mapping[str, PaperTable]


def load(path: Path = NUMBERS) -> Transcription:
    """The transcription; a value not as printed is an error, not a guess."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    tables = {}
    for table_id, spec in raw["tables"].items():
        rows = []
        for row in spec["rows"]:
            unknown = set(row) - set(METRICS) - set(ROW_KEYS)
            bad = [v for k, v in row.items() if k in METRICS and not VALUE.match(str(v))]
            if unknown or bad or not isinstance(row.get("method"), str):
                raise ValueError(f"{path}: table {table_id}: bad row {row} ({unknown or bad})")
            keys = {k: str(v) for k, v in row.items() if k in ROW_KEYS}
            rows.append(PaperRow(keys, {k: v for k, v in row.items() if k in METRICS}))
        fields = {k: spec.get(k) for k in ("part", "backbone", "epochs", "context", "ood")}
        tables[table_id] = PaperTable(
            table_id, spec["cite"], data=spec["data"], seeds=spec["seeds"], rows=tuple(rows),
            **fields,
        )  # fmt: skip
    return Transcription(raw["short"], tables)


@dataclass(frozen=True)
class Ours:
    """Our side of a comparison, for the line on what differs."""

    backbone: str
    budget: str
    context: str
    ood: str


@dataclass(frozen=True)
class Pairing:
    """Which paper rows stand beside one of our tables, and how our setup differs.

    ``sources`` are (table id, row filter) pairs; rows of different tables with the same keys
    (Table 1's and Table 3's FS-EB) merge into one row, so a row can carry Table 1's accuracy
    and Table 3's AUROC. A filter keeps the rows whose keys include it.
    """

    sources: tuple[tuple[str, Mapping[str, str]], ...]
    ours: Ours


_FMNIST_CNN = "the CNN of the authors' public FashionMNIST config (`fseb_cnn`), from scratch"
PAIRINGS = {
    "fmnist": Pairing(
        (
            ("table1", {}),
            ("table3-fmnist", {}),
            ("context-dist-fmnist", {"context": "train, corrupted"}),
            ("context-dist-fmnist", {"context": "train"}),
        ),
        Ours(
            _FMNIST_CNN,
            "the epochs stated above the table",
            "each FS-EB row's label: corrupted training inputs (train-corr), 10,000 CIFAR-10 "
            "training images in grayscale (cifar10-gray), the 10,000 KMNIST test images (kmnist)",
            "MNIST",
        ),
    ),
    "fmnist-tuned": Pairing(
        (("table1", {}), ("table3-fmnist", {})),
        Ours(
            _FMNIST_CNN,
            "3 epochs, 8 trials per method (the paper: a randomised grid search of unstated size)",
            "corrupted training inputs",
            "MNIST",
        ),
    ),
    "fmnist-tuned-kmnist": Pairing(
        (("table1", {}), ("table3-fmnist", {})),
        Ours(
            _FMNIST_CNN,
            "3 epochs, 8 trials per method (the paper: a randomised grid search of unstated size)",
            "the 10,000 KMNIST test images",
            "MNIST",
        ),
    ),
    "cifar10-far": Pairing(
        (("table4", {}),),
        Ours(
            "EfficientNet-Lite0, ImageNet-pretrained",
            "the training subset, resolution and epochs stated above the table",
            "corrupted training inputs",
            "MNIST and FashionMNIST",
        ),
    ),
    "cifar10-tuned": Pairing(
        (("table4", {}),),
        Ours(
            "EfficientNet-Lite0, ImageNet-pretrained",
            "3 epochs at 64 px on 9,000 training images, 4 trials per method (the paper: a "
            "randomised grid search of unstated size)",
            "corrupted training inputs",
            "MNIST",
        ),
    ),
    "cifar10-context": Pairing(
        (("table4", {}),),
        Ours(
            "EfficientNet-Lite0, ImageNet-pretrained",
            "the training subset, resolution and epochs stated above the table",
            "each FS-EB row's label: the 10,000 CIFAR-100 training images of `../shared` "
            "(cifar100), or the 10,000 Tiny-ImageNet validation photos (tiny-imagenet), a "
            "stand-in for the paper's ImageNet context of its pretrained setting",
            "MNIST, FashionMNIST, and whichever of CIFAR-100 and Tiny-ImageNet a row does not "
            "use as its context",
        ),
    ),
    **{
        f"fmnist-frac{share}": Pairing(
            (("fraction-fmnist", {"fraction": f"{share} %"}),),
            Ours(
                f"{_FMNIST_CNN}; a seeded stratified {share} % of the training set "
                "(`data.train.fraction`)",
                "the epochs stated above the table, the checkpoint of lowest validation NLL",
                "the 10,000 KMNIST test images",
                "MNIST",
            ),
        )
        for share in (10, 25)
    },
    "cifar10-frac10": Pairing(
        (("fraction-cifar10", {"fraction": "10 %"}),),
        Ours(
            "EfficientNet-Lite0, ImageNet-pretrained; a seeded stratified 10 % of the training "
            "set (`data.train.fraction`)",
            "the resolution and epochs stated above the table, the checkpoint of lowest "
            "validation NLL",
            "the 10,000 CIFAR-100 training images of `../shared`",
            "MNIST, FashionMNIST and Tiny-ImageNet",
        ),
    ),
    "fmnist-context-batch": Pairing(
        (("context-batch-fmnist", {}),),
        Ours(
            _FMNIST_CNN,
            "the epochs stated above the table",
            "the 10,000 KMNIST test images",
            "MNIST",
        ),
    ),
}
# Marked section of docs/results.md → the pairing whose rows it gets.
SECTIONS = {
    "fmnist": "fmnist",
    "fmnist-kmnist": "fmnist",
    "fmnist-frac10": "fmnist-frac10",
    "fmnist-frac25": "fmnist-frac25",
    "fmnist-context-batch": "fmnist-context-batch",
    "fmnist-tuned": "fmnist-tuned",
    "fmnist-tuned-kmnist": "fmnist-tuned-kmnist",
    "cifar10-far": "cifar10-far",
    "cifar10-context": "cifar10-context",
    "cifar10-tuned": "cifar10-tuned",
    "cifar10-frac10": "cifar10-frac10",
}


@dataclass
class _Merged:
    """One rendered row: the merged values, the tables they come from, its AUROC's OOD set."""

    keys: Mapping[str, str]
    values: dict[str, str]
    tables: list[PaperTable]
    ood: str | None = None


def _merged(pairing: Pairing, tables: Mapping[str, PaperTable]) -> list[_Merged]:
    """The pairing's rows in order, rows with equal keys across tables merged into one."""
    merged: dict[tuple, _Merged] = {}
    for table_id, wanted in pairing.sources:
        table = tables[table_id]
        for row in table.rows:
            if not all(row.keys.get(k) == v for k, v in wanted.items()):
                continue
            entry = merged.setdefault(tuple(sorted(row.keys.items())), _Merged(row.keys, {}, []))
            clash = {k for k in set(entry.values) & set(row.values)
                     if entry.values[k] != row.values[k]}  # fmt: skip
            if clash:
                raise ValueError(f"{table_id}: {row.keys} disagrees on {sorted(clash)}")
            entry.values.update(row.values)
            if "ood_auroc" in row.values:
                entry.ood = table.ood
            if table not in entry.tables:
                entry.tables.append(table)
    return list(merged.values())


def _cites(tables: Sequence[PaperTable]) -> str:
    """'Tables 1, 3' for numbered tables, the headings themselves otherwise."""
    numbered = [t.cite.removeprefix("Table ") for t in tables if t.cite.startswith("Table ")]
    others = [t.cite for t in tables if not t.cite.startswith("Table ")]
    cites = [("Tables " if len(numbered) > 1 else "Table ") + ", ".join(numbered)] * bool(numbered)
    return " and ".join(dict.fromkeys([*cites, *others]))


def _label(row: _Merged) -> str:
    """'paper: FS-EB (ResNet-18, from scratch; context: KMNIST; Tables 1, 3)'."""
    first = row.tables[0]
    parts = [first.backbone] if first.backbone else []
    if "fraction" in row.keys:
        parts.append(f"{row.keys['fraction']} of the training set")
    if "context_batch" in row.keys:
        parts.append(f"context batch {row.keys['context_batch']}")
    context = row.keys.get("context", first.context)
    if context and not row.keys["method"].startswith("PS-MAP"):
        parts.append(f"context: {context}")
    parts.append(_cites(row.tables))
    return f"paper: {row.keys['method']} ({'; '.join(parts)})"


def _same_set(column_set: str, ood: str) -> bool:
    norm = [s.lower().replace("-", "") for s in (column_set, ood)]
    return OOD_ALIASES.get(norm[0], norm[0]) == OOD_ALIASES.get(norm[1], norm[1])


def _cells(row: _Merged, columns: Sequence[str]) -> list[str]:
    """One cell per column: the printed value, the label, the seed count, or "—"."""
    cells = [MISSING] * len(columns)
    for i, title in enumerate(columns):
        if i == 0:
            cells[i] = _label(row)
        elif title == "seeds":
            seeds = row.tables[0].seeds
            cells[i] = str(seeds) if seeds else MISSING
        elif title in COLUMN_METRICS:
            cells[i] = row.values.get(COLUMN_METRICS[title], MISSING)
    auroc = row.values.get("ood_auroc")
    if auroc is not None:
        ood = row.ood
        sets = {i: m["set"] for i, t in enumerate(columns) if (m := AUROC_COLUMN.match(t))}
        same = [i for i, s in sets.items() if _same_set(s, ood)]
        for i in same:
            cells[i] = auroc
        if sets and not same:  # a different OOD set: shown once, named
            cells[min(sets)] = f"{auroc} ({ood})"
    return cells


def rows(pairing: Pairing, columns: Sequence[str], tables: Mapping[str, PaperTable]) -> list[str]:
    """The pairing's paper rows as Markdown table rows under ``columns`` (our header)."""
    return ["| " + " | ".join(_cells(row, columns)) + " |" for row in _merged(pairing, tables)]


def differs(pairing: Pairing, paper: Transcription) -> str:
    """The line under a table: where the paper rows come from and what differs from ours."""
    used = [paper.tables[t] for t in dict.fromkeys(t for t, _ in pairing.sources)]
    first, ours = used[0], pairing.ours
    ood = next((t.ood for t in used if t.ood), None)
    seeds = f"± standard error over {first.seeds} seeds" if first.seeds else "no standard error"
    epochs = f"paper {first.epochs} epochs" if first.epochs else "not stated in the paper's tables"
    same_ood = ood is not None and _same_set(ours.ood, ood)
    ood_text = f"{ood} in both" if same_ood else f"paper {ood}; here {ours.ood}"
    return (
        f"{DIFFERS} {paper.short}, {_cites(used)}, as printed ({seeds}), from "
        f"`benchmarks/paper_numbers.yaml`. What differs — backbone: paper {first.backbone}; "
        f"here {ours.backbone}. Budget: {epochs}; here {ours.budget}. Context: paper "
        f"{first.context}; here {ours.context}. OOD set: {ood_text}."
    )


def _split(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def extend(markdown: str, pairing_name: str, path: Path = NUMBERS) -> str:
    """``markdown`` (a section holding one of our tables) with the pairing's paper rows.

    The rows go at the end of the first table, the line on what differs right after it; paper
    rows and a line already there are replaced, so extending twice equals extending once.
    """
    paper, pairing = load(path), PAIRINGS[pairing_name]
    lines = markdown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    table = [line for line in lines[start:end] if not line.startswith(PAPER_ROW)]
    rest = lines[end:]
    if len(rest) > 1 and rest[0] == "" and rest[1].startswith(DIFFERS):
        rest = rest[2:]
    new = rows(pairing, _split(table[0]), paper.tables)
    line = differs(pairing, paper)
    return "\n".join([*lines[:start], *table, *new, "", line, *rest])


def claims_section(path: Path = NUMBERS) -> str:
    """The paper's PS-MAP → FS-EB numbers for each claim of its abstract, cited by table."""
    tables = load(path).tables

    def change(table_ids: Sequence[str], metric: str) -> str:
        found = {}
        for table_id in table_ids:
            for row in tables[table_id].rows:
                if metric in row.values:
                    found[row.keys["method"]] = (row.values[metric], tables[table_id].ood)
        (before, ood), (after, _) = found["PS-MAP"], found["FS-EB"]
        return (f"{ood}: " if metric == "ood_auroc" else "") + f"{before} → {after}"

    fmnist, transfer = ("table1", "table3-fmnist"), ("table4",)
    claims = (
        ("equal accuracy", "Acc. (%)", "acc"),
        ("better NLL", "NLL", "nll"),
        ("better ECE", "ECE (%)", "ece"),
        ("near-perfect semantic-shift detection", "OOD AUROC (%)", "ood_auroc"),
    )
    seeds = {tables[t].seeds for t in (*fmnist, *transfer)}
    lines = [
        "The paper's own numbers for each claim, PS-MAP → FS-EB, as printed (± standard error "
        f"over {', '.join(map(str, sorted(seeds)))} seeds), from `benchmarks/paper_numbers.yaml` "
        f"(`{COMMAND}`):",
        "",
        "| claim | metric | paper: FashionMNIST, ResNet-18 from scratch, KMNIST context "
        f"({_cites([tables[t] for t in fmnist])}) | paper: CIFAR-10 transfer, ImageNet-pretrained "
        f"ResNet-18 ({_cites([tables[t] for t in transfer])}) |",
        "|---|---|---|---|",
        *(
            f"| {claim} | {title} | {change(fmnist, metric)} | {change(transfer, metric)} |"
            for claim, title, metric in claims
        ),
        "| graceful under covariate shift | — | shown in figures, not in a table | — |",
    ]
    return "\n".join(lines) + "\n"


# The paper's runtime rows → our case in benchmarks.overhead's JSON (method / PS-MAP step ratio).
OUR_RUNTIMES = {
    ("FashionMNIST", "FS-EB"): ("cnn/cached/M=128", "`fseb_cnn`, M = B = 128, cached φ0"),
    ("CIFAR-10", "FS-EB"): ("resnet18/cached/M=128", "ResNet-18 at 32×32, M = B = 128, cached φ0"),
    ("FashionMNIST", "FS-VI"): ("cnn/fsvi/M=128", "`fseb_cnn`, M = B = 128, variance on the head"),
    ("CIFAR-10", "FS-VI"): ("resnet18/fsvi/M=128", "ResNet-18 at 32×32, M = B = 128, head"),
}


def runtimes_section(ratios: Mapping[str, float], path: Path = NUMBERS) -> str:
    """The paper's step and epoch times, its ratios to PS-MAP, and our step ratio beside them."""
    table = load(path).tables["runtimes"]
    lines = [
        f"The paper's runtimes ({table.cite}, hardware not stated) and the ratios to PS-MAP "
        "they give, beside this page's step-time ratio from the JSON above; from "
        f"`benchmarks/paper_numbers.yaml` (`{COMMAND}`).",
        "",
        "| data | method | paper: step (ms) | paper: epoch (s) | paper: step ratio | "
        "paper: epoch ratio | here: step ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {r.keys["data"]: r.values for r in table.rows if r.keys["method"] == "PS-MAP"}
    for row in table.rows:
        data, method = row.keys["data"], row.keys["method"]
        ratio = [float(row.values[k]) / float(base[data][k]) for k in ("step_ms", "epoch_s")]
        key, what = OUR_RUNTIMES.get((data, method), ("", ""))
        ours = f"{ratios[key]:.2f} ({what})" if key in ratios else MISSING
        ours = "1" if method == "PS-MAP" else ours
        lines.append(
            f"| {data} | {method} | {row.values['step_ms']} | {row.values['epoch_s']} | "
            f"{ratio[0]:.1f} | {ratio[1]:.1f} | {ours} |"
        )
    return "\n".join(lines) + "\n"


def our_step_ratios(page: str) -> dict[str, float]:
    """The ratios JSON that ``benchmarks.overhead`` prints, as pasted in docs/performance.md."""
    for block in re.findall(r"```json\n(.*?)\n```", page, flags=re.DOTALL):
        found = json.loads(block)
        if any(key in found for key, _ in OUR_RUNTIMES.values()):
            return found
    return {}


GENERATED = ("paper-claims", "paper-runtimes")
"""The sections :func:`write_page` renders from the paper's numbers alone (no run of ours)."""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def _replace(page: str, name: str, body: str) -> str:
    begin, end = _markers(name)
    head, rest = page.split(begin, 1)
    return head + begin + "\n" + body + end + rest.split(end, 1)[1]


def _section(page: str, name: str) -> str | None:
    begin, end = _markers(name)
    if begin not in page:
        return None
    return page.split(begin, 1)[1].split(end, 1)[0].removeprefix("\n")


def write_page(path: Path) -> list[str]:
    """Fill the paper rows and sections of one page; return the sections written."""
    page = path.read_text(encoding="utf-8")
    written = []
    for name, pairing in SECTIONS.items():
        body = _section(page, name)
        if body is not None:
            page = _replace(page, name, extend(body, pairing))
            written.append(name)
    generated = {  # the names of GENERATED
        "paper-claims": claims_section,
        "paper-runtimes": lambda: runtimes_section(our_step_ratios(page)),
    }
    for name, render in generated.items():
        if _section(page, name) is not None:
            page = _replace(page, name, render())
            written.append(name)
    write_text(path, page)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: write the paper rows into the marked sections of the pages given."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.paper_rows", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", type=Path, nargs="+", required=True, metavar="PAGE")
    args = parser.parse_args(argv)
    for page in args.write:
        names = write_page(page)
        print(f"{page}: {', '.join(names) if names else 'no paper sections'}")


if __name__ == "__main__":
    main()
