"""Build a Kaggle-style task folder (``train.csv`` + ``train_images/``) from CIFAR-10 JPEGs.

    python docs/examples/kaggle_folder.py /tmp/kaggle-cifar [--per-class 300] [--tar PATH]

Kaggle ships APTOS, SIIM-ISIC and Cassava as one labelled ``train.csv`` beside a folder of images,
and keeps the test labels private. This script lays five CIFAR-10 classes out the same way, so
docs/kaggle.md can walk from that layout to a calibrated, abstaining model on a CPU:

- ``train_images/<image_id>.jpg`` and ``train.csv`` with columns ``image_id`` (no extension, as
  APTOS's ``id_code``), ``label`` (the class name) and ``source`` (which of two halves of the
  CIFAR-10 file numbering the image came from: a metadata column to group results by);
- ``ood_images/`` and ``ood.csv``: images of the five other classes, the semantic-shift set.

The images are read in place from the CIFAR-10 image-folder tar in ``../shared`` (or ``--tar``);
nothing is downloaded. ``--per-class`` images per in-distribution class are drawn with a fixed
seed; the OOD set has a fifth as many per class.
"""

from __future__ import annotations

import argparse
import csv
import random
import tarfile
from pathlib import Path, PurePosixPath

IN_DISTRIBUTION = ("airplane", "automobile", "bird", "cat", "deer")
"""The task's classes (CIFAR-10 folder names)."""
OUT_OF_DISTRIBUTION = ("dog", "frog", "horse", "ship", "truck")
"""Classes the model never sees: the OOD set."""
DEFAULT_TAR = Path(__file__).resolve().parents[3] / "shared/data/cifar10-jpeg/CIFAR-10-images.tar"


def members_by_class(tar: tarfile.TarFile) -> dict[str, list[tarfile.TarInfo]]:
    """The ``train/<class>/NNNN.jpg`` members of the tar, by class, in name order."""
    out: dict[str, list[tarfile.TarInfo]] = {}
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if member.isfile() and len(parts) >= 3 and parts[-3] == "train":
            out.setdefault(parts[-2], []).append(member)
    return {name: sorted(items, key=lambda m: m.name) for name, items in out.items()}


def write_split(
    tar: tarfile.TarFile,
    chosen: dict[str, list[tarfile.TarInfo]],
    folder: Path,
    label_file: Path,
) -> int:
    """Copy the chosen JPEGs to ``folder`` as ``<image_id>.jpg`` and write ``label_file``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, members in chosen.items():
        for member in members:
            number = int(PurePosixPath(member.name).stem)
            image_id = f"{name[:3]}_{number:04d}"
            (folder / f"{image_id}.jpg").write_bytes(tar.extractfile(member).read())
            rows.append((image_id, name, "a" if number < 2500 else "b"))
    random.Random(1).shuffle(rows)  # a Kaggle file is not sorted by class
    with label_file.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image_id", "label", "source"])
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and write the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to create (train.csv, train_images/, …)")
    parser.add_argument("--per-class", type=int, default=300, help="training images per class")
    parser.add_argument("--tar", type=Path, default=DEFAULT_TAR, help="CIFAR-10 image tar")
    args = parser.parse_args(argv)
    if not args.tar.is_file():
        parser.error(f"{args.tar} not found: pass --tar, the CIFAR-10 image-folder tar")
    rng = random.Random(0)
    with tarfile.open(args.tar) as tar:
        members = members_by_class(tar)
        train = {c: rng.sample(members[c], args.per_class) for c in IN_DISTRIBUTION}
        ood = {c: rng.sample(members[c], max(1, args.per_class // 5)) for c in OUT_OF_DISTRIBUTION}
        n_train = write_split(tar, train, args.out / "train_images", args.out / "train.csv")
        n_ood = write_split(tar, ood, args.out / "ood_images", args.out / "ood.csv")
    print(f"{args.out}: train.csv ({n_train} images), ood.csv ({n_ood} images)")


if __name__ == "__main__":
    main()
