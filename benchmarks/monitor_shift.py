"""How often ``fseb-ft monitor`` raises the alarm on CIFAR-10 batches (issue 37, item 3).

    OMP_NUM_THREADS=2 python -m benchmarks.monitor_shift RUN [--cache FILE] [--results PAGE]

RUN is a CIFAR-10 run at 64 px (docs/results.md used a copy of the ImageNet-pretrained
EfficientNet-Lite0 PS-MAP fine-tune of the distant-context protocol, seed 0). The network's
penultimate features and logits are computed once per pool and cached (``--cache``):

- ``validation``: the run's validation split (1,000 CIFAR-10 training images), the reference;
- ``clean``: 6,000 CIFAR-10 test images (a seeded draw): i.i.d. batches measure the false-alarm
  rate (a pool this large, so that batches of 500 overlap little and the pool's own departure
  from the test distribution is small), and batches drawn from it with three classes
  (airplane, automobile, bird) making up 60 % of the images, the other seven 40 %, measure a
  class-proportion (label) shift;
- ``corrupted``: 1,000 other test images, 250 each of Gaussian noise, defocus blur, contrast and
  JPEG compression at severity 3 (this repo's corruptions, on the 32 px images before resizing);
  a batch mixes the four;
- ``mnist``: 1,000 MNIST test images (grey replicated to RGB).

For each kind of batch and batch size, ``--draws`` batches are drawn (without replacement
within a batch, seeded by the draw) and checked with the monitor's defaults (level 0.01, 1,000
permutations, the run's abstention threshold, its first OOD score). The table of alarm rates,
and which test fired at each size, goes between ``<!-- monitor-shift:begin/end -->`` of
``--results``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from benchmarks.provenance import write_section
from fseb_ft.data.corruptions import corrupt_images
from fseb_ft.data.images import ArrayImages, IndexedImages, LabeledImages
from fseb_ft.data.sources import load_split
from fseb_ft.data.splits import allocate
from fseb_ft.prediction.inputs import ImageInputs, outputs_and_read_errors
from fseb_ft.prediction.loading import LoadedModel, load_model
from fseb_ft.prediction.monitor_data import validation_outputs
from fseb_ft.prediction.requests import RuleRequest
from fseb_ft.prediction.shift_report import MonitorSettings, Outputs, shift_report
from fseb_ft.prediction.thresholds import choose_rule
from fseb_ft.recipe import Recipe

CORRUPTIONS = ("gaussian_noise", "defocus_blur", "contrast", "jpeg_compression")
SEVERITY = 3
N_CLEAN, N_PER_CORRUPTION, N_MNIST = 6000, 250, 1000
SHIFTED_CLASSES, SHIFTED_SHARE = (0, 1, 2), 0.6
KINDS = ("i.i.d. clean", "label shift", "corrupted", "MNIST")
MARKERS = ("<!-- monitor-shift:begin -->", "<!-- monitor-shift:end -->")
_LOADER = {"batch_size": 128, "num_workers": 0, "progress": False}


def outputs_of(loaded: LoadedModel, data: LabeledImages) -> Outputs:
    """Features, logits and labels of ``data`` through the monitor's pass."""
    net = loaded.model.eval()
    logits, features, errors = outputs_and_read_errors(
        net, ImageInputs(None, data, loaded), loaded, torch.device("cpu"), "pool", **_LOADER,
        network=loaded.network or net,
    )  # fmt: skip
    assert not any(errors), errors[:3]
    return Outputs(cast(torch.Tensor, features), logits, torch.as_tensor(data.labels))


