"""The behaviour fingerprint's data: the same seeded integer images written as every source
reads them (an image folder of PNGs and one of JPEGs, an ``.npz``, IDX gzip files, a CSV label
file, a ``save_to_disk`` folder), plus scikit-learn's digits; each as the recipe's
:class:`~fseb_ft.recipe.DatasetSpec` that loads it.

Everything is generated from :data:`SEED` alone, so the files are the same bytes on every
machine (PNG and JPEG through Pillow's encoders, whose output does not depend on the CPU).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from fseb_ft.recipe import DatasetSpec

__all__ = ["CLASSES", "IMAGE_SHAPE", "NUM_IMAGES", "SEED", "fixture_images", "write_sources"]

SEED = 20261127
"""The seed of the fixture images."""
NUM_IMAGES = 6
"""Images per source: two of each class."""
IMAGE_SHAPE = (20, 14, 3)
"""(H, W, C) of a fixture image: not square and larger than the 16 px input, so every resize,
crop and pad has work to do."""
CLASSES = ("a", "b", "c")
"""The class names; image ``i`` is of class ``i % 3``."""


def fixture_images() -> tuple[np.ndarray, np.ndarray]:
    """(N, H, W, 3) uint8 images, smooth enough for JPEG and resizing to matter, and labels."""
    rng = np.random.default_rng(SEED)
    height, width, _ = IMAGE_SHAPE
    base = rng.integers(0, 256, size=(NUM_IMAGES, 1, 1, 3))
    ramp = np.add.outer(np.arange(height), np.arange(width))[None, :, :, None] * 6  # (1, H, W, 1)
    noise = rng.integers(-30, 31, size=(NUM_IMAGES, *IMAGE_SHAPE))
    images = np.clip(base + ramp + noise, 0, 255).astype(np.uint8)
    return images, np.arange(NUM_IMAGES, dtype=np.int64) % len(CLASSES)


def _folder(root: Path, images: np.ndarray, labels: np.ndarray, suffix: str) -> None:
    """``root/train/<class>/NNN.<suffix>``."""
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / "train" / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:03d}.{suffix}", quality=90)


def _idx(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """``train-images-idx3-ubyte.gz`` (the first channel) and ``train-labels-idx1-ubyte.gz``."""
    root.mkdir(parents=True)
    gray = np.ascontiguousarray(images[..., 0])  # (N, H, W)
    for kind, array, code in (("images", gray, 3), ("labels", labels.astype(np.uint8), 1)):
        header = struct.pack(">HBB", 0, 0x08, code) + struct.pack(f">{code}I", *array.shape)
        (root / f"train-{kind}-idx{code}-ubyte.gz").write_bytes(
            gzip.compress(header + array.tobytes(), mtime=0)
        )


def _csv(root: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """``root/train.csv`` (``image,label`` by class name) beside ``root/train_images/*.png``."""
    (root / "train_images").mkdir(parents=True)
    rows = ["image,label"]
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image).save(root / "train_images" / f"{i:03d}.png")
        rows.append(f"{i:03d}.png,{CLASSES[label]}")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    return root / "train.csv"


def _disk(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """A ``datasets`` ``save_to_disk`` folder with an ``Image`` and a ``ClassLabel`` column."""
    import datasets

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))}
    )
    pictures = [Image.fromarray(image) for image in images]
    data = {"image": pictures, "label": labels.tolist()}
    shown = not datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # six rows: a bar would only clutter the output
    try:
        dataset = datasets.Dataset.from_dict(data, features=features, split="train")
        dataset.save_to_disk(str(root))
    finally:
        if shown:
            datasets.enable_progress_bars()


def write_sources(root: Path) -> dict[str, DatasetSpec]:
    """Write the fixtures under ``root``; source label → the spec that loads its images."""
    images, labels = fixture_images()
    _folder(root / "png", images, labels, "png")
    _folder(root / "jpeg", images, labels, "jpg")
    np.savez(root / "arrays.npz", images=images, labels=labels, class_names=np.array(CLASSES))
    _idx(root / "idx", images, labels)
    label_file = _csv(root / "csv", images, labels)
    _disk(root / "disk", images, labels)
    return {
        "imagefolder_png": DatasetSpec(source="imagefolder", path=str(root / "png")),
        "imagefolder_jpeg": DatasetSpec(source="imagefolder", path=str(root / "jpeg")),
        "arrays": DatasetSpec(source="arrays", path=str(root / "arrays.npz")),
        "idx": DatasetSpec(source="idx", path=str(root / "idx")),
        "csv": DatasetSpec(source="csv", path=str(label_file), image_dir="train_images"),
        "disk": DatasetSpec(source="disk", path=str(root / "disk"), split="train"),
        "sklearn_digits": DatasetSpec(
            source="sklearn_digits", split="train", classes=(0, 1, 2), limit=NUM_IMAGES
        ),
    }
