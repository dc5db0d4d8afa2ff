"""The model card's front matter: its Hub metadata and the ``model-index`` of the run's results,
built with ``huggingface_hub``'s card classes (``ModelCardData`` and one ``EvalResult`` per
number), so the Hub reads the metrics, the datasets they were measured on and the split.

Every value is the one the card's results table prints, at its scale and rounding: percentages
where the table's title says ``(%)``, and the metric's name is that title.

A dataset is typed by its Hub id when it is a Hub dataset, else by ``local:`` and its name
(``local:owls``): ``EvalResult.dataset_type`` is free text, which ``huggingface_hub`` takes as
given, and a colon is in no Hub id, so a local folder is never read as a link to an unrelated
Hub dataset of the same name.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import PureWindowsPath
from typing import Any

from huggingface_hub import EvalResult, ModelCardData

from fseb_ft.data.splits import VALIDATION_SPLIT
from fseb_ft.evaluation.metrics import METRIC_REGISTRY
from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY
from fseb_ft.recipe import Recipe
from fseb_ft.recipe.datasets import DataConfig, DatasetSpec
from fseb_ft.runs.posthoc import posthoc_blocks
from fseb_ft.runs.published import folder_name
from fseb_ft.runs.rundir import results_split

__all__ = ["LOCAL_TYPE", "TASK_TYPE", "card_data", "dataset_type", "eval_results", "local_name"]

TASK_TYPE = "image-classification"
"""The model-index task of every result (the Hub's task id)."""
LOCAL_TYPE = "local:"
"""What starts the dataset type of a dataset that is not on the Hub (a colon is in no Hub id)."""
_METRICS = ("accuracy", "nll", "ece", "sel_pred_auc")
"""The in-distribution metrics every model-index has (when the results hold them); the task
metrics of ``eval.metrics`` follow."""
_OOD_METRIC = ("auroc", "OOD AUROC (%)")
"""(metric type, name) of each OOD set's AUROC, per OOD score (the metric's ``config``)."""


def card_data(
    recipe: Recipe,
    results: Mapping[str, Any],
    *,
    model_name: str,
    front: Mapping[str, Any],
) -> ModelCardData:
    """The card's metadata: ``front`` (``library_name``, ``license``, ``tags``, …) and, when
    ``results`` hold any, the model-index of :func:`eval_results` under ``model_name``."""
    found = eval_results(recipe, results)
    if not found:
        return ModelCardData(**front)
    return ModelCardData(**front, model_name=model_name, eval_results=found)


def eval_results(recipe: Recipe, results: Mapping[str, Any]) -> list[EvalResult]:
    """The run's results as the model-index's ``EvalResult`` list.

    On the reported split (test, or validation without one): accuracy, NLL, ECE, Sel. Pred. and
    the task metrics of ``eval.metrics`` (per-class ones stay in the card's table); per OOD set,
    the AUROC of each OOD score, on that set's dataset. Each again from each post-hoc block the
    run has ("+ TS", "+ LLLA"), named with its ``metric_suffix``
    (:data:`~fseb_ft.runs.posthoc.POSTHOC_BLOCKS`). Missing or non-finite values (the table's
    "–") are left out.
    """
    blocks = [(results, "")]
    blocks += [(found, block.metric_suffix) for block, found in posthoc_blocks(results)]
    data = recipe.data
    reported = _reported_dataset(data, results_split(results), data.draw_seed(recipe.train.seed))
    found = [
        EvalResult(**reported, **metric)
        for block, suffix in blocks
        for metric in _test_metrics(block.get("test") or {}, suffix)
    ]
    ood = _ood_datasets(data.ood, _identifier(reported))
    for name, dataset in ood.items():
        for block, suffix in blocks:
            scores = (block.get("ood") or {}).get(name) or {}
            found += [EvalResult(**dataset, **m) for m in _ood_metrics(scores, suffix)]
    return found


def dataset_type(spec: DatasetSpec) -> str:
    """A dataset as the model-index types it: its Hub id (source ``hub``), else
    :data:`LOCAL_TYPE` and its local name (:func:`local_name`), which no Hub id can be."""
    if spec.source == "hub":
        return spec.path
    return LOCAL_TYPE + local_name(spec)


def local_name(spec: DatasetSpec) -> str:
    """A dataset's name without its path: a Hub id as it is, else the folder (a ``csv`` label
    file's folder), file or source (``sklearn_digits``)."""
    if spec.source == "hub":
        return spec.path
    if spec.source == "sklearn_digits":
        return spec.source
    if spec.source == "csv":
        return PureWindowsPath(spec.path).parent.name or folder_name(spec.path)
    return folder_name(spec.path)


def _reported_dataset(data: DataConfig, split: str, seed: int) -> dict[str, Any]:
    """The dataset the in-distribution results come from: ``data.test`` (``data.val`` when
    ``split`` is the validation split), else the part of ``data.train``'s split held out as
    ``split`` (``test_fraction`` / ``val_fraction`` of it, drawn with ``seed``): named so, with
    the hold-out in the dataset's ``args``, as no Hub split holds those images alone."""
    validation = split == VALIDATION_SPLIT
    given = data.val if validation else data.test
    if given is not None:
        return _dataset(given)
    dataset = _dataset(data.train)
    dataset["dataset_name"] += f", held-out {split} part"
    fraction = data.val_fraction if validation else data.test_fraction
    dataset["dataset_args"] = {"held_out": split, "fraction": fraction, "seed": seed}
    return dataset


def _dataset(spec: DatasetSpec) -> dict[str, Any]:
    """The model-index's dataset fields of ``spec`` (a ``csv`` file is one split, so none is
    named)."""
    return {
        "task_type": TASK_TYPE,
        "dataset_type": dataset_type(spec),
        "dataset_name": local_name(spec),
        "dataset_config": spec.config,
        "dataset_split": None if spec.source == "csv" else spec.split,
        "dataset_revision": spec.revision,
    }


def _identifier(dataset: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the model-index groups results by (``EvalResult.unique_identifier``)."""
    keys = ("task_type", "dataset_type", "dataset_config", "dataset_split", "dataset_revision")
    return tuple(dataset[key] for key in keys)


def _ood_datasets(
    specs: Mapping[str, DatasetSpec], in_distribution: tuple[Any, ...]
) -> dict[str, dict[str, Any]]:
    """Each OOD set's dataset, named by its recipe key. The Hub groups results by dataset
    (:func:`_identifier`) and names each group once, so a set whose dataset is shared with the
    in-distribution set or with another OOD set (other classes of the same split: the
    quickstart's digits 5–9, CIFAR-100's ``near`` and ``far`` classes) gets its key as the
    config too, which keeps its AUROCs under its own name."""
    datasets = {name: _dataset(spec) | {"dataset_name": name} for name, spec in specs.items()}
    seen = Counter(_identifier(d) for d in datasets.values())
    seen[in_distribution] += 1
    for name, dataset in datasets.items():
        if seen[_identifier(dataset)] > 1:
            config = dataset["dataset_config"]
            dataset["dataset_config"] = name if config is None else f"{config}/{name}"
    return datasets


def _test_metrics(test: Mapping[str, Any], suffix: str) -> Iterator[dict[str, Any]]:
    metrics = [METRIC_REGISTRY[name] for name in _METRICS]
    metrics += [m for m in METRIC_REGISTRY.values() if m.task and not m.per_class]
    for metric in metrics:
        value = _shown(test.get(metric.name), metric.scale)
        if value is not None:
            yield {
                "metric_type": metric.name,
                "metric_name": metric.title + suffix,
                "metric_value": value,
            }


def _ood_metrics(scores: Mapping[str, Any], suffix: str) -> Iterator[dict[str, Any]]:
    kind, title = _OOD_METRIC
    for score, registered in OOD_SCORE_REGISTRY.items():
        value = _shown(scores.get(f"{score}_{kind}"), 100.0)
        if value is not None:
            yield {
                "metric_type": kind,
                "metric_name": f"{title}, {registered.title}{suffix}",
                "metric_config": score,
                "metric_value": value,
            }


def _shown(value: Any, scale: float) -> float | None:
    """``value`` as the results table shows it (times ``scale``, 2 decimals; 4 unscaled),
    ``None`` where the table shows "–"."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(value * scale, 2) if scale != 1.0 else round(value, 4)
