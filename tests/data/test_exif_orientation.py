"""A photo whose EXIF orientation says "turn to display" (a portrait phone photo, orientation 6)
is read upright by every reader, as viewers and ``datasets`` show it: its pixels equal those of
its physically rotated twin (:func:`tests.helpers.exif_twins`) in training (a reduced-scale
decode too), the context pool, the cache, evaluation, the Hub path and predict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import albumentations as A
import datasets
import numpy as np
import pytest
from PIL import Image

from fseb_ft.data.decode_size import min_decode_size
from fseb_ft.data.files import FileImages, read_image
from fseb_ft.data.image_cache import cache_images
from fseb_ft.data.images import HFImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.pixels import any_image_to_array
from fseb_ft.data.transforms import TransformedImages, eval_transform, perturbation_transform
from fseb_ft.method.context import build_context_pool
from fseb_ft.recipe import ImageCacheConfig
from tests.helpers import exif_twins

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def _twins(folder: Path) -> FileImages:
    """The twins 512 × 256 (upright) as a dataset: upright first."""
    exif_twins(folder / "a", 512, 256)
    return FileImages(folder, ["a/upright.jpg", "a/rotated.jpg"], np.array([0, 0]), ["a"], "t")


def _same(upright: object, rotated: object, shape: tuple[int, ...]) -> None:
    upright, rotated = np.asarray(upright), np.asarray(rotated)
    assert upright.shape == shape and np.array_equal(rotated, upright)


def test_files_hub_and_predict_read_the_upright_image_in_full_and_reduced(tmp_path: Path) -> None:
    files = _twins(tmp_path)
    _same(files[0][0], files[1][0], (512, 256, 3))
    _same(read_image(files.path(0), 3), read_image(files.path(1), 3), (512, 256, 3))  # predict
    table = {"image": [{"bytes": files.path(i).read_bytes(), "path": None} for i in (0, 1)]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    hub = HFImages(datasets.Dataset.from_dict(table | {"label": [0, 0]}, features=features))
    _same(hub[0][0], hub[1][0], (512, 256, 3))
    # A landscape output of a portrait photo: the scale is the upright image's (1/2: 256 × 128
    # still covers 64 × 128); the stored size (512 wide) would allow 1/4, then enlarged.
    rule = min_decode_size(A.Compose([A.Resize(64, 128)]))
    _same(files.read(0, rule)[0], files.read(1, rule)[0], (256, 128, 3))
    _same(hub.read(0, rule)[0], hub.read(1, rule)[0], (256, 128, 3))
    with Image.open(files.path(0)) as up, Image.open(files.path(1)) as stored:  # in memory
        _same(any_image_to_array(up, "up"), any_image_to_array(stored, "stored"), (512, 256, 3))


def test_the_context_pool_evaluation_and_the_cache_see_the_upright_image(tmp_path: Path) -> None:
    files = _twins(tmp_path / "data")
    spec = InputSpec((64, 32), MEAN, STD)
    for perturb in (False, True):  # a perturbed pool decodes reduced
        pools = [
            build_context_pool("train", _only(files, i), [], spec, size=1, perturb=perturb)
            for i in (0, 1)
        ]
        _same(pools[0][0], pools[1][0], (3, 64, 32))
    for make in (  # evaluation; a random resized crop, the same draw for both
        lambda: eval_transform((64, 32), MEAN, STD),
        lambda: perturbation_transform((64, 32), MEAN, STD, seed=0),
    ):
        seen = [TransformedImages(_only(files, i), make())[0][0] for i in (0, 1)]
        _same(seen[0], seen[1], (3, 64, 32))
    config = ImageCacheConfig(size=40, dir=str(tmp_path / "cache"))
    cached = cache_images({"data.train": files}, config, progress=False).sets["data.train"]
    _same(cached[0][0], cached[1][0], (80, 40, 3))


def _only(files: FileImages, index: int) -> FileImages:
    return FileImages(files.folder, [files.files[index]], np.array([0]), ["a"], f"only{index}")


_STORED: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.transpose(1, 0, 2),
    6: np.rot90,  # a quarter counter-clockwise: displayed turned clockwise
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),
    8: lambda a: np.rot90(a, -1),
}
"""How each EXIF orientation stores an upright (H, W, 3) image (EXIF 2.3, tag 0x0112)."""


@pytest.mark.parametrize("orientation", sorted(_STORED))
def test_every_orientation_is_undone(tmp_path: Path, orientation: int) -> None:
    upright = np.random.default_rng(orientation).integers(0, 256, (6, 4, 3), np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored = np.ascontiguousarray(_STORED[orientation](upright))
    Image.fromarray(stored).save(tmp_path / "x.png", exif=exif)  # lossless, with an eXIf chunk
    assert np.array_equal(read_image(tmp_path / "x.png", 3), upright)
