"""Evaluation: predictions → metrics (test split and named OOD sets) → JSON, Markdown, plots.

    python -m fseb_ft.evaluate RUN_DIR [RUN_DIR ...]            # fseb-ft evaluate RUN_DIR ...
    python -m fseb_ft.evaluate runs/quickstart      # the psmap/ and fseb/ runs of --compare
    python -m fseb_ft.evaluate RUN_A RUN_B ... --ensemble [--out DIR]

The first form re-evaluates each saved run from its resolved recipe and best weights, and
rewrites its ``results.json``, ``results.md`` and plots (``reliability.png``,
``selective_prediction.png``, ``entropy_ood.png``; with ``eval.corruptions`` also the corrupted
test split's metrics and ``corruptions.png``). The second loads every run's best weights,
predicts the test split and OOD sets they share, averages the members' probabilities and writes
the ensemble's results and plots, with every member as a row of the table, to ``--out``
(default: ``ensemble/`` beside the runs when they share a parent folder, else ``./ensemble``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from safetensors.torch import load_model
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from fseb_ft.atomic import write_text
from fseb_ft.config import Recipe, load_recipe
from fseb_ft.images import IndexedImages, LabeledImages, Splits, stratified_split
from fseb_ft.metrics import classification_metrics, ensemble_log_probs, ood_metrics
from fseb_ft.models import InputSpec, create_model
from fseb_ft.sources import build_splits
from fseb_ft.transforms import TransformedImages, eval_transform, make_loader

__all__ = [
    "COMPARISON_PLOTS",
    "CORRUPTION_PLOT",
    "MODEL_WEIGHTS",
    "PLOTS",
    "EvalResults",
    "Predictions",
    "corruption_markdown",
    "default_ensemble_dir",
    "eval_loader",
    "evaluate_ensemble",
    "evaluate_predictions",
    "evaluate_run",
    "evaluate_splits",
    "expand_run_dirs",
    "main",
    "markdown_table",
    "method_title",
    "predict",
    "predict_corruptions",
    "predict_splits",
    "warnings_markdown",
    "write_comparison_plots",
    "write_json",
    "write_plots",
    "write_results",
]

logger = logging.getLogger(__name__)

RECIPE_FILE = "recipe.yaml"
"""The resolved recipe a run directory holds (what makes a folder a run)."""

MODEL_WEIGHTS = Path("model") / "model.safetensors"
"""Where a run directory keeps its best (validation-selected) weights."""

PLOTS = ("reliability.png", "selective_prediction.png", "entropy_ood.png")
"""Figures written beside ``results.json`` (``entropy_ood.png`` only when there are OOD sets)."""

COMPARISON_PLOTS = ("comparison_reliability.png", "comparison_selective.png")
"""Side-by-side figures that ``fseb-ft RECIPE --compare`` writes beside ``comparison.md``."""

CORRUPTION_PLOT = "corruptions.png"
"""Accuracy and ECE against corruption severity, written when ``eval.corruptions`` is set."""


@dataclasses.dataclass
class Predictions:
    """One model's (or ensemble's) predictions on the evaluation sets, on CPU."""

    test: tuple[Tensor, Tensor]
    """(log-probabilities (N, K), labels (N,)) on the in-distribution test split."""
    ood: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """OOD set name → log-probabilities (N_o, K)."""
    corruptions: dict[str, dict[int, Tensor]] = dataclasses.field(default_factory=dict)
    """Corruption name → severity → log-probabilities (N_c, K) on the corrupted test split (the
    test images, or the ``eval.corruption_limit`` subset of them; see
    :func:`predict_corruptions`)."""
    corruption_labels: Tensor | None = None
    """Labels (N_c,) of the corrupted images; ``None``: those of ``test`` (no subset)."""


class EvalResults(dict):
    """A results dict (JSON-ready, as :func:`evaluate_predictions` returns) that also carries the
    :class:`Predictions` it was computed from as ``.predictions``, so figures can be drawn
    without predicting again. The predictions are not part of the dict and never serialised.
    """

    def __init__(self, results: Mapping[str, Any], predictions: Predictions | None = None):
        """Copy ``results`` and attach ``predictions``."""
        super().__init__(results)
        self.predictions = predictions


# (results key, column title, scale) — percentages as in the paper's tables.
_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("accuracy", "Acc. (%)", 100.0),
    ("nll", "NLL", 1.0),
    ("ece", "ECE (%)", 100.0),
    ("ece_10bin", "ECE-10 (%)", 100.0),
    ("brier", "Brier", 1.0),
    ("sel_pred_auc", "Sel. Pred. (%)", 100.0),
    ("aurc", "AURC (%)", 100.0),
)
# Shown only when some result has it (binary tasks, see metrics.classification_metrics).
_OPTIONAL_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("auroc_positive", "AUROC pos. (%)", 100.0),
)
_OOD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("entropy_auroc", "AUROC (%)"),
    ("entropy_aupr", "AUPR (%)"),
    ("entropy_fpr95", "FPR95 (%)"),
)


@torch.no_grad()
def predict(
    model: nn.Module, loader: DataLoader, accelerator: Accelerator
) -> tuple[Tensor, Tensor]:
    """Float32 log-probabilities (N, K) and labels (N,) on CPU, each sample counted once.

    ``gather_for_metrics`` drops the samples Accelerate duplicated to even out the last batch
    across processes, so N is the dataset size whatever the process count.
    """
    was_training = model.training
    model.eval()
    log_probs, labels = [], []
    for x, y in tqdm(loader, desc="predict", disable=not accelerator.is_main_process, leave=False):
        with accelerator.autocast():
            logits = model(x)  # (B, K)
        lp = torch.log_softmax(logits.float(), dim=-1)  # (B, K)
        lp, y = accelerator.gather_for_metrics((lp, y))
        log_probs.append(lp.cpu())
        labels.append(y.cpu())
    model.train(was_training)
    return torch.cat(log_probs), torch.cat(labels)


def evaluate_predictions(
    test: tuple[Tensor, Tensor],
    ood: Mapping[str, Tensor] | None = None,
    corruptions: Mapping[str, Mapping[int, Tensor]] | None = None,
    corruption_labels: Tensor | None = None,
) -> dict[str, Any]:
    """Metrics of design §3 for the test predictions, each named OOD set and each corruption.

    Args:
        test: (log-probabilities (N, K), labels (N,)) on the in-distribution test split.
        ood: name → log-probabilities (N_o, K) on that semantic-shift set.
        corruptions: corruption name → severity → log-probabilities (N_c, K) on the corrupted
            test split.
        corruption_labels: labels (N_c,) of the corrupted images; ``None``: ``test``'s.

    Returns:
        ``{"test": {metric: float, "n": N}, "ood": {name: {metric: float, "n": N_o}}}``; with
        ``corruptions`` also ``"corruptions": {name: {"1": {metric: float, "n": N}, ...}}``
        (severities as strings, as JSON keys) and ``"corruption_summary": {"1": {metric: mean
        over the corruptions}, ..., "all": {metric: mean over every corruption and severity}}``.
        The metrics are those of ``test`` (:func:`~fseb_ft.metrics.classification_metrics`).
    """
    log_probs, labels = test
    out: dict[str, Any] = {
        "test": {k: float(v) for k, v in classification_metrics(log_probs, labels).items()}
    }
    out["test"]["n"] = len(labels)
    probs_in = log_probs.exp()  # (N, K)
    out["ood"] = {}
    for name, lp in (ood or {}).items():
        scores = {k: float(v) for k, v in ood_metrics(probs_in, lp.exp()).items()}
        out["ood"][name] = scores | {"n": len(lp)}
    if corruptions:
        c_labels = labels if corruption_labels is None else corruption_labels  # (N_c,)
        out["corruptions"] = {
            name: {
                str(sev): {k: float(v) for k, v in classification_metrics(lp, c_labels).items()}
                | {"n": len(lp)}
                for sev, lp in sorted(by_severity.items())
            }
            for name, by_severity in corruptions.items()
        }
        out["corruption_summary"] = _corruption_summary(out["corruptions"])
    return out


def _corruption_summary(
    corruptions: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, dict[str, float]]:
    """Per severity (and ``"all"``), the mean of every metric over the corruptions."""
    groups: dict[str, list[Mapping[str, float]]] = {}
    for by_severity in corruptions.values():
        for sev, metrics in by_severity.items():
            groups.setdefault(sev, []).append(metrics)
            groups.setdefault("all", []).append(metrics)
    order = [*sorted((k for k in groups if k != "all"), key=int), "all"]
    return {
        sev: {
            key: math.fsum(m[key] for m in groups[sev]) / len(groups[sev])
            for key in groups[sev][0]
            if key != "n"
        }
        | {"corruptions": len(groups[sev])}
        for sev in order
    }


def corruption_markdown(results: Mapping[str, Any]) -> str:
    """Markdown tables of the corrupted test split (empty without ``corruptions``).

    The first gives, per severity, the mean over the corruptions of accuracy, NLL, ECE and
    Sel. Pred. (the clean test split first, for reference); the second the accuracy and ECE of
    every corruption at every severity.
    """
    corruptions = results.get("corruptions") or {}
    if not corruptions:
        return ""
    summary = results.get("corruption_summary") or _corruption_summary(corruptions)
    columns = [c for c in _COLUMNS if c[0] in ("accuracy", "nll", "ece", "sel_pred_auc")]
    header = ["Severity", *(title for _, title, _ in columns)]
    lines = [
        f"## Covariate shift: corrupted test split\n\nMean over {len(corruptions)} "
        f"corruption(s): {', '.join(corruptions)}.\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    rows = [("clean", results.get("test", {}))]
    rows += [(sev if sev != "all" else "all severities", m) for sev, m in summary.items()]
    for label, metrics in rows:
        cells = [_num(metrics.get(key), scale) for key, _, scale in columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    severities = sorted({sev for by_sev in corruptions.values() for sev in by_sev}, key=int)
    lines += [
        "\nAcc. (%) / ECE (%) per corruption and severity:\n",
        "| Corruption | " + " | ".join(severities) + " |",
        "|" + "---|" * (len(severities) + 1),
    ]
    for name, by_sev in corruptions.items():
        cells = [
            f"{_num(by_sev[s]['accuracy'], 100.0)} / {_num(by_sev[s]['ece'], 100.0)}"
            if s in by_sev
            else "–"
            for s in severities
        ]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


def warnings_markdown(results: Mapping[str, Any]) -> str:
    """A Markdown warning block for the problems training recorded (empty when none)."""
    found = (results.get("training") or {}).get("warnings") or []
    if not found:
        return ""
    return "\n>\n".join(f"> **Warning:** {text}" for text in found) + "\n\n"


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of several runs' results, one row per method (e.g. PS-MAP, FS-EB).

    Binary tasks get an ``AUROC pos. (%)`` column (positive class = label 1).
    """
    ood_names = sorted({n for r in results.values() for n in r.get("ood", {})})
    columns = list(_COLUMNS)
    columns += [c for c in _OPTIONAL_COLUMNS if any(c[0] in r["test"] for r in results.values())]
    header = ["Method", *(title for _, title, _ in columns)]
    header += [f"{name} {title}" for name in ood_names for _, title in _OOD_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, res in results.items():
        row = [method]
        row += [_num(res["test"].get(key), scale) for key, _, scale in columns]
        for name in ood_names:
            scores = res.get("ood", {}).get(name, {})
            row += [_num(scores.get(key), 100.0) for key, _ in _OOD_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_results(
    run_dir: Path,
    results: Mapping[str, Any],
    title: str,
    predictions: Predictions | None = None,
) -> None:
    """Write ``results.json`` (machines), ``results.md`` (people) and the plots into ``run_dir``.

    ``predictions`` (default: ``results.predictions`` when ``results`` is an
    :class:`EvalResults`) are drawn with :func:`write_plots` (``strict=False``: a figure that
    fails is logged as a warning, after the results are written).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "results.json", results)
    md = f"# {title}\n\n" + warnings_markdown(results) + markdown_table({title: results})
    if results.get("corruptions"):
        md += "\n" + corruption_markdown(results)
    write_text(run_dir / "results.md", md)
    if predictions is None:
        predictions = getattr(results, "predictions", None)
    if predictions is not None:
        write_plots(run_dir, predictions, title, strict=False)
    _write_corruption_plot(run_dir, results, title)


def _write_corruption_plot(directory: Path, results: Mapping[str, Any], title: str) -> None:
    """:data:`CORRUPTION_PLOT` from ``results["corruptions"]`` (if any); a failure is logged."""
    if not results.get("corruptions"):
        return
    from fseb_ft import plots

    path = Path(directory) / CORRUPTION_PLOT
    clean = results.get("test")
    _draw(
        [
            lambda: plots.corruption_plot(
                results["corruptions"], path, clean=clean, title=f"{title}: corrupted test split"
            )
        ],
        strict=False,
    )


def write_plots(
    directory: Path,
    predictions: Predictions,
    title: str,
    others: Mapping[str, Predictions] | None = None,
    strict: bool = True,
) -> list[Path]:
    """Draw :data:`PLOTS` for ``predictions`` into ``directory``; return the files written.

    ``reliability.png``: reliability diagram of the test split (15 bins, as the ECE column).
    ``selective_prediction.png``: accuracy–coverage curve, plus one curve per entry of
    ``others`` (e.g. an ensemble's members), drawn first. ``entropy_ood.png``: predictive
    entropy of the test split vs each OOD set (skipped when there is none). With
    ``strict=False`` a figure that fails is logged as a warning and skipped: figures are a
    by-product and must not fail a finished run.
    """
    from fseb_ft import plots  # matplotlib only when drawing

    directory = Path(directory)
    probs, labels = _probs_labels(predictions)
    curves = {name: _probs_labels(p) for name, p in (others or {}).items()}
    curves[title] = (probs, labels)
    ood = {name: lp.exp() for name, lp in predictions.ood.items()}
    jobs = [
        lambda: plots.reliability_diagram(probs, labels, directory / PLOTS[0], title=title),
        lambda: plots.selective_prediction_plot(curves, directory / PLOTS[1], title=title),
    ]
    if ood:
        jobs.append(lambda: plots.entropy_histogram(probs, ood, directory / PLOTS[2], title=title))
    return _draw(jobs, strict)


def write_comparison_plots(
    directory: Path, methods: Mapping[str, Predictions], title: str, strict: bool = True
) -> list[Path]:
    """Draw :data:`COMPARISON_PLOTS` (methods side by side) into ``directory``.

    ``comparison_reliability.png``: one reliability diagram per method, in a row with shared
    axes. ``comparison_selective.png``: every method's accuracy–coverage curve on one axes.
    ``strict`` as in :func:`write_plots`.
    """
    from fseb_ft import plots

    directory = Path(directory)
    data = {name: _probs_labels(p) for name, p in methods.items()}
    return _draw(
        [
            lambda: plots.reliability_comparison(
                data, directory / COMPARISON_PLOTS[0], title=title
            ),
            lambda: plots.selective_prediction_plot(
                data, directory / COMPARISON_PLOTS[1], title=title
            ),
        ],
        strict,
    )


def evaluate_run(
    run_dir: str | Path, cpu: bool = False, overrides: Sequence[str] = ()
) -> EvalResults:
    """Re-evaluate a finished run from its ``recipe.yaml``, ``run.json`` and best weights.

    Rewrites the run's ``results.json``, ``results.md`` and plots (keeping the ``training``
    record of the original results). ``overrides`` (``eval.key=value``, e.g.
    ``eval.corruptions=all``) change evaluation settings of the saved recipe for this
    evaluation only; ``recipe.yaml`` is left as it is.
    """
    run_dir = Path(run_dir)
    recipe, info = _read_run(run_dir, cpu, overrides)
    accelerator = Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision)
    predictions = _predict_run(run_dir, recipe, info, accelerator)
    results = EvalResults(_evaluate(predictions), predictions)
    previous = run_dir / "results.json"
    if previous.exists():
        results["training"] = json.loads(previous.read_text()).get("training")
    if accelerator.is_main_process:
        write_results(run_dir, results, title=method_title(recipe))
    return results


def evaluate_ensemble(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    cpu: bool = False,
    overrides: Sequence[str] = (),
) -> EvalResults:
    """Evaluate the ensemble of several finished runs (design §3: average member probabilities).

    Every run's best weights predict the test split and OOD sets (each member with its own
    input size and normalisation). The runs must share the class list and the identities of the
    test and OOD data recorded in their ``run.json`` (seeds, backbones and FS-EB settings may
    differ); otherwise a :class:`ValueError` names the runs and what differs. The ensemble's
    log-probabilities are :func:`~fseb_ft.metrics.ensemble_log_probs` of the members' float64
    log-probabilities, so its NLL is that of the averaged probabilities.

    Writes ``results.json`` (the ensemble's ``test``/``ood`` metrics at the top level, as for a
    run, plus ``members``: each member's metrics, and ``runs``), ``results.md`` (members and
    ensemble as rows) and :data:`PLOTS` to ``out_dir`` (default: :func:`default_ensemble_dir`).

    Returns:
        The ensemble's :class:`EvalResults` (``.predictions``: the ensemble's).
    """
    run_dirs = [Path(d) for d in run_dirs]
    if len(run_dirs) < 2:
        raise ValueError(f"an ensemble needs at least two run directories, got {len(run_dirs)}")
    resolved = [d.resolve() for d in run_dirs]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"a run directory is listed twice: {[str(d) for d in run_dirs]}")
    out = Path(out_dir) if out_dir is not None else default_ensemble_dir(run_dirs)
    if out.resolve() in resolved or (out / "run.json").exists():
        raise ValueError(f"--out {out} is a run directory; its results would be overwritten")
    runs = [(d, *_read_run(d, cpu, overrides)) for d in run_dirs]
    _check_same_data(runs)
    # One accelerator for all members: their common precision, else full precision.
    precisions = {recipe.train.mixed_precision for _, recipe, _ in runs}
    precision = precisions.pop() if len(precisions) == 1 else "no"
    accelerator = Accelerator(cpu=cpu, mixed_precision=precision)

    labels = _member_labels(runs)
    members: dict[str, EvalResults] = {}
    for (run_dir, recipe, info), label in zip(runs, labels, strict=True):
        preds = _predict_run(run_dir, recipe, info, accelerator)
        if members:
            _check_same_predictions(next(iter(members.values())).predictions, preds, run_dir)
        members[label] = EvalResults(_evaluate(preds), preds)

    member_preds = [m.predictions for m in members.values()]

    def average(log_probs: list[Tensor]) -> Tensor:
        return ensemble_log_probs(torch.stack([lp.double() for lp in log_probs]))  # (N, K)

    ensemble = Predictions(
        test=(average([p.test[0] for p in member_preds]), member_preds[0].test[1]),
        ood={name: average([p.ood[name] for p in member_preds]) for name in member_preds[0].ood},
        corruptions={
            name: {sev: average([p.corruptions[name][sev] for p in member_preds]) for sev in sevs}
            for name, sevs in _shared_corruptions(runs, member_preds).items()
        },
        corruption_labels=member_preds[0].corruption_labels,
    )
    results = EvalResults(_evaluate(ensemble), ensemble)
    results["members"] = {label: dict(m) for label, m in members.items()}
    results["runs"] = [str(d) for d in run_dirs]
    if accelerator.is_main_process:
        title = f"Ensemble of {len(runs)}"
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", results)
        table = markdown_table({**members, title: results})
        listing = "".join(f"- {label}: `{d}`\n" for label, d in zip(labels, run_dirs, strict=True))
        shift = "\n" + corruption_markdown(results) if results.get("corruptions") else ""
        (out / "results.md").write_text(f"# {title}\n\n{table}\nMembers:\n\n{listing}{shift}")
        others = {label: m.predictions for label, m in members.items()}
        write_plots(out, ensemble, title, others, strict=False)
        _write_corruption_plot(out, results, title)
    return results


def default_ensemble_dir(run_dirs: Sequence[str | Path]) -> Path:
    """``ensemble/`` beside the runs when they share a parent folder, else ``./ensemble``."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    return Path(run_dirs[0]).parent / "ensemble" if len(parents) == 1 else Path("ensemble")


