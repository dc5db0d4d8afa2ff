"""Input pipeline: decode + random-resized crop + flip + normalise to 224 px, on one core.

    OMP_NUM_THREADS=1 python -m benchmarks.input_pipeline [--jpeg-images 40] [--png-images 10]
        [--epoch-images 200] [--rounds 5] [--work DIR] [--quick]

The images are made from real photos of ``../shared`` (Tiny-ImageNet's validation JPEGs and
CIFAR-10's, taken in turn, a few of each): upsampled (bicubic) to 1024×768 and saved as JPEG
(quality 90), and to 2048×1536 (fundus-photo size) and saved as PNG, with Gaussian noise (σ = 6
grey levels) so that they compress like photographs (~180 KB per JPEG, ~6 MB per PNG). They are
made once into ``--work`` (``$TMPDIR/fseb_input_pipeline``) and read from the page cache. The
benchmark skips, with the reason, where ``../shared`` has neither tar (``--quick`` needs none: it
makes tiny images from noise, for the test).

Every pipeline does the same work, one process, one thread (torch, OpenCV and OpenMP at one):
decode, a random resized crop of scale (0.35, 1) and ratio (3/4, 4/3) to 224×224 (fseb_ft's
``randaug-lite`` augmentation), a horizontal flip half of the time, float32 and normalisation.

- ``fseb_ft, uncached``: a run's training path, an image folder through
  :class:`fseb_ft.data.transforms.TransformedImages` with ``train_transform(..., "randaug-lite")``
  (a JPEG decoded at the least scale its crops still shrink); ``decoded in full``: the same
  transform on ``data[i]`` (the path before); ``fseb_ft, cached``: the same path on the
  resized-image cache (shorter side 256 px, built before timing), where fseb_ft has one;
- ``timm create_transform (PIL)``: ``create_transform(is_training=True)``, colour jitter off,
  on ``Image.open(path).convert("RGB")``;
- ``torchvision decode_image + v2``: ``io.decode_image`` + ``transforms.v2``
  (``RandomResizedCrop(antialias=True)``, flip, ``ToDtype``, ``Normalize``).

The methods take turns image by image (so a burst of load on a shared machine hits them alike)
over the same files: ``--jpeg-images`` JPEGs, then the first ``--png-images`` PNGs, once
untimed, then ``--rounds`` times, each image reseeded to the same crop and flip every round. A
method's time is, per image, its fastest try, summed: process CPU time for the rates and the
ratios, wall-clock time beside it. The epoch table is one such pass (no repeat, no warm-up) over
``--epoch-images`` 2048×1536 PNGs (an APTOS-shaped stand-in: 20 distinct images, the other files
hard links to them, each still read and decoded), over the same images resized once so their
shorter side is 256 px and saved as PNG ("pre-resized files", what Kaggle practitioners train
on), and over the cache where there is one.

The last line printed is one JSON object: the rates and the ratios, among them
``jpeg_uncached_vs_torchvision`` and ``png_cached_vs_uncached`` (null without a cache).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import albumentations
import cv2
import numpy as np
import PIL
import timm
import timm.data
import torch
import torchvision
from PIL import Image, features
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms import v2

from fseb_ft.data.files import FileImages
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.sources.imagefolder import load_imagefolder
from fseb_ft.data.transforms import TransformedImages, train_transform

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TARS = (
    SHARED / "tiny-imagenet" / "tiny-imagenet-200-val.tar",
    SHARED / "cifar10-jpeg" / "CIFAR-10-images.tar",
)
MEAN, STD = timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD
SCALE = (0.35, 1.0)
"""The crop's area share: fseb_ft's ``randaug-lite``; every pipeline uses it."""
NOISE = 6.0
"""Standard deviation of the Gaussian noise added to the upsampled photos, in grey levels."""


@dataclass(frozen=True)
class Setup:
    """What one run measures on."""

    jpeg_size: tuple[int, int]
    """(width, height) of the JPEGs."""
    png_size: tuple[int, int]
    """(width, height) of the PNGs."""
    out: int
    """The crop's output side in pixels."""
    cache_side: int
    """The shorter side of the pre-resized files and of the cache."""
    jpeg_images: int
    png_images: int
    """PNGs of the rates table: the first of the epoch's."""
    epoch_images: int
    distinct_pngs: int
    """Distinct PNGs of the epoch (the others are links to them; the rates table's are these)."""
    rounds: int


