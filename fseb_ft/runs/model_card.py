"""The model card (``README.md`` of a run's model folder): Hub metadata (with the results'
``model-index``: :mod:`fseb_ft.runs.model_index`), provenance, method, results table, plots and a
usage example, from the run's recipe, ``run.json`` and results.

Text only: writing the folder is :mod:`fseb_ft.runs.export`'s job, uploading it
:mod:`fseb_ft.runs.upload`'s. The card is published, so it names local paths by their last
component (:mod:`fseb_ft.runs.published`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fseb_ft.data.splits import TEST_SPLIT, VALIDATION_SPLIT
from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.evaluation.metrics import METRIC_REGISTRY
from fseb_ft.method.methods import find_method
from fseb_ft.recipe import Recipe, dump_yaml, recipe_tree
from fseb_ft.runs.card_usage import predict_section, usage_section
from fseb_ft.runs.model_index import card_data, local_name
from fseb_ft.runs.posthoc import LAPLACE, TEMPERATURE, WISE
from fseb_ft.runs.published import LOCAL_DIR, PLACEHOLDER, model_label, placeholders, scrub
from fseb_ft.runs.rundir import (
    CONFUSION_PLOT,
    CORRUPTION_PLOT,
    MODEL_RECIPE,
    PLOTS,
    RunInfo,
    results_split,
)
from fseb_ft.runs.tables import (
    VALIDATION_NOTE,
    groups_markdown,
    markdown_table,
    method_title,
    ood_score_titles,
    warnings_markdown,
)

__all__ = [
    "PLOT_CAPTIONS",
    "UNKNOWN_LICENSE",
    "model_card",
    "plot_caption",
    "published_recipe",
    "selection",
]

PLOT_CAPTIONS = {
    PLOTS[0]: "Reliability diagram ({split} split)",
    PLOTS[1]: "Selective prediction: accuracy of the most confident fraction",
    PLOTS[2]: "Predictive entropy on the {split} split and the OOD sets",
    CONFUSION_PLOT: "Confusion matrix on the {split} split: counts, and rows normalised",
    CORRUPTION_PLOT: "Accuracy and ECE against corruption severity",
}
"""The run's plots, in card order, with their captions (``{split}``: the split the
results are on)."""
UNKNOWN_LICENSE = "other"
"""The card's license when neither ``output.license`` nor the starting weights state one."""
_CARD_TAGS = ["image-classification", "timm", "fseb-ft"]
_MAX_FILES_SHOWN = 10
_MAX_CLASSES_SHOWN = 20
_MAX_GROUPS_SHOWN = 20
_GROUP_METRICS = ("accuracy", "nll", "ece", "auroc_positive")
"""The columns of the card's per-group table (``eval.group_by``); results.json has them all."""


def model_card(
    recipe: Recipe,
    run_info: RunInfo,
    results: Mapping[str, Any],
    *,
    source: Mapping[str, Any],
    baseline: Mapping[str, Mapping[str, Any]] | None = None,
    plots: Sequence[str] = (),
    repo_id: str | None = None,
    local_dir: str | Path | None = None,
    abstention: AbstentionRule | None = None,
) -> str:
    """The model card (``README.md``): Hub metadata, provenance, method, results, plots, usage.

    Args:
        recipe, run_info, results: the run's recipe, ``run.json`` and results.
        source: the ``source_model`` entry of ``fseb.json`` (name, hub_id, license, …).
        baseline: method title → results of other runs, shown under this run in the table.
        plots: PNG file names inside the model folder, embedded with relative links.
        repo_id: the Hub repo (``user/name``) for the usage example; a placeholder if unknown.
        local_dir: the model folder, whose name the ``local-dir:`` example shows (its path is
            a placeholder: the card is published).
        abstention: the threshold ``fseb-ft predict --keep`` stored (``abstention.json``).
    """
    method = find_method(recipe.fseb.method).title(recipe.fseb)
    title = method_title(recipe)
    name = repo_id.split("/")[-1] if repo_id else title
    datasets = sorted({s.path for s in _data_specs(recipe) if s.source == "hub"})
    front = {
        "library_name": "timm",
        "license": source["license"],
        "tags": [*_CARD_TAGS, method.lower()],
        "pipeline_tag": "image-classification",
        "base_model": source.get("hub_id") or None,
        "datasets": datasets or None,
    }
    meta = card_data(recipe, results, model_name=name, front=front).to_yaml()
    parts = [f"---\n{meta}\n---\n", f"# {name}\n"]
    if warnings_markdown(results):
        parts.append(warnings_markdown(results))
    if recipe.output.license is None and source["license"] == UNKNOWN_LICENSE:
        parts.append(
            f"> **License: not known** (`license: {UNKNOWN_LICENSE}` above). Neither the recipe "
            "nor the starting weights state one, and the training data's terms are not known: "
            "set `output.license` (or the card's `license:`) before sharing.\n"
        )
    parts.append(_provenance(recipe, run_info, source, method))
    parts.append(_method_section(recipe, run_info))
    parts.append(_results_section(recipe, run_info, results, title, baseline))
    if plots:
        split = results_split(results)
        shown = "\n\n".join(f"![{plot_caption(p, split)}]({p})" for p in plots)
        parts.append(f"## Plots\n\n{shown}\n")
    parts.append(
        usage_section(recipe.data.channels, _temperature(results), source, repo_id, local_dir)
    )
    parts.append(predict_section(repo_id, abstention))
    parts.append(_recipe_section(recipe))
    return scrub("\n".join(parts))


