"""Is a batch of incoming images still like the validation split the model was calibrated on?
The ``fseb-ft monitor`` command and :func:`monitor_images`.

    fseb-ft monitor RUN IMAGES... [--dataset SPEC] [--out DIR] [--level 0.01]
                    [--permutations 1000] [--seed 0] [--min-batch 50] [--ood-score entropy]
    fseb-ft monitor runs/quickstart/fseb incoming/ --out monitor/ || echo "the images shifted"

RUN is a run folder (its validation split is rebuilt from its recipe); IMAGES are files, folders
and globs, or ``--dataset`` a recipe's dataset spec, as for ``fseb-ft predict``. Four tests
compare the batch with validation, and any of them below ``level / 4`` raises the alarm, so a
batch like validation alarms with probability at most ``level``: the penultimate features (MMD²,
permutation test), the abstention rate and the OOD-flag rate (Fisher's exact test), and the
predicted classes' proportions (χ², permutation test). Two estimates only report: the batch's
accuracy without labels (ATC) and its class proportions under label shift (BBSE), with each
image's re-weighted prediction.

It prints a table, writes ``monitor.json`` and ``monitor.png`` into ``--out`` and exits with 3 on
alarm, 0 otherwise (1 on an error), so a cron job or CI can act.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from torch import Tensor

from fseb_ft.cli import dataset_argument, device_argument, help_text, run_entry
from fseb_ft.errors import FsebError
from fseb_ft.logs import configure_logging
from fseb_ft.method.devices import resolve_device
from fseb_ft.prediction.loading import load_model
from fseb_ft.prediction.monitor_data import batch_outputs, check_has_validation, validation_outputs
from fseb_ft.prediction.monitor_files import format_table, reweighted_rows, write_monitor
from fseb_ft.prediction.requests import RuleRequest
from fseb_ft.prediction.shift_report import (
    DEFAULT_LEVEL,
    MonitorSettings,
    ShiftReport,
    shift_report,
)
from fseb_ft.prediction.thresholds import choose_rule
from fseb_ft.recipe.options import OUTPUT_OOD_SCORES

__all__ = ["ALARM_EXIT", "DEFAULT_MIN_BATCH", "main", "monitor_images"]

ALARM_EXIT = 3
"""The exit status of a batch that raised the alarm."""
DEFAULT_MIN_BATCH = 50
"""The fewest readable images the monitor checks: below it the tests notice only gross shifts
(docs/results.md, CIFAR-10: at 50 images MNIST alarms in every draw, corrupted images in half,
a label shift in one of 20; at 200, each in 19 or 20 of 20), and a silent monitor would read as
an all-clear."""


def monitor_images(
    model: str | Path,
    images: Sequence[str | Path] = (),
    *,
    dataset: Any = None,
    out: Path | None = None,
    settings: MonitorSettings | None = None,
    min_batch: int = DEFAULT_MIN_BATCH,
    device: str | None = None,
    loader_kw: dict[str, Any] | None = None,
) -> tuple[ShiftReport, dict[str, Any]]:
    """Check ``images`` (or ``dataset``) against the validation split of the run ``model``.

    ``settings`` give the level, permutations, seed and OOD score (their
    :class:`~fseb_ft.prediction.shift_report.MonitorSettings` defaults; the abstention
    threshold is the run's kept rule, else the one for coverage 0.9, as predict's). Returns the
    report and its JSON record, also written with the figure into ``out`` when given.

    Raises:
        FsebError: ``model`` has no validation split, or fewer than ``min_batch`` images of the
            batch could be read.
        ValueError: no images, or none readable.
    """
    if min_batch < 2:
        raise ValueError(f"min_batch must be at least 2, got {min_batch}")
    base = settings or MonitorSettings()
    loaded = load_model(model)
    check_has_validation(loaded)
    where = resolve_device(device)
    kw = {"batch_size": 64, "num_workers": 0, "progress": True} | (loader_kw or {})
    batch = batch_outputs(loaded, images, dataset, where, kw)
    if len(batch.names) < min_batch:
        raise FsebError(
            f"the batch has {len(batch.names)} readable image(s), fewer than --min-batch "
            f"{min_batch}: below it the permutation and Fisher tests have too little power to "
            "notice any but gross shifts, and a silent monitor reads as an all-clear; gather "
            "more images into one batch (or lower --min-batch, knowing this)"
        )
    val = validation_outputs(loaded, where, kw)
    labels = cast(Tensor, val.labels)  # validation's outputs have labels
    rule = choose_rule(loaded, loaded.temperature, RuleRequest(), lambda: (val.logits, labels))
    checked = dataclasses.replace(
        base, log_odds_threshold=rule.log_odds_threshold, temperature=loaded.temperature,
        ood_score=base.ood_score or loaded.default_ood_score,
    )  # fmt: skip
    report = shift_report(val, batch.outputs, checked)
    record = {
        "model": loaded.where, "images": len(batch.names), "validation_images": len(val.logits),
        "unreadable": batch.unreadable, "left_out": [str(p) for p in batch.skipped],
        "abstention": rule.to_json(), "ood_score": checked.ood_score,
        "permutations": checked.permutations, "seed": checked.seed,
        **report.to_json(loaded.class_names),
        "rows": reweighted_rows(report, batch.names, loaded.class_names),
    }  # fmt: skip
    if out is not None:
        write_monitor(out, record, report, loaded.class_names)
    return report, record


def main(argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.monitor") -> None:
    """CLI ``fseb-ft monitor RUN IMAGES...``: prints the table, exits 3 on alarm."""
    parser = _parser(prog)
    args = parser.parse_intermixed_args(argv)
    if not args.images and args.dataset is None:
        parser.error("give IMAGES (files, folders, globs) or --dataset")
    try:
        settings = MonitorSettings(level=args.level, permutations=args.permutations,
                                   seed=args.seed, ood_score=args.ood_score)  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    configure_logging(args.verbose)
    report, record = monitor_images(
        args.model, args.images, dataset=args.dataset, out=args.out, settings=settings,
        min_batch=args.min_batch, device=args.device,
        loader_kw={"batch_size": args.batch_size, "progress": not args.no_progress},
    )  # fmt: skip
    print(f"{record['model']}: {record['images']} images against {record['validation_images']} "
          "validation images")  # fmt: skip
    print(format_table(report, record["label_shift"]["classes"]))
    if record["unreadable"]:
        print(f"{len(record['unreadable'])} unreadable image(s) left out, e.g. "
              f"{record['unreadable'][0]}")  # fmt: skip
    if args.out is not None:
        print(f"report: {args.out / 'monitor.json'}, figure: {args.out / 'monitor.png'}")
    if report.alarm:
        raise SystemExit(ALARM_EXIT)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument(
        "model", help="the run folder whose validation split the batch is checked against"
    )
    parser.add_argument("images", nargs="*", default=[], help="image files, folders and globs")
    parser.add_argument("--dataset", metavar="SPEC", type=dataset_argument,
                        help='a recipe dataset spec instead of IMAGES: "{source: idx, path: data, '
                        'split: t10k}"')  # fmt: skip
    parser.add_argument("--out", type=Path, help="folder for monitor.json and monitor.png")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                        help="the alarm's false-alarm rate (default %(default)s: hourly checks "
                        "of healthy batches alarm about once in four days)")  # fmt: skip
    parser.add_argument(
        "--permutations",
        type=int,
        default=1000,
        help="permutations of each permutation test (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the permutations")
    parser.add_argument(
        "--min-batch",
        type=int,
        default=DEFAULT_MIN_BATCH,
        help="the fewest readable images checked (default %(default)s)",
    )
    parser.add_argument(
        "--ood-score",
        choices=OUTPUT_OOD_SCORES,
        help="the OOD score whose flags are counted (default: the run's first)",
    )
    parser.add_argument("--device", type=device_argument, help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the libraries' INFO lines")  # fmt: skip
    return parser


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.monitor")