FULL = Setup((1024, 768), (2048, 1536), 224, 256, 40, 10, 200, 20, rounds=5)
QUICK = Setup((128, 96), (160, 120), 32, 40, 3, 2, 3, 2, rounds=1)


# --------------------------------------------------------------------------- the images


def real_photos(count: int) -> list[Image.Image]:
    """``count`` photos from the tars of ``../shared`` that exist, taken in turn, each tar's
    spread evenly over its members (so over its classes)."""
    per_tar = []
    tars = [tar for tar in TARS if tar.is_file()]
    for path in tars:
        with tarfile.open(path) as tar:
            names = (".jpg", ".jpeg")
            members = [m for m in tar.getmembers() if m.isfile() and m.name.lower().endswith(names)]
            step = max(1, len(members) // (count // len(tars) + 1))
            chosen = members[::step][: count // len(tars) + 1]
            per_tar.append([_open(tar.extractfile(m).read()) for m in chosen])
    mixed = [photo for group in zip(*per_tar, strict=False) for photo in group]
    return (mixed * (count // max(1, len(mixed)) + 1))[:count]


def _open(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def noise_photos(count: int) -> list[Image.Image]:
    """``count`` 8×6 images of noise, the stand-in photos of ``--quick``."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)) for _ in range(count)]


def enlarged(photo: Image.Image, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """``photo`` upsampled (bicubic) to ``size`` (width, height) with Gaussian noise added."""
    pixels = np.asarray(photo.resize(size, Image.Resampling.BICUBIC), np.float32)
    pixels += NOISE * rng.standard_normal(pixels.shape, dtype=np.float32)
    return Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8))


def shorter_side(image: Image.Image, side: int) -> Image.Image:
    """``image`` shrunk (PIL bilinear, antialiased) so its shorter side is ``side``."""
    scale = side / min(image.size)
    size = (round(image.width * scale), round(image.height * scale))
    return image.resize(size, Image.Resampling.BILINEAR)


def image_set(root: Path, name: str, count: int, make: Callable[[int, Path], None]) -> Path:
    """``root/name/train/photo/`` (one class) of ``count`` images, ``make(index, folder)``
    writing each; made once (marked complete: a killed build is made again)."""
    folder = root / name
    if not (folder / ".complete").exists():
        target = folder / "train" / "photo"
        target.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            make(index, target)
        (folder / ".complete").touch()
    return folder


def make_sets(
    root: Path, setup: Setup, photos: Sequence[Image.Image], origin: str
) -> dict[str, Path]:
    """The JPEG set, the PNG set (the epoch's) and the pre-resized PNGs, image folders of one
    class each under ``root``, named by what they hold (``origin``: the photos') and made once.

    The epoch's files beyond the first ``setup.distinct_pngs`` are hard links to those, in turn:
    each file is still read and decoded in full, and the set costs seconds to make, not minutes.
    """
    rng = np.random.default_rng(0)
    distinct, side = setup.distinct_pngs, setup.cache_side

    def write_jpeg(index: int, folder: Path) -> None:
        enlarged(photos[index], setup.jpeg_size, rng).save(folder / f"{index:04d}.jpg", quality=90)

    def write_png(index: int, folder: Path) -> None:
        name = folder / f"{index:04d}.png"
        if index >= distinct:
            os.link(folder / f"{index % distinct:04d}.png", name)
        else:
            enlarged(photos[index], setup.png_size, rng).save(name)

    def write_resized(index: int, folder: Path) -> None:
        name = folder / f"{index:04d}.png"
        if index >= distinct:
            os.link(folder / f"{index % distinct:04d}.png", name)
        else:
            with Image.open(sets["png"] / "train" / "photo" / name.name) as image:
                shorter_side(image.convert("RGB"), side).save(name)

    jpegs = f"{origin}-{setup.jpeg_images}-{'x'.join(map(str, setup.jpeg_size))}-jpeg"
    pngs = f"{origin}-{setup.epoch_images}-of-{distinct}-{'x'.join(map(str, setup.png_size))}-png"
    sets = {
        "jpeg": image_set(root, jpegs, setup.jpeg_images, write_jpeg),
        "png": image_set(root, pngs, setup.epoch_images, write_png),
    }
    sets["resized"] = image_set(root, f"{pngs}-side{side}", setup.epoch_images, write_resized)
    return sets


# --------------------------------------------------------------------------- the pipelines


@dataclass(frozen=True)
class Method:
    """One pipeline, image by image: ``step(i)`` decodes and transforms image ``i`` (the result
    dropped); ``reseed(i)`` seeds its random draws for image ``i``, so that every round repeats
    the same crop and flip of that image."""

    step: Callable[[int], object]
    reseed: Callable[[int], None]


def fseb_ft_method(data: LabeledImages, out: int, reduced: bool = True) -> Method:
    """fseb_ft's training path over ``data``; ``reduced=False``: every image decoded in full."""
    dataset = TransformedImages(data, train_transform((out, out), MEAN, STD, "randaug-lite"))

    def decoded_in_full(index: int) -> object:
        return dataset.transform(image=data[index][0])

    return Method(dataset.__getitem__ if reduced else decoded_in_full, dataset.reseed)


def _seed_torch_and_random(index: int) -> None:
    """Seed what timm's and torchvision's transforms draw from: ``random`` and torch."""
    random.seed(index)
    torch.manual_seed(index)


def timm_method(paths: Sequence[Path], out: int) -> Method:
    """timm's training transform on each PIL image."""
    transform = timm.data.create_transform(
        input_size=out, is_training=True, scale=SCALE, hflip=0.5, color_jitter=None,
        interpolation="bilinear", mean=MEAN, std=STD,
    )  # fmt: skip

    def step(index: int) -> object:
        with Image.open(paths[index]) as image:
            return transform(image.convert("RGB"))

    return Method(step, _seed_torch_and_random)


def torchvision_method(paths: Sequence[Path], out: int) -> Method:
    """torchvision's ``decode_image`` + ``transforms.v2``."""
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(out, scale=SCALE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )

    def step(index: int) -> object:
        return transform(decode_image(read_file(str(paths[index])), mode=ImageReadMode.RGB))

    return Method(step, _seed_torch_and_random)


def cached(data: LabeledImages, work: Path, side: int) -> LabeledImages | None:
    """``data`` served from fseb_ft's resized-image cache (``data.cache``, shorter side
    ``side``, built here, before any timing), or None where fseb_ft has no cache module."""
    try:
        from fseb_ft.data import image_cache
        from fseb_ft.recipe import ImageCacheConfig
    except ImportError:
        return None
    config = ImageCacheConfig(size=side, dir=str(work / "cache"))
    built = image_cache.cache_images({"train": data}, config, progress=False, workers=1)
    return built.sets["train"]


def timed(
    methods: dict[str, Method | None], count: int, rounds: int, warm: bool = True
) -> dict[str, tuple[float, float] | None]:
    """Each method's (CPU seconds, wall seconds) over images ``0 .. count - 1``: per image the
    fastest of ``rounds`` tries of the same crop, summed. The methods take turns image by image,
    so a burst of load on a shared machine hits them alike; ``warm``: one untimed pass first.
    None for a method that is None."""
    ready = {name: method for name, method in methods.items() if method is not None}
    for method in ready.values() if warm else ():
        for index in range(count):
            method.step(index)
    best = {name: np.full((count, 2), np.inf) for name in ready}  # (image, CPU | wall)
    for _ in range(rounds):
        for index in range(count):
            for name, method in ready.items():
                method.reseed(index)
                cpu, wall = time.process_time(), time.perf_counter()
                method.step(index)
                took = (time.process_time() - cpu, time.perf_counter() - wall)
                best[name][index] = np.minimum(best[name][index], took)
    return {name: tuple(best[name].sum(axis=0)) if name in best else None for name in methods}


# --------------------------------------------------------------------------- the tables

NO_CACHE = "n/a (no cache module)"


def format_methods(kind: str, folder: Path, count: int, setup: Setup, work: Path) -> dict:
    """The methods over the first ``count`` files of the image folder ``folder``."""
    listed = load_imagefolder(folder, "train")
    data = FileImages(listed.folder, listed.files[:count], listed.labels[:count],
                      listed.class_names, f"{listed.identity}:{count}")  # fmt: skip
    paths = [data.path(i) for i in range(len(data))]
    in_cache = cached(data, work, setup.cache_side)
    methods: dict[str, Method | None] = {"fseb_ft, uncached": fseb_ft_method(data, setup.out)}
    if kind == "JPEG":
        methods["fseb_ft, uncached, decoded in full"] = fseb_ft_method(data, setup.out, False)
    methods["fseb_ft, cached"] = None if in_cache is None else fseb_ft_method(in_cache, setup.out)
    methods["timm create_transform (PIL)"] = timm_method(paths, setup.out)
    methods["torchvision decode_image + v2"] = torchvision_method(paths, setup.out)
    return methods


def rates_table(kind: str, folder: Path, setup: Setup, work: Path) -> dict[str, float | None]:
    """Print one format's table; return images/s (CPU time) by method, None where n/a."""
    count = setup.jpeg_images if kind == "JPEG" else setup.png_images
    size = setup.jpeg_size if kind == "JPEG" else setup.png_size
    times = timed(format_methods(kind, folder, count, setup, work), count, setup.rounds)
    rates = {name: None if t is None else count / t[0] for name, t in times.items()}
    reference = rates["torchvision decode_image + v2"]
    print(f"\n{kind}s of {size[0]}×{size[1]} → {setup.out} px: {count} images, each the "
          f"fastest of {setup.rounds} tries\n")  # fmt: skip
    print("| method | images/s (CPU) | images/s (wall) | vs torchvision |")
    print("|---|---:|---:|---:|")
    for name, rate in rates.items():
        if rate is None:
            print(f"| {name} | {NO_CACHE} | | |")
        else:
            wall = count / times[name][1]
            print(f"| {name} | {rate:.1f} | {wall:.1f} | {rate / reference:.2f}× |")
    return rates


def epoch_table(sets: dict[str, Path], setup: Setup, work: Path) -> dict[str, float | None]:
    """Print one pass over the epoch's PNGs, as they are, pre-resized and cached; return the
    CPU seconds of each (keys ``uncached``, ``preresized``, ``cached``; None where n/a)."""
    originals = load_imagefolder(sets["png"], "train")
    in_cache = cached(originals, work, setup.cache_side)
    side = setup.cache_side
    methods = {
        "uncached": fseb_ft_method(originals, setup.out),
        "preresized": fseb_ft_method(load_imagefolder(sets["resized"], "train"), setup.out),
        "cached": None if in_cache is None else fseb_ft_method(in_cache, setup.out),
    }
    names = {
        "uncached": f"the {setup.png_size[0]}×{setup.png_size[1]} PNGs, uncached",
        "preresized": f"pre-resized PNGs (shorter side {side})",
        "cached": f"the PNGs through the resized-image cache (shorter side {side})",
    }
    for folder in (sets["png"], sets["resized"]):  # into the page cache
        for file in (folder / "train" / "photo").iterdir():
            file.read_bytes()
    times = timed(methods, len(originals), rounds=1, warm=False)
    base = times["preresized"][0]
    print(f"\nOne epoch of fseb_ft's training path: {len(originals)} images\n")
    print("| images read | seconds (CPU) | seconds (wall) | images/s (CPU) | vs pre-resized |")
    print("|---|---:|---:|---:|---:|")
    for key, found in times.items():
        if found is None:
            print(f"| {names[key]} | {NO_CACHE} | | | |")
        else:
            cpu, wall = found
            rate = len(originals) / cpu
            print(f"| {names[key]} | {cpu:.2f} | {wall:.2f} | {rate:.1f} | {cpu / base:.2f}× |")
    return {key: None if found is None else found[0] for key, found in times.items()}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def summary_of(jpeg: dict, png: dict, epoch: dict) -> dict:
    """The JSON line: the ratios, the rates and the epoch's seconds."""
    uncached, full, in_cache = (
        "fseb_ft, uncached",
        "fseb_ft, uncached, decoded in full",
        "fseb_ft, cached",
    )
    timm_, tv = "timm create_transform (PIL)", "torchvision decode_image + v2"
    return {
        "jpeg_uncached_vs_torchvision": _ratio(jpeg[uncached], jpeg[tv]),
        "jpeg_uncached_vs_timm": _ratio(jpeg[uncached], jpeg[timm_]),
        "jpeg_uncached_vs_decoded_in_full": _ratio(jpeg[uncached], jpeg[full]),
        "png_uncached_vs_torchvision": _ratio(png[uncached], png[tv]),
        "png_cached_vs_uncached": _ratio(png[in_cache], png[uncached]),
        "jpeg_cached_vs_uncached": _ratio(jpeg[in_cache], jpeg[uncached]),
        "epoch_cached_vs_preresized": _ratio(epoch["cached"], epoch["preresized"]),
        "epoch_uncached_vs_preresized": _ratio(epoch["uncached"], epoch["preresized"]),
        "images_per_s": {"jpeg": jpeg, "png": png},
        "epoch_cpu_seconds": epoch,
    }


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch and OpenCV on one thread (OpenMP's is the environment's), restored after."""
    threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads[0])
        cv2.setNumThreads(threads[1])


def cpu_model() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def hardware() -> str:
    """The machine and the libraries, in one line."""
    turbo = features.version("jpg") if features.check_feature("libjpeg_turbo") else "no"
    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs (load average "
        f"{os.getloadavg()[0]:.1f}), torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, Pillow {PIL.__version__} (libjpeg-turbo {turbo}), "
        f"albumentations {albumentations.__version__}, OpenCV {cv2.__version__}, timm "
        f"{timm.__version__}, python {sys.version.split()[0]}"
    )


def parse(argv: list[str]) -> tuple[Setup, argparse.Namespace]:
    """The run's setup: ``--quick``'s or the full one, with the counts given."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.input_pipeline", description=__doc__
    )
    parser.add_argument("--jpeg-images", type=int, help=f"default {FULL.jpeg_images}")
    parser.add_argument("--png-images", type=int, help=f"default {FULL.png_images}")
    parser.add_argument("--epoch-images", type=int, help=f"default {FULL.epoch_images}")
    parser.add_argument("--rounds", type=int, help=f"default {FULL.rounds}")
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "fseb_input_pipeline"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny images of noise, no ../shared (a test)"
    )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    counts = {
        name: getattr(args, name) or getattr(base, name)
        for name in ("jpeg_images", "png_images", "epoch_images", "rounds")
    }
    # The rates table times distinct PNGs: at least as many as it asks for, if the epoch has them.
    distinct = min(counts["epoch_images"], max(base.distinct_pngs, counts["png_images"]))
    counts |= {"distinct_pngs": distinct, "png_images": min(counts["png_images"], distinct)}
    return replace(base, **counts), args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the tables and, last, the JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    setup, args = parse(argv)
    if not args.quick and not any(tar.is_file() for tar in TARS):
        reason = f"neither {TARS[0]} nor {TARS[1]} exists (only checkouts next to ../shared)"
        print(f"skipped: {reason}")
        print(json.dumps({"skipped": reason}))
        return {"skipped": reason}
    threads = os.environ.get("OMP_NUM_THREADS", "(unset)")
    command = " ".join([f"OMP_NUM_THREADS={threads}", "python -m benchmarks.input_pipeline", *argv])
    print(f"command: {command}")
    print(f"hardware: {hardware()}")
    count = max(setup.jpeg_images, setup.distinct_pngs)
    photos = noise_photos(count) if args.quick else real_photos(count)
    sets = make_sets(args.work, setup, photos, "noise" if args.quick else "photos")
    with one_thread(), warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders for TorchCodec; they are what is compared.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision")
        jpeg = rates_table("JPEG", sets["jpeg"], setup, args.work)
        png = rates_table("PNG", sets["png"], setup, args.work)
        epoch = epoch_table(sets, setup, args.work)
    summary = summary_of(jpeg, png, epoch)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
