"""A run's data phase: its images screened, its context sets, its validation OOD sets and the
training loader (:func:`fseb_ft.engine.run.run`'s first phase, and what its later ones read)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelerate import Accelerator
from torch import Tensor
from torch.utils.data import DataLoader

from fseb_ft.data.images import LabeledImages
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.sampling import BalancedSampler
from fseb_ft.data.screening import screen, screen_splits
from fseb_ft.data.sources import load_split
from fseb_ft.data.splits import Splits
from fseb_ft.data.transforms import TransformedImages
from fseb_ft.engine.run_checks import class_count, reported_task_metrics
from fseb_ft.method.context import context_sets
from fseb_ft.method.likelihood import class_weights
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import Recipe

__all__ = ["RunData", "load_run_data", "loader_kw", "training_loader", "uses_context"]


@dataclass(frozen=True)
class RunData:
    """A run's images once screened: what the model, the context and run.json are built from."""

    splits: Splits
    context_sets: list[LabeledImages]
    """The datasets of ``context.datasets`` (none for PS-MAP, which draws no context)."""
    val_ood: dict[str, LabeledImages]
    """The ``data.val_ood`` sets, scored against validation each epoch."""
    num_classes: int
    """The head's class count K."""
    dropped: dict[str, list[str]]
    """Unreadable images left out (``data.bad_images: skip``), by recipe key."""
    warnings: list[str]
    """What the labels make doubtful (a class without images, …)."""
    task_metrics: tuple[str, ...]
    """The metrics of ``eval.metrics`` defined for ``num_classes`` classes."""
    built: Splits
    """The splits as built, before the screen: what ``run.json``'s split fingerprints name."""
    class_weights: Tensor | None = None
    """The per-class likelihood weights (K,) of ``train.class_weights``; ``None``: unweighted."""


def load_run_data(recipe: Recipe, splits: Splits, accelerator: Accelerator) -> RunData:
    """Screen the splits and the context sets for unreadable images (serving them from the
    resized-image cache with ``data.cache``), check the labels, weigh the classes
    (``train.class_weights``), and load the validation OOD sets."""
    seed, channels, cache = recipe.train.seed, recipe.data.channels, recipe.data.cache
    with accelerator.main_process_first():  # the main process builds the cache, the others read it
        screened, others, dropped = screen_splits(
            splits,
            # A method without context points (PS-MAP, L2-SP) draws none.
            context_sets(recipe.context, channels, seed) if uses_context(recipe) else [],
            recipe.data.bad_images,
            accelerator.is_main_process,
            cache=cache,
        )
        val_ood, dropped_ood = _val_ood_sets(recipe, accelerator.is_main_process)
    num_classes, warnings = class_count(recipe, screened)
    weights = class_weights(recipe.train.class_weights, screened.train.labels, num_classes)
    metrics = reported_task_metrics(recipe, num_classes, accelerator.is_main_process)
    dropped |= dropped_ood
    return RunData(
        screened, others, val_ood, num_classes, dropped, warnings, metrics, splits, weights
    )


def _val_ood_sets(
    recipe: Recipe, progress: bool
) -> tuple[dict[str, LabeledImages], dict[str, list[str]]]:
    """The ``data.val_ood`` sets by name; with ``data.cache``, served from it and their
    unreadable images handled as the other sets' are (with the files left out, by key)."""
    data = recipe.data
    keys = {name: f"data.val_ood.{name}" for name in data.val_ood}
    sets = {
        keys[name]: load_split(keys[name], spec, data.channels, data.draw_seed(recipe.train.seed))
        for name, spec in data.val_ood.items()
    }
    dropped: dict[str, list[str]] = {}
    if data.cache is not None:
        sets, dropped = screen(sets, data.bad_images, progress, data.cache)
    return {name: sets[key] for name, key in keys.items()}, dropped


def training_loader(
    recipe: Recipe, images: LabeledImages, transform: Any, accelerator: Accelerator
) -> DataLoader:
    """The training split's loader, shuffled or drawn by ``train.sampler``; read every epoch, so
    its workers persist until the run closes them.

    A last batch of one image is left out (a different image each epoch, with a notice): it
    stops BatchNorm where a feature map is 1x1 (a ResNet at 32 px). Any other partial last
    batch trains.
    """
    batch, train_set = recipe.data.batch_size, TransformedImages(images, transform)
    sampler = None
    if recipe.train.sampler == "balanced":
        sampler = BalancedSampler(images.labels, recipe.train.seed)
    lone = batch > 1 and len(train_set) % batch == 1
    if lone:
        accelerator.print(
            f"train: {len(train_set)} images in batches of {batch}: each epoch's last batch, "
            "a single image, is left out (BatchNorm cannot train on one)"
        )
    return make_loader(
        train_set, batch, shuffle=sampler is None, sampler=sampler, persistent=True,
        drop_last=lone, **loader_kw(recipe),
    )  # fmt: skip


def loader_kw(recipe: Recipe) -> dict[str, Any]:
    """The loaders' workers and seed."""
    return {"num_workers": recipe.data.num_workers, "seed": recipe.train.seed}


def uses_context(recipe: Recipe) -> bool:
    """Whether the recipe's method draws context points (FS-EB with ``reg_scale > 0``, FS-VI)."""
    return find_method(recipe.fseb.method).uses_context(recipe.fseb)
