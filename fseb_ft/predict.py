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
training split that the model keeps (:mod:`fseb_ft.prediction.feature_fit`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from fseb_ft.cli import (
    dataset_argument,
    device_argument,
    fraction_argument,
    help_text,
    run_entry,
)
from fseb_ft.logs import configure_logging
from fseb_ft.prediction import (
    DEFAULT_COVERAGE,
    ImagePredictions,
    LoadRequest,
    OutputRequest,
    PredictRequest,
    RowRequest,
    RuleRequest,
    add_conformal_arguments,
    format_rows,
    predict_images,
    summary,
)
from fseb_ft.recipe.datasets import is_data_path_override
from fseb_ft.recipe.options import OOD_SCORES

__all__ = ["main"]


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
    configure_logging(args.verbose)
    result = predict_images(
        args.model, args.images, dataset=args.dataset, request=_request(args, data_paths)
    )
    if args.out is None:  # the rows are the answer: to stdout, so `> file` keeps them alone
        sys.stdout.write(format_rows(result.rows, args.format or "csv"))
        print(summary(result.meta, None), file=sys.stderr)
        print("(rows above; --out FILE.csv or .jsonl writes them and a meta record)",
              file=sys.stderr)  # fmt: skip
    else:
        print(summary(result.meta, args.out))
    return result


def _request(args: argparse.Namespace, data_paths: Sequence[str]) -> PredictRequest:
    """The request the parsed command line makes."""
    return PredictRequest(
        load=LoadRequest(
            data_paths=data_paths, temperature=args.temperature, device=args.device,
            batch_size=args.batch_size, num_workers=args.num_workers,
            progress=not args.no_progress,
        ),
        rule=RuleRequest(
            coverage=args.coverage, max_risk=args.max_risk, threshold=args.threshold,
            confidence=args.confidence, keep=args.keep,
        ),
        rows=RowRequest(
            top_k=args.top_k, ood=args.ood_score, conformal=args.conformal,
            conformal_method=args.conformal_method, class_conditional=args.class_conditional,
        ),
        output=OutputRequest(out=args.out, fmt=args.format),
    )  # fmt: skip


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
        "--dataset", metavar="SPEC", type=dataset_argument,
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
    add_conformal_arguments(parser, fraction_argument("coverage"))
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' INFO lines"
    )
    return parser


def _add_rule_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the abstention rule: how its threshold is chosen or given, and kept."""
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument(
        "--coverage", type=fraction_argument("coverage"), metavar="A",
        help="the threshold that accepts the fraction A of the validation split (default "
        f"{DEFAULT_COVERAGE} for a run without a kept threshold)",
    )  # fmt: skip
    rule.add_argument(
        "--max-risk", type=fraction_argument("max_risk"), metavar="R",
        help="the lowest threshold whose error rate among accepted validation predictions is ≤ R",
    )  # fmt: skip
    parser.add_argument(
        "--confidence", type=fraction_argument("confidence"), metavar="C",
        help="with --max-risk R: the lowest threshold whose risk among accepted images is ≤ R "
        "with probability ≥ C over the validation draw (Learn-then-Test, Clopper–Pearson)",
    )  # fmt: skip
    rule.add_argument(
        "--threshold",
        type=fraction_argument("threshold"),
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


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.predict")
