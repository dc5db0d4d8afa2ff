"""Peak memory of the README's own-folder recipe, with and without DataLoader workers.

    python -m benchmarks.memory [--workers 0 2] [--no-mallopt] [--cap-gib 18] [--single]

Builds a small 3-class JPEG image folder (``train/``, ``test/`` and a one-class OOD folder) in a
temporary directory and the README's own-folder recipe for it: ``recipes/quickstart.yaml`` with
its ``model:`` and ``data:`` sections replaced by the README's (EfficientNet-Lite0 from
``../shared/weights``, pretrained; data defaults: 224 px, batch 128, ``crop_flip``). For each
``data.num_workers`` it runs ``python -m fseb_ft.finetune RECIPE --compare train.epochs=2``
(``--single``: one FS-EB run instead) as a subprocess and samples the process tree (the run and
its loader workers) every ``--interval`` seconds:

- PSS (``/proc/PID/smaps_rollup``) summed over the tree: the memory the run really holds, with
  pages shared between the parent and its forked workers counted once;
- RSS summed over the tree (counts shared pages once per process, as ``top`` users add it up),
  the main process's RSS and the largest worker RSS.

Safety: the run's process group is killed, and the case reported as ``exceeded cap``, when the
tree's PSS passes ``--cap-gib`` or the machine's ``MemAvailable`` falls below
``--min-available-gib``, so the benchmark never drives a shared machine into the OOM killer.
``--no-mallopt`` adds the cases with ``FSEB_FT_NO_MALLOPT=1`` (glibc's default allocator) as a
reference. Linux only. The last line printed is a JSON object of the peaks per case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from fseb_ft.engine.allocator import DISABLE_ENV

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT.parent / "shared" / "weights" / "efficientnet_lite0.in1k"
CLASSES = ("a", "b", "c")
GIB = 2**30


@dataclass
class Case:
    """One benchmark row: the peaks of one run."""

    name: str
    num_workers: int
    outcome: str
    seconds: float
    pss_gib: float
    rss_gib: float
    main_rss_gib: float
    worker_rss_gib: float
    processes: int


def make_folder(root: Path, train: int, test: int, size: int, seed: int = 0) -> None:
    """``root/data/{train,test}/<class>/*.jpg`` and ``root/other/test/x/*.jpg`` (OOD).

    Each class has its own mean colour plus noise, so the images differ and decode like photos.
    """
    rng = np.random.default_rng(seed)
    folders = [(root / "data" / split / c, n, k) for split, n in (("train", train), ("test", test))
               for k, c in enumerate(CLASSES)]  # fmt: skip
    folders.append((root / "other" / "test" / "x", test, len(CLASSES)))
    for folder, count, k in folders:
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.uniform(0, 255, size=3) * (k + 1) % 255
        for i in range(count):
            noise = rng.normal(0, 40, size=(size, size, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)  # (size, size, 3)
            Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", quality=90)


def readme_recipe(root: Path, weights: Path) -> Path:
    """The quickstart recipe with the README's own-folder ``model:`` and ``data:`` sections."""
    recipe = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    recipe["model"] = {"name": f"local-dir:{weights.resolve()}", "pretrained": True}
    recipe["data"] = {
        "train": {"source": "imagefolder", "path": str(root / "data"), "split": "train"},
        "test": {"source": "imagefolder", "path": str(root / "data"), "split": "test"},
        "ood": {"other": {"source": "imagefolder", "path": str(root / "other"), "split": "test"}},
    }
    recipe["output"] = {"dir": str(root / "runs")}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree(pid: int) -> list[int]:
    children, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _rollup(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in bytes; (0, 0) if it has gone."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return fields.get("Pss", 0), fields.get("Rss", 0)


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def measure(
    name: str, command: list[str], env: dict[str, str], workers: int, args: argparse.Namespace
) -> Case:
    """Run ``command`` in its own process group, sampling its tree until it ends or is killed."""
    log = open(args.log_dir / f"{name}.log", "w")  # noqa: SIM115  (closed below)
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT)  # fmt: skip
    peak = {"pss": 0, "rss": 0, "main": 0, "worker": 0, "n": 0}
    outcome = None
    while proc.poll() is None:
        pids = _tree(proc.pid)
        stats = {p: _rollup(p) for p in pids}
        peak["pss"] = max(peak["pss"], sum(s[0] for s in stats.values()))
        peak["rss"] = max(peak["rss"], sum(s[1] for s in stats.values()))
        peak["main"] = max(peak["main"], stats[proc.pid][1])
        peak["worker"] = max([peak["worker"]] + [s[1] for p, s in stats.items() if p != proc.pid])
        peak["n"] = max(peak["n"], len(pids))
        if peak["pss"] > args.cap_gib * GIB or _available() < args.min_available_gib * GIB:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            outcome = "exceeded cap"
            break
        time.sleep(args.interval)
    log.close()
    if outcome is None:
        outcome = "completed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    return Case(name, workers, outcome, round(time.perf_counter() - start, 1),
                *(round(peak[k] / GIB, 2) for k in ("pss", "rss", "main", "worker")),
                peak["n"])  # fmt: skip


def main() -> None:
    """CLI: run the cases, print the table, then the JSON line of peaks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="data.num_workers")
    parser.add_argument("--no-mallopt", action="store_true", help=f"also run with {DISABLE_ENV}=1")
    parser.add_argument("--single", action="store_true", help="one FS-EB run, not --compare")
    parser.add_argument("--epochs", type=int, default=2, help="train.epochs")
    parser.add_argument("--train-per-class", type=int, default=50, help="training JPEGs per class")
    parser.add_argument("--test-per-class", type=int, default=20, help="test (and OOD) JPEGs")
    parser.add_argument("--image-size", type=int, default=256, help="JPEG side in pixels")
    parser.add_argument("--cap-gib", type=float, default=18.0, help="kill a run above this PSS")
    parser.add_argument(
        "--min-available-gib", type=float, default=2.0, help="kill a run below this MemAvailable"
    )
    parser.add_argument("--interval", type=float, default=0.2, help="sampling period, seconds")
    parser.add_argument("--weights", type=Path, default=WEIGHTS, help="EfficientNet-Lite0 folder")
    parser.add_argument("--log-dir", type=Path, default=None, help="run logs (default: temp dir)")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("benchmarks.memory reads /proc: Linux only")
    if not (args.weights / "model.safetensors").is_file():
        print(f"skipped: EfficientNet-Lite0 weights not found at {args.weights}")
        return
    with tempfile.TemporaryDirectory(prefix="fseb-memory-") as tmp:
        root = Path(tmp)
        args.log_dir = args.log_dir or root
        args.log_dir.mkdir(parents=True, exist_ok=True)
        make_folder(root, args.train_per_class, args.test_per_class, args.image_size)
        recipe = readme_recipe(root, args.weights)
        base = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
        base.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(root / "hf"))
        envs = [("", base)] + ([("no-mallopt ", {**base, DISABLE_ENV: "1"})] * args.no_mallopt)
        rows = []
        for label, env in envs:
            for workers in args.workers:
                name = f"{label}workers={workers}".replace(" ", "_")
                out = root / "runs" / name
                command = [sys.executable, "-m", "fseb_ft.finetune", str(recipe)]
                command += [] if args.single else ["--compare"]
                command += [f"train.epochs={args.epochs}", f"data.num_workers={workers}"]
                command += [f"output.dir={out}"]
                rows.append(measure(name, command, env, workers, args))
                print(f"{rows[-1]}", flush=True)
    mode = "one FS-EB run" if args.single else "--compare (PS-MAP, then FS-EB)"
    print(
        f"\nrecipe: README own-folder (EfficientNet-Lite0, 224 px, batch 128), {mode}, "
        f"train.epochs={args.epochs}, {len(CLASSES)}×{args.train_per_class} train JPEGs; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GIB:.1f} GiB"
    )
    header = (
        f"{'case':24s} {'outcome':>16s} {'s':>7s} {'PSS GiB':>8s} {'RSS GiB':>8s} "
        f"{'main RSS':>9s} {'worker RSS':>11s} {'procs':>6s}"
    )
    print(header)
    for r in rows:
        print(
            f"{r.name:24s} {r.outcome:>16s} {r.seconds:7.1f} {r.pss_gib:8.2f} {r.rss_gib:8.2f} "
            f"{r.main_rss_gib:9.2f} {r.worker_rss_gib:11.2f} {r.processes:6d}"
        )
    print(json.dumps({r.name: asdict(r) for r in rows}))


if __name__ == "__main__":
    main()
