"""The run directory: the name of every file a run writes, ``run.json`` as :class:`RunInfo`, and
reading a finished run back (its recipe, its record, the method's state beside its weights).

A run directory (``output.dir``) holds::

    recipe.yaml                     RECIPE_FILE: the resolved recipe (what makes a folder a run)
    run.json                        RUN_INFO_FILE: RunInfo (classes, input, data and context
                                    provenance, devices, warnings, training record)
    results.json  results.md        RESULTS_JSON, RESULTS_MD: metrics of the best weights, on
                                    the split RESULTS_SPLIT names (:func:`results_split`)
    *.png                           PLOTS, CONFUSION_PLOT, CORRUPTION_PLOT
    checkpoints/epoch-NNNN/         CHECKPOINTS: the last complete epoch, with TRAINER_STATE
    model/model.safetensors         MODEL_WEIGHTS: the best weights (MODEL_DIR: the Hub folder)
    model/<method's file>           method_state_file: the method's state at the best epoch
                                    (its ``state_file``: FS-VI's σ in variational.safetensors)
    model/feature_ood.safetensors   FEATURE_OOD_FIT: the feature OOD scores' fit on the training
                                    split, kept by an evaluation that computed them
    model/wise_ft.safetensors       WISE_WEIGHTS: the WiSE-FT network of ``eval.wise_ft``, in
                                    the layout of the best weights (:func:`write_wise_weights`)
    model/training_recipe.yaml      MODEL_RECIPE: the recipe as published, local paths as
                                    placeholders (``fseb_ft.runs.published``)
    abstention.json                 ABSTENTION_FILE: the threshold `fseb-ft predict --keep`
                                    stored (:func:`read_abstention`)
    val_logits.safetensors          VAL_LOGITS: `fseb-ft predict`'s cache of the validation
                                    logits thresholds are chosen from (:func:`read_val_logits`),
                                    with `fseb-ft monitor`'s features (:func:`read_val_features`)

Every writer here is atomic (:mod:`fseb_ft.runs.atomic`): a reader sees the old file or the new one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model
from torch import Tensor, nn

from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.splits import TEST_SPLIT
from fseb_ft.recipe import ConfigError, Recipe, load_recipe
from fseb_ft.runs.atomic import (
    cleaned_on_failure,
    is_not_writable,
    publish,
    remove,
    temp_beside,
    write_text,
)

__all__ = [
    "ABSTENTION_FILE",
    "CHECKPOINTS",
    "CHECKPOINT_PREFIX",
    "COMPARISON_JSON",
    "COMPARISON_MD",
    "COMPARISON_PLOTS",
    "CONFUSION_PLOT",
    "CORRUPTION_PLOT",
    "DATA_FILES",
    "FEATURE_OOD_FIT",
    "LOCK_FILE",
    "MODEL_DIR",
    "MODEL_RECIPE",
    "MODEL_WEIGHTS",
    "NOT_A_RUN",
    "PLOTS",
    "RECIPE_FILE",
    "RESULTS_JSON",
    "RESULTS_MD",
    "RESULTS_SPLIT",
    "RUN_INFO_FILE",
    "RUN_PLOTS",
    "TRAINER_STATE",
    "VAL_LOGITS",
    "WISE_WEIGHTS",
    "RunInfo",
    "check_output_dir",
    "checkpoint_name",
    "clear_run",
    "epochs_done",
    "latest_checkpoint",
    "method_state_file",
    "read_abstention",
    "read_class_names",
    "read_json",
    "read_method_state",
    "read_run",
    "read_val_features",
    "read_val_logits",
    "results_split",
    "runs_in",
    "write_best_weights",
    "write_json",
    "write_method_state",
    "write_tensors",
    "write_val_logits",
    "write_wise_weights",
]

RECIPE_FILE = "recipe.yaml"
"""The resolved recipe a run directory holds (what makes a folder a run)."""
RUN_INFO_FILE = "run.json"
"""The run's :class:`RunInfo`."""
DATA_FILES = "data_files.json"
"""The image files of the run's image-folder splits (``data.train`` …: each file's size and
modification time by its path), so a rerun refused for changed data names the files that changed."""
RESULTS_JSON = "results.json"
"""Metrics of the best weights (and the training record), for machines."""
RESULTS_MD = "results.md"
"""The same results as Markdown tables, for people."""
RESULTS_SPLIT = "split"
"""The key of ``results.json`` naming the split its in-distribution metrics (``test``, the OOD
sets' other side, the corruptions' clean images) come from:
:data:`~fseb_ft.data.splits.TEST_SPLIT`, or :data:`~fseb_ft.data.splits.VALIDATION_SPLIT` for a
recipe without ``data.test``."""
MODEL_DIR = "model"
"""The model folder inside a run directory: timm's Hub format, with card (``fseb_ft.push``)."""
MODEL_WEIGHTS = Path(MODEL_DIR) / "model.safetensors"
"""Where a run directory keeps its best (validation-selected) weights."""
FEATURE_OOD_FIT = Path(MODEL_DIR) / "feature_ood.safetensors"
"""The fit of the feature OOD scores (``eval.ood_scores``: ``mahalanobis``, …) on the training
split's penultimate features of the best weights, written by the evaluation that computed them
(``fseb_ft.runs.feature_fit``), so that ``fseb-ft predict`` scores new images with it. In the
model folder: exported and pushed with it."""
WISE_WEIGHTS = Path(MODEL_DIR) / "wise_ft.safetensors"
"""WiSE-FT's interpolated network (``eval.wise_ft``), a state dict in the layout of
``MODEL_WEIGHTS``, written by the evaluation that chose its ``α``; in the model folder, exported
and pushed with it, while ``MODEL_WEIGHTS`` stays the fine-tuned network."""
MODEL_RECIPE = Path(MODEL_DIR) / "training_recipe.yaml"
"""The recipe the model card says to reproduce with, its local paths as placeholders. Not
``recipe.yaml``: that name makes a folder a run, and a model folder is not one."""
LOCK_FILE = ".lock"
"""The file a training holds locked while it runs (``fseb_ft.runs.lock``); a finished run
removes it, a killed run's holds nothing."""
CHECKPOINTS = "checkpoints"
"""The folder of per-epoch checkpoints (only the newest complete one is kept)."""
CHECKPOINT_PREFIX = "epoch-"
"""Checkpoint folders are ``CHECKPOINT_PREFIX`` + the epoch on four digits."""
TRAINER_STATE = "trainer_state.json"
"""The loop's progress inside a checkpoint folder; a checkpoint without it is incomplete."""
PLOTS = ("reliability.png", "selective_prediction.png", "entropy_ood.png")
"""Figures written beside ``results.json`` (``entropy_ood.png`` only when there are OOD sets)."""
COMPARISON_MD = "comparison.md"
"""The side-by-side table that ``--compare`` (of a run or a sweep) writes in its output folder."""
COMPARISON_JSON = "comparison.json"
"""The same comparison for machines."""
COMPARISON_PLOTS = ("comparison_reliability.png", "comparison_selective.png")
"""Side-by-side figures that ``fseb-ft RECIPE --compare`` writes beside ``comparison.md``."""
CORRUPTION_PLOT = "corruptions.png"
"""Accuracy and ECE against corruption severity, written when ``eval.corruptions`` is set."""
CONFUSION_PLOT = "confusion.png"
"""The confusion matrix of the reported split, counts and row-normalised, beside ``PLOTS``."""
RUN_PLOTS = (*PLOTS, CONFUSION_PLOT, CORRUPTION_PLOT)
"""The figures a run draws of itself: its model card shows these and no other PNG of its folder
(a run trained into a ``--compare`` folder sits beside ``COMPARISON_PLOTS``)."""
ABSTENTION_FILE = "abstention.json"
"""The abstention threshold ``fseb-ft predict --keep`` stored, with its coverage and risk on the
validation split (``fseb_ft.predict``); the model folder's ``fseb.json`` and card repeat it."""
VAL_LOGITS = "val_logits.safetensors"
"""A cache of the validation split's logits and labels as ``fseb-ft predict`` computed them to
choose a threshold: a later ``--coverage`` or ``--max-risk`` (any temperature) reuses them; and,
once ``fseb-ft monitor`` has run, the split's penultimate features, so later monitors skip the
validation pass. Only written where the run folder can be written to; it changes no
prediction."""

