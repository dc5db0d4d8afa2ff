"""Which code made a results table: the stamp a driver writes under each table it generates.

A table's numbers come from run folders, and each run's ``run.json`` records the code that ran
(``code``: fseb_ft's git commit, whether tracked files differed from it, library versions;
:mod:`fseb_ft.runs.code_record`). The stamp gathers those commits and the behaviour fingerprint
each one committed (``benchmarks/fingerprint.json`` at that commit) into one HTML comment that
``python -m benchmarks.stale`` reads, and one line a reader sees::

    <!-- made-by: {"date": "2026-11-27", "commits": ["9e7a226"], "dirty": false, ...} -->
    Made by the code of commit `9e7a226` (2026-11-27; kernels: AVX512), behaviour fingerprint …

A table made before runs recorded their code carries the same comment, written by hand: no
``commits``, ``"recorded_in"`` the commit that added the table, ``"fingerprint": null`` and a
``"waits"`` reason until it is rerun.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.fingerprint import FILE as FINGERPRINT_FILE

__all__ = [
    "MARK",
    "fingerprint_at",
    "fingerprint_id",
    "made_by",
    "read_stamp",
    "run_codes",
    "stamp",
    "write_section",
]

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- made-by: "
"""How a stamp's comment starts; the JSON after it runs to `` -->`` on the same line."""
_STAMP = re.compile(re.escape(MARK) + r"(\{.*?\}) -->")


def fingerprint_at(commit: str, repo: Path = REPO) -> dict[str, str] | None:
    """Each part's hash in ``benchmarks/fingerprint.json`` as committed at ``commit``; ``None``
    when that commit has no fingerprint (it predates it) or git cannot read it."""
    relative = FINGERPRINT_FILE.relative_to(REPO).as_posix()
    done = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{relative}"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return None
    return {name: part["hash"] for name, part in json.loads(done.stdout)["parts"].items()}


def fingerprint_id(parts: Mapping[str, str]) -> str:
    """A short name for a whole fingerprint: 8 hex digits of the hash of its part hashes."""
    return hashlib.sha256(json.dumps(dict(sorted(parts.items()))).encode()).hexdigest()[:8]


def run_codes(folders: Iterable[Path]) -> list[dict[str, Any] | None]:
    """The ``code`` record of every run folder in or under ``folders`` (``None``: a run from
    before ``run.json`` recorded it)."""
    records = []
    for folder in folders:
        for run_json in sorted(Path(folder).glob("**/run.json")):
            records.append(json.loads(run_json.read_text()).get("code"))
    return records


def made_by(codes: Iterable[dict[str, Any] | None], repo: Path = REPO) -> dict[str, Any]:
    """The stamp's record: today's date, the runs' commits (short, oldest listed first as
    found), whether any ran with uncommitted edits, the kernels they ran on (the GPU, or torch's
    CPU vector instructions: a float32 run repeats to the digit only on the same ones), and
    their common fingerprint's part hashes
    (``None`` when a run has no code record, a commit has no fingerprint, or the commits'
    fingerprints differ: ``"mixed": true`` then)."""
    codes = list(codes)
    gits = [None if code is None else code.get("git") for code in codes]
    commits = list(dict.fromkeys(g["commit"][:7] for g in gits if g is not None))
    prints = [fingerprint_at(g["commit"], repo) if g is not None else None for g in gits]
    known = [p for p in prints if p is not None]
    unique = list({json.dumps(p, sort_keys=True): p for p in known}.values())
    record: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "commits": commits,
        "dirty": any(g is not None and g["dirty"] for g in gits),
        "runs": len(codes),
        "kernels": sorted({_kernels(code) for code in codes if code is not None} - {None}),
        "fingerprint": unique[0] if len(unique) == 1 and len(known) == len(codes) else None,
    }
    if len(unique) > 1:
        record["mixed"] = True
    return record


def _kernels(code: Mapping[str, Any]) -> str | None:
    """The run's device kernels: the GPU's name, else torch's CPU vector instructions."""
    machine = code.get("machine") or {}
    return machine.get("gpu") or machine.get("cpu_capability")


def stamp(record: Mapping[str, Any]) -> str:
    """The comment and the reader's line for one table (ends with a newline)."""
    commits = ", ".join(f"`{c}`" for c in record["commits"])
    label = "commit" if len(record["commits"]) == 1 else "commits"
    edits = " with uncommitted edits" if record.get("dirty") else ""
    parts = record.get("fingerprint")
    if parts:
        which = f"behaviour fingerprint `{fingerprint_id(parts)}`"
    elif record.get("mixed"):
        which = "several behaviour fingerprints (a mixed table)"
    else:
        which = "no behaviour fingerprint (its runs predate it or did not record their code)"
    if commits:
        kernels = ", ".join(record.get("kernels") or []) or "unrecorded"
        made = f"the code of {label} {commits}{edits} ({record['date']}; kernels: {kernels})"
    else:  # a table from before runs recorded their code
        made = f"the code of {record['date']} (added in commit `{record.get('recorded_in')}`)"
    return f"{MARK}{json.dumps(dict(record), sort_keys=True)} -->\nMade by {made}, {which}.\n"


def read_stamp(section: str) -> dict[str, Any] | None:
    """The record of the stamp in one section's text, or ``None`` if it has none."""
    found = _STAMP.search(section)
    return None if found is None else json.loads(found.group(1))


def write_section(
    path: Path,
    body: str,
    markers: tuple[str, str],
    *,
    runs: Sequence[Path] = (),
    codes: Sequence[dict[str, Any] | None] = (),
) -> None:
    """Replace one marked section of ``docs/results.md`` (or append it), stamped with the code
    that made the run folders in or under ``runs`` (:mod:`benchmarks.provenance`), and with
    ``codes``, the code records of work done in this process
    (:func:`fseb_ft.runs.code_record.code_record`), for a table made without run folders."""
    text = path.read_text() if path.exists() else "# Results\n"
    body = body.rstrip("\n") + "\n\n" + stamp(made_by([*run_codes(runs), *codes]))
    block = f"{markers[0]}\n{body}{markers[1]}"
    if markers[0] in text:
        head, rest = text.split(markers[0], 1)
        text = head + block + rest.split(markers[1], 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
