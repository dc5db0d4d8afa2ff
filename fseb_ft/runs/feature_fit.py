"""The feature OOD scores' fit a model keeps: written by the evaluation that computed the scores
(training's, or ``fseb-ft evaluate``), read back by ``fseb-ft predict`` to score new images.

The file, :data:`~fseb_ft.runs.rundir.FEATURE_OOD_FIT` in the run's model folder (so exported
and pushed with it), holds the :class:`~fseb_ft.evaluation.feature_ood.FeatureOodFit` as named
tensors (:func:`~fseb_ft.evaluation.feature_ood.fit_tensors`): float64, but the unit training
features KNN compares with, float32. Predict scores with exactly the fit the evaluation scored
with (:func:`load_feature_fit`). The model folder's ``fseb.json`` lists the scores it can
compute (:func:`feature_scores_in`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import (
    FeatureOodFit,
    fit_from_tensors,
    fit_scores,
    fit_tensors,
)
from fseb_ft.recipe.options import FEATURE_OOD_SCORES
from fseb_ft.runs.rundir import FEATURE_OOD_FIT, write_tensors

if TYPE_CHECKING:  # loading pulls in the data pipeline, which exporting a folder never needs
    from fseb_ft.runs.loading import LoadedModel

__all__ = ["feature_scores_in", "load_feature_fit", "read_feature_fit", "write_feature_fit"]


def write_feature_fit(run_dir: Path, fit: FeatureOodFit) -> Path:
    """Keep ``fit`` in the run's model folder, atomically; return the file."""
    path = Path(run_dir) / FEATURE_OOD_FIT
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tensors(path, fit_tensors(fit), "the feature OOD scores' fit")
    return path


def read_feature_fit(path: Path) -> FeatureOodFit:
    """The fit :func:`write_feature_fit` kept in ``path``, on CPU.

    Raises:
        FsebError: ``path`` is not such a file (damaged, or another file of that name).
    """
    try:
        return fit_from_tensors(load_file(str(path)))
    except (SafetensorError, OSError, ValueError) as err:
        raise FsebError(f"{path} is not a readable feature OOD scores' fit: {err}") from err


def feature_scores_in(folder: Path) -> list[str]:
    """The feature scores the model folder ``folder`` can compute with the fit it keeps (none
    without one), for its ``fseb.json``: read from the file's tensor names alone (the fit can
    be hundreds of MB), ``vim`` when the classifier's weights are among them.

    Raises:
        FsebError: the file is not a readable safetensors file.
    """
    path = Path(folder) / FEATURE_OOD_FIT.name
    if not path.is_file():
        return []
    try:
        with safe_open(str(path), framework="pt") as found:
            names = set(found.keys())
    except (SafetensorError, OSError) as err:
        raise FsebError(f"{path} is not a readable feature OOD scores' fit: {err}") from err
    return [name for name in FEATURE_OOD_SCORES if name != "vim" or "weight" in names]


def load_feature_fit(loaded: LoadedModel, name: str) -> FeatureOodFit | None:
    """The fit ``loaded`` keeps for the OOD score ``name``; ``None`` for a score of the outputs.

    Raises:
        FsebError: the model keeps no fit (the message names the command that writes one), its
            fit cannot compute ``name``, or it was fitted with other weights.
    """
    if name not in FEATURE_OOD_SCORES:
        return None
    path = loaded.feature_fit_file()
    if path is None:
        raise FsebError(_missing(loaded, name))
    fit = read_feature_fit(path)
    if name not in fit_scores(fit):
        raise FsebError(
            f"--ood-score {name}: {loaded.where}'s feature OOD fit has no ViM part (its "
            f"classifier is not linear); choose one of {list(fit_scores(fit))}"
        )
    _check_weights(fit, loaded.network or loaded.model, loaded, name)
    return fit


def _missing(loaded: LoadedModel, name: str) -> str:
    """Why ``loaded`` cannot compute the feature score ``name``, and the command that fixes it."""
    evaluate = _evaluate_command(loaded, name)
    what = (
        f"--ood-score {name} scores the penultimate features with a fit on the training split "
        f"that the model keeps ({FEATURE_OOD_FIT.name}), and {loaded.where} keeps none"
    )
    if loaded.run_dir is not None:
        return f"{what}: run `{evaluate}` (it fits and keeps it)"
    if loaded.where.startswith("hf-hub:"):
        repo = loaded.where.removeprefix("hf-hub:").partition("@")[0]
        return f"{what}: run `{evaluate}` on the run it pushed, then `fseb-ft push RUN {repo}`"
    return f"{what}: run `{evaluate}` on the run it was exported from and use that run's model/"


def _evaluate_command(loaded: LoadedModel, name: str) -> str:
    """The ``fseb-ft evaluate`` command that fits (again) and keeps the fit of ``name``: the
    run's own ``eval.ood_scores`` with ``name`` added, so its results keep their scores."""
    scores: Sequence[str] = loaded.recipe.eval.ood_scores if loaded.recipe is not None else ()
    named = ",".join(dict.fromkeys([*scores, name]))
    return f"fseb-ft evaluate {loaded.run_dir or 'RUN'} eval.ood_scores=[{named}]"


def _check_weights(fit: FeatureOodFit, network: nn.Module, loaded: LoadedModel, name: str) -> None:
    """Refuse a fit whose classifier (kept for ViM) is not ``network``'s: fitted on other
    weights, since replaced."""
    timm_network = cast(Any, network)  # timm's method, which nn.Module does not declare
    head = timm_network.get_classifier() if hasattr(network, "get_classifier") else None
    if fit.weight is None or not isinstance(head, nn.Linear):
        return
    if head.weight.shape != fit.weight.shape or not torch.equal(
        head.weight.detach().double().cpu(), fit.weight
    ):
        raise FsebError(
            f"--ood-score {name}: {loaded.where}'s feature OOD fit was made for other weights "
            f"than its own: run `{_evaluate_command(loaded, name)}` again"
        )