NOT_A_RUN = "{run_dir} is not a finished run: {missing} is missing"
"""The message of a run folder that lacks a file (formatted with ``run_dir`` and ``missing``)."""


@dataclasses.dataclass(kw_only=True)
class RunInfo:
    """What a run records about itself in ``run.json`` (besides its recipe and results).

    :meth:`to_json` gives the exact ``run.json`` layout; :meth:`from_json` reads it back, also
    from run folders written before some of these fields existed (they are ``None`` then).
    """

    num_classes: int
    """Outputs of the classifier head (K)."""
    class_names: list[str] | None = None
    """Class names of the training split, in label order (``None``: unnamed)."""
    input: InputSpec
    """Input size and normalisation the model was trained with."""
    num_train: int | None = None
    """Training images (N in the objective)."""
    data: dict[str, Any] | None = None
    """Identity of every split (``train``, ``val``, ``test``, ``ood``)."""
    splits: dict[str, Any] | None = None
    """The ``train``, ``validation`` and ``test`` splits as trained and reported on (``test``
    ``null`` without one): ``size``, ``groups`` (distinct groups, when the images have a
    ``group_column``) and ``fingerprint`` of the hold-out as built, before the screen and the
    cache (:func:`fseb_ft.data.holdout.split_records`); ``None`` in runs from before it."""
    context: dict[str, Any] | None = None
    """The context pool's provenance (kind, fingerprint, …); ``None`` for PS-MAP."""
    num_processes: int | None = None
    """Processes the run trained on."""
    device: str | None = None
    """Device type (``cpu``, ``cuda``, …)."""
    mixed_precision: str | None = None
    """The precision that really ran (``no``, ``bf16``, ``fp16``)."""
    warnings: list[str] | None = None
    """Warnings about the launch and the data, in the order they were logged."""
    prior: dict[str, Any] | None = None
    """The function-space prior resolved from ``fseb.prior_std``: ``prior_std``,
    ``feature_share``, ``mean_sq_norm`` (m = mean ‖h(x̂; φ0)‖² over the context pool),
    ``prior_cov_scale`` (s) and ``prior_cov_diag`` (d); ``None`` when the recipe gives s and d."""
    training: dict[str, Any] | None = None
    """The training record (as in ``results.json``); written once training has finished."""
    bad_images: dict[str, list[str]] | None = None
    """Unreadable images left out before training (``data.bad_images: skip``): their files by
    recipe key (``data.train``, ``context.datasets[0]``, …); ``None`` when none was left out."""
    class_weights: list[float] | None = None
    """The per-class weights of the training likelihood (``train.class_weights``), in label
    order, scaled to mean 1 over the training images; ``None``: unweighted."""
    code: dict[str, Any] | None = None
    """The code that ran and where (:func:`fseb_ft.runs.code_record.code_record`): fseb_ft's
    version, its git commit and whether tracked files differed from it (``git`` is ``null``
    outside a checkout), the versions of the libraries that shape results, and the machine (CPU,
    torch's vector instructions, threads, GPU); those of the last start when a run resumed;
    ``None`` in runs from before it."""

    def to_json(self) -> dict[str, Any]:
        """The ``run.json`` mapping (``training`` only once set, ``prior`` only when resolved)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["input"] = {k: list(v) for k, v in dataclasses.asdict(self.input).items()}
        if self.training is None:
            del out["training"]
        if self.prior is None:  # s and d as the recipe gives them: run.json as before
            del out["prior"]
        if self.splits is None:  # a run.json from before splits were recorded reads back as it was
            del out["splits"]
        if not self.bad_images:
            del out["bad_images"]
        if self.class_weights is None:  # unweighted: run.json as before
            del out["class_weights"]
        if self.code is None:
            del out["code"]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RunInfo:
        """Read a ``run.json`` mapping (as :meth:`to_json` writes it)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in obj.items() if k in known}
        values["input"] = InputSpec(**{k: tuple(v) for k, v in obj["input"].items()})
        return cls(**values)


