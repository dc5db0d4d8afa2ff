"""A model ready to predict new images: loaded from a run folder, a model folder in timm's Hub
format or ``hf-hub:owner/name``; its inputs (image files, or a recipe's dataset spec) read
without stopping at a bad file; its forward pass; and a run's validation split, rebuilt.

A run's network with its best weights is :func:`load_run_model`, and what the run predicts with
(FS-VI: the Monte-Carlo predictive of the saved q(θ)) :func:`run_predictor`. A loaded model says
where it keeps its feature OOD scores' fit (``feature_fit_file``), which
:mod:`fseb_ft.runs.feature_fit` reads, and :func:`outputs_and_read_errors` gives the images'
penultimate features in the pass that gives their logits.

The engine of ``fseb-ft predict`` (:mod:`fseb_ft.predict`); its thresholds are chosen by
:mod:`fseb_ft.runs.thresholds`, its files written by :mod:`fseb_ft.runs.prediction_files`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import timm
import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_model as load_safetensors
from timm.data import resolve_data_config
from torch import Tensor, nn
from torch.utils.data import Dataset

from fseb_ft.data.files import find_images, read_image
from fseb_ft.data.hub_access import hub_or_cache, offline_hint
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.pixels import set_max_image_pixels
from fseb_ft.data.screening import screen
from fseb_ft.data.sources import hold_outs, load_split
from fseb_ft.data.transforms import eval_transform, make_loader
from fseb_ft.errors import FsebError, first_line
from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.logs import progress_bar
from fseb_ft.method.models import create_model
from fseb_ft.method.posterior import posterior
from fseb_ft.recipe import DataConfig, DatasetSpec, Recipe
from fseb_ft.recipe.datasets import IN_MEMORY
from fseb_ft.recipe.options import OUTPUT_OOD_SCORES
from fseb_ft.recipe.schema import build
from fseb_ft.runs.rundir import (
    FEATURE_OOD_FIT,
    MODEL_DIR,
    MODEL_WEIGHTS,
    NOT_A_RUN,
    RECIPE_FILE,
    RESULTS_JSON,
    RunInfo,
    read_abstention,
    read_json,
    read_method_state,
    read_run,
)

__all__ = [
    "ImageInputs",
    "LoadedModel",
    "ModelLoadError",
    "first_line",
    "gather_inputs",
    "load_model",
    "load_run_model",
    "logits_and_read_errors",
    "outputs_and_read_errors",
    "run_predictor",
    "validation_split",
]

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


def load_run_model(run_dir: Path, recipe: Recipe, info: RunInfo) -> nn.Module:
    """The run's model with its best weights (:data:`~fseb_ft.runs.rundir.MODEL_WEIGHTS`), on CPU.

    Raises:
        FileNotFoundError: the run has no best weights.
    """
    weights = run_dir / MODEL_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(NOT_A_RUN.format(run_dir=run_dir, missing=MODEL_WEIGHTS))
    # The weights come from the run, so never fetch pretrained ones again.
    model_cfg = dataclasses.replace(recipe.model, pretrained=False)
    model = create_model(model_cfg, int(info.num_classes), in_chans=recipe.data.channels)
    load_safetensors(model, str(weights))
    return model


def run_predictor(run_dir: Path, recipe: Recipe, model: nn.Module) -> nn.Module:
    """What the run predicts with: its method's predictor around ``model`` (its best weights),
    built by :func:`fseb_ft.method.posterior.posterior` with the method's state saved beside
    them (:func:`~fseb_ft.runs.rundir.read_method_state`) and seeded by ``train.seed``, as
    training built the predictor it scored the test split with, draw for draw: ``model``
    itself for a MAP method; for FS-VI the Monte-Carlo predictive of q(θ) = N(μ, diag(σ²)),
    μ = ``model``'s weights and σ the saved state, with ``fsvi.predict_samples`` draws.

    ``model`` may already be on its device (the draws are made where its parameters are).

    Raises:
        FileNotFoundError: a method with state (FS-VI) whose saved state is missing.
    """
    method = posterior(model, recipe.fseb)
    if method.state_file is not None:
        method.load_state(read_method_state(run_dir, method.state_file))
    return method.predictor(model, recipe.train.seed)


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


class ImageInputs(Dataset):
    """``(tensor (C, H, W), error)`` per input: an unreadable one gives zeros and its error."""

    def __init__(
        self, files: list[Path] | None, data: LabeledImages | None, loaded: LoadedModel
    ) -> None:
        self.files, self.data, self.channels = files, data, loaded.channels
        self.transform = eval_transform(loaded.spec.size, loaded.spec.mean, loaded.spec.std)
        self.shape = (loaded.channels, *loaded.spec.size)

    def __len__(self) -> int:
        # Files, or else a dataset (one of the two is given).
        return len(self.files) if self.files is not None else len(cast(LabeledImages, self.data))

    def __getitem__(self, index: int) -> tuple[Tensor, str]:
        try:
            if self.files is not None:
                image = read_image(self.files[index], self.channels)  # (H, W, C) uint8
            else:
                image = cast(LabeledImages, self.data)[index][0]  # (H, W, C) uint8
        except (OSError, ValueError) as err:
            # The decoder's own words (its wrapper repeats the file name the row already has).
            return torch.zeros(self.shape), first_line(err.__cause__ or err)
        return self.transform(image=image)["image"], ""  # (C, H', W') float32


def gather_inputs(
    loaded: LoadedModel, images: Sequence[str | Path], dataset: Any
) -> tuple[ImageInputs, list[str], list[str] | None, list[Path]]:
    """The inputs, their names, their labels' class names (datasets) and files passed over."""
    if dataset is not None and images:
        raise ValueError("give IMAGES or a dataset, not both")
    if loaded.recipe is not None:  # the run's data.max_image_pixels; a model folder: PIL's
        set_max_image_pixels(loaded.recipe.data.max_image_pixels)
    if dataset is None:
        files, skipped = find_images(images) if images else ([], [])
        if not files:
            raise ValueError("no images given: name files, folders or globs, or a dataset")
        return ImageInputs(files, None, loaded), [str(f) for f in files], None, skipped
    spec = (
        dataset
        if isinstance(dataset, DatasetSpec)
        else build(DatasetSpec, dict(dataset), "dataset")
    )
    data = load_split("dataset", spec, loaded.channels)
    names = [f"{data.identity}[{i}]" for i in range(len(data))]
    labels = [data.class_names[k] if k < len(data.class_names) else str(k) for k in data.labels]
    return ImageInputs(None, data, loaded), names, labels, []


