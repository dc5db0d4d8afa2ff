"""The parts of the behaviour fingerprint (:mod:`benchmarks.fingerprint`), each a function that
runs a tiny, seeded slice of what shapes a run's results and returns its values as JSON.

- :func:`pixels`: every source's decoded images and what the evaluation transform and each
  training augmentation (``data.augment``) make of them, seeded as a run's first epoch, as
  integer grey levels (normalised with mean 0 and std 1, so a tensor is ``level / 255``);
- :func:`corruptions`: the fixture images under every corruption of ``eval.corruptions`` at
  severities 1, 3 and 5, as grey levels;
- :func:`context`: the perturbed context pool of a tiny recipe and its first batches of two
  epochs, as grey levels;
- :func:`training`: PS-MAP and FS-EB from one seeded initialisation, in float64: the initial
  weights, the loss terms of the first step, each step's loss and the weights after a few
  steps of the recipe's optimiser and schedule;
- :func:`metrics`: the in-distribution, task and OOD metrics and the fitted temperature of
  fixed logits (integers / 16, exact in every float format).

The training steps are the loop's (objective, backward, optimiser, schedule) without
Accelerate: gradient accumulation, clipping, mixed precision and the callbacks are not in it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from accelerate.utils import set_seed
from torch import Tensor, nn

from benchmarks.fingerprint_fixtures import fixture_images, write_sources
from fseb_ft.data.corruptions import corrupt_images
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.sources import load_spec
from fseb_ft.data.transforms import (
    AUGMENTATIONS,
    TransformedImages,
    epoch_seed,
    eval_transform,
    seed_transform,
    train_transform,
)
from fseb_ft.engine.optimizers import build_optimizer, build_scheduler
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.ood import ood_metrics
from fseb_ft.evaluation.temperature import fit_temperature
from fseb_ft.method.context import context_stream
from fseb_ft.method.models import create_model, input_spec
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.recipe import Recipe
from fseb_ft.recipe.load import recipe_from_dict
from fseb_ft.recipe.options import (
    BINARY_TASK_METRICS,
    CORRUPTIONS,
    OUTPUT_OOD_SCORES,
    TASK_METRICS,
)

__all__ = [
    "EPOCHS",
    "SEED",
    "compute",
    "context",
    "corruptions",
    "metrics",
    "pixels",
    "training",
]

SEED = 3
"""The run's seed (``train.seed``) of every part."""
EPOCHS = 2
"""Training epochs of :func:`training`: 2 batches each (6 images, batch size 4)."""
PROJECTIONS = 4
"""Seeded random directions the trained weights are projected on (their summary)."""
_CPU = SimpleNamespace(device=torch.device("cpu"), process_index=0, print=lambda *_: None)
"""What the context stream reads of an Accelerator: one quiet CPU process."""


def tiny_recipe(train: Mapping[str, Any], reg_scale: float) -> Recipe:
    """The recipe of every part: ``test_byobnet`` from its initialisation at 16 px."""
    return recipe_from_dict(
        {
            "model": {"name": "test_byobnet", "pretrained": False, "input_size": 16},
            "data": {"train": dict(train), "augment": "crop_flip", "batch_size": 4},
            "context": {"kind": "train", "perturb": True, "pool_size": 5, "batch_size": 2},
            "fseb": {
                "reg_scale": reg_scale,
                "prior_var": 1.0,
                "prior_cov_scale": 0.01,
                "prior_cov_diag": 1.0,
            },
            "optim": {"lr": 0.05, "warmup_steps": 2},
            "train": {"epochs": EPOCHS, "cpu": True, "seed": SEED},
        }
    )


def digest(array: np.ndarray) -> str:
    """sha256 (16 hex digits) of an integer array's shape, dtype and bytes."""
    array = np.ascontiguousarray(array)
    head = f"{array.shape}{array.dtype.str}".encode()
    return hashlib.sha256(head + array.tobytes()).hexdigest()[:16]


def grey_levels(tensors: list[Tensor]) -> np.ndarray:
    """(N, C, H, W) uint8 of transform outputs normalised with mean 0 and std 1 (level / 255):
    a value that is not a grey level is an error, not rounded away."""
    scaled = torch.stack(tensors).double().numpy() * 255.0
    levels = np.rint(scaled)
    if np.abs(scaled - levels).max() > 1e-3:
        raise ValueError("a transform's output is not a whole grey level / 255")
    return levels.astype(np.uint8)