def published_recipe(recipe: Recipe) -> str:
    """The resolved recipe as the model folder publishes it: local paths as placeholders."""
    return dump_yaml(placeholders(recipe_tree(recipe)))


def _recipe_section(recipe: Recipe) -> str:
    text = published_recipe(recipe)
    name = MODEL_RECIPE.name
    fill = ""
    if PLACEHOLDER in text:
        fill = f", after replacing its `{PLACEHOLDER}…` placeholders with your local paths"
    return (
        f"## Recipe\n\nReproduce with `fseb-ft {name}` (package `fseb_ft`; the file is in this "
        f"folder){fill}.\n\n"
        f"<details>\n<summary>Resolved recipe (<code>{name}</code>)</summary>\n\n"
        f"```yaml\n{text}```\n\n</details>\n"
    )


def _provenance(recipe: Recipe, run_info: RunInfo, source: Mapping[str, Any], method: str) -> str:
    arch, name = source["architecture"], model_label(source["name"])
    if source.get("hub_id"):
        hub = source["hub_id"]
        start = f"fine-tuned from [`{hub}`](https://huggingface.co/{hub})"
    elif source["pretrained"] and source["name"].startswith(LOCAL_DIR):
        start = f"fine-tuned from the local weights `{name}` (a `{LOCAL_DIR}` folder)"
    elif source["pretrained"]:
        start = f"fine-tuned from the pretrained timm model `{name}`"
    elif name != arch:
        start = f"trained from the random initialisation of `{name}` (`pretrained: false`)"
    else:
        start = "trained from its random initialisation (`pretrained: false`)"
    names = [str(n) for n in run_info.class_names or []]
    shown = ", ".join(names[:_MAX_CLASSES_SHOWN])
    if len(names) > _MAX_CLASSES_SHOWN:
        shown += ", …"
    train = recipe.data.train  # by its folder's name: run.json's identity adds fingerprints
    size = "×".join(str(s) for s in run_info.input.size)
    return (
        f"A timm `{arch}` image classifier {start} with **{method}** using `fseb_ft`, "
        f"on the `{train.split}` split of `{local_name(train)}` "
        f"({_or(run_info.num_train, '?')} training images; "
        f"{run_info.num_classes} classes: {shown or '–'}). "
        f"Input: {size} pixels, {recipe.data.channels} channel(s)."
        + _hardware(run_info)
        + _left_out(recipe, run_info)
        + "\n"
    )


def _left_out(recipe: Recipe, run_info: RunInfo) -> str:
    """The unreadable images a run left out (``data.bad_images: skip``), if any."""
    roots = [Path(s.path) for s in (*_data_specs(recipe), *recipe.context.datasets) if s.path]
    found = [f for files in (run_info.bad_images or {}).values() for f in files]
    files = [f"`{_in_dataset(Path(f), roots)}`" for f in found]
    if not files:
        return ""
    more = f", and {len(files) - _MAX_FILES_SHOWN} more" if len(files) > _MAX_FILES_SHOWN else ""
    shown = ", ".join(files[:_MAX_FILES_SHOWN])
    return (
        f" {len(files)} unreadable image(s) were left out before training "
        f"(`data.bad_images: skip`; run.json lists them): {shown}{more}."
    )


