"""One short real fine-tune per method, through the run a user starts, timed step by step to
say whether the input pipeline or the accelerator bounds it (issue 35).

    python -m benchmarks.gpu.finetune --data DIR --model local-dir:WEIGHTS [--workers 12]
        [--size 224] [--batch 128] [--epochs 1] [--work DIR]

``DIR`` is an image folder ``DIR/{train,test}/<class>/*.jpg`` (the GPU script carries ~2,000
CIFAR-10 JPEGs from ``../shared``). Each method (PS-MAP, then FS-EB with the recipe's corrupted
training context) runs ``recipes/cifar10.yaml`` with its data pointed at ``DIR``, no OOD set,
bf16 and ``channels_last``, through :func:`fseb_ft.engine.run.run` with a timing callback:

- **wait**: from the end of one step to the next batch's arrival, the time the loop waits for
  the input pipeline (the DataLoader's workers, the copy to the device);
- **step**: from the batch's arrival to the end of its optimiser step, CUDA-synchronised.

The synchronisation at each step's end costs the overlap of one step's host work with the
previous step's kernels, so the figures are a bound on what an unobserved run does, not its
exact rate. The training phase's images/s counts every step and every wait; the step-only
rate is ``B /`` the median step. Steps over five times the median pay one-time work (on an
H100, the first step and the first step of the partial last batch: a new input shape), summed
as ``one_time_s`` and listed as ``slow_steps`` (step, batch size, seconds); the wait for each
epoch's first batch (the loader's workers starting) is ``loader_start_s``. A run whose other
waits exceed its steps less their one-time work is bounded by its input pipeline. The last
line printed is a JSON object of every figure.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.engine.run import run
from fseb_ft.recipe import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cifar10.yaml"
METHODS = {"PS-MAP": 0.0, "FS-EB": 1.0}  # fseb.reg_scale
ONE_TIME_FACTOR = 5
"""A step over this many × the median step counts as paying one-time work."""


class StepTimer(Callback):
    """Time each training step and the wait for its batch (see the module's docstring)."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.starts: list[float] = []
        """Each epoch's wait for its first batch."""
        self.steps: list[float] = []
        self.sizes: list[int] = []
        """Each step's batch size (the last, partial batch is a new input shape)."""
        self._mark = self._start = 0.0
        self._first = False

    def on_epoch_begin(self, trainer: TrainerView, epoch: int) -> None:
        self._mark, self._first = time.perf_counter(), True

    def on_batch_begin(self, trainer: TrainerView, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        self._start = time.perf_counter()
        (self.starts if self._first else self.waits).append(self._start - self._mark)
        self._first = False
        self.sizes.append(x.shape[0])
        return x, y

    def on_step_end(self, trainer: TrainerView, terms: Mapping[str, Tensor]) -> None:
        if trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize(trainer.accelerator.device)
        self._mark = time.perf_counter()
        self.steps.append(self._mark - self._start)

    def figures(self, batch: int, images: int, epochs: int) -> dict[str, float | str]:
        """The rates and the verdict of ``epochs`` epochs of ``images`` training images."""
        wait, start, step = sum(self.waits), sum(self.starts), sum(self.steps)
        median = statistics.median(self.steps)
        # Steps far above the median pay one-time work (a new input shape's first use).
        slow = [(i, n, t) for i, (n, t) in enumerate(zip(self.sizes, self.steps, strict=True))
                if t > ONE_TIME_FACTOR * median]  # fmt: skip
        one_time = sum(t - median for _, _, t in slow)
        return {
            "train_images_per_s": round(images * epochs / (start + wait + step), 1),
            "step_only_images_per_s": round(batch / median, 1),
            "loader_start_s": round(start, 3),
            "wait_s": round(wait, 3),
            "step_s": round(step, 3),
            "one_time_s": round(one_time, 3),
            "wait_fraction": round(wait / (wait + step - one_time), 3),
            "bound_by": "input pipeline" if wait > step - one_time else "accelerator",
            "steps": len(self.steps),
            "slow_steps": [[i, n, round(t, 3)] for i, n, t in slow],
        }


def overrides(args: argparse.Namespace, method: str) -> list[str]:
    """The recipe overrides of one method's run."""
    data = Path(args.data).resolve()
    folder = f"{{source: imagefolder, path: '{data}'"
    return [
        f"model.name={args.model}",
        f"model.pretrained={str(args.pretrained).lower()}",
        f"model.input_size={args.size}",
        f"data.train={folder}, split: train}}",
        f"data.test={folder}, split: test}}",
        "data.ood={}",
        f"data.batch_size={args.batch}",
        f"data.num_workers={args.workers}",
        f"context.pool_size={args.pool}",
        f"context.batch_size={args.batch // 4}",
        f"fseb.reg_scale={METHODS[method]}",
        f"train.epochs={args.epochs}",
        f"train.mixed_precision={args.precision}",
        "train.channels_last=true",
        "train.resume=never",
        "eval.bootstrap=0",
        f"output.dir={Path(args.work).resolve() / method.replace(' ', '_')}",
    ]


def finetune(args: argparse.Namespace, method: str) -> dict[str, object]:
    """One method's run, timed; its figures and test accuracy."""
    recipe = load_recipe(RECIPE, overrides(args, method))
    timer = StepTimer()
    started = time.perf_counter()
    results = run(recipe, callbacks=[timer])
    wall = time.perf_counter() - started
    history = results["training"]["history"]
    info = json.loads(Path(recipe.output.dir, "run.json").read_text())
    return {
        **timer.figures(recipe.data.batch_size, info["num_train"], len(history)),
        "run_wall_s": round(wall, 1),
        "epoch_s": [round(h["seconds"], 2) for h in history],
        "test_accuracy": results["test"]["accuracy"],
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="image folder with train/ and test/")
    parser.add_argument("--model", default="efficientnet_lite0")
    parser.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--pool", type=int, default=1000, help="context.pool_size")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--precision", choices=("bf16", "no"), default="bf16")
    parser.add_argument("--work", default="/tmp/fseb-gpu-runs", help="the runs' folders")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Run each method, print a line each, then one JSON line of every figure."""
    args = parse(argv)
    found = {}
    for method in METHODS:
        found[method] = finetune(args, method)
        print(f"{method}: {json.dumps(found[method])}", flush=True)
    print(json.dumps(found), flush=True)
    return found


if __name__ == "__main__":
    main()
    # On an H100 this process once outlived its last line by minutes (the runs' DataLoader
    # workers, pinned memory?): if it is still here in 20 s, every thread's stack goes to the
    # log. Armed here, not in main(), which the test suite calls in its own process.
    faulthandler.dump_traceback_later(20)
