"""Which results tables today's code would not reproduce: their fingerprint differs from today's.

    python -m benchmarks.stale [PAGE ...]      (default: every page of docs/)

Every generated table of the docs (a section between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->``) carries the stamp of the code that made it (:mod:`benchmarks.provenance`).
A table is *current* when its stamp's fingerprint equals the committed
``benchmarks/fingerprint.json`` part for part, and *stale* otherwise: some part that shapes
results (pixels, corruptions, context, loss, training, metrics) changed since, the table predates
the fingerprint, or its runs mixed several. A stale table either is rerun or says, in its
stamp's ``"waits"``, why it waits. The command lists the stale tables with the parts that
changed and the reason, and exits with 1 when one has no reason (or a table has no stamp), which
``make test`` checks; the sections ``benchmarks.paper_rows`` renders from the paper's numbers
alone are not results of this code and are left out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fingerprint import FILE as FINGERPRINT_FILE
from benchmarks.paper_rows import GENERATED
from benchmarks.provenance import fingerprint_id, read_stamp

__all__ = ["Table", "main", "state", "tables"]

REPO = Path(__file__).resolve().parents[1]
_SECTION = re.compile(r"<!-- ([\w-]+):begin -->(.*?)<!-- \1:end -->", re.DOTALL)


@dataclass(frozen=True)
class Table:
    """One generated section of a page and the stamp it carries."""

    page: Path
    """The Markdown page holding it."""
    name: str
    """The section's marker name."""
    made_by: dict[str, Any] | None
    """Its stamp's record (:func:`benchmarks.provenance.made_by`); ``None``: no stamp."""


def tables(pages: Sequence[Path]) -> Iterator[Table]:
    """The generated results sections of ``pages``, in page order (the paper's own left out)."""
    for page in pages:
        for found in _SECTION.finditer(page.read_text(encoding="utf-8")):
            if found.group(1) not in GENERATED:
                yield Table(page, found.group(1), read_stamp(found.group(2)))


def state(table: Table, today: Mapping[str, str]) -> tuple[bool, str]:
    """``(stale, why)`` for one table against today's part hashes."""
    record = table.made_by
    if record is None:
        return True, "no stamp"
    parts = record.get("fingerprint")
    if not parts:
        return True, "mixed fingerprints" if record.get("mixed") else "made before the fingerprint"
    changed = [name for name in today if parts.get(name) != today[name]]
    if changed:
        return True, "changed since: " + ", ".join(changed)
    return False, f"current (fingerprint {fingerprint_id(parts)})"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: list every table with its state; exit status 1 if a stale one says not why it waits."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("pages", nargs="*", type=Path, default=sorted((REPO / "docs").glob("*.md")))
    args = parser.parse_args(argv)
    today = {k: v["hash"] for k, v in json.loads(FINGERPRINT_FILE.read_text())["parts"].items()}
    unexplained = 0
    for table in tables(args.pages):
        stale, why = state(table, today)
        record = table.made_by or {}
        commits = ",".join(record.get("commits", [])) or f"added in {record.get('recorded_in')}"
        made = f"{record.get('date', '?')} {commits}"
        line = f"{table.page.name}:{table.name}  [{made}]  {why}"
        if stale:
            waits = record.get("waits")
            unexplained += waits is None
            line += f"\n    waits: {waits}" if waits else "\n    STALE, and says not why it waits"
        print(line)
    if unexplained:
        print(f"{unexplained} stale table(s) say not why they wait: rerun them, or give the stamp "
              "a \"waits\" reason", file=sys.stderr)  # fmt: skip
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
