"""Whether a run folder may be resumed: the same recipe (up to settings that do not change the
maths) and the same data as the run whose checkpoints it holds.

Both checks run before anything is written, so a refused rerun leaves the folder as it was.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fseb_ft.data.files import file_changes, list_split
from fseb_ft.errors import FsebError
from fseb_ft.recipe import DataConfig, Recipe, TrainConfig, load_recipe
from fseb_ft.runs.rundir import (
    DATA_FILES,
    MODEL_DIR,
    RECIPE_FILE,
    RUN_INFO_FILE,
    RunInfo,
    latest_checkpoint,
    read_json,
)

__all__ = [
    "RecipeMismatchError",
    "check_resumable",
    "check_same_data",
    "data_files",
    "flat_keys",
]


class RecipeMismatchError(FsebError, ValueError):
    """``output.dir`` holds checkpoints of a run with a different recipe."""


# Settings that may change between a killed run and its resumption without changing its maths.
_RESUME_FREE = ("output", "eval", "sweep", "train.resume", "train.log_every", "train.trackers",
                "data.num_workers")  # fmt: skip


def check_resumable(recipe: Recipe, run_dir: Path) -> None:
    """Refuse to resume a run directory whose saved recipe differs from ``recipe``.

    Resuming restores the weights, optimiser and schedule of the saved run, so a changed
    ``fseb.reg_scale`` or ``optim.lr`` would silently be ignored or mixed with the old one.
    A changed ``train.epochs`` alone gets its own message: why, and how to train on.
    """
    saved = run_dir / RECIPE_FILE
    if recipe.train.resume != "auto" or latest_checkpoint(run_dir) is None or not saved.exists():
        return
    old_recipe = load_recipe(saved)
    old = flat_keys(dataclasses.asdict(old_recipe))
    new = flat_keys(dataclasses.asdict(recipe))
    keys = [
        key
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and not key.startswith(_RESUME_FREE)
    ]
    if keys == ["train.epochs"]:
        raise RecipeMismatchError(_epochs_message(run_dir, old_recipe, recipe.train.epochs))
    if keys:
        changed = "; ".join(f"{key}: {old.get(key)!r} → {new.get(key)!r}" for key in keys)
        raise RecipeMismatchError(
            f"{run_dir} holds checkpoints of a run with a different recipe ({changed});"
            " resuming would mix the two. Use another output.dir, or train.resume=never to "
            "start over in this one."
        )


def _epochs_message(run_dir: Path, old: Recipe, epochs: int) -> str:
    """Why a rerun into ``run_dir`` cannot change ``train.epochs`` from ``old``'s to ``epochs``,
    and, for more epochs, the command that trains on from the run's exported weights."""
    was, optim = old.train.epochs, old.optim
    cosine = optim.schedule == "cosine"
    end_lr = optim.lr * (optim.min_lr_ratio if cosine else 1.0)
    why = (
        f"its cosine schedule decays the learning rate to its end (optim.lr × optim.min_lr_ratio"
        f" = {end_lr:.3g}) over those epochs, and train.epochs={epochs} would "
        "change the schedule of the epochs already trained"
        if cosine
        else "a run is only resumed with its own recipe"
    )
    said = f"{run_dir} holds a run of train.epochs={was}, which a rerun cannot change: {why}."
    if epochs < was:
        return f"{said} Use another output.dir, or train.resume=never to start over in this one."
    # model.head_init=timm keeps the trained head (auto would zero a pretrained model's head).
    warmup = ["optim.warmup_steps=0"] if optim.warmup_steps else []
    command = shlex.join([
        "fseb-ft", str(run_dir / RECIPE_FILE), f"model.name=local-dir:{run_dir / MODEL_DIR}",
        "model.pretrained=true", "model.head_init=timm", "optim.schedule=constant",
        f"optim.lr={end_lr:.3g}", *warmup, f"train.epochs={epochs - was}",
        f"output.dir={run_dir}-more",
    ])  # fmt: skip
    finished = (run_dir / MODEL_DIR / "config.json").is_file()
    first = "" if finished else f"finish it first (rerun it with train.epochs={was}), then "
    return (
        f"{said} To train {epochs - was} more epoch(s), {first}start a new run from its exported "
        "weights (the epoch best on validation; they are then also its φ0) at a constant "
        f"learning rate: {command}"
    )