def runs_in(folder: Path) -> list[Path]:
    """The run directories directly inside ``folder`` (``psmap`` and ``fseb`` of ``--compare``)."""
    if not folder.is_dir():
        return []
    return sorted(d for d in folder.iterdir() if (d / RECIPE_FILE).is_file() and d.is_dir())


def read_run(
    run_dir: Path,
    overrides: Sequence[str] = (),
    needed: Sequence[str | Path] = (RECIPE_FILE, RUN_INFO_FILE),
    missing: str = NOT_A_RUN,
) -> tuple[Recipe, RunInfo]:
    """A finished run's resolved recipe (with ``overrides``) and ``run.json``.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist, or a file of ``needed`` is missing (the
            message is then ``missing`` formatted with ``run_dir`` and the missing file's name).
    """
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir} does not exist")
    for name in needed:
        if not (run_dir / name).is_file():
            raise FileNotFoundError(missing.format(run_dir=run_dir, missing=name))
    recipe = load_recipe(run_dir / RECIPE_FILE, overrides)
    return recipe, RunInfo.from_json(read_json(run_dir / RUN_INFO_FILE))


def _current(path: Path, run_dir: Path) -> bool:
    """``path`` exists and is not older than the run's best weights (not made for older ones)."""
    weights = run_dir / MODEL_WEIGHTS
    if not path.is_file():
        return False
    return not weights.is_file() or path.stat().st_mtime >= weights.stat().st_mtime