def predict_splits(
    model: nn.Module, splits: Splits, spec: InputSpec, recipe: Recipe, accelerator: Accelerator
) -> Predictions:
    """Predict the test split, every OOD set and every corruption of ``eval.corruptions``."""
    if splits.test is None:
        raise ValueError("data.test is not set: there is no test split to evaluate")
    test = predict(model, accelerator.prepare(eval_loader(splits.test, spec, recipe)), accelerator)
    ood = {
        name: predict(model, accelerator.prepare(eval_loader(data, spec, recipe)), accelerator)[0]
        for name, data in splits.ood.items()
    }
    corrupted = corruption_subset(
        splits.test, recipe.eval.corruption_limit, recipe.eval.corruption_seed
    )
    corruptions = predict_corruptions(model, corrupted, spec, recipe, accelerator)
    labels = (
        None if corrupted is splits.test else torch.as_tensor(corrupted.labels, dtype=torch.long)
    )
    for name, by_severity in corruptions.items():
        for severity, lp in by_severity.items():
            if lp.shape[0] != len(corrupted):
                raise RuntimeError(
                    f"{name} severity {severity}: {lp.shape[0]} predictions for "
                    f"{len(corrupted)} corrupted test images"
                )
    return Predictions(test=test, ood=ood, corruptions=corruptions, corruption_labels=labels)


