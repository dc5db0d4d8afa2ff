"""engine.run_data: the training loader's last batch: one lone image is left out, any other partial
batch trains."""

from pathlib import Path

import pytest
from torch import Tensor

from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.engine.run import run
from fseb_ft.recipe import recipe_from_dict
from tests.helpers import tiny_recipe

TRAIN_IMAGES = 27
"""The tiny folders' 36 training images less the 9 that ``val_fraction: 0.25`` holds out."""


class BatchSizes(Callback):
    """Records the size of every training batch."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_batch_begin(self, trainer: TrainerView, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        self.sizes.append(len(y))
        return x, y


def _train(folders: dict[str, Path], out: Path, batch_size: int) -> list[int]:
    raw = tiny_recipe(folders, out, epochs=1)
    del raw["data"]["ood"], raw["data"]["test"]
    raw["fseb"]["reg_scale"] = 0.0  # PS-MAP: the network alone, whose BatchNorm sees the batch
    raw["data"]["batch_size"] = batch_size
    sizes = BatchSizes()
    run(recipe_from_dict(raw), callbacks=[sizes], evaluate_test=False)
    return sizes.sizes


def test_a_last_batch_of_one_image_is_left_out_where_batchnorm_would_stop(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # test_byobnet's last feature map is 1x1 at 16 px: BatchNorm raises on a batch of one there.
    assert _train(folders, tmp_path / "run", batch_size=13) == [13, 13]
    assert (
        f"train: {TRAIN_IMAGES} images in batches of 13: each epoch's last batch, a single "
        "image, is left out" in capsys.readouterr().out
    )


def test_a_partial_last_batch_of_several_images_trains(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(folders, tmp_path / "run", batch_size=12) == [12, 12, 3]
    assert "left out" not in capsys.readouterr().out