def read_abstention(run_dir: Path) -> dict[str, Any] | None:
    """The run's :data:`ABSTENTION_FILE`, or ``None`` when it has none or it is older than the
    best weights (chosen for weights that have since been replaced)."""
    path = run_dir / ABSTENTION_FILE
    return read_json(path) if _current(path, run_dir) else None


def read_class_names(run_dir: Path) -> list[str] | None:
    """The class names in label order that the run's ``run.json`` records; ``None`` when it
    records none or the folder has no ``run.json``."""
    path = run_dir / RUN_INFO_FILE
    return RunInfo.from_json(read_json(path)).class_names if path.is_file() else None


def read_val_logits(run_dir: Path) -> tuple[Tensor, Tensor] | None:
    """The run's :data:`VAL_LOGITS` as ``(logits (N_v, K), labels (N_v,))``, or ``None`` when it
    has none or they are older than the best weights."""
    path = run_dir / VAL_LOGITS
    if not _current(path, run_dir):
        return None
    with safe_open(str(path), "pt") as tensors:  # not the monitor's features
        return tensors.get_tensor("logits"), tensors.get_tensor("labels")


def read_val_features(run_dir: Path) -> Tensor | None:
    """The penultimate features (N_v, D) kept in the run's :data:`VAL_LOGITS` beside its logits,
    or ``None`` when it has none (written by ``fseb-ft predict``, or older than the weights)."""
    path = run_dir / VAL_LOGITS
    if not _current(path, run_dir):
        return None
    with safe_open(str(path), "pt") as tensors:
        names = tensors.keys()  # safe_open has keys() but no `in`
        return tensors.get_tensor("features") if "features" in names else None


def write_tensors(path: Path, tensors: Mapping[str, Tensor], what: str) -> None:
    """Write named tensors to a safetensors file atomically (``what`` names them in errors)."""
    tmp = temp_beside(path)
    with cleaned_on_failure(tmp, what=what):
        save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, str(tmp))
    publish(tmp, path)


def write_val_logits(
    run_dir: Path, logits: Tensor, labels: Tensor, features: Tensor | None = None
) -> None:
    """Keep the validation logits ``(N_v, K)`` and labels ``(N_v,)`` with the run, atomically;
    and the penultimate ``features`` ``(N_v, D)`` when given."""
    tensors = {"logits": logits, "labels": labels}
    if features is not None:
        tensors["features"] = features
    write_tensors(run_dir / VAL_LOGITS, tensors, "the validation logits")


def write_wise_weights(run_dir: Path, state: Mapping[str, Tensor] | None) -> None:
    """Keep WiSE-FT's network (``state``) as :data:`WISE_WEIGHTS`, atomically; ``None`` (an
    evaluation without ``eval.wise_ft``) removes an earlier one, whose ``α`` the rewritten
    results no longer record."""
    path = run_dir / WISE_WEIGHTS
    if state is None:
        remove(path)
    else:
        write_tensors(path, state, "the WiSE-FT weights")


def write_best_weights(model: nn.Module, path: Path) -> None:
    """Atomically replace the best weights (a killed run never leaves a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    hint = f"the best weights so far stay in {path}" if path.exists() else ""
    with cleaned_on_failure(tmp, what="the best weights", hint=hint):
        save_model(model, str(tmp))
    publish(tmp, path)


def method_state_file(name: str) -> Path:
    """Where a run keeps its method's state beside the best weights: ``model/<name>``, ``name``
    the method's ``state_file`` (the model folder publishes it with the weights)."""
    return Path(MODEL_DIR) / name


def write_method_state(
    run_dir: Path, state: Mapping[str, Tensor], name: str, what: str = "the method's state"
) -> None:
    """Keep the tensors the method saves beside the best weights (by name) in
    :func:`method_state_file` ``(name)``, atomically; nothing for a method without any
    (``state`` empty). ``what`` names them in an error (the objective's ``method_state_name``)."""
    if state:
        write_tensors(run_dir / method_state_file(name), state, what)