def compute_pools(loaded: LoadedModel) -> dict[str, Outputs]:
    """The four pools' outputs (see the module docstring)."""
    recipe = cast(Recipe, loaded.recipe)
    test = load_split("data.test", cast(Any, recipe.data.test), loaded.channels)
    order = np.random.default_rng(0).permutation(len(test))
    clean = IndexedImages(test, order[:N_CLEAN])
    rest = order[N_CLEAN : N_CLEAN + N_PER_CORRUPTION * len(CORRUPTIONS)]
    pixels, labels = [], []
    for k, name in enumerate(CORRUPTIONS):
        part = rest[k * N_PER_CORRUPTION : (k + 1) * N_PER_CORRUPTION]
        images = [test[int(i)][0] for i in part]  # (32, 32, 3) uint8 each
        pixels += corrupt_images(images, name, SEVERITY, seed=0, indices=list(part))
        labels += [int(test.labels[i]) for i in part]
    corrupted = ArrayImages(np.stack(pixels), np.array(labels), test.class_names)
    mnist = load_split("mnist", recipe.data.ood["mnist"], loaded.channels)
    mnist = IndexedImages(mnist, np.random.default_rng(1).permutation(len(mnist))[:N_MNIST])
    return {
        "validation": validation_outputs(loaded, torch.device("cpu"), _LOADER),
        "clean": outputs_of(loaded, clean),
        "corrupted": outputs_of(loaded, corrupted),
        "mnist": outputs_of(loaded, mnist),
    }


def load_pools(loaded: LoadedModel, cache: Path) -> dict[str, Outputs]:
    """The pools from ``cache``, computed and saved there the first time."""
    if cache.is_file():
        saved = torch.load(cache)
        return {name: Outputs(**parts) for name, parts in saved.items()}
    pools = compute_pools(loaded)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({name: dataclasses.asdict(p) for name, p in pools.items()}, cache)
    return pools


def draw(pools: dict[str, Outputs], kind: str, size: int, rng: np.random.Generator) -> Outputs:
    """One batch of ``kind`` and ``size``, without replacement, with its labels (CIFAR-10's;
    MNIST's digits name no CIFAR-10 class)."""
    pool = pools[{"corrupted": "corrupted", "MNIST": "mnist"}.get(kind, "clean")]
    if kind != "label shift":
        rows = rng.choice(len(pool.logits), size=size, replace=False)
    else:
        labels = cast(torch.Tensor, pool.labels).numpy()
        k = int(labels.max()) + 1
        share = np.full(k, (1 - SHIFTED_SHARE) / (k - len(SHIFTED_CLASSES)))
        share[list(SHIFTED_CLASSES)] = SHIFTED_SHARE / len(SHIFTED_CLASSES)
        counts = allocate(size, share)
        rows = np.concatenate([
            rng.choice(np.flatnonzero(labels == c), size=n, replace=False)
            for c, n in enumerate(counts)
        ])  # fmt: skip
    index = torch.as_tensor(rows)
    return Outputs(pool.features[index], pool.logits[index], cast(torch.Tensor, pool.labels)[index])


