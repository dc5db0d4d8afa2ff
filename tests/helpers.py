"""What several test modules build or do: a tiny timm-shaped classifier, image folders and the
recipe of a tiny run on them; a NaN loss, a kill after a checkpoint, a folder's bytes.

Import what you need: ``from tests.helpers import TinyNet, tiny_recipe, write_image_folder``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import fseb_ft.engine.loop as train_module
from fseb_ft.method.objective import FSEBObjective

N_TEST = 13  # odd, so two processes see an uneven last batch
N_OOD = 5


class LogProbs(nn.Module):
    """A predictor around a network that is not the network itself, as FS-VI's Monte-Carlo
    predictive is: its outputs are the network's log-probabilities."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.network(x), -1)


class TinyNet(nn.Module):
    """A timm-shaped classifier: ``forward_features`` (linear, tanh, optional BatchNorm) →
    ``forward_head(pre_logits)`` → the linear head that ``get_classifier`` returns."""

    def __init__(self, d_in: int = 6, width: int = 5, k: int = 3, bn: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, width), nn.Tanh())
        self.norm = nn.BatchNorm1d(width) if bn else nn.Identity()
        self.head = nn.Linear(width, k)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.body(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head


def write_image_folder(
    root: Path, split: str, classes: dict[str, int], size: int | tuple[int, int] = 16
) -> None:
    """Noisy per-class-coloured PNGs ``root/split/<class>/NNN.png`` of ``size`` (side or (H, W))."""
    height, width = (size, size) if isinstance(size, int) else size
    # crc32, not hash(): str hashes are salted per process, and fixtures must not vary by run.
    rng = np.random.default_rng(zlib.crc32(f"{root.name}/{split}".encode()))
    for name, count in classes.items():
        base = rng.integers(0, 256, size=3)
        (root / split / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            noise = rng.integers(-40, 40, size=(height, width, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")


def exif_twins(folder: Path, height: int, width: int) -> tuple[Path, Path]:
    """``folder/upright.jpg`` (height × width) and ``folder/rotated.jpg``: the same picture stored
    turned a quarter counter-clockwise with EXIF orientation 6 (display turned clockwise), as a
    phone stores a portrait photo. Exact twins: flat 8×8 blocks without chroma subsampling, so
    a JPEG decodes each block to its one colour however the image is turned (at a reduced scale
    too: a flat block shrinks to a flat block); ``height`` and ``width`` are multiples of 16."""
    colours = np.random.default_rng(0).integers(0, 256, (height // 8, width // 8, 3), np.uint8)
    upright = np.kron(colours, np.ones((8, 8, 1), np.uint8))  # (height, width, 3)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "upright.jpg", folder / "rotated.jpg"
    Image.fromarray(upright).save(paths[0], quality=90, subsampling=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    stored = Image.fromarray(np.ascontiguousarray(np.rot90(upright)))  # (width, height, 3)
    stored.save(paths[1], quality=90, subsampling=0, exif=exif)
    with Image.open(paths[0]) as up, Image.open(paths[1]) as raw:
        assert np.array_equal(np.rot90(np.asarray(raw), -1), np.asarray(up))  # exact twins
    return paths


def image_folders(
    root: Path, train: dict[str, int], test: dict[str, int], owls: int
) -> dict[str, Path]:
    """``{"ind": root/"ind", "ood": root/"ood"}`` for :func:`tiny_recipe`: class folders of
    ``train`` and ``test`` images (class → count) and an OOD test folder of ``owls`` images."""
    write_image_folder(root / "ind", "train", train)
    write_image_folder(root / "ind", "test", test)
    write_image_folder(root / "ood", "test", {"owl": owls})
    return {"ind": root / "ind", "ood": root / "ood"}


def tiny_recipe(folders: dict[str, Path], out: Path, epochs: int = 2) -> dict[str, Any]:
    """A recipe (as a mapping) that trains ``test_byobnet`` at 16 px on the image folders
    ``folders["ind"]`` (``train``, ``test``) and ``folders["ood"]`` (``test``) into ``out``."""
    return {
        "model": {"name": "test_byobnet", "pretrained": False, "input_size": 16},
        "data": {
            "train": {"source": "imagefolder", "path": str(folders["ind"]), "split": "train"},
            "test": {"source": "imagefolder", "path": str(folders["ind"]), "split": "test"},
            "ood": {
                "owls": {"source": "imagefolder", "path": str(folders["ood"]), "split": "test"}
            },
            "val_fraction": 0.25,
            "augment": "crop_flip",
            "batch_size": 8,
            "num_workers": 0,
        },
        "context": {"kind": "train", "perturb": True, "pool_size": 20, "batch_size": 4},
        "fseb": {"prior_var": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0},
        "optim": {"lr": 0.05, "warmup_steps": 2},
        "train": {"epochs": epochs, "cpu": True, "log_every": 2},
        "eval": {"batch_size": 4},
        "output": {"dir": str(out)},
    }


DIGITS_012 = {"source": "sklearn_digits", "split": "test", "classes": [0, 1, 2]}
"""scikit-learn's digits 0-2, test split: the in-distribution images of :func:`digits_recipe`."""


def digits_recipe(out: Path, epochs: int = 1, **eval_keys: Any) -> dict[str, Any]:
    """A recipe (as a mapping) of a PS-MAP run of the paper's CNN on scikit-learn's digits 0-2
    (30 % of the training split held out for validation) into ``out``; ``eval_keys`` join its
    ``eval`` section (``temperature_scaling=True``, ``ood_scores=[...]``)."""
    return {
        "model": {"name": "fseb_cnn", "pretrained": False},
        "data": {
            "train": {**DIGITS_012, "split": "train"},
            "test": DIGITS_012,
            "channels": 1,
            "val_fraction": 0.3,
            "batch_size": 32,
            "num_workers": 0,  # no worker processes to start and join: faster on a busy CPU
        },
        "fseb": {"reg_scale": 0.0},
        "optim": {"lr": 0.05},
        "train": {"epochs": epochs, "cpu": True},
        "eval": {"batch_size": 256, **eval_keys},
        "output": {"dir": str(out)},
    }


def poison_loss(monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
    """Make the training loss NaN from the objective's call ``after + 1`` on."""
    original = FSEBObjective.forward
    calls = []

    def poisoned(self, *args, **kwargs):
        terms = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) > after:
            terms["loss"] = terms["loss"] * float("nan")
        return terms

    monkeypatch.setattr(FSEBObjective, "forward", poisoned)


def kill_after_checkpoint(monkeypatch: pytest.MonkeyPatch, count: int = 1) -> list[Path]:
    """Kill a run (``KeyboardInterrupt``) right after the ``count``-th epoch checkpoint written
    from now on; checkpoints after it are written as usual. Returns the run folder of each."""
    original = train_module._save_checkpoint
    saved: list[Path] = []

    def save_then_die(accelerator, run_dir, state) -> None:
        original(accelerator, run_dir, state)
        saved.append(run_dir)
        if len(saved) == count:
            raise KeyboardInterrupt(f"simulated kill after checkpoint {count}")

    monkeypatch.setattr(train_module, "_save_checkpoint", save_then_die)
    return saved


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path → bytes): what a reader of it would see."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def skip_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draw no run figures (half of a tiny run's time), for tests about something else: every
    figure a run, an evaluation, an ensemble or --compare writes is drawn through
    ``report._draw``, a sweep's through ``leaderboard.sweep_plot``. tests/runs/test_plots.py and
    the runs whose figures a test checks draw them."""
    import fseb_ft.runs.leaderboard as leaderboard
    import fseb_ft.runs.report as report

    monkeypatch.setattr(report, "_draw", lambda jobs, strict: [])
    monkeypatch.setattr(leaderboard, "sweep_plot", lambda *args, **kwargs: None)
