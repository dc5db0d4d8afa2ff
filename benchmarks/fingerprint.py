"""The behaviour fingerprint: a tiny, seeded slice of every path that shapes results, one hash per
part, so that a change that moves results is noticed, and made on purpose.

Run ``python -m benchmarks.fingerprint``: it computes the parts
(:mod:`benchmarks.fingerprint_parts`, about 1 s after the imports, on one thread), prints their
values, then one line per part with
its hash and whether it matches the committed ``benchmarks/fingerprint.json``, and exits with
status 1 when a part changed. ``--write`` writes the file (a commit that changes a part says so
in its message and commits the file regenerated). ``tests/benchmarks/test_fingerprint.py``
recomputes it.

Parts and how they compare (docs/results.md, "Behaviour fingerprint"):

- ``pixels``, ``corruptions`` and ``context`` are integer grey levels and pool indices: exact
  on every x86-64 CPU with AVX2 (:func:`exact_here`; without it OpenCV's hue jitter rounds
  differently);
- ``loss``, ``training`` and ``metrics`` are float64 values, compared within a relative
  tolerance (:data:`TOLERANCES`): BLAS, LAPACK and vectorised ``exp``/``log`` round differently
  on CPUs with other vector units, even in float64, so their bits are not compared. The hash of
  such a part is the hash of the committed values whenever the values found agree with them, so
  it is the same on every CPU; only a change beyond the tolerance gives a new hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

__all__ = [
    "FILE",
    "LIBRARIES",
    "TOLERANCES",
    "compute",
    "differences",
    "exact_here",
    "isolated",
    "main",
    "part_hash",
    "read_committed",
    "report",
    "resolve",
]

FILE = Path(__file__).with_suffix(".json")
"""The committed fingerprint, ``benchmarks/fingerprint.json``."""
PARTS = ("pixels", "corruptions", "context", "loss", "training", "metrics")
"""The parts, in the order they are computed and printed."""
TOLERANCES: dict[str, float | None] = {
    "pixels": None,
    "corruptions": None,
    "context": None,
    "loss": 1e-10,
    "training": 1e-9,
    "metrics": 1e-12,
}
"""Each part's relative tolerance (absolute below 1); ``None``: exact.

What they cover, measured on one machine by switching each library's instruction set (AVX-512,
AVX2, SSE4; ``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ``NPY_DISABLE_CPU_FEATURES``,
``OPENCV_CPU_DISABLE``, ``JSIMD_FORCENONE``): ``loss``, the float64 forward of a tiny conv net
and the FS-EB Cholesky (MKL's GEMM and LAPACK kernels, torch's vectorised kernels), differed by
at most 1e-13; ``training``, the same through four SGD steps, by 1.3e-12; ``metrics`` (torch's
and numpy's vectorised ``exp``/``log``, scikit-learn's sums) by 3e-17. Each tolerance is about
1,000 times (``metrics``: 30,000) what was measured, and far below what a change of behaviour
moves."""
LIBRARIES = (
    "torch",
    "timm",
    "numpy",
    "pillow",
    "opencv-python-headless",
    "albumentations",
    "albucore",
    "scikit-learn",
    "scipy",
    "datasets",
)
"""Libraries whose versions the file records: an upgrade may move a part."""
SHOWN = 8
"""Differences listed per part; the rest are counted."""


@contextmanager
def isolated() -> Iterator[None]:
    """torch and OpenCV on one thread inside; their thread counts and the global random
    streams (which the parts seed as a run does) restored after, for the tests that follow."""
    import cv2
    import numpy as np
    import torch

    threads, cv_threads = torch.get_num_threads(), cv2.getNumThreads()
    streams = random.getstate(), np.random.get_state(), torch.get_rng_state()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv_threads)
        random.setstate(streams[0])
        np.random.set_state(streams[1])
        torch.set_rng_state(streams[2])


def compute() -> dict[str, Any]:
    """Every part's values (fixtures in a temporary folder, one thread)."""
    from benchmarks.fingerprint_parts import compute as compute_parts

    with isolated(), tempfile.TemporaryDirectory() as root:
        return compute_parts(Path(root))


def exact_here() -> bool:
    """Whether OpenCV runs its AVX2 code here, as on every x86-64 CPU since 2013-15 (Intel
    Haswell, AMD Excavator): its SSE4 RGB↔HSV conversion (the context's hue jitter) rounds a
    few pixels one grey level apart, which moves the ``context`` part and FS-EB's values."""
    import cv2

    return any(feature.lstrip("*") == "AVX2" for feature in cv2.getCPUFeaturesLine().split())


