"""Source ``idx``: MNIST-style IDX files, ``{split}-images-idx3-ubyte.gz`` and
``{split}-labels-idx1-ubyte.gz`` in one folder."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fseb_ft.data.images import ArrayImages, content_hash, nonempty
from fseb_ft.data.sources.registry import source
from fseb_ft.recipe import DatasetSpec

__all__ = ["load_idx", "read_idx"]


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw) holding unsigned bytes.

    Layout: ``>HBB`` header (zero, dtype code 0x08 = uint8, ndim), ndim big-endian uint32 sizes,
    then the raw data, whose length must equal the product of the sizes.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise ValueError(f"{path} is not a complete gzip stream ({err})") from err
    if len(raw) < 4:
        raise ValueError(f"{path} is too short ({len(raw)} bytes) to hold an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0:
        raise ValueError(f"{path} is not an IDX file: first two bytes are {zero:#06x}, not 0")
    if dtype_code != 0x08:
        raise ValueError(f"{path} has IDX dtype {dtype_code:#04x}; only 0x08 (uint8) is supported")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path} is truncated inside its header ({ndim} dimensions announced)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header announces shape {shape} = {expected} bytes of data, "
            f"but the file holds {len(raw) - header} (truncated or corrupt)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_idx(
    images_path: str | Path,
    labels_path: str | Path,
    class_names: Sequence[str] | None = None,
    channels: int = 3,
) -> ArrayImages:
    """Load an MNIST-style pair of IDX files: images (N, H, W) and labels (N,)."""
    images = read_idx(images_path)  # (N, H, W)
    labels = read_idx(labels_path)  # (N,)
    if images.ndim != 3:
        raise ValueError(f"{images_path} holds shape {images.shape}; expected (N, H, W)")
    if labels.ndim != 1:
        raise ValueError(f"{labels_path} holds shape {labels.shape}; expected (N,)")
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    identity = (
        f"idx:{Path(images_path).name}+{Path(labels_path).name}#{content_hash(images, labels)}"
    )
    return nonempty(ArrayImages(images, labels, class_names, identity, channels))


@source("idx")
def _from_spec(spec: DatasetSpec, channels: int, seed: int) -> ArrayImages:
    """The spec's split of the IDX pair in folder ``spec.path``."""
    path = Path(spec.path)
    images = path / f"{spec.split}-images-idx3-ubyte.gz"
    labels = path / f"{spec.split}-labels-idx1-ubyte.gz"
    for file in (images, labels):
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} not found: an idx source needs {spec.split}-images-idx3-ubyte.gz and "
                f"{spec.split}-labels-idx1-ubyte.gz in {path}"
            )
    return load_idx(images, labels, channels=channels)
