"""fseb_ft on one GPU in one call: the CUDA tests, step throughput, a real fine-tune (issue 35).

    bash benchmarks/gpu/run.sh [--dry-run] [--out DIR]
        [--parts tests eager finetune profile firststep compile] [--budget 420]

(``run.sh`` installs the carried wheels, then runs ``python -m benchmarks.gpu``.) The parts run
in this order, each in its own process with its own time limit (:data:`PART_LIMITS`, within
what is left of ``--budget`` seconds), so a hang or a crash in one loses only that part:

- ``tests``: ``pytest -m cuda`` over the suite (the two-process test is not CUDA-marked: one GPU);
- ``eager``: :mod:`benchmarks.gpu.throughput`, eager, for ResNet-50 and ViT-B/16;
- ``finetune``: :mod:`benchmarks.gpu.finetune` on the carried CIFAR-10 JPEGs and weights;
- ``profile``: :mod:`benchmarks.gpu.profile`, ``torch.profiler`` over timm's and PS-MAP's steps,
  eager and compiled;
- ``firststep``: :mod:`benchmarks.gpu.firststep`, what a step's first use of an input shape
  costs, and whether cuDNN spends it;
- ``compile``: :mod:`benchmarks.gpu.throughput` under ``model.compile()``.

Under ``--out`` (default ``$OUT``, else ``gpu-out``) go each part's log, ``gpu.json`` (every
figure) and ``summary.md`` (the tables); the last line printed is ``gpu.json``'s one JSON line.
``--dry-run`` runs every part on the CPU, small (tiny models, a few steps, a generated image
folder, torch.compile's ``eager`` backend), so the script is exercised by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import cast

import numpy as np
from PIL import Image

from benchmarks.gpu.tables import ROW_PREFIX, Row, first_steps, ratios, reports, table

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("tests", "eager", "finetune", "profile", "firststep", "compile")
PART_LIMITS = {"tests": 120, "eager": 120, "finetune": 180, "profile": 150, "firststep": 120}
"""Seconds a part may take at most (an H100 took 41, 47 and 114 for the first three): a hang
costs one part, and ``compile`` gets the rest of the budget."""
CARRIED_DATA = ROOT / ".gpu-carry" / "cifar10"
CARRIED_WEIGHTS = ROOT / ".gpu-carry" / "efficientnet_lite0.in1k"
THROUGHPUT_DRY = ["--models", "test_resnet", "test_vit", "--batch", "8", "--size", "32", "--steps",
                  "1", "--warmup", "0", "--precision", "no", "--device", "cpu"]  # fmt: skip


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each part's command line (for the dry run, once its image folder is written)."""
    py = [sys.executable]
    tests = [*py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
    throughput = [*py, "-m", "benchmarks.gpu.throughput"]
    finetune = [*py, "-m", "benchmarks.gpu.finetune", "--work", str(Path(args.work) / "runs")]
    if not args.dry_run:
        return {
            "tests": [*tests, "tests"],
            "eager": [*throughput, "--variants", "eager"],
            "finetune": [*finetune, "--data", str(CARRIED_DATA),
                         "--model", f"local-dir:{CARRIED_WEIGHTS}"],
            "profile": [*py, "-m", "benchmarks.gpu.profile"],
            "firststep": [*py, "-m", "benchmarks.gpu.firststep"],
            "compile": [*throughput, "--variants", "compile"],
        }  # fmt: skip
    data = write_image_folder(Path(args.work) / "images", classes=3, train=8, test=4)
    return {
        "tests": [*tests, "tests/test_cuda.py"],
        "eager": [*throughput, *THROUGHPUT_DRY, "--variants", "eager"],
        "finetune": [*finetune, "--data", str(data), "--model", "test_efficientnet",
                     "--no-pretrained", "--size", "32", "--batch", "8", "--workers", "0",
                     "--pool", "8", "--precision", "no"],
        "profile": [*py, "-m", "benchmarks.gpu.profile", "--model", "test_resnet", "--batch", "8",
                    "--size", "32", "--steps", "1", "--warmup", "0", "--precision", "no",
                    "--device", "cpu", "--variants", "eager"],
        "firststep": [*py, "-m", "benchmarks.gpu.firststep", "--models", "test_resnet",
                      "--batch", "8", "--new", "2", "4", "6", "--size", "32", "--precision",
                      "no", "--device", "cpu"],
        # One model: tracing is the dry run's slowest part, and it is the same code for both.
        "compile": [*throughput, *THROUGHPUT_DRY, "--models", "test_resnet",
                    "--variants", "compile", "--compile-backend", "eager"],
    }  # fmt: skip


def write_image_folder(root: Path, classes: int, train: int, test: int) -> Path:
    """A seeded image folder ``root/{train,test}/c<k>/*.jpg`` of 32×32 noise around a colour
    per class (the dry run's data)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("test", test)):
        for k in range(classes):
            folder = root / split / f"c{k}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.normal(60 * k + 40, 30, (32, 32, 3)).clip(0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)
    return root


def run_part(name: str, cmd: list[str], out: Path, limit: float) -> dict[str, object]:
    """Run one part with a time limit, its output to ``out/<name>.log``; its status, seconds
    and the JSON object of its last line (if any)."""
    started = time.perf_counter()
    log = out / f"{name}.log"
    with log.open("w") as f:
        print("$ " + " ".join(cmd), file=f, flush=True)
        try:
            code = subprocess.run(
                cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit
            ).returncode
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
    lines = log.read_text().splitlines()
    found: dict[str, object] = {"status": status, "seconds": round(time.perf_counter() - started)}
    if last := next((x for x in reversed(lines) if x.startswith("{")), None):
        found["figures"] = json.loads(last)  # a part that hung after it may still print more
    elif rows := [
        json.loads(x.removeprefix(ROW_PREFIX)) for x in lines if x.startswith(ROW_PREFIX)
    ]:
        found["figures"] = {"rows": rows}  # a throughput part stopped early keeps its rows
    elif name == "tests" and lines:
        found["summary"] = lines[-1]
    print(f"{name}: {status} in {found['seconds']} s", flush=True)
    return found


def environment() -> dict[str, object]:
    """The machine and the libraries the figures come from (timm's version read from its
    metadata: importing it takes this process 2.5 s that only the parts need)."""
    import torch

    found: dict[str, object] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "timm": metadata.version("timm"), "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
    }  # fmt: skip
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found |= {"device": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                  "sms": props.multi_processor_count}  # fmt: skip
    else:
        found["device"] = f"CPU ({platform.machine()})"
    return found


def summary(results: dict[str, dict[str, object]]) -> str:
    """The Markdown of the throughput tables, the profile and the fine-tunes."""
    lines = [f"`{json.dumps(results['environment'])}`", ""]
    for part in ("eager", "compile"):
        figures = results.get(part, {}).get("figures")
        if figures:
            rows = [Row(**r) for r in figures["rows"]]
            lines += [table(rows, ratios(rows)), ""]
    if found := results.get("profile", {}).get("figures"):
        lines += [reports(cast(dict[str, object], found)), ""]
    if found := results.get("firststep", {}).get("figures"):
        lines += [first_steps(cast(dict[str, object], found)), ""]
    for method, fig in (results.get("finetune", {}).get("figures") or {}).items():
        lines.append(f"- fine-tune {method}: {json.dumps(fig)}")
    for part in (p for p in PARTS if p in results):
        got = results[part]
        lines.append(
            f"- {part}: {got.get('status')} ({got.get('seconds')} s) {got.get('summary', '')}"
        )
    return "\n".join(lines) + "\n"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="every part small, on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-out")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget", type=float, default=420, help="seconds for all the parts")
    parser.add_argument("--work", default="/tmp/fseb-gpu", help="scratch folder (runs, images)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, object]]:
    """Run the parts within the budget; write ``gpu.json`` and ``summary.md``."""
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    results: dict[str, dict[str, object]] = {"environment": environment()}
    cmds = commands(args)
    for name in (p for p in PARTS if p in args.parts):
        left = deadline - time.monotonic()
        if left < 10:
            results[name] = {"status": "not run: the budget was spent"}
            continue
        # A dry run's parts have only the budget: on a loaded CPU (a test suite beside it) a
        # part can outlast a GPU part's limit without hanging.
        limit = left if args.dry_run else min(left, PART_LIMITS.get(name, left))
        results[name] = run_part(name, cmds[name], out, limit)
    (out / "gpu.json").write_text(json.dumps(results) + "\n")
    (out / "summary.md").write_text(summary(results))
    print((out / "summary.md").read_text())
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