def predict_corruptions(
    model: nn.Module, test: Any, spec: InputSpec, recipe: Recipe, accelerator: Accelerator
) -> dict[str, dict[int, Tensor]]:
    """Predict ``test`` under every corruption and severity of ``recipe.eval``.

    Each (corruption, severity) is a :class:`~fseb_ft.corruptions.CorruptedImages` of the
    test images (the raw pixels corrupted, then the model's evaluation transform), loaded from
    ``eval.corruption_cache`` or computed there by the main process first, then read by the
    others. Empty when ``eval.corruptions`` is.

    Returns:
        corruption name → severity → log-probabilities (N, K), in the order of ``test`` (pass
        :func:`corruption_subset` of the test split to honour ``eval.corruption_limit``).
    """
    cfg = recipe.eval
    if not cfg.corruptions:
        return {}
    from fseb_ft.corruptions import CorruptedImages

    main = accelerator.is_main_process
    pairs = [(name, severity) for name in cfg.corruptions for severity in cfg.severities]
    out: dict[str, dict[int, Tensor]] = {}
    for name, severity in tqdm(pairs, desc="corruptions", disable=not main):
        with accelerator.main_process_first():
            data = CorruptedImages(
                test, name, severity, cfg.corruption_seed, cfg.corruption_cache, progress=main
            )
        loader = accelerator.prepare(eval_loader(data, spec, recipe))
        out.setdefault(name, {})[severity] = predict(model, loader, accelerator)[0]
        del data, loader
    return out


