"""Use a fine-tuned model on new images: predictions with abstention, the ``fseb-ft predict``
command and :func:`predict_images` (``fseb_ft.predict_images``).

    fseb-ft predict MODEL IMAGES... [--out predictions.csv] [--coverage 0.9 | --max-risk 0.02
                    [--confidence 0.95] | --threshold 0.8] [--keep] [--top-k 3] [--ood-score energy]
                    [--device cuda]
                    [--conformal 0.9 [--conformal-method lac|aps|raps] [--class-conditional]]
    fseb-ft predict runs/quickstart/fseb photos/ --coverage 0.9 --out predictions.csv
    fseb-ft predict runs/quickstart/fseb photos/ --max-risk 0.02 --keep  # and from now on
    fseb-ft predict runs/quickstart/fseb photos/ --max-risk 0.02 --confidence 0.95  # certified
    fseb-ft predict RUN --dataset "{source: idx, path: data/mnist, split: t10k}" --out p.jsonl

MODEL is a run folder (``output.dir``; the OUTPUT of ``--compare`` means its ``fseb`` run), a
model folder in timm's Hub format (a run's ``model/``, exported or downloaded) or
``hf-hub:owner/name``. IMAGES are files, folders (searched recursively for image files) and
glob patterns; ``--dataset`` takes a recipe's dataset spec instead (its labels are kept).

Each image gets its predicted class and probability, the top-k classes, the predictive entropy, an
OOD score (:mod:`fseb_ft.evaluation.ood`) and an ``abstain`` flag: the model abstains when its
confidence, the maximum class probability after the run's temperature scaling, is below a threshold
``τ``. ``--coverage`` and ``--max-risk`` choose ``τ`` on the run's validation split, rebuilt from
its recipe as training built it (:mod:`fseb_ft.evaluation.selective`); ``--threshold`` sets it.
``--max-risk R --confidence C`` takes the lowest ``τ`` whose risk among accepted images is at most
``R`` with probability at least ``C`` over the validation draw (Learn-then-Test with
Clopper–Pearson bounds, :mod:`fseb_ft.evaluation.certified`); without ``--confidence`` the
empirical validation risk is at most ``R``.
Without any of them the model's kept threshold is used, else a run chooses one for coverage 0.9,
else nothing abstains. Choosing is a query: it changes nothing the run does. Only ``--keep`` stores
the threshold with the run (``abstention.json``, the model folder's ``fseb.json`` and card), so that
later calls, a model folder exported from it and a pushed copy abstain the same way. The
validation logits are cached with the run (``val_logits.safetensors``) so the next choice needs
no second pass over validation; a run folder that cannot be written to is only read.

The predictions go to ``--out`` (CSV, or JSON Lines for ``.jsonl``) and what produced them —
model, temperature, threshold, validation coverage and risk, files left out — to
``<out stem>.meta.json`` beside it, both written atomically. A file that cannot be read is left
out of the predictions and named in a note and in the meta file.

``--conformal P`` adds each image's conformal prediction set (``set``, ``set_size``): the classes
that, over images exchangeable with the run's validation split, hold the true one with probability
at least P (:mod:`fseb_ft.evaluation.conformal`, calibrated on the validation logits the threshold
is chosen on; approximately, as that split also chose the run's best epoch).

``--ood-score`` picks the row's OOD score: one of the outputs (default: the run's first), or a
feature score (``mahalanobis``, ``relative_mahalanobis``, ``knn``, ``vim``) of the images'
penultimate features, taken in the pass that gives their logits and scored with the fit on the
training split that the model keeps (:mod:`fseb_ft.runs.feature_fit`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import yaml

from fseb_ft.cli import device_argument, help_text, run_entry
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import AbstentionRule, out_of_range
from fseb_ft.evaluation.conformal import ConformalCalibration
from fseb_ft.evaluation.feature_ood import FeatureOodFit, feature_ood_score
from fseb_ft.evaluation.temperature import temperature_warnings
from fseb_ft.logs import configure_logging
from fseb_ft.method.devices import resolve_device
from fseb_ft.recipe import DatasetSpec
from fseb_ft.recipe.datasets import is_data_path_override
from fseb_ft.recipe.options import OOD_SCORES
from fseb_ft.runs.conformal_sets import (
    add_conformal_arguments,
    add_set_columns,
    calibrate_on_run,
    check_conformal,
    conformal_record,
)
from fseb_ft.runs.feature_fit import load_feature_fit
from fseb_ft.runs.loading import (
    LoadedModel,
    first_line,
    gather_inputs,
    load_model,
    outputs_and_read_errors,
)
from fseb_ft.runs.prediction_files import (
    ImagePredictions,
    accuracy_record,
    check_out_file,
    format_rows,
    image_rows,
    output_format,
    write_predictions,
)
from fseb_ft.runs.prediction_summary import summary
from fseb_ft.runs.rundir import ABSTENTION_FILE
from fseb_ft.runs.thresholds import DEFAULT_COVERAGE, choose_rule, keep_rule, validation_fetch

__all__ = ["ImagePredictions", "main", "predict_images", "summary"]


def predict_images(
    model: str | Path | LoadedModel,
    images: Sequence[str | Path] = (),
    *,
    dataset: DatasetSpec | Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    fmt: str | None = None,
    coverage: float | None = None,
    max_risk: float | None = None,
    threshold: float | None = None,
    confidence: float | None = None,
    top_k: int = 3,
    ood: str | None = None,
    temperature: float | None = None,
    device: str | None = None,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool = True,
    keep: bool = False,
    conformal: float | None = None,
    conformal_method: str = "lac",
    class_conditional: bool = False,
    data_paths: Sequence[str] = (),
) -> ImagePredictions:
    """Predict ``images`` (or a ``dataset``) with ``model``, abstaining below a threshold.

    Args:
        model: a run folder, a model folder, ``hf-hub:owner/name`` or a :class:`LoadedModel`.
        images: files, folders (searched recursively) and glob patterns.
        dataset: a recipe dataset spec (``{source: idx, path: …, split: t10k}``) instead.
        out: where to write the rows (``.csv`` or ``.jsonl``) and, beside it,
            ``<stem>.meta.json``; ``None`` writes nothing.
        fmt: ``csv`` or ``jsonl``; ``None`` goes by the extension of ``out``.
        coverage: choose ``τ`` on the run's validation split to accept this fraction, in
            (0, 1].
        max_risk: choose ``τ`` there for at most this error rate among accepted predictions,
            in [0, 1).
        threshold: ``τ`` itself, in [0, 1] (a run still reports its validation coverage and
            risk).
        confidence: with ``max_risk`` only, in [0.5, 1): certify the risk with this
            probability over the validation draw (:mod:`fseb_ft.evaluation.certified`);
            ``None``: the empirical rule.
        top_k: how many classes each row ranks.
        ood: the OOD score reported (:data:`~fseb_ft.recipe.options.OOD_SCORES`); a feature
            score needs the fit the model keeps (``fseb-ft evaluate RUN
            eval.ood_scores=[mahalanobis]`` writes it); default: the run's first score of the
            outputs.
        temperature: overrides the model's temperature (1: raw outputs).
        device: ``cpu``, ``cuda``, ``cuda:1``, …; default: CUDA when there is one.
        batch_size, num_workers: the loader's.
        progress: show progress bars.
        keep: store the threshold with the run (its ``abstention.json``, model card and
            ``fseb.json``): later calls and the model's card use it. Without it nothing the
            run does changes (its validation logits may be cached, a folder that cannot be
            written to is only read).
        conformal: add each image's conformal prediction set for this target coverage in
            (0, 1], calibrated on the run's validation split.
        conformal_method: its score, ``lac``, ``aps`` or ``raps``.
        class_conditional: one quantile per class: the coverage holds for each class.
        data_paths: where a run's data are now when they moved since training
            (``data.train.path=DIR``, ``data.val.path=DIR``), for its validation split.

    Returns:
        The rows and the meta record (:class:`ImagePredictions`).
    """
    _check_arguments(coverage, max_risk, threshold, top_k, ood, temperature, confidence)
    check_conformal(conformal, conformal_method)
    fmt = output_format(out, fmt)
    check_out_file(out)
    images = [images] if isinstance(images, str | Path) else list(images)
    loaded = _loaded(model, keep, data_paths)
    ood = ood or loaded.default_ood_score
    call = _Call(
        temperature=loaded.temperature if temperature is None else float(temperature),
        ood=ood,
        fit=load_feature_fit(loaded, ood),  # before any pass: a model without one stops here
        top_k=top_k,
        device=resolve_device(device),
        loader_kw={"batch_size": batch_size, "num_workers": num_workers, "progress": progress},
    )
    inputs, names, labels, skipped = gather_inputs(loaded, images, dataset)
    validation = validation_fetch(loaded, call.device, call.loader_kw)  # predicted at most once
    rule = choose_rule(
        loaded, call.temperature, coverage, max_risk, threshold, validation, level=confidence
    )
    sets = None
    if conformal is not None:
        sets = calibrate_on_run(loaded, call.temperature, conformal, conformal_method,
                                class_conditional, validation)  # fmt: skip
    rows, unreadable = _rows(loaded, call, rule, inputs, names, labels, sets)
    # A temperature the caller chose is not the fit's, so its range says nothing of it.
    warnings = temperature_warnings(call.temperature) if temperature is None else []
    meta = _meta(loaded, call, rule, warnings, rows, unreadable, skipped)
    if labels is not None:
        meta |= accuracy_record(rows, loaded.class_names)
    if sets is not None:
        meta["conformal"] = conformal_record(sets, rows)
    if keep and loaded.run_dir is not None and rule.chosen_on != "kept":
        meta["kept_in"] = str(keep_rule(loaded.run_dir, rule))
    if out is not None:
        write_predictions(Path(out), fmt, rows, meta)
    return ImagePredictions(rows=rows, meta=meta)


@dataclasses.dataclass(frozen=True)
class _Call:
    """How one :func:`predict_images` call predicts, once its defaults are resolved."""

    temperature: float | None
    """The temperature applied to the logits (the model's unless overridden; None: none)."""
    ood: str
    """The OOD score each row reports."""
    fit: FeatureOodFit | None
    """The fit the model keeps when ``ood`` is a feature score."""
    top_k: int
    """How many classes each row ranks."""
    device: torch.device
    """Where the network runs."""
    loader_kw: dict[str, Any]
    """``batch_size``, ``num_workers``, ``progress`` of every loader."""


def _loaded(
    model: str | Path | LoadedModel, keep: bool, data_paths: Sequence[str] = ()
) -> LoadedModel:
    """``model`` loaded (its data where ``data_paths`` say); ``keep`` refused before anything
    predicts when it is not a run."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model, data_paths)
    if keep and loaded.run_dir is None:
        raise FsebError(
            f"--keep stores the threshold in a run folder ({ABSTENTION_FILE}), and MODEL is "
            f"{loaded.where}: predict with the run folder, or leave out --keep"
        )
    return loaded


def _meta(
    loaded: LoadedModel,
    call: _Call,
    rule: AbstentionRule,
    warnings: list[str],
    rows: list[dict[str, Any]],
    unreadable: list[str],
    skipped: Sequence[Path],
) -> dict[str, Any]:
    """The meta record of the predictions: model, temperature and its ``warnings``, rule,
    counts, files unreadable or left out, device."""
    return {
        "model": loaded.where,
        "temperature": call.temperature,
        "warnings": warnings,
        "abstention": rule.to_json(),
        "ood_score": call.ood,
        "images": len(rows),
        "abstained": sum(row["abstain"] for row in rows),
        "unreadable": unreadable,
        "left_out": [str(p) for p in skipped],
        "device": str(call.device),
    }


def _rows(
    loaded: LoadedModel,
    call: _Call,
    rule: AbstentionRule,
    inputs: Any,
    names: Sequence[str],
    labels: Sequence[str] | None,
    sets: ConformalCalibration | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the readable images (with their conformal ``sets``), and ``"name: why"`` for
    each unreadable one.

    Raises:
        ValueError: none of the images could be read.
    """
    net = loaded.model.to(call.device).eval()
    network = None if call.fit is None else (loaded.network or net)
    logits, features, errors = outputs_and_read_errors(
        net, inputs, loaded, call.device, "predict", **call.loader_kw, network=network
    )
    readable = [i for i, err in enumerate(errors) if not err]
    unreadable = [f"{names[i]}: {errors[i]}" for i in range(len(names)) if errors[i]]
    if not readable:
        raise ValueError(f"none of the {len(names)} images could be read: {unreadable[0]}")
    fit = cast(FeatureOodFit, call.fit)  # loaded for a feature score, the one features serve
    rows = image_rows(
        [names[i] for i in readable],
        None if labels is None else [labels[i] for i in readable],
        logits[readable], call.temperature, rule.log_odds_threshold, call.ood,
        loaded.class_names, call.top_k,
        None if features is None else feature_ood_score(call.ood, fit, features[readable]),
    )  # fmt: skip
    if sets is not None:
        add_set_columns(rows, logits[readable], call.temperature, sets, loaded.class_names)
    return rows, unreadable


def _check_arguments(
    coverage: float | None,
    max_risk: float | None,
    threshold: float | None,
    top_k: int,
    ood: str | None,
    temperature: float | None,
    confidence: float | None = None,
) -> None:
    """Refuse what :func:`predict_images` cannot do before anything loads.

    Raises:
        ValueError: naming the argument and what it takes.
    """
    if sum(x is not None for x in (coverage, max_risk, threshold)) > 1:
        raise ValueError("give at most one of coverage, max_risk and threshold")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if ood is not None and ood not in OOD_SCORES:
        raise ValueError(f"ood score must be one of {list(OOD_SCORES)}, got {ood!r}")
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if confidence is not None and max_risk is None:
        raise ValueError("confidence certifies a max_risk: give max_risk too")
    for name, value in (("coverage", coverage), ("max_risk", max_risk), ("threshold", threshold),
                        ("confidence", confidence)):  # fmt: skip
        if value is not None and (problem := out_of_range(name, value)) is not None:
            raise ValueError(f"{name} {problem}")


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.predict"
) -> ImagePredictions:
    """CLI ``fseb-ft predict MODEL IMAGES... --out predictions.csv``; prints a summary."""
    parser = _parser(prog)
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    data_paths = [a for a in args.images if _override(a)]
    args.images = [a for a in args.images if not _override(a)]
    bad = [o for o in data_paths if not is_data_path_override(o)]
    if bad:
        parser.error(
            "overrides take data.SPLIT.path=DIR (data.train.path, data.val.path: where a run's "
            f"data are now, when they moved since training), got {bad}"
        )
    if not args.images and args.dataset is None:
        parser.error("give IMAGES (files, folders, globs) or --dataset")
    if args.confidence is not None and args.max_risk is None:
        parser.error("--confidence C certifies --max-risk R: give --max-risk too")
    dataset = None
    if args.dataset is not None:
        try:
            dataset = yaml.safe_load(args.dataset)
        except yaml.YAMLError as err:
            parser.error(f"--dataset is not a YAML mapping: {first_line(err)}")
        if not isinstance(dataset, dict):
            parser.error(
                "--dataset takes a YAML mapping like "
                f'"{{source: idx, path: data, split: t10k}}", got {args.dataset!r}'
            )
    configure_logging(args.verbose)
    result = predict_images(
        args.model, args.images, dataset=dataset, out=args.out, fmt=args.format,
        coverage=args.coverage, max_risk=args.max_risk, threshold=args.threshold,
        confidence=args.confidence, top_k=args.top_k, ood=args.ood_score,
        temperature=args.temperature, device=args.device,
        batch_size=args.batch_size, num_workers=args.num_workers, progress=not args.no_progress,
        keep=args.keep, conformal=args.conformal, conformal_method=args.conformal_method,
        class_conditional=args.class_conditional, data_paths=data_paths,
    )  # fmt: skip
    if args.out is None:  # the rows are the answer: to stdout, so `> file` keeps them alone
        sys.stdout.write(format_rows(result.rows, args.format or "csv"))
        print(summary(result.meta, None), file=sys.stderr)
        print("(rows above; --out FILE.csv or .jsonl writes them and a meta record)",
              file=sys.stderr)  # fmt: skip
    else:
        print(summary(result.meta, args.out))
    return result


