"""Prepare, on this machine, what the GPU script carries to a GPU machine (issue 35).

    python -m benchmarks.gpu.prepare [--shared ../shared] [--train-per-class 200]
        [--test-per-class 50] [--python-version 3.12]

- ``.whl/``: the wheels of what fseb_ft needs that the GPU machine's image lacks
  (:data:`WHEELS`), at this environment's versions, for CPython ``--python-version`` on
  manylinux x86-64 (``pip download --no-deps --only-binary=:all:``);
- ``.gpu-carry/cifar10/{train,test}/<class>/*.jpg``: the first ``--train-per-class`` and
  ``--test-per-class`` CIFAR-10 JPEGs of each class from ``../shared``'s tar;
- ``.gpu-carry/efficientnet_lite0.in1k/``: the pretrained weights from ``../shared``.

Both folders are added to ``.git/info/exclude`` (never committed). The last line printed is the
device call to make, with its ``carry`` list.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR, CARRY_DIR = ".whl", ".gpu-carry"
WHEELS = (
    "timm",  # the image's is older than fseb_ft's minimum
    "datasets", "dill", "multiprocess",
    "albumentations", "albucore", "stringzilla", "simsimd",
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "optuna", "alembic", "colorlog", "SQLAlchemy", "Mako",
)  # fmt: skip
"""fseb_ft's dependencies (and theirs) that the GPU image lacks or has too old; the README's."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")  # fmt: skip
WEIGHTS = "efficientnet_lite0.in1k"


def download_command(name: str, version: str, python: str) -> list[str]:
    """``pip download`` of one wheel for the GPU machine's Python."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", *platforms,
        "-d", str(ROOT / WHEEL_DIR), f"{name}=={version}",
    ]  # fmt: skip


def download_wheels(python: str) -> None:
    """Every wheel of :data:`WHEELS` at this environment's version."""
    for name in WHEELS:
        version = importlib.metadata.version(name)
        subprocess.run(download_command(name, version, python), check=True)


def extract_cifar10(tar_path: Path, out: Path, per_split: dict[str, int]) -> dict[str, int]:
    """The first ``per_split[split]`` JPEGs of each class (tar order), as an image folder."""
    taken: Counter[tuple[str, str]] = Counter()
    with tarfile.open(tar_path) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 3 or parts[0] not in per_split:
                continue
            split, cls, name = parts
            if taken[split, cls] >= per_split[split]:
                continue
            target = out / split / cls / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            taken[split, cls] += 1
    return {split: sum(n for (s, _), n in taken.items() if s == split) for split in per_split}


def exclude(paths: Sequence[str]) -> None:
    """Add ``paths`` to ``.git/info/exclude`` once each."""
    exclude_file = ROOT / ".git" / "info" / "exclude"
    lines = exclude_file.read_text().splitlines() if exclude_file.exists() else []
    new = [f"/{p}/" for p in paths if f"/{p}/" not in lines]
    if new:
        exclude_file.write_text("\n".join([*lines, *new]) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    """Download, extract, copy; print the device call."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--train-per-class", type=int, default=200)
    parser.add_argument("--test-per-class", type=int, default=50)
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args(argv)
    exclude([WHEEL_DIR, CARRY_DIR])
    download_wheels(args.python_version)
    carry = ROOT / CARRY_DIR
    shutil.rmtree(carry / "cifar10", ignore_errors=True)
    tar_path = args.shared / "data" / "cifar10-jpeg" / "CIFAR-10-images.tar"
    per_split = {"train": args.train_per_class, "test": args.test_per_class}
    counts = extract_cifar10(tar_path, carry / "cifar10", per_split)
    shutil.copytree(args.shared / "weights" / WEIGHTS, carry / WEIGHTS, dirs_exist_ok=True)
    print(f"{WHEEL_DIR}/: {len(list((ROOT / WHEEL_DIR).glob('*.whl')))} wheels; "
          f"{CARRY_DIR}/cifar10: {counts}; {CARRY_DIR}/{WEIGHTS}")  # fmt: skip
    print(f'device run: command="bash benchmarks/gpu/run.sh", carry=["{WHEEL_DIR}", "{CARRY_DIR}"]')


if __name__ == "__main__":
    main()