def logits_and_read_errors(
    net: nn.Module,
    inputs: ImageInputs,
    loaded: LoadedModel,
    device: torch.device,
    desc: str,
    batch_size: int,
    num_workers: int,
    progress: bool,
) -> tuple[Tensor, list[str]]:
    """``net`` (``loaded``'s network, on ``device``) run over the images' ``inputs``: float32
    logits (N, K) on CPU in input order, and each input's read error ("" if none; an unreadable
    image's row is the logits of zeros, to be left out). Not
    :func:`fseb_ft.evaluation.predictions.predict_logits`, which scores a labelled split's loader.
    """
    logits, _, errors = outputs_and_read_errors(
        net, inputs, loaded, device, desc, batch_size, num_workers, progress
    )
    return logits, errors


@torch.no_grad()
def outputs_and_read_errors(
    net: nn.Module,
    inputs: ImageInputs,
    loaded: LoadedModel,
    device: torch.device,
    desc: str,
    batch_size: int,
    num_workers: int,
    progress: bool,
    network: nn.Module | None = None,
) -> tuple[Tensor, Tensor | None, list[str]]:
    """:func:`logits_and_read_errors`, with ``network`` (the timm network behind ``net``, on
    ``device``, in eval mode) also the float32 penultimate features (N, D) on CPU, those
    :func:`fseb_ft.evaluation.predictions.predict_features` computes; ``None`` without it."""
    loader = make_loader(inputs, batch_size, shuffle=False, num_workers=num_workers)
    logits, features, errors = [], [], []
    with progress_bar(total=len(inputs), desc=desc, unit="img", show=progress) as bar:
        for x, err in loader:
            z, h = _forward(net, network, x.to(device))
            logits.append(z.float().cpu())  # (B, K)
            if h is not None:
                features.append(h.float().flatten(1).cpu())  # (B, D)
            errors.extend(err)
            bar.update(len(err))
    out = torch.cat(logits)  # (N, K)
    if out.shape[1] != len(loaded.class_names):
        raise ValueError(
            f"{loaded.where} outputs {out.shape[1]} classes but names {len(loaded.class_names)}"
        )
    return out, torch.cat(features) if network is not None else None, errors


def _forward(net: nn.Module, network: nn.Module | None, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``net``'s outputs (B, K) of ``x`` and, with ``network``, its penultimate features: one
    ``forward_features`` for both when ``net`` is the network (timm's ``forward`` is
    ``forward_head(forward_features(x))``), else the network's own pass beside ``net``'s."""
    if network is None:
        return net(x), None
    timm_network = cast(Any, network)  # timm's methods, which nn.Module does not declare
    found = timm_network.forward_features(x)
    h = timm_network.forward_head(found, pre_logits=True)  # (B, D)
    return (timm_network.forward_head(found) if net is network else net(x)), h


def validation_split(recipe: Recipe, info: RunInfo | None) -> LabeledImages:
    """The run's validation split, rebuilt from its recipe as
    :func:`~fseb_ft.data.sources.build_splits` built it (``data.val``, or the seeded stratified
    ``data.val_fraction`` of ``data.train``, after its ``data.test_fraction``), then screened as
    training screened it: served from the resized-image cache with ``data.cache`` (the pixels the
    run validated on) and without the images ``data.bad_images: skip`` left out.

    Raises:
        FsebError: the run was trained on in-memory data (``fseb_ft.finetune``), which the
            recipe only names; or the rebuilt split is not the one ``run.json`` records.
    """
    cfg = recipe.data
    seed = cfg.draw_seed(recipe.train.seed)
    spec = cfg.val if cfg.val is not None else cfg.train
    if spec.path.startswith(IN_MEMORY):
        raise FsebError(
            "the run was trained on in-memory data (fseb_ft.finetune), so its validation split "
            "cannot be rebuilt: give --threshold"
        )
    if cfg.val is not None:
        val = load_split("data.val", cfg.val, cfg.channels, seed)
    else:
        full = load_split("data.train", cfg.train, cfg.channels, seed)
        # Without data.val the recipe's rules give a val_fraction: a hold-out.
        val = cast(LabeledImages, hold_outs(full, cfg, seed)[1])
    val = screen({"data.val": val}, cfg.bad_images, progress=False, cache=cfg.cache)[0]["data.val"]
    recorded = ((info.data if info else None) or {}).get("val")
    if recorded is not None and recorded != val.identity:
        raise FsebError(
            f"the validation split rebuilt from the recipe ({val.identity}) is not the one the "
            f"run validated on ({recorded}): the data changed since training; give --threshold"
        )
    return val
