"""Start-up on image folders: the time to build the splits of a folder of JPEGs.

    python -m benchmarks.startup [--cache DIR] [--repeats 3] [--datasets-repeats 1]

Three ways of turning ``root/<split>/<class>/*.jpg`` into labelled samples are timed on the
CIFAR-10 JPEGs of ``../shared`` (extracted once into ``--cache``):

- ``fseb_ft``: :func:`fseb_ft.data.sources.imagefolder.load_imagefolder` (``os.scandir``
  listing, see :mod:`fseb_ft.data.files`);
- ``datasets``: ``datasets.load_dataset("imagefolder", ...)`` as fseb_ft called it before,
  with its Arrow cache already built (what every run after the first paid);
- ``torchvision``: ``torchvision.datasets.ImageFolder``.

Two sizes: 7k (the first 700 training JPEGs of each class, linked into a folder of their own;
split ``train``) and 60k (the whole folder; splits ``train`` and ``test``). ``first`` is the
first build in the process (for ``datasets``, the first after the one that built its cache),
``median`` the median of ``--repeats`` more (``--datasets-repeats`` for ``datasets``); the
libraries are imported before any timing. The labels of the three
are checked to agree. The last line printed is a JSON object whose ``seconds_per_10k`` is
fseb_ft's worst first build per 10,000 images.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import torch
from torchvision.datasets import ImageFolder

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.screening import check_image
from fseb_ft.data.sources.imagefolder import load_imagefolder

REPO = Path(__file__).resolve().parents[1]
CIFAR_TAR = REPO.parent / "shared" / "data" / "cifar10-jpeg" / "CIFAR-10-images.tar"
TINY_TAR = REPO.parent / "shared" / "data" / "tiny-imagenet" / "tiny-imagenet-200-val.tar"
PER_CLASS_7K = 700
LARGE = (500, 375)
"""ImageNet's typical JPEG size (W, H), for the check's cost on larger images."""
LARGE_COUNT = 500


def extract(cache: Path) -> tuple[Path, Path]:
    """The whole CIFAR-10 JPEG folder and its 7k training subset under ``cache`` (made once)."""
    full, small = cache / "cifar10", cache / "cifar10-7k"
    if not (full / ".complete").exists():
        with tarfile.open(CIFAR_TAR) as tar:
            tar.extractall(full, filter="data")
        (full / ".complete").touch()
    if not (small / ".complete").exists():
        for class_dir in sorted((full / "train").iterdir()):
            target = small / "train" / class_dir.name
            target.mkdir(parents=True, exist_ok=True)
            for file in sorted(class_dir.iterdir())[:PER_CLASS_7K]:
                if not (target / file.name).exists():
                    os.symlink(file, target / file.name)
        (small / ".complete").touch()
    return full, small


def check_sets(cache: Path, full: Path) -> dict[str, LabeledImages]:
    """The folders the check is timed on: CIFAR-10's 10k test JPEGs, Tiny-ImageNet's 10k
    validation JPEGs (when ``../shared`` has them), and CIFAR images enlarged to 500×375."""
    from PIL import Image

    sets = {"CIFAR-10 test, 32×32": load_imagefolder(full, "test")}
    if TINY_TAR.is_file():
        tiny = cache / "tiny-imagenet"
        if not (tiny / ".complete").exists():
            with tarfile.open(TINY_TAR) as tar:
                tar.extractall(tiny, filter="data")
            (tiny / ".complete").touch()
        sets["Tiny-ImageNet val, 64×64"] = load_imagefolder(tiny / "tiny-imagenet-200", "val")
    large = cache / "large"
    if not (large / ".complete").exists():
        source = load_imagefolder(full, "train")
        for i in range(LARGE_COUNT):
            target = large / "train" / source.class_names[source.labels[i]] / f"{i:04d}.jpg"
            target.parent.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(source[i][0]).resize(LARGE, Image.Resampling.BICUBIC)
            image.save(target, quality=90)
        (large / ".complete").touch()
    sets[f"CIFAR-10 enlarged, {LARGE[0]}×{LARGE[1]}"] = load_imagefolder(large, "train")
    return sets


def header_only(data: LabeledImages) -> None:
    """``Image.open`` and ``size`` of every image: what a header check costs."""
    from PIL import Image

    for i in range(len(data)):
        with Image.open(data.encoded(i)[1]) as image:
            _ = image.size


def the_check(data: LabeledImages) -> None:
    """:func:`fseb_ft.data.screening.check_image` on every image (``find_bad_images`` without its
    per-process memo)."""
    for i in range(len(data)):
        check_image(data.encoded(i)[1])


def full_decode(data: LabeledImages) -> None:
    """A full decode of every image."""
    from PIL import Image

    for i in range(len(data)):
        with Image.open(data.encoded(i)[1]) as image:
            image.load()


def check_costs(cache: Path, full: Path, repeats: int) -> float:
    """Print the check's cost per 10k images by depth; return the chosen depth's worst cost.

    Each cell is the fastest of ``repeats`` passes (files already read once, so in the page
    cache), as wall-clock and process CPU seconds per 10,000 images.
    """
    print(
        "\n| images | header: open + size | the check (JPEG at 1/8 scale, else full) "
        "| full decode |"
    )
    print("|---|---:|---:|---:|")
    worst = 0.0
    for name, data in check_sets(cache, full).items():
        cells = []
        depths = (header_only, the_check, full_decode)
        header_only(data)  # warm the page cache
        for i, depth in enumerate(depths):
            walls, cpus = [], []
            for _ in range(max(1, repeats)):
                start, cpu = time.perf_counter(), time.process_time()
                depth(data)
                walls.append((time.perf_counter() - start) / len(data) * 10_000)
                cpus.append((time.process_time() - cpu) / len(data) * 10_000)
            worst = max(worst, min(walls)) if i == 1 else worst
            cells.append(f"{min(walls):.1f} s (CPU {min(cpus):.1f} s)")
        print(f"| {name} ({len(data):,}) | {' | '.join(cells)} |")
    return worst


def fseb_ft_labels(root: Path, split: str) -> list[str]:
    """fseb_ft's class name of every sample, in its order."""
    data = load_imagefolder(root, split)
    return [data.class_names[k] for k in data.labels]