def read_method_state(run_dir: Path, name: str) -> dict[str, Tensor]:
    """What :func:`write_method_state` kept beside the run's best weights in ``name``.

    Raises:
        FileNotFoundError: the run has no :func:`method_state_file` ``(name)``.
    """
    path = run_dir / method_state_file(name)
    if not path.is_file():
        missing = method_state_file(name)
        raise FileNotFoundError(NOT_A_RUN.format(run_dir=run_dir, missing=missing))
    return load_file(str(path))


def checkpoint_name(epoch: int) -> str:
    """The checkpoint folder of ``epoch`` inside :data:`CHECKPOINTS`."""
    return f"{CHECKPOINT_PREFIX}{epoch:04d}"


def check_output_dir(run_dir: Path, what: str = "output.dir") -> None:
    """Refuse an ``output.dir`` (``what`` names it in the message) that is, or lies inside, an
    existing file, or that cannot be written to.

    Checked before anything loads: creating or writing the folder would otherwise fail only after
    the data and model, with the bare ``[Errno 17] File exists`` (or ``Not a directory``,
    ``Permission denied``).

    Raises:
        ConfigError: ``run_dir`` or a folder above it is a file, or the folder (the nearest
            existing one above it when it does not exist yet) refuses a file.
    """
    for folder in (run_dir, *run_dir.parents):
        if folder.is_dir():
            _check_writable(folder, run_dir, what)
            return
        # Looked at again: another worker of a sweep may have made the folder since.
        if folder.exists() and not folder.is_dir():
            where = "is a file" if folder == run_dir else f"lies inside {folder}, which is a file"
            raise ConfigError(
                f"{what} {run_dir} {where}, not a folder: give a folder (created if missing)"
            )


def _check_writable(folder: Path, run_dir: Path, what: str) -> None:
    """Refuse ``folder`` (``run_dir`` or the folder it will be made in) if it refuses a file:
    one is made and removed, as the OS says it (permissions, a read-only file system). Its name
    is new to each call: the workers of a sweep check one folder at once, threads included."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".fseb-ft-write-check-", dir=folder)
    except OSError as err:
        if not is_not_writable(err):
            raise
        inside = "" if folder == run_dir else f" (made in {folder})"
        raise ConfigError(
            f"{what} {run_dir}{inside} cannot be written to ({err.strerror}): give a folder "
            "you can write to"
        ) from err
    os.close(fd)
    Path(probe).unlink(missing_ok=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory (one with a trainer state), if any."""
    root = run_dir / CHECKPOINTS
    done = sorted(p for p in root.glob(f"{CHECKPOINT_PREFIX}*") if (p / TRAINER_STATE).is_file())
    return done[-1] if done else None


def results_split(results: Mapping[str, Any]) -> str:
    """The split ``results`` (a ``results.json`` mapping) were computed on;
    :data:`~fseb_ft.data.splits.TEST_SPLIT` for results written before :data:`RESULTS_SPLIT`
    existed, when every run had a test split."""
    return results.get(RESULTS_SPLIT) or TEST_SPLIT


def epochs_done(run_dir: Path) -> int:
    """The epochs the run's newest complete checkpoint holds (0 without one)."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return 0
    return int(read_json(checkpoint / TRAINER_STATE)["epoch"])


def read_json(path: Path) -> Any:
    """A JSON file's content."""
    return json.loads(Path(path).read_text())


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def clear_run(run_dir: Path) -> list[str]:
    """Remove what an earlier run left in ``run_dir``: checkpoints, model, results and plots.

    ``train.resume=never`` starts over: removing these up front means a run killed early never
    leaves the old run's results beside its own recipe. Returns the names removed, folders
    ending in ``/``.
    """
    old = [
        run_dir / CHECKPOINTS,
        run_dir / MODEL_DIR,
        run_dir / RUN_INFO_FILE,
        run_dir / DATA_FILES,
        run_dir / ABSTENTION_FILE,
        run_dir / VAL_LOGITS,
    ]
    old += [run_dir / RESULTS_JSON, run_dir / RESULTS_MD, *sorted(run_dir.glob("*.png"))]
    found = [path for path in old if path.exists()]
    names = [path.name + ("/" if path.is_dir() else "") for path in found]
    for path in found:
        remove(path)
    return names