def _in_dataset(file: Path, roots: Sequence[Path]) -> str:
    """``file`` as ``<dataset folder>/<path inside it>``: the card is published."""
    for root in roots:
        if file.is_relative_to(root):
            return str(root.name / file.relative_to(root))
    return str(file)


def _hardware(run_info: RunInfo) -> str:
    """The sentence on devices and precision (empty for a run.json that predates them)."""
    if run_info.mixed_precision is None:
        return ""
    precision = run_info.mixed_precision
    return (
        f" Trained on {_or(run_info.num_processes, 1)} {_or(run_info.device, '?')} "
        f"process(es), mixed precision `{precision}`{' (fp32)' if precision == 'no' else ''}."
    )


def _method_section(recipe: Recipe, run_info: RunInfo) -> str:
    """The method: what FS-EB and PS-MAP are, then the method's own paragraph on this model."""
    text = (
        "## Method\n\n"
        "**FS-EB** (function-space empirical Bayes; Rudner, Kapoor, Qiu & Wilson, ICML 2023) adds "
        "to the cross-entropy a Gaussian prior over the network's *outputs* at a batch of context "
        "images, with a covariance built from the features of the frozen starting model, so the "
        "fine-tuned function stays where those features support it and is uncertain elsewhere. "
        "**PS-MAP** is the same training loop with that function-space term switched off "
        "(`fseb.reg_scale=0`): only a Gaussian prior on the parameters, i.e. weight decay.\n\n"
    )
    method = find_method(recipe.fseb.method)
    return text + method.card_text(recipe, run_info.prior, run_info.context)


def _results_section(
    recipe: Recipe,
    run_info: RunInfo,
    results: Mapping[str, Any],
    title: str,
    baseline: Mapping[str, Mapping[str, Any]] | None,
) -> str:
    rows = {title: results, **{k: v for k, v in (baseline or {}).items() if k != title}}
    test = results.get("test", {})
    data = run_info.data or {}
    lines = ["## Results\n", markdown_table(rows, run_info.class_names)]
    n = test.get("n", "?")
    on_val = results_split(results) == VALIDATION_SPLIT
    notes = [
        f"Validation split `{data.get('val', '?')}` (n={n}): {VALIDATION_NOTE}."
        if on_val
        else f"Test split `{data.get('test', '?')}` (n={n})."
    ]
    for name, scores in (results.get("ood") or {}).items():
        ident = (data.get("ood") or {}).get(name, "?")
        notes.append(f"OOD set {name}: `{ident}` (n={scores.get('n', '?')}).")
    scores = " / ".join(ood_score_titles(rows.values()))
    notes.append(
        "ECE: 15 equal-width bins; Sel. Pred.: area under the accuracy-coverage curve; "
        f"OOD AUROC/AUPR/FPR95: {scores or 'predictive entropy'} as the score, OOD as the "
        "positive class."
    )
    notes += _task_metric_notes(rows.values())
    temperature = _temperature(results)
    if temperature is not None:
        notes.append(
            f'Rows "{TEMPERATURE.suffix.strip()}": temperature scaling, a temperature fitted on '
            f"the validation split by NLL; this model's T = {temperature:.4f} (also in "
            "`fseb.json`), applied as `probs = (model(x) / T).softmax(-1)`."
            + (f" Here {note}." if (note := results[TEMPERATURE.key].get("note")) else "")
        )
    if results.get(LAPLACE.key):
        notes.append(_laplace_note(results[LAPLACE.key]))
    if results.get(WISE.key):
        notes.append(_wise_note(results[WISE.key]))
    sel = selection(recipe, results)
    if sel.get("best_epoch") is not None:
        notes.append(
            f"Weights from epoch {sel['best_epoch']} of {sel['epochs']}, selected on validation "
            f"{sel['metric']}"
            + ("." if on_val else " (the test split is never used for selection).")
        )
    if len(rows) > 1:
        notes.append(
            "The first row is this model; the others are baselines (same data and backbone; "
            "PS-MAP is the same recipe with `fseb.reg_scale=0`)."
        )
    lines.append(" ".join(notes) + "\n")
    if results.get("groups"):
        lines.append(groups_markdown(results, _GROUP_METRICS, _MAX_GROUPS_SHOWN, level=3))
    return "\n".join(lines)