def corruption_subset(test: LabeledImages, limit: int | None, seed: int) -> LabeledImages:
    """The seeded, class-stratified subset of ``test`` that ``eval.corruption_limit`` asks for.

    Corrupting every test image at every corruption and severity costs 70 passes over the
    split; a stratified subset keeps the class balance of the clean test set.
    """
    if limit is None or limit >= len(test):
        return test
    _, keep = stratified_split(test.labels, limit / len(test), seed)  # (≈limit,) sorted
    return IndexedImages(test, keep)


def evaluate_splits(
    model: nn.Module, splits: Splits, spec: InputSpec, recipe: Recipe, accelerator: Accelerator
) -> EvalResults:
    """Predict the test split and every OOD set with ``model`` and compute their metrics.

    The returned dict carries the predictions as ``.predictions`` (see :class:`EvalResults`),
    which :func:`write_results` draws.
    """
    predictions = predict_splits(model, splits, spec, recipe, accelerator)
    return EvalResults(_evaluate(predictions), predictions)


def _evaluate(predictions: Predictions) -> dict[str, Any]:
    return evaluate_predictions(
        predictions.test, predictions.ood, predictions.corruptions, predictions.corruption_labels
    )


def eval_loader(data: Any, spec: InputSpec, recipe: Recipe) -> torch.utils.data.DataLoader:
    """Un-augmented, un-shuffled loader (resize + normalise) for evaluation."""
    dataset = TransformedImages(data, eval_transform(spec.size, spec.mean, spec.std))
    return make_loader(
        dataset,
        recipe.eval.batch_size,
        shuffle=False,
        num_workers=recipe.data.num_workers,
        seed=recipe.train.seed,
    )


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def method_title(recipe: Recipe) -> str:
    """ "FS-EB · model" or "PS-MAP · model" for tables and titles."""
    method = "FS-EB" if recipe.fseb.reg_scale > 0 else "PS-MAP"
    return f"{method} · {recipe.model.name}"