def part_hash(values: Any) -> str:
    """sha256 (16 hex digits) of ``values`` as canonical JSON."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _close(old: float, new: float, tolerance: float | None) -> bool:
    if tolerance is None:
        return old == new
    if math.isnan(old) or math.isnan(new):
        return math.isnan(old) and math.isnan(new)
    return math.isclose(old, new, rel_tol=tolerance, abs_tol=tolerance)


def _moved(path: str, old: Any, new: Any, tolerance: float | None) -> str:
    """One difference: ``path: old -> new``, with the relative difference of two numbers."""
    line = f"{path}: {old!r} -> {new!r}"
    if _number(old) and _number(new) and tolerance is not None:
        relative = abs(new - old) / max(abs(old), abs(new), 1.0)
        line += f" (relative difference {relative:.1e} > tolerance {tolerance:.0e})"
    return line


def differences(path: str, old: Any, new: Any, tolerance: float | None) -> list[str]:
    """Where ``new`` differs from ``old``: numbers beyond ``tolerance`` (``None``: exact),
    anything else when unequal; keys and lengths too."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        found = [f"{path}.{k}: no longer computed" for k in old if k not in new]
        found += [f"{path}.{k}: new" for k in new if k not in old]
        for key in (k for k in old if k in new):
            found += differences(f"{path}.{key}", old[key], new[key], tolerance)
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} values -> {len(new)}"]
        return [
            line
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for line in differences(f"{path}[{i}]", a, b, tolerance)
        ]
    if _number(old) and _number(new) and _close(float(old), float(new), tolerance):
        return []
    return [] if old == new and type(old) is type(new) else [_moved(path, old, new, tolerance)]


def resolve(
    found: Mapping[str, Any], committed: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The fingerprint document of the values ``found`` and each changed part's differences
    from ``committed``. A part that agrees keeps the committed values (and so their hash)."""
    parts = {} if committed is None else committed.get("parts", {})
    document: dict[str, Any] = {"libraries": libraries(), "parts": {}}
    changes: dict[str, list[str]] = {}
    for name in PARTS:
        tolerance = TOLERANCES[name]
        if name in parts:
            moved = differences(name, parts[name]["values"], found[name], tolerance)
        else:
            moved = [f"{name}: not in the committed fingerprint"]
        values = found[name] if moved else parts[name]["values"]
        if moved:
            changes[name] = moved
        document["parts"][name] = {
            "hash": part_hash(values),
            "tolerance": "exact" if tolerance is None else tolerance,
            "values": values,
        }
    return document, changes


def libraries() -> dict[str, str]:
    """The installed versions of :data:`LIBRARIES`."""
    return {name: version(name) for name in LIBRARIES}


def report(changes: Mapping[str, list[str]], committed: Mapping[str, Any] | None = None) -> str:
    """What changed, part by part (at most :data:`SHOWN` lines each), the library versions that
    differ from the committed file's, and how to regenerate it."""
    lines = [f"the behaviour fingerprint changed in: {', '.join(changes)}"]
    for name, moved in changes.items():
        lines += [f"  {line}" for line in moved[:SHOWN]]
        if len(moved) > SHOWN:
            lines.append(f"  ... and {len(moved) - SHOWN} more in {name}")
    before = {} if committed is None else committed.get("libraries", {})
    upgraded = [f"{k} {before[k]} -> {v}" for k, v in libraries().items() if before.get(k, v) != v]
    if upgraded:
        lines.append("libraries differ from the committed file's: " + ", ".join(upgraded))
    lines.append(
        "If the change is intended: python -m benchmarks.fingerprint --write, commit "
        "benchmarks/fingerprint.json and say in the commit message which part changed and why."
    )
    return "\n".join(lines)


def read_committed(path: Path = FILE) -> dict[str, Any] | None:
    """The committed fingerprint, ``None`` when there is none yet."""
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, print the values and a line per part; ``--write`` the file. Status 1 when a
    part changed and the file was not written."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fingerprint", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {FILE.name}")
    parser.add_argument("--file", type=Path, default=FILE, help="the fingerprint file")
    args = parser.parse_args(argv)
    committed = read_committed(args.file)
    document, changes = resolve(compute(), committed)
    print(json.dumps({k: v["values"] for k, v in document["parts"].items()}, indent=1))
    for name, part in document["parts"].items():
        state = "CHANGED" if name in changes else "unchanged"
        print(f"{name:11s} {part['hash']}  {part['tolerance']!s:6s} {state}")
    if changes:
        print(report(changes, committed))
    if not exact_here():
        print("note: OpenCV runs no AVX2 code here; the fingerprint is exact on AVX2 CPUs only")
    if args.write:
        args.file.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.file}")
    return 1 if changes and not args.write else 0


if __name__ == "__main__":
    # Before torch loads (below, in compute): OpenMP sizes its pool from this once.
    os.environ["OMP_NUM_THREADS"] = "1"
    raise SystemExit(main())