def _unnormalised(spec: InputSpec, channels: int = 3) -> InputSpec:
    """``spec`` with mean 0 and std 1 for ``channels``: the transforms' grey levels, exact."""
    return InputSpec(size=spec.size, mean=(0.0,) * channels, std=(1.0,) * channels)


def _transforms(spec: InputSpec, seed: int) -> dict[str, Any]:
    """The evaluation transform and every training augmentation, as a run of ``seed`` builds
    them."""
    found = {"eval": eval_transform(spec.size, spec.mean, spec.std)}
    for name in AUGMENTATIONS:
        found[name] = train_transform(spec.size, spec.mean, spec.std, name, seed)
    return found


def _source_pixels(images: LabeledImages, spec: InputSpec, seed: int) -> dict[str, Any]:
    """One source's labels, decoded pixels and each transform's grey levels (first epoch)."""
    decoded = [images.read(i)[0] for i in range(len(images))]
    found: dict[str, Any] = {"labels": images.labels.tolist()}
    found["decoded"] = hashlib.sha256("".join(map(digest, decoded)).encode()).hexdigest()[:16]
    for name, transform in _transforms(spec, seed).items():
        data = TransformedImages(images, transform)
        seed_transform(transform, epoch_seed(seed, 0))  # as the loop reseeds epoch 0
        found[name] = digest(grey_levels([data[i][0] for i in range(len(data))]))
    return found


def pixels(sources: Mapping[str, Any], spec: InputSpec, seed: int = SEED) -> dict[str, Any]:
    """Source label → its labels, decoded pixels and transformed grey levels, in RGB; and the
    IDX images as one channel (``data.channels: 1``), as ``idx_gray``."""
    found = {
        name: _source_pixels(load_spec(source, 3, seed), _unnormalised(spec), seed)
        for name, source in sources.items()
    }
    gray = load_spec(sources["idx"], 1, seed)
    return found | {"idx_gray": _source_pixels(gray, _unnormalised(spec, 1), seed)}


def corruptions(severities: tuple[int, ...] = (1, 3, 5)) -> dict[str, str]:
    """``<corruption>_<severity>`` → the grey levels of the fixture images corrupted (seed 0),
    every corruption of ``eval.corruptions``."""
    images, _ = fixture_images()
    return {
        f"{name}_{severity}": digest(np.stack(corrupt_images(images, name, severity, seed=0)))
        for name in CORRUPTIONS
        for severity in severities
    }


def context(recipe: Recipe, train: LabeledImages, spec: InputSpec) -> dict[str, Any]:
    """The recipe's perturbed context pool and the grey levels of its first two batches of
    epochs 0 and 1 (a perturbed pool caches no φ0 features: no objective is read)."""
    seed = recipe.train.seed
    stream = context_stream(recipe.context, seed, train, [], _unnormalised(spec), _CPU, None)
    found: dict[str, Any] = {"pool": stream.pool.identity["fingerprint"][:16]}
    found["counts"] = stream.pool.identity["counts"]
    for epoch in range(2):
        batches = stream.epoch(epoch)
        levels = [grey_levels(list(next(batches)[0])) for _ in range(2)]
        found[f"epoch_{epoch}"] = digest(np.stack(levels))
    return found


