"""A model ready to predict new images, loaded from a run folder, a model folder in timm's Hub
format or ``hf-hub:owner/name`` (:func:`load_model`), with what a prediction needs to know about
it (:class:`LoadedModel`): input size and normalisation, class names, temperature, the
abstention rule it keeps, where it keeps its feature OOD scores' fit
(:mod:`fseb_ft.prediction.feature_fit` reads it) and, for a run, its folder and recipe (its
validation split can be rebuilt: :mod:`fseb_ft.prediction.validation`).

A run's network is :func:`fseb_ft.runs.loading.load_run_model` and what it predicts with
(FS-VI: the Monte-Carlo predictive of the saved q(θ)) :func:`fseb_ft.runs.loading.run_predictor`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import timm
from huggingface_hub import hf_hub_download
from timm.data import resolve_data_config
from torch import nn

from fseb_ft.data.hub_access import hub_or_cache, offline_hint
from fseb_ft.data.inputs import InputSpec
from fseb_ft.errors import FsebError, first_line
from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.recipe import DataConfig, Recipe
from fseb_ft.recipe.options import OUTPUT_OOD_SCORES
from fseb_ft.runs.loading import load_run_model, run_predictor
from fseb_ft.runs.rundir import (
    FEATURE_OOD_FIT,
    MODEL_DIR,
    RECIPE_FILE,
    RESULTS_JSON,
    RunInfo,
    read_abstention,
    read_json,
    read_run,
)

__all__ = ["LoadedModel", "ModelLoadError", "load_model"]

logger = logging.getLogger(__name__)


class ModelLoadError(FsebError, OSError):
    """MODEL cannot be loaded: not a run or model folder, or not on (or not reached at) the Hub."""


def _no_file() -> Path | None:
    """No file: the model keeps no feature OOD fit."""
    return None


@dataclasses.dataclass
class LoadedModel:
    """A model ready to predict, with what a prediction needs to know about it."""

    model: nn.Module
    """The classifier, in eval mode, on CPU."""
    spec: InputSpec
    """Input size and normalisation it was trained with."""
    channels: int
    """Input channels (1 or 3)."""
    class_names: list[str]
    """Class names, index = output."""
    temperature: float | None
    """The temperature fitted on validation NLL (``eval.temperature_scaling``); ``None``: none."""
    where: str
    """What was loaded, for messages: ``run runs/x``, ``model folder …``, ``hf-hub:…``."""
    run_dir: Path | None = None
    """The run folder, when MODEL is one (its validation split can be rebuilt)."""
    recipe: Recipe | None = None
    """The run's resolved recipe."""
    info: RunInfo | None = None
    """The run's ``run.json``."""
    kept: AbstentionRule | None = None
    """The abstention rule the model keeps (``abstention.json`` / ``fseb.json``), if any."""
    default_ood_score: str = "entropy"
    """The OOD score reported when none is asked for: the run's first ``eval.ood_scores`` of the
    network's outputs (``entropy`` without one)."""
    network: nn.Module | None = None
    """The timm network behind ``model`` whose penultimate features the feature OOD scores read,
    when it is not ``model`` itself (FS-VI: the mean network inside the Monte-Carlo
    predictive); ``None``: ``model``."""
    feature_fit_file: Callable[[], Path | None] = _no_file
    """Gives the file of the feature OOD scores' fit the model keeps
    (:data:`~fseb_ft.runs.rundir.FEATURE_OOD_FIT`; a Hub model's downloaded then), or ``None``
    when it keeps none; called only when a feature score is asked for."""


