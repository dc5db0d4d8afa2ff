"""The feature OOD scores' fit a model keeps: written by the evaluation that computed the scores
(training's, or ``fseb-ft evaluate``), read back at prediction time to score new images
(:mod:`fseb_ft.prediction.feature_fit`).

The file, :data:`~fseb_ft.runs.rundir.FEATURE_OOD_FIT` in the run's model folder (so exported
and pushed with it), holds the :class:`~fseb_ft.evaluation.feature_ood.FeatureOodFit` as named
tensors (:func:`~fseb_ft.evaluation.feature_ood.fit_tensors`): float64, but the unit training
features KNN compares with, float32. The model folder's ``fseb.json`` lists the scores it can
compute (:func:`feature_scores_in`).
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import FeatureOodFit, fit_from_tensors, fit_tensors
from fseb_ft.recipe.options import FEATURE_OOD_SCORES
from fseb_ft.runs.rundir import FEATURE_OOD_FIT, write_tensors

__all__ = ["feature_scores_in", "read_feature_fit", "write_feature_fit"]


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