# What a resumed run must find as it was: the classes, the images of every split and the context.
_DATA_FACTS = ("num_classes", "class_names", "num_train", "data", "context")


def check_same_data(
    train: TrainConfig, run_dir: Path, info: RunInfo, files: Mapping[str, Any] | None = None
) -> None:
    """Refuse to resume a run directory whose run was trained on other data than ``info`` says.

    Called before anything is written: resuming would load weights trained on the old images
    (or fail on a head of another size) and then describe them by the new data, so the model's
    ``label_names`` would name classes it never saw. Compared: the class names and count, the
    training-set size, every split's identity (image folders: names, sizes and times of their
    files) and the context pool's. The message names a changed image folder's files added,
    rewritten and removed (``files``, :func:`data_files`, against the run's
    :data:`~fseb_ft.runs.rundir.DATA_FILES`), and a changed identity only by its key: its
    fingerprints say nothing to a person.
    """
    saved = run_dir / RUN_INFO_FILE
    if train.resume != "auto" or latest_checkpoint(run_dir) is None or not saved.is_file():
        return
    old = read_json(saved)
    new = json.loads(json.dumps(info.to_json()))  # as run.json would hold it: lists, not tuples
    recorded = read_json(run_dir / DATA_FILES) if (run_dir / DATA_FILES).is_file() else {}
    files = files or {}
    changed = [
        _said(key, a, b, recorded.get(key), files.get(key))
        for key, a, b in _changes(old, new, _DATA_FACTS)
    ]
    if changed:
        raise RecipeMismatchError(
            f"{run_dir} holds checkpoints of a run trained on other data ({'; '.join(changed)});"
            " resuming would describe its weights by the new data. Use another output.dir, or "
            "train.resume=never to start over in this one."
        )


def data_files(data: DataConfig) -> dict[str, dict[str, list[int]]]:
    """The image files of the image-folder splits ``data.train``, ``data.val`` and
    ``data.test``: each file's ``[size, mtime_ns]`` by its path in the split folder, as
    :data:`~fseb_ft.runs.rundir.DATA_FILES` records them. A folder that cannot be listed is left
    out (loading the data names it)."""
    out = {}
    for key in ("train", "val", "test"):
        spec = getattr(data, key)
        if spec is None or spec.source != "imagefolder":
            continue
        try:
            listing = list_split(spec.path, spec.split)
        except OSError:
            continue
        out[f"data.{key}"] = {name: list(stat) for name, stat in listing.stats.items()}
    return out


def _said(key: str, a: Any, b: Any, was: Any, now: Any) -> str:
    """One change, as the refusal says it: an image folder's files that changed when both
    listings are known; another dataset's or the context's identity by its key alone; any other
    fact (classes, counts) old → new, shortened."""
    if was is not None and now is not None and (found := file_changes(was, now)):
        return f"{key}: {found}"
    if key.startswith(("data.", "context")):
        return f"{key} changed"
    return f"{key}: {_short(a)} → {_short(b)}"


def _changes(
    old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]
) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` of what differs under ``keys``, nested mappings
    followed down to the values that differ."""
    out = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            sub = _changes(a, b, sorted(set(a) | set(b)))
            out += [(f"{key}.{child}", x, y) for child, x, y in sub]
        elif a != b:
            out.append((key, a, b))
    return out


def _short(value: Any, width: int = 80) -> str:
    """``repr(value)``, cut in the middle to ``width`` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width // 2 - 2]}…{text[-(width // 2 - 1) :]}"


def flat_keys(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping (a recipe's ``asdict``) as ``{dotted key: value}``; values other than
    numbers, strings and booleans as their ``str`` (for comparing, and for the trackers)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_keys(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, int | float | str | bool) else str(value)
    return out