def load_model(model: str | Path, data_paths: Sequence[str] = ()) -> LoadedModel:
    """Load a run folder, a model folder (timm's Hub format) or ``hf-hub:owner/name``.

    A model folder inside a run (``RUN/model``) loads as its run, whose validation split can
    choose thresholds. A folder holding runs (the OUTPUT of ``--compare``) loads its ``fseb``
    run, or its only run. ``data_paths`` (``data.train.path=DIR``, …) say where a run's data
    are now when they moved since training.

    Raises:
        ModelLoadError: ``model`` is none of these, or the Hub cannot be reached; or
            ``data_paths`` are given for a model that is not a run.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.name == MODEL_DIR and (path.parent / RECIPE_FILE).is_file():
        path = path.parent
    if data_paths and not (path / RECIPE_FILE).is_file():
        raise ModelLoadError(
            f"{', '.join(data_paths)}: data paths move a run's data, and MODEL {text} is not a "
            "run folder"
        )
    if text.startswith("hf-hub:"):
        return _load_hub(text)
    if (path / RECIPE_FILE).is_file():
        return _load_run(path, data_paths)
    if (path / "config.json").is_file():
        return _load_folder(path)
    runs = sorted(p.parent.name for p in path.glob(f"*/{RECIPE_FILE}")) if path.is_dir() else []
    if len(runs) == 1 or "fseb" in runs:
        chosen = "fseb" if "fseb" in runs else runs[0]
        if len(runs) > 1:
            others = ", ".join(str(path / r) for r in runs if r != chosen)
            logger.info("%s holds runs %s: using %s (give %s for another)", path, runs,
                        path / chosen, others)  # fmt: skip
        return _load_run(path / chosen)
    what = f"holds runs {runs}: give one of them" if runs else "does not exist"
    if path.exists() and not runs:
        what = "is neither a run folder (recipe.yaml) nor a model folder (config.json)"
    raise ModelLoadError(
        f"MODEL {path} {what}; MODEL is a run folder, a model folder in timm's Hub format or "
        "hf-hub:owner/name"
    )


def _load_run(run_dir: Path, data_paths: Sequence[str] = ()) -> LoadedModel:
    recipe, info = read_run(run_dir, data_paths)
    if data_paths:
        info = _moved(info, read_run(run_dir)[0].data, recipe.data)
    network = load_run_model(run_dir, recipe, info)
    # FS-VI runs predict with their Monte-Carlo predictive, as their results were scored.
    model = run_predictor(run_dir, recipe, network).eval()
    names = [str(n) for n in info.class_names or []]
    results = read_json(run_dir / RESULTS_JSON) if (run_dir / RESULTS_JSON).is_file() else {}
    return LoadedModel(
        model=model,
        spec=info.input,
        channels=recipe.data.channels,
        class_names=names + [str(i) for i in range(len(names), int(info.num_classes))],
        temperature=(results.get("temperature_scaled") or {}).get("temperature"),
        where=f"run {run_dir}",
        run_dir=run_dir,
        recipe=recipe,
        info=info,
        kept=_kept(read_abstention(run_dir)),
        # predict has logits, not the training split's features: the first logit score.
        default_ood_score=next(
            (s for s in recipe.eval.ood_scores if s in OUTPUT_OOD_SCORES), "entropy"
        ),
        network=None if model is network else network,
        feature_fit_file=_local_file(run_dir / FEATURE_OOD_FIT),
    )


def _moved(info: RunInfo, old: DataConfig, new: DataConfig) -> RunInfo:
    """``info`` with the identities of the splits whose folder moved (``old`` → ``new``) named by
    their new folder, so the rebuilt validation split is checked against the images the run
    recorded: an image folder's identity is its folder and its listing's fingerprint (names,
    sizes, times of its files), which moving the folder keeps."""
    text = json.dumps(info.data, ensure_ascii=False)
    for a, b in ((old.train, new.train), (old.val, new.val), (old.test, new.test)):
        if a is not None and b is not None and a.path != b.path:
            was, now = (json.dumps(f":{Path(x.path)}:", ensure_ascii=False)[1:-1] for x in (a, b))
            text = text.replace(was, now)
    return dataclasses.replace(info, data=json.loads(text))


def _load_folder(folder: Path) -> LoadedModel:
    if not (folder / "model.safetensors").is_file():
        raise ModelLoadError(f"{folder} has a config.json but no model.safetensors")
    try:
        model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    except (RuntimeError, OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"cannot load the model folder {folder}: {first_line(err)}") from err
    meta_path = folder / "fseb.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    return _from_timm(
        model, f"model folder {folder}", meta, _local_file(folder / FEATURE_OOD_FIT.name)
    )


_LOCAL_MODEL = (
    "give MODEL as a local model folder (a run's model/ folder, or a download of the repo)"
)


def _load_hub(name: str) -> LoadedModel:
    repo, _, revision = name.removeprefix("hf-hub:").partition("@")  # timm's owner/name@rev
    with hub_or_cache() as unreachable:
        try:
            model = timm.create_model(name, pretrained=True)
        except Exception as err:  # network, auth, missing repo, cache: all mean "could not load it"
            why = "" if unreachable is None else "the Hub did not answer and it is not cached: "
            raise ModelLoadError(
                f"could not load {name} from the Hugging Face Hub ({why}{type(err).__name__}: "
                f"{first_line(err)}); {offline_hint(_LOCAL_MODEL)}"
            ) from err
        try:
            meta = read_json(Path(hf_hub_download(repo, "fseb.json", revision=revision or None)))
        except Exception:  # a timm model not trained by fseb_ft has no fseb.json: no T, no τ
            meta = {}
    return _from_timm(model, name, meta, _hub_file(name, meta))


def _local_file(path: Path) -> Callable[[], Path | None]:
    """``path`` when it is a file then, else ``None``."""
    return lambda: path if path.is_file() else None


def _hub_file(name: str, meta: Mapping[str, Any]) -> Callable[[], Path | None]:
    """The Hub model ``name``'s :data:`~fseb_ft.runs.rundir.FEATURE_OOD_FIT`, downloaded when
    called; ``None`` when its ``fseb.json`` lists no feature score (none was pushed)."""
    if not meta.get("feature_ood_scores"):
        return _no_file
    repo, _, revision = name.removeprefix("hf-hub:").partition("@")

    def download() -> Path:
        with hub_or_cache():
            try:
                return Path(hf_hub_download(repo, FEATURE_OOD_FIT.name, revision=revision or None))
            except Exception as err:  # network, auth, a file removed since: could not fetch it
                raise ModelLoadError(
                    f"could not fetch {FEATURE_OOD_FIT.name} of {name} from the Hugging Face Hub "
                    f"({type(err).__name__}: {first_line(err)}); {offline_hint(_LOCAL_MODEL)}"
                ) from err

    return download


def _from_timm(
    model: nn.Module,
    where: str,
    meta: Mapping[str, Any],
    feature_fit_file: Callable[[], Path | None] = _no_file,
) -> LoadedModel:
    """A :class:`LoadedModel` of a timm model with its data config, ``fseb.json`` and the file
    of its feature OOD scores' fit."""
    config = resolve_data_config(model=model)
    channels, height, width = config["input_size"]
    timm_model = cast(Any, model)  # timm's attributes, which nn.Module does not declare
    labels = list(timm_model.pretrained_cfg.get("label_names") or [])
    num_classes = int(timm_model.num_classes)
    labels = [str(n) for n in labels[:num_classes]]
    return LoadedModel(
        model=model.eval(),
        spec=InputSpec((height, width), tuple(config["mean"]), tuple(config["std"])),
        channels=int(channels),
        class_names=labels + [str(i) for i in range(len(labels), num_classes)],
        temperature=meta.get("temperature"),
        where=where,
        kept=_kept(meta.get("abstention")),
        feature_fit_file=feature_fit_file,
    )


def _kept(record: Mapping[str, Any] | None) -> AbstentionRule | None:
    return AbstentionRule.from_json(record) if record else None
