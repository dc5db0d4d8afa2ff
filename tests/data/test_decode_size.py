"""Training decodes a large JPEG at a reduced scale (PIL's draft) that its first step still only
shrinks; evaluation decodes in full, bit for bit timm's eval transform of the stored image."""

from __future__ import annotations

import io
import math
from pathlib import Path

import albumentations as A
import datasets
import numpy as np
import pytest
import timm
import torch
from PIL import Image

from fseb_ft.data.decode_size import min_decode_size
from fseb_ft.data.files import FileImages
from fseb_ft.data.images import HFImages, IndexedImages, LabeledImages
from fseb_ft.data.inputs import EVAL_RESIZE, InputSpec
from fseb_ft.data.pixels import MinSize
from fseb_ft.data.transforms import (
    TransformedImages,
    eval_transform,
    perturbation_transform,
    train_transform,
)
from fseb_ft.method.context import build_context_pool

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A photo-like uint8 (H, W, 3) image: smooth colour regions, edges and sensor noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(2, height // 48), max(2, width // 48), 3), dtype=np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    noisy = np.asarray(smooth, np.float64) + rng.normal(0.0, 4.0, (height, width, 3))
    return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def _jpeg(path: Path, width: int, height: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_photo(width, height)).save(path, quality=90)
    return path


class _Recorded(FileImages):
    """FileImages that records the shape of every image it decodes."""

    shapes: list[tuple[int, ...]]

    def _read_at_least(self, index: int, min_size: MinSize | None) -> np.ndarray:
        image = super()._read_at_least(index, min_size)
        self.shapes.append(image.shape)
        return image


def _recorded(folder: Path) -> _Recorded:
    data = _Recorded(folder, ["a/big.jpg"], np.array([0]), ["a"], "test")
    data.shapes = []
    return data


def test_training_and_perturbed_context_decode_a_large_jpeg_reduced(tmp_path: Path) -> None:
    _jpeg(tmp_path / "a" / "big.jpg", 512, 384)
    data = _recorded(tmp_path)
    train = TransformedImages(data, train_transform((64, 64), MEAN, STD, "randaug-lite", seed=0))
    image, label = train[0]
    assert image.shape == (3, 64, 64) and label == 0
    # The smallest crop of scale 0.35 at ratio 4/3 of 512x384 is 227 px high at full size:
    # 1/2 keeps it at 113 >= 64, 1/4 would not (56 < 64).
    assert data.shapes == [(192, 256, 3)]
    spec = InputSpec((64, 64), MEAN, STD)
    pool = build_context_pool("train", data, [], spec, size=1, perturb=True)
    assert pool[0].shape == (3, 64, 64) and data.shapes[-1] == (192, 256, 3)
    build_context_pool("train", data, [], spec, size=1)[0]  # a fixed pool: eval, in full
    TransformedImages(data, eval_transform((64, 64), MEAN, STD))[0]
    assert data.shapes[-2:] == [(384, 512, 3), (384, 512, 3)]


def _hub(path: Path) -> LabeledImages:
    table = {"image": [{"bytes": path.read_bytes(), "path": None}], "label": [0]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return HFImages(datasets.Dataset.from_dict(table, features=features))


@pytest.mark.parametrize("kind", ["files", "subset", "hub"])
def test_every_encoded_source_reads_reduced_and_in_full(tmp_path: Path, kind: str) -> None:
    path = _jpeg(tmp_path / "a" / "big.jpg", 512, 384)
    files = FileImages(tmp_path, ["a/big.jpg"], np.array([0]), ["a"], "test")
    data = {"files": files, "subset": IndexedImages(files, [0]), "hub": _hub(path)}[kind]
    rule = min_decode_size(train_transform((64, 64), MEAN, STD, "flip"))  # a resize: 1/4 fits
    assert data.read(0, rule)[0].shape == (96, 128, 3)
    full = np.asarray(Image.open(path).convert("RGB"))
    assert np.array_equal(data[0][0], full) and np.array_equal(data.read(0)[0], full)


@pytest.mark.parametrize("size", [(1024, 768), (768, 1024), (2048, 1536), (3000, 500), (90, 70)])
@pytest.mark.parametrize(
    "transform",
    [
        train_transform((224, 224), MEAN, STD, "randaug-lite"),
        train_transform((224, 160), MEAN, STD, "crop_flip"),
        perturbation_transform((224, 224), MEAN, STD),
        perturbation_transform((64, 64), MEAN, STD, strength=1.4),
    ],
    ids=["randaug-lite", "crop_flip", "perturbation", "perturbation-1.4"],
)
def test_every_crop_of_a_reduced_decode_is_still_shrunk(
    size: tuple[int, int], transform: A.Compose
) -> None:
    # The decoded size is PIL's choice for the request (no pixels decoded: draft sets the size).
    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, format="JPEG")
    rule = min_decode_size(transform)
    with Image.open(buffer) as image:
        image.draft(None, rule(image.size))
        width, height = image.size
    if size == (2048, 1536):
        assert width < 2048  # every one of these reduces a large image
    if (width, height) == size:
        return  # decoded in full, as before
    first = transform.transforms[0]
    if isinstance(first, A.Resize):
        assert height >= first.height and width >= first.width
        return
    first.set_random_seed(0)
    for _ in range(300):
        x0, y0, x1, y1 = first.get_params_dependent_on_data({"shape": (height, width)}, {})[
            "crop_coords"
        ]
        assert y1 - y0 >= first.size[0] and x1 - x0 >= first.size[1]


def test_a_reduced_decode_crops_to_nearly_the_pixels_of_a_full_decode(tmp_path: Path) -> None:
    _jpeg(tmp_path / "a" / "big.jpg", 1024, 768)
    files = FileImages(tmp_path, ["a/big.jpg"], np.array([0]), ["a"], "test")
    crop = A.RandomResizedCrop(size=(224, 224), scale=(0.35, 1.0), area_for_downscale="image")
    full = files[0][0]  # (768, 1024, 3)
    reduced = files.read(0, min_decode_size(A.Compose([crop])))[0]  # (384, 512, 3)
    assert reduced.shape == (384, 512, 3)
    # The same crops, in the image's own coordinates: the smallest one (scale 0.35, ratio 4/3,
    # 454 x 606 px) and the whole image.
    h, w = round(math.sqrt(0.35 * 768 * 1024 * 3 / 4)), round(math.sqrt(0.35 * 768 * 1024 * 4 / 3))
    for x0, y0, x1, y1 in [(200, 100, 200 + w, 100 + h), (0, 0, 1024, 768)]:
        a = crop.apply(full, crop_coords=(x0, y0, x1, y1)).astype(np.float64)
        b = crop.apply(reduced, crop_coords=(x0 // 2, y0 // 2, x1 // 2, y1 // 2))
        assert a.shape == b.shape == (224, 224, 3)
        assert np.abs(a - b).mean() < 1.5  # grey levels; the crop's own spread is ~40


@pytest.mark.parametrize("input_size", [(32, 32), (24, 40)])
def test_evaluation_of_a_large_jpeg_is_timms_eval_transform_bit_for_bit(
    tmp_path: Path, input_size: tuple[int, int]
) -> None:
    path = _jpeg(tmp_path / "a" / "big.jpg", 256, 192)  # 1/4 or 1/2 would still cover it
    files = FileImages(tmp_path, ["a/big.jpg"], np.array([0]), ["a"], "test")
    exported = {"input_size": (3, *input_size), "mean": MEAN, "std": STD, **EVAL_RESIZE}
    reference = timm.data.create_transform(**timm.data.resolve_data_config(pretrained_cfg=exported))
    expected = reference(Image.open(path).convert("RGB"))
    image, _ = TransformedImages(files, eval_transform(input_size, MEAN, STD))[0]
    assert expected.shape == (3, *input_size) and torch.equal(image, expected)
    assert min_decode_size(eval_transform(input_size, MEAN, STD)) is None
