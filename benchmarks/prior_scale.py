"""m = mean ‖h(x̂; φ0)‖² of a real backbone, and what a recipe's (s, d) mean there.

    python -m benchmarks.prior_scale --setting cifar10 [--images 500]
    python -m benchmarks.prior_scale --setting fmnist [--images 500]

The prior variance of a logit at a context point is ``s (‖h(x̂; φ0)‖² + 1) + d``
(docs/method.md, "A prior stated in units that transfer"). This measures m, the mean of
``‖h‖²`` over the context pool, exactly as a run resolves ``fseb.prior_std``
(:func:`fseb_ft.method.context.mean_sq_feature_norm`), for the perturbed context pool ("train-corr",
the recipes' default) and for the clean training images, and prints the prior standard deviation
and feature share that the recipe's (s, d) give at each m:

- ``cifar10``: the ImageNet-pretrained EfficientNet-Lite0 of ``../shared/weights`` at 64 px on
  the first ``--images`` / 10 training images of each CIFAR-10 class (from ``../shared``'s JPEG
  archive, extracted to a temporary folder), with ``recipes/cifar10.yaml``'s (s, d) = (1e-5, 1e-2);
- ``fmnist``: ``recipes/fmnist.yaml``'s CNN at its (seeded) initialisation, φ0 of a run from
  scratch, on a seeded subset of the FashionMNIST training images, (s, d) = (0.01, 1).

CPU, one pass, no training; seconds to a minute. The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

import torch

from fseb_ft.data.sources import load_split
from fseb_ft.method.context import build_context_pool, mean_sq_feature_norm
from fseb_ft.method.models import create_model, input_spec
from fseb_ft.method.objective import FSEBObjective
from fseb_ft.method.regularizer import prior_std_of
from fseb_ft.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CIFAR_TAR = SHARED / "data" / "cifar10-jpeg" / "CIFAR-10-images.tar"
WEIGHTS = SHARED / "weights" / "efficientnet_lite0.in1k"


def cifar_subset(target: Path, per_class: int) -> Path:
    """The first ``per_class`` training JPEGs of each CIFAR-10 class as ``target/train/<class>``."""
    with tarfile.open(CIFAR_TAR) as tar:
        wanted = [
            m
            for m in tar.getmembers()
            if m.isfile()
            and m.name.split("/")[-3:-2] == ["train"]
            and int(Path(m.name).stem) < per_class
        ]
        tar.extractall(target, members=wanted, filter="data")
    inner = next(p.parent for p in target.rglob("train") if p.is_dir())
    return inner


def overrides(setting: str, images: int, tmp: Path) -> tuple[Path, list[str]]:
    """The recipe and the overrides that point it at ``images`` offline training images."""
    if setting == "cifar10":
        root = cifar_subset(tmp, max(1, images // 10))
        return REPO / "recipes" / "cifar10.yaml", [
            f"model.name=local-dir:{WEIGHTS}",
            "model.input_size=64",
            f"data.train={{source: imagefolder, path: '{root}', split: train}}",
            "data.test=null",
            "data.ood={}",
        ]
    fmnist = SHARED / "data" / "fashion-mnist"
    return REPO / "recipes" / "fmnist.yaml", [
        f"data.train={{source: idx, path: '{fmnist}', split: train, limit: {images}}}",
        "data.test=null",
        "data.ood={}",
    ]


def measure(setting: str, images: int) -> dict:
    """m for the perturbed pool and the clean images, and the recipe's (s, d) at each."""
    with tempfile.TemporaryDirectory() as tmp:
        path, extra = overrides(setting, images, Path(tmp))
        recipe = load_recipe(path, extra)
        seed = recipe.train.seed
        torch.manual_seed(seed)  # φ0 of a scratch model is its seeded initialisation
        train = load_split("data.train", recipe.data.train, recipe.data.channels, seed)
        model = create_model(recipe.model, 10, in_chans=recipe.data.channels)
        spec = input_spec(model, recipe.model, recipe.data)
        objective = FSEBObjective.from_config(model, len(train), recipe.fseb)
        s, d = recipe.fseb.prior_cov_scale, recipe.fseb.prior_cov_diag
        out = {"setting": setting, "model": recipe.model.name, "input": list(spec.size)}
        out.update(images=len(train), prior_cov_scale=s, prior_cov_diag=d)
        for name, perturb in (("perturbed", True), ("clean", False)):
            pool = build_context_pool(
                "train", train, [], spec, size=len(train), seed=seed, perturb=perturb
            )
            m = mean_sq_feature_norm(pool, objective, "cpu", seed, max_images=len(pool))
            prior_std, share = prior_std_of(s, d, m)
            out[name] = {"mean_sq_norm": m, "prior_std": prior_std, "feature_share": share}
    return out


def main() -> None:
    """CLI: measure one setting and print a short table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=("cifar10", "fmnist"), default="cifar10")
    parser.add_argument("--images", type=int, default=500, help="training images measured")
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found: this benchmark reads ../shared")
    out = measure(args.setting, args.images)
    s, d = out["prior_cov_scale"], out["prior_cov_diag"]
    print(f"{out['model']} at {out['input']} px, {out['images']} images, s = {s:g}, d = {d:g}")
    for name in ("perturbed", "clean"):
        r = out[name]
        print(
            f"  {name:9s}  m = {r['mean_sq_norm']:9.4g}   prior_std = {r['prior_std']:.4g}   "
            f"feature share = {r['feature_share']:.3f}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