def _laplace_note(found: Mapping[str, Any]) -> str:
    """What the "+ LLLA" rows are, and that this folder does not carry their posterior."""
    return (
        f'Rows "{LAPLACE.suffix.strip()}": a last-layer Laplace approximation (laplace-torch; '
        f"{found['hessian']} GGN of the classifier on the training split's features, prior "
        f"precision {found['prior_precision']:.4g} by {_prior_method(found['prior_method'])}, "
        "probit predictive). Evaluation only: this folder does not carry the posterior, and "
        "`fseb-ft predict` uses the network's own (or temperature-scaled) probabilities."
    )


def _wise_note(found: Mapping[str, Any]) -> str:
    """What the "+ WiSE" rows are, and where their weights are."""
    return (
        f'Rows "{WISE.suffix.strip()}": WiSE-FT, the backbone\'s weights interpolated as '
        f"(1 − α) θ_pretrained + α θ_fine-tuned with α = {found['alpha']:g}, chosen on the "
        "validation split by NLL, the classifier the fine-tuned one, BatchNorm statistics "
        "re-estimated on the training images when 0 < α < 1. Its weights are "
        "`wise_ft.safetensors` in this folder, in the layout of `model.safetensors`: load the "
        "model as below, then "
        '`safetensors.torch.load_model(model, "wise_ft.safetensors")`.'
    )


def _prior_method(name: str) -> str:
    """How the card says each ``eval.laplace_prior``."""
    said = {"marglik": "the training split's marginal likelihood", "validation": "validation NLL"}
    return said.get(name, name)


_TASK_METRIC_NOTES = {
    "qwk": "quadratic weighted Cohen's kappa of the predicted class, the class indices as grades",
    "balanced_accuracy": "the mean recall over the classes",
    "macro_f1": "the mean F1 over the classes",
    "roc_auc": "AUROC of label 1's probability for two classes, else the macro mean of the "
    "one-vs-rest AUROCs",
    "average_precision": "average precision, of label 1's probability for two classes, else the "
    "macro mean of the one-vs-rest ones",
    "sensitivity_at_90_specificity": "the largest sensitivity (label 1 positive) at a threshold "
    "whose specificity is at least 90 %",
    "sensitivity_at_95_specificity": "the same at 95 % specificity",
    "per_class_recall": "the fraction of each class's images predicted as it",
}
"""What each task metric means, said under the card's table when a result reports it."""


def _task_metric_notes(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The definitions of the task metrics the results report (``eval.metrics``), in one note."""
    found = {key for res in results for key in res.get("test", {})}
    shown = [
        f"{METRIC_REGISTRY[name].title.removesuffix(' (%)')}: {text}"
        for name, text in _TASK_METRIC_NOTES.items()
        if name in found
    ]
    return [f"{'; '.join(shown)} (scikit-learn; docs/method.md)."] if shown else []


def selection(recipe: Recipe, results: Mapping[str, Any]) -> dict[str, Any]:
    training = results.get("training") or {}
    return {
        "metric": recipe.train.select_metric,
        "best_epoch": training.get("best_epoch"),
        "epochs": training.get("epochs"),
    }


def plot_caption(name: str, split: str = TEST_SPLIT) -> str:
    """The card's caption of the plot file ``name``, whose figure shows ``split``."""
    caption = PLOT_CAPTIONS.get(name)
    return (
        caption.format(split=split) if caption else Path(name).stem.replace("_", " ").capitalize()
    )


def _data_specs(recipe: Recipe) -> list[Any]:
    d = recipe.data
    return [s for s in (d.train, d.val, d.test, *d.ood.values()) if s is not None]


def _temperature(results: Mapping[str, Any]) -> float | None:
    """The temperature fitted by ``eval.temperature_scaling``; ``None`` when it was off."""
    return (results.get(TEMPERATURE.key) or {}).get("temperature")


def _or(value: Any, default: Any) -> Any:
    """``value``, or ``default`` for a field a partial or older ``run.json`` lacks."""
    return default if value is None else value