def alarm_rates(
    pools: dict[str, Outputs], base: MonitorSettings, sizes: Sequence[int], draws: dict[str, int]
) -> dict[tuple[str, int], dict[str, float]]:
    """For each (kind, size): how many of ``draws[kind]`` draws alarmed, in all and per test,
    and the mean ATC estimate and true accuracy of the batches."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for kind in KINDS:
        for size in sizes:
            counts = dict.fromkeys(("alarm", "features", "abstention", "ood", "classes"), 0.0)
            counts |= {"atc": 0.0, "accuracy": 0.0, "bbse": 0.0, "draws": draws[kind]}
            for i in range(draws[kind]):
                rng = np.random.default_rng([size, KINDS.index(kind), i])
                settings = dataclasses.replace(base, seed=i)
                batch = draw(pools, kind, size, rng)
                report = shift_report(pools["validation"], batch, settings)
                counts["alarm"] += report.alarm
                for check in report.checks[:-1]:
                    counts[check.name] += check.alarm
                correct = batch.logits.argmax(-1) == cast(torch.Tensor, batch.labels)
                counts["atc"] += cast(float, report.checks[-1].observed) / draws[kind]
                counts["accuracy"] += float(correct.double().mean()) / draws[kind]
                shifted = report.label_shift.proportions[list(SHIFTED_CLASSES)].sum()
                counts["bbse"] += float(shifted) / draws[kind]
            found[kind, size] = counts
            print(f"{kind:<14} n={size:<4} {counts}", flush=True)
    return found


def markdown(found: dict[tuple[str, int], dict[str, float]], sizes: Sequence[int],
             command: str) -> str:  # fmt: skip
    """The two tables: alarm rates, then which tests fired and ATC against the true accuracy."""
    head = "| batch | " + " | ".join(f"{n} images" for n in sizes) + " |\n"
    rule = "|---|" + "---:|" * len(sizes) + "\n"
    rows = "".join(
        f"| {kind} | "
        + " | ".join(f"{found[kind, n]['alarm']:.0f}/{found[kind, n]['draws']:.0f}" for n in sizes)
        + " |\n"
        for kind in KINDS
    )
    tests = ("features", "abstention", "ood", "classes")
    detail = "".join(
        f"| {kind} | {n} | " + " | ".join(f"{found[kind, n][t]:.0f}" for t in tests)
        + f" | {100 * found[kind, n]['atc']:.1f} | "
        + (f"{100 * found[kind, n]['accuracy']:.1f} | " if kind != "MNIST" else "— | ")
        + f"{100 * found[kind, n]['bbse']:.1f} |\n"
        for kind in KINDS for n in sizes
    )  # fmt: skip
    return (
        "Batches that raised the alarm (level 0.01, Bonferroni over four tests):\n\n"
        f"{head}{rule}{rows}\nWhich test fired (draws; one draw may fire several), and the "
        "batches' mean accuracy estimated without labels (ATC) against their true accuracy, "
        "and BBSE's mean estimate of the share of airplane, automobile and bird (30 % of the "
        "clean pool, 60 % of a label-shift batch), in %:\n\n"
        "| batch | images | features (MMD²) | abstention | OOD flags | classes (χ²) | ATC "
        "| true | BBSE: 3 classes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"{detail}\n`{command}`\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.monitor_shift",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("run", type=Path)
    parser.add_argument(
        "--cache", type=Path, help="the pools' outputs (default RUN/../NAME-pools.pt)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 500])
    parser.add_argument("--draws", type=int, default=20, help="batches per shifted cell")
    parser.add_argument("--null-draws", type=int, default=100, help="i.i.d. batches per size")
    parser.add_argument("--results", type=Path, help="write the tables into this page")
    args = parser.parse_args(argv)
    loaded = load_model(args.run)
    cache = args.cache or args.run.parent / f"{args.run.name}-monitor-pools.pt"
    start = time.perf_counter()
    pools = load_pools(loaded, cache)
    print(f"pools ready in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {len(v.logits)}" for k, v in pools.items()), flush=True)  # fmt: skip
    val = pools["validation"]
    labels = cast(torch.Tensor, val.labels)
    rule = choose_rule(loaded, loaded.temperature, RuleRequest(), lambda: (val.logits, labels))
    base = MonitorSettings(
        log_odds_threshold=rule.log_odds_threshold,
        temperature=loaded.temperature,
        ood_score=loaded.default_ood_score,
    )
    start = time.perf_counter()
    draws = dict.fromkeys(KINDS, args.draws) | {"i.i.d. clean": args.null_draws}
    found = alarm_rates(pools, base, args.sizes, draws)
    print(f"checks done in {time.perf_counter() - start:.0f} s", flush=True)
    command = "python -m benchmarks.monitor_shift RUN --results docs/results.md"
    text = markdown(found, args.sizes, command)
    print(text)
    if args.results is not None:
        write_section(args.results, text, MARKERS, runs=[args.run])


if __name__ == "__main__":
    main(sys.argv[1:])