def _float64_model(recipe: Recipe, num_classes: int) -> nn.Module:
    """The recipe's model, created (and initialised) in float64 under the run's seed."""
    set_seed(recipe.train.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return create_model(recipe.model, num_classes).double()
    finally:
        torch.set_default_dtype(default)


def summary(module: nn.Module) -> dict[str, Any]:
    """The float state of ``module``: its norm, its sum, :data:`PROJECTIONS` seeded random
    projections, and each tensor's norm (to find the one that moved)."""
    state = {
        k: v.detach().double() for k, v in module.state_dict().items() if v.is_floating_point()
    }
    flat = torch.cat([v.reshape(-1) for v in state.values()])
    directions = torch.randn(
        PROJECTIONS, flat.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    return {
        "norm": float(flat.norm()),
        "sum": float(flat.sum()),
        "projections": (directions @ flat).tolist(),
        "tensors": {k: float(v.norm()) for k, v in state.items()},
    }


def _terms(terms: Mapping[str, Tensor]) -> dict[str, float]:
    """The loss terms of one step as floats."""
    return {k: float(terms[k].detach()) for k in ("loss", "nll", "fs_reg", "param_reg")}


def _method(recipe: Recipe, train: LabeledImages) -> dict[str, Any]:
    """One method's initial weights, first loss terms, step losses and trained weights."""
    seed = recipe.train.seed
    model = _float64_model(recipe, len(train.class_names))
    found: dict[str, Any] = {"initial": summary(model)}
    spec = input_spec(model, recipe.model, recipe.data)
    objective = FSEBObjective.from_config(model, len(train), recipe.fseb)
    transform = train_transform(spec.size, spec.mean, spec.std, recipe.data.augment, seed)
    loader = make_loader(TransformedImages(train, transform), recipe.data.batch_size, True, 0, seed)
    stream = None
    if not recipe.fseb.is_ps_map:
        stream = context_stream(recipe.context, seed, train, [], spec, _CPU, objective)
    optimizer = build_optimizer(recipe.optim, objective.trainable_parameters(), model)
    scheduler = build_scheduler(recipe.optim, optimizer, EPOCHS * len(loader))
    objective.train()
    losses = []
    for epoch in range(EPOCHS):
        seed_transform(transform, epoch_seed(seed, epoch))
        contexts = None if stream is None else stream.epoch(epoch)
        for x, y in loader:
            ctx = None if contexts is None else next(contexts)[0].double()
            terms = objective(x.double(), y, ctx)
            if not losses:
                found["first_step"] = _terms(terms)
            losses.append(float(terms["loss"].detach()))
            terms["loss"].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
    return found | {"losses": losses, "trained": summary(model)}


def training(
    train_spec: Mapping[str, Any], train: LabeledImages
) -> tuple[dict[str, Any], dict[str, Any]]:
    """PS-MAP's and FS-EB's :func:`_method` from the same initialisation, as two parts: the
    initial weights and first loss terms (``loss``), the step losses and trained weights."""
    loss: dict[str, Any] = {}
    trained: dict[str, Any] = {}
    for name, reg_scale in (("psmap", 0.0), ("fseb", 1.0)):
        found = _method(tiny_recipe(train_spec, reg_scale), train)
        loss[name] = {key: found[key] for key in ("initial", "first_step")}
        trained[name] = {key: found[key] for key in ("losses", "trained")}
    return loss, trained


def _logits(rows: int, classes: int, seed: int) -> Tensor:
    """(rows, classes) float64 logits of seeded integers / 16: exact in every float format."""
    levels = np.random.default_rng(seed).integers(-64, 65, size=(rows, classes))
    return torch.from_numpy(levels).double() / 16


def _jsonable(values: Mapping[str, Tensor]) -> dict[str, Any]:
    """0-dim tensors as floats, vectors as lists."""
    return {k: v.tolist() for k, v in values.items()}


def metrics() -> dict[str, Any]:
    """The metrics of fixed logits: 3 and 2 classes (every task metric that applies), OOD
    detection by every output score, and the temperature fitted on the 3-class logits."""
    found: dict[str, Any] = {}
    for classes, seed in ((3, 1), (2, 2)):
        labels = torch.arange(60) % classes
        logits = _logits(60, classes, seed) + 1.5 * nn.functional.one_hot(labels, classes)
        names = [m for m in TASK_METRICS if classes == 2 or m not in BINARY_TASK_METRICS]
        log_probs = torch.log_softmax(logits, -1)
        found[f"classes_{classes}"] = _jsonable(classification_metrics(log_probs, labels, names))
        found[f"temperature_{classes}"] = float(fit_temperature(logits, labels))
    logits_in, logits_out = _logits(60, 3, 1), _logits(40, 3, 3) * 0.5
    probs = torch.softmax(logits_in, -1), torch.softmax(logits_out, -1)
    found["ood"] = _jsonable(ood_metrics(*probs, OUTPUT_OOD_SCORES, logits_in, logits_out))
    return found


def compute(root: Path) -> dict[str, dict[str, Any]]:
    """Every part's values, its fixtures written under ``root``."""
    sources = write_sources(root)
    train_spec = {"source": "imagefolder", "path": sources["imagefolder_png"].path}
    recipe = tiny_recipe(train_spec, 1.0)
    train = load_spec(recipe.data.train, 3, SEED)
    spec = input_spec(create_model(recipe.model, 3), recipe.model, recipe.data)
    found = {"pixels": pixels(sources, spec), "corruptions": corruptions()}
    found["context"] = context(recipe, train, spec)
    found["loss"], found["training"] = training(train_spec, train)
    return found | {"metrics": metrics()}