def datasets_labels(root: Path, split: str, cache_dir: Path) -> list[str]:
    """The class name of every sample as ``datasets``' imagefolder builder gives it."""
    dataset = datasets.load_dataset(
        "imagefolder", data_dir=str(root), split=split, drop_labels=False, cache_dir=str(cache_dir)
    )
    names = dataset.features["label"].names
    return [names[k] for k in dataset.with_format("arrow")["label"].to_numpy()]


def torchvision_labels(root: Path, split: str) -> list[str]:
    """The class name of every sample as ``torchvision.datasets.ImageFolder`` gives it."""
    data = ImageFolder(str(root / split))
    return [data.classes[k] for k in data.targets]


def timed(build: Callable[[], list[list[str]]], repeats: int) -> tuple[float, float, float, list]:
    """(first build's seconds, its CPU seconds, median of ``repeats`` more, its labels)."""
    start, cpu = time.perf_counter(), time.process_time()
    labels = build()
    first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build()
        times.append(time.perf_counter() - start)
    return first, first_cpu, statistics.median(times) if times else first, labels


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print the table and, last, the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "fseb_startup")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datasets-repeats", type=int, default=1)
    parser.add_argument(
        "--check", action="store_true", help="also time the check before training, by depth"
    )
    parser.add_argument("--only-check", action="store_true", help="time only the check")
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    if not CIFAR_TAR.is_file():
        print(f"skipped: {CIFAR_TAR} is absent (only checkouts next to ../shared have it)")
        return {}
    full, small = extract(args.cache)
    if args.only_check:
        summary = {"check_seconds_per_10k": check_costs(args.cache, full, args.repeats)}
        print(json.dumps(summary))
        return summary
    cases = {"7k": (small, ("train",)), "60k": (full, ("train", "test"))}
    hf_cache = args.cache / "hf-datasets"
    print(
        f"device: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, python {sys.version.split()[0]}"
    )
    print(
        "| files | method | first build (s) | its CPU time (s) | median of repeats (s) "
        "| s per 10k (first) |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    per_10k: dict[str, float] = {}
    for size, (root, splits) in cases.items():
        methods = {
            "fseb_ft": (lambda r=root, s=splits: [fseb_ft_labels(r, x) for x in s], args.repeats),
            "datasets": (
                lambda r=root, s=splits: [datasets_labels(r, x, hf_cache) for x in s],
                args.datasets_repeats,
            ),
            "torchvision": (
                lambda r=root, s=splits: [torchvision_labels(r, x) for x in s],
                args.repeats,
            ),
        }
        found = {}
        for name, (build, repeats) in methods.items():
            if name == "datasets":
                build()  # builds the Arrow cache once: the runs after the first one skip it
            first, cpu, median, labels = timed(build, repeats)
            n = sum(len(split) for split in labels)
            found[name] = labels
            rate = first / n * 10_000
            if name == "fseb_ft":
                per_10k[size] = rate
            print(f"| {n:,} | {name} | {first:.2f} | {cpu:.2f} | {median:.2f} | {rate:.3f} |")
        for name in ("datasets", "torchvision"):
            if not all(
                np.array_equal(sorted(a), sorted(b))
                for a, b in zip(found["fseb_ft"], found[name], strict=True)
            ):
                raise SystemExit(f"{size}: fseb_ft's labels differ from {name}'s")
        if found["fseb_ft"] != found["datasets"]:
            raise SystemExit(f"{size}: fseb_ft's sample order differs from datasets'")
    summary = {"seconds_per_10k": max(per_10k.values())}
    summary |= {f"seconds_per_10k_{size}": rate for size, rate in per_10k.items()}
    if args.check:
        summary["check_seconds_per_10k"] = check_costs(args.cache, full, args.repeats)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