def _override(arg: str) -> bool:
    """Whether ``arg`` is a ``section.key=value`` override, not an image (a file stays one)."""
    return re.match(r"[a-z_]+\.[\w.]+=", arg) is not None and not Path(arg).exists()


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="run folder, model folder or hf-hub:owner/name")
    parser.add_argument(
        "images", nargs="*", default=[],
        help="image files, folders (recursive) and globs; data.SPLIT.path=DIR says where a run's "
        "data are now when they moved since training (its validation split chooses thresholds)",
    )  # fmt: skip
    parser.add_argument(
        "--dataset", metavar="SPEC",
        help='a recipe dataset spec instead of IMAGES: "{source: idx, path: data, split: t10k}"',
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="predictions file, .csv or .jsonl")
    parser.add_argument(
        "--format",
        choices=("csv", "jsonl"),
        help="default: by --out's extension; without --out, csv to standard output",
    )
    _add_rule_arguments(parser)
    _add_row_arguments(parser)
    add_conformal_arguments(parser, _fraction("coverage"))
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' INFO lines"
    )
    return parser


def _add_rule_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the abstention rule: how its threshold is chosen or given, and kept."""
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument(
        "--coverage", type=_fraction("coverage"), metavar="A",
        help="the threshold that accepts the fraction A of the validation split (default "
        f"{DEFAULT_COVERAGE} for a run without a kept threshold)",
    )  # fmt: skip
    rule.add_argument(
        "--max-risk", type=_fraction("max_risk"), metavar="R",
        help="the lowest threshold whose error rate among accepted validation predictions is ≤ R",
    )  # fmt: skip
    parser.add_argument(
        "--confidence", type=_fraction("confidence"), metavar="C",
        help="with --max-risk R: the lowest threshold whose risk among accepted images is ≤ R "
        "with probability ≥ C over the validation draw (Learn-then-Test, Clopper–Pearson)",
    )  # fmt: skip
    rule.add_argument(
        "--threshold",
        type=_fraction("threshold"),
        metavar="T",
        help="abstain when max probability < T",
    )
    parser.add_argument(
        "--keep", action="store_true",
        help="store the threshold in the run (abstention.json, fseb.json, model card): later "
        "predict calls and the model card use it; without --keep the run is left as it was",
    )  # fmt: skip


def _add_row_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of what each row holds and how the images are predicted."""
    parser.add_argument(
        "--top-k", type=int, default=3, metavar="K", help="classes ranked per image"
    )
    parser.add_argument(
        "--ood-score",
        choices=OOD_SCORES,
        help="default: the run's first eval.ood_scores of the outputs, else entropy; a feature "
        "score (mahalanobis, relative_mahalanobis, knn, vim) needs the fit on the training split "
        "that `fseb-ft evaluate RUN eval.ood_scores=[...]` keeps with the model",
    )
    parser.add_argument(
        "--temperature", type=float, help="override the model's temperature (1: raw outputs)"
    )
    parser.add_argument(
        "--device",
        type=device_argument,
        help="cpu, cuda, cuda:1, mps (default: cuda when available)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0, help="image-reading processes")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _fraction(name: str) -> Callable[[str], float]:
    """The argparse type of the abstention option ``name``: a number in its range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if (problem := out_of_range(name, value)) is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.predict")