def _num(value: float | None, scale: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * scale:.2f}" if scale != 1.0 else f"{value:.4f}"


def main(argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.evaluate") -> Any:
    """CLI: re-evaluate saved runs, or evaluate their ensemble; print the results table.

    Returns the results of one run, ``{row: results}`` for several, or the ensemble's results.
    """
    parser = _parser(prog)
    args = parser.parse_args(argv)
    args.run_dirs = expand_run_dirs(args.run_dirs)
    if args.out is not None and not args.ensemble:
        parser.error("--out is only used with --ensemble (a re-evaluated run writes in place)")
    if args.ensemble and len(args.run_dirs) < 2:
        parser.error("--ensemble needs at least two run directories")
    bad = [o for o in args.overrides if not o.startswith("eval.") or "=" not in o]
    if bad:
        parser.error(f"--set takes eval.KEY=VALUE (evaluation settings only), got {bad}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.ensemble:
            results = evaluate_ensemble(
                args.run_dirs, args.out, cpu=args.cpu, overrides=args.overrides
            )
            rows = {**results["members"], f"Ensemble of {len(args.run_dirs)}": results}
        else:
            each = [(d, evaluate_run(d, args.cpu, args.overrides)) for d in args.run_dirs]
            rows = {str(d): r for d, r in each}
            results = each[0][1] if len(each) == 1 else rows
    except FileNotFoundError as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    if PartialState().is_main_process:
        print(markdown_table(rows))
    return results


def expand_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Each path as given when it is a run directory, else the run directories directly in it.

    ``fseb-ft RECIPE --compare`` writes ``OUTPUT/psmap`` and ``OUTPUT/fseb``, so ``OUTPUT`` stands
    for both. A path that is neither stays, for :func:`evaluate_run` to report.
    """
    out: list[Path] = []
    for path in map(Path, paths):
        inner = [] if (path / RECIPE_FILE).exists() else _runs_in(path)
        out.extend(inner or [path])
    return out


def _runs_in(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(d for d in folder.iterdir() if (d / RECIPE_FILE).is_file() and d.is_dir())


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="run directories written by fseb_ft.finetune; a folder holding runs (the "
        "OUTPUT of --compare) stands for the runs in it",
    )
    parser.add_argument(
        "--ensemble",
        action="store_true",
        help="evaluate the ensemble of the runs (average of their probabilities) instead of "
        "re-evaluating each; the runs must share classes, test and OOD data",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --ensemble: where to write results.json, results.md and plots (default: "
        "'ensemble' beside the runs when they share a parent folder, else ./ensemble)",
    )
    parser.add_argument("--cpu", action="store_true", help="evaluate on CPU")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="eval.KEY=VALUE",
        help="change an evaluation setting of the saved recipes for this evaluation, e.g. "
        "--set eval.corruptions=all --set eval.severities=[1,3,5] (repeatable)",
    )
    return parser


# --------------------------------------------------------------------------------------------
# Loading runs
# --------------------------------------------------------------------------------------------


def _read_run(
    run_dir: Path, cpu: bool, overrides: Sequence[str] = ()
) -> tuple[Recipe, dict[str, Any]]:
    """A finished run's resolved recipe and ``run.json``; a clear error if it is not one."""
    for needed in (RECIPE_FILE, "run.json", str(MODEL_WEIGHTS)):
        if not (run_dir / needed).exists():
            raise FileNotFoundError(f"{run_dir} is not a finished run: {needed} is missing")
    recipe = load_recipe(run_dir / RECIPE_FILE, [f"train.cpu={str(cpu).lower()}", *overrides])
    return recipe, json.loads((run_dir / "run.json").read_text())


def _predict_run(
    run_dir: Path, recipe: Recipe, info: Mapping[str, Any], accelerator: Accelerator
) -> Predictions:
    """Load the run's best weights and predict its test split and OOD sets."""
    splits = build_splits(recipe.data, recipe.train.seed)
    # The weights come from the run, so never fetch pretrained ones again.
    model_cfg = dataclasses.replace(recipe.model, pretrained=False)
    model = create_model(model_cfg, info["num_classes"], in_chans=recipe.data.channels)
    load_model(model, str(run_dir / MODEL_WEIGHTS))
    spec = InputSpec(**{k: tuple(v) for k, v in info["input"].items()})
    model = accelerator.prepare(model)
    predictions = predict_splits(model, splits, spec, recipe, accelerator)
    accelerator.free_memory(model)
    return predictions


def _check_same_data(runs: Sequence[tuple[Path, Recipe, Mapping[str, Any]]]) -> None:
    """Members of an ensemble must agree on classes and on test and OOD data identities."""
    first_dir, _, first = runs[0]
    for run_dir, _, info in runs[1:]:
        for what, get in (
            ("classes", lambda i: i.get("class_names") or i.get("num_classes")),
            ("test data", lambda i: (i.get("data") or {}).get("test")),
            ("OOD sets", lambda i: (i.get("data") or {}).get("ood") or {}),
        ):
            a, b = get(first), get(info)
            if a != b:
                raise ValueError(
                    f"cannot ensemble {first_dir} and {run_dir}: their {what} differ "
                    f"(run.json: {a!r} vs {b!r}); ensemble members must be trained on the same "
                    "classes and evaluated on the same test and OOD data"
                )


def _check_same_predictions(first: Predictions, other: Predictions, run_dir: Path) -> None:
    labels_a, labels_b = first.test[1], other.test[1]
    if labels_a.shape != labels_b.shape or not torch.equal(labels_a, labels_b):
        raise ValueError(
            f"{run_dir} loads a different test split ({len(labels_b)} samples) from the first "
            f"member ({len(labels_a)} samples, or other labels): the data changed since training"
        )
    for name, lp in first.ood.items():
        if other.ood[name].shape != lp.shape:
            raise ValueError(
                f"{run_dir} predicts OOD set {name!r} with shape {tuple(other.ood[name].shape)}, "
                f"the first member with {tuple(lp.shape)}"
            )


def _shared_corruptions(
    runs: Sequence[tuple[Path, Recipe, Mapping[str, Any]]], member_preds: Sequence[Predictions]
) -> dict[str, list[int]]:
    """(corruption, severities) every member predicted with the same corrupted images."""
    subsets = {(r.eval.corruption_seed, r.eval.corruption_limit) for _, r, _ in runs}
    if len(subsets) > 1:
        logger.warning(
            "members differ in (eval.corruption_seed, eval.corruption_limit) %s: no corruption "
            "results",
            subsets,
        )
        return {}
    shared = {
        name: [s for s in by_sev if all(s in p.corruptions.get(name, {}) for p in member_preds)]
        for name, by_sev in member_preds[0].corruptions.items()
    }
    return {name: sevs for name, sevs in shared.items() if sevs}


def _member_labels(runs: Sequence[tuple[Path, Recipe, Mapping[str, Any]]]) -> list[str]:
    """Table rows "FS-EB · model (dir name)", with the whole path when names collide."""
    labels = [f"{method_title(recipe)} ({d.name})" for d, recipe, _ in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{method_title(recipe)} ({d})" for d, recipe, _ in runs]
    return labels


def _probs_labels(predictions: Predictions) -> tuple[Tensor, Tensor]:
    log_probs, labels = predictions.test
    return log_probs.exp(), labels


def _draw(jobs: Sequence[Callable[[], Path]], strict: bool) -> list[Path]:
    written = []
    for job in jobs:
        try:
            written.append(job())
        except Exception as exc:
            if strict:
                raise
            logger.warning("could not draw a figure: %r", exc)
    return written


if __name__ == "__main__":
    main()
