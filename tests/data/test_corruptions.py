"""Common corruptions: reference parameters, determinism, severity, shapes, cache, config, and
the corrupted test split evaluated at the end of a run and on re-evaluation."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

import fseb_ft.data.corruptions as C
import fseb_ft.engine.ensemble as ensemble_module
import fseb_ft.runs.report as report_module
from fseb_ft.data.images import ArrayImages
from fseb_ft.data.splits import stratified_split
from fseb_ft.data.transforms import TransformedImages, eval_transform
from fseb_ft.engine.ensemble import evaluate_ensemble
from fseb_ft.engine.reevaluate import evaluate_run_with_predictions
from fseb_ft.evaluate import main as evaluate_main
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.finetune import run
from fseb_ft.recipe import ConfigError, options, recipe_from_dict
from fseb_ft.recipe.reporting import resolve_corruptions
from fseb_ft.runs import plots
from fseb_ft.runs.report import evaluate_predictions, temperature_scaled_results
from fseb_ft.runs.rundir import CORRUPTION_PLOT
from fseb_ft.runs.tables import clean_reference, corruption_markdown
from tests.helpers import N_TEST, tiny_recipe, write_image_folder

NOISE = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise")
# Corruptions whose mean pixel change must grow strictly with the severity.
MONOTONE = ("gaussian_noise", "impulse_noise", "contrast", "brightness", "fog", "zoom_blur",
            "pixelate", "defocus_blur")  # fmt: skip


def _images(n: int, channels: int, size: tuple[int, int] = (24, 24), seed: int = 0) -> np.ndarray:
    """Smooth random uint8 images (n, H, W, C) in 20..220, a stand-in for natural images."""
    raw = np.random.default_rng(seed).uniform(0, 1, (n, *size, channels))
    smooth = ndimage.gaussian_filter(raw, (0, 1.5, 1.5, 0))
    lo, hi = smooth.min(), smooth.max()
    return ((smooth - lo) / (hi - lo) * 200 + 20).astype(np.uint8)


def _change(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------


def test_names_all_and_the_error_listing_them() -> None:
    assert len(C.BENCHMARK) == 14 and "frost" not in C.CORRUPTIONS
    assert set(C.BENCHMARK) | set(C.EXTRA) == set(C.CORRUPTIONS)
    assert tuple(C.CORRUPTIONS) == options.CORRUPTIONS, "the registry and the recipe's names"
    assert resolve_corruptions(["contrast", "all", "contrast"]) == (
        "contrast",
        *(n for n in C.BENCHMARK if n != "contrast"),
    )
    with pytest.raises(ValueError, match=r"unknown corruption 'frost'; available: \[.*'fog'"):
        resolve_corruptions(["frost"])
    for bad in (0, 6, True, 2.0):
        with pytest.raises(ValueError, match=r"severity must be one of \[1, 2, 3, 4, 5\]"):
            C.corrupt(np.zeros((8, 8), np.uint8), "contrast", bad)
    with pytest.raises(ValueError, match="must be uint8"):
        C.corrupt(np.zeros((8, 8), np.float32), "contrast", 1)
    with pytest.raises(ValueError, match=r"\(H, W\), \(H, W, 1\) or \(H, W, 3\)"):
        C.corrupt(np.zeros((8, 8, 4), np.uint8), "contrast", 1)


def test_reference_formulas_and_parameters() -> None:
    """CIFAR-10-C's formulas with its severity parameters, rounded to uint8."""
    image = _images(1, 3, (32, 32))[0]
    x = image / 255.0

    def u8(y: np.ndarray) -> np.ndarray:
        return np.rint(np.clip(y, 0, 1) * 255).astype(np.uint8)

    means = x.mean(axis=(0, 1), keepdims=True)
    assert np.array_equal(C.corrupt(image, "contrast", 5), u8((x - means) * 0.15 + means))
    z = np.random.default_rng(7).standard_normal(x.shape)
    assert np.array_equal(C.corrupt(image, "gaussian_noise", 2, 7), u8(x + 0.06 * z))
    # Brightness: HSV value + 0.3 with hue and saturation kept.
    v = x.max(axis=-1, keepdims=True)
    brighter = u8(x * np.minimum(v + 0.3, 1) / v).astype(int)
    assert np.abs(C.corrupt(image, "brightness", 5) - brighter).max() <= 1  # float rounding
    # Pixelate: box-downscale to 65 % (20 px) and back with Pillow.
    small = Image.fromarray(image).resize((20, 20), Image.BOX).resize((32, 32), Image.BOX)
    assert np.array_equal(C.corrupt(image, "pixelate", 5), np.asarray(small))
    # Impulse noise: about 7 % of the values set to 0 or 255 at severity 5.
    flipped = C.corrupt(image, "impulse_noise", 5, 3) != image
    assert 0.05 < flipped.mean() < 0.09


@pytest.mark.parametrize("name", NOISE)
@pytest.mark.parametrize("channels", [1, 3])
def test_same_seed_same_pixels_other_seed_other_pixels(name: str, channels: int) -> None:
    images = _images(4, channels)
    first = C.corrupt_images(images, name, 3, seed=0)
    again = C.corrupt_images(images, name, 3, seed=0)
    other = C.corrupt_images(images, name, 3, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    # Image i depends only on (seed, corruption, i): a subset in another order agrees.
    subset = C.corrupt_images(images[[3, 1]], name, 3, seed=0, indices=[3, 1])
    assert np.array_equal(subset[0], first[3]) and np.array_equal(subset[1], first[1])
    # Two images of a set get different noise.
    twins = C.corrupt_images(np.repeat(images[:1], 2, axis=0), name, 3, seed=0)
    assert not np.array_equal(twins[0], twins[1])


@pytest.mark.parametrize("name", MONOTONE)
@pytest.mark.parametrize("channels", [1, 3])
def test_pixel_change_grows_with_severity(name: str, channels: int) -> None:
    images = _images(4, channels)
    change = [
        np.mean(
            [_change(c, i) for c, i in zip(C.corrupt_images(images, name, s), images, strict=True)]
        )
        for s in C.SEVERITIES
    ]
    assert all(b > a for a, b in itertools.pairwise(change)), change
    assert change[0] > 0


@pytest.mark.parametrize("name", list(C.CORRUPTIONS))
def test_shapes_and_dtypes_for_one_and_three_channels(name: str) -> None:
    for shape in [(28, 28), (28, 28, 1), (32, 32, 3), (20, 45, 3), (48, 40, 1)]:
        image = _images(1, shape[2] if len(shape) == 3 else 1, shape[:2], seed=len(shape))[0]
        image = image.reshape(shape)
        for severity in (1, 5):
            out = C.corrupt(image, name, severity, C.image_rng(0, name, 0))
            assert out.shape == shape and out.dtype == np.uint8, (shape, severity)
        assert _change(out, image) > 0.05, (name, shape)  # severity 5 changes the image


# ---------------------------------------------------------------------------------------------
# Dataset wrapper and cache
# ---------------------------------------------------------------------------------------------


def _base(channels: int = 3, n: int = 6, seed: int = 0) -> ArrayImages:
    images = _images(n, channels, (16, 16), seed)
    return ArrayImages(images, np.arange(n) % 3, identity=f"test-set-{seed}", channels=channels)


def test_corrupted_images_wrap_the_base_set_and_feed_the_eval_transform(tmp_path: Path) -> None:
    base = _base(channels=1)
    data = C.CorruptedImages(base, "shot_noise", 4, seed=2, cache_dir=tmp_path, progress=False)
    assert len(data) == len(base) and data.channels == 1
    assert data.class_names == base.class_names and np.array_equal(data.labels, base.labels)
    assert data.identity == "test-set-0|corrupt:shot_noise:4:2"
    image, label = data[5]
    assert image.shape == (16, 16, 1) and image.dtype == np.uint8 and label == base[5][1]
    expected = C.corrupt(base[5][0], "shot_noise", 4, C.image_rng(2, "shot_noise", 5))
    assert np.array_equal(image, expected)
    x, _ = TransformedImages(data, eval_transform((24, 24), [0.5], [0.25]))[0]
    assert x.shape == (1, 24, 24) and x.dtype == torch.float32
    with pytest.raises(ValueError, match="unknown corruption 'rain'"):
        C.CorruptedImages(base, "rain", 1, cache_dir=False)


def test_second_construction_reads_the_cache_instead_of_corrupting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    original = C.corrupt

    def counting(*args, **kwargs):
        calls.append(args[1:3])
        return original(*args, **kwargs)

    monkeypatch.setattr(C, "corrupt", counting)
    base = _base()
    first = C.CorruptedImages(base, "glass_blur", 2, cache_dir=tmp_path, progress=False)
    assert len(calls) == len(base) and not first.from_cache
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 2 and files[0].startswith("glass_blur/s2-seed0-")  # .npy + .npz index
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))

    calls.clear()
    second = C.CorruptedImages(base, "glass_blur", 2, cache_dir=tmp_path, progress=False)
    assert calls == [] and second.from_cache
    for i in range(len(base)):
        assert np.array_equal(first[i][0], second[i][0])

    # Another severity, seed or image content is another cache entry.
    C.CorruptedImages(base, "glass_blur", 3, cache_dir=tmp_path, progress=False)
    C.CorruptedImages(base, "glass_blur", 2, seed=1, cache_dir=tmp_path, progress=False)
    same_identity = ArrayImages(_images(6, 3, (16, 16), seed=9), base.labels, identity="test-set-0")
    C.CorruptedImages(same_identity, "glass_blur", 2, cache_dir=tmp_path, progress=False)
    assert len(calls) == 3 * len(base)

    # A damaged pixel file is ignored and rewritten.
    pixels = first.cache_path.with_suffix(".npy")
    pixels.write_bytes(pixels.read_bytes()[:-10])
    calls.clear()
    again = C.CorruptedImages(base, "glass_blur", 2, cache_dir=tmp_path, progress=False)
    assert len(calls) == len(base) and np.array_equal(again[0][0], first[0][0])


def test_default_cache_dir_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/cache")
    assert C.default_cache_dir() == Path("/somewhere/cache/fseb_ft/corruptions")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert C.default_cache_dir() == Path.home() / ".cache" / "fseb_ft" / "corruptions"


# ---------------------------------------------------------------------------------------------
# Recipe keys
# ---------------------------------------------------------------------------------------------


def _eval(**keys) -> object:
    return recipe_from_dict({"data": {"train": {"source": "sklearn_digits"}}, "eval": keys}).eval


def test_eval_config_validates_and_resolves_corruptions() -> None:
    cfg = _eval()
    assert cfg.corruptions == () and cfg.severities == (1, 2, 3, 4, 5)
    assert cfg.corruption_seed == 0 and cfg.corruption_cache is None
    assert _eval(corruptions="all").corruptions == C.BENCHMARK
    cfg = _eval(corruptions=["contrast", "gaussian_noise", "contrast"], severities=[5, 1, 5])
    assert cfg.corruptions == ("contrast", "gaussian_noise") and cfg.severities == (1, 5)
    with pytest.raises(ConfigError, match=r"eval.corruptions=\['frost'\]: unknown .*available"):
        _eval(corruptions=["frost"])
    with pytest.raises(ConfigError, match=r"eval.severities=\(0, 3\): must be .* in 1..5"):
        _eval(severities=[0, 3])
    with pytest.raises(ConfigError, match=r"eval.severities=\(\): must be a non-empty list"):
        _eval(severities=[])
    with pytest.raises(ConfigError, match=r"eval.corruption_seed=-1: must be ≥ 0"):
        _eval(corruption_seed=-1)
    assert _eval().corruption_limit is None and _eval(corruption_limit=500).corruption_limit == 500
    with pytest.raises(ConfigError, match=r"eval.corruption_limit=0: must be ≥ 1 or null"):
        _eval(corruption_limit=0)


# ---------------------------------------------------------------------------------------------
# Reporting and end to end
# ---------------------------------------------------------------------------------------------


def _fake_results() -> dict:
    metrics = {"accuracy": 0.9, "nll": 0.3, "ece": 0.02, "sel_pred_auc": 0.95, "n": 10}
    per = {
        name: {str(s): {**metrics, "accuracy": 0.9 - 0.1 * s - d} for s in (1, 3, 5)}
        for name, d in (("contrast", 0.0), ("fog", 0.05))
    }
    return {"test": metrics, "corruptions": per}


def test_corruption_plot_and_tables(tmp_path: Path) -> None:
    results = _fake_results()
    path = plots.corruption_plot(results["corruptions"], tmp_path / "c.png", clean=results["test"])
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) > 500
    md = corruption_markdown(results)
    assert "| clean | 90.00 | 0.3000 | 2.00 | 95.00 |" in md
    assert "| 3 | 57.50 |" in md  # mean of 60 % and 55 %
    assert "| fog | 75.00 / 2.00 | 55.00 / 2.00 | 35.00 / 2.00 |" in md
    assert corruption_markdown({"test": results["test"]}) == ""


def test_the_clean_row_is_taken_on_the_images_that_were_corrupted() -> None:
    # Every image is predicted class 0: the corrupted subset (images 0, 1, both class 0) is
    # right, the whole split half right. A corruption that changes nothing must not read as a
    # rise from 50 % to 100 %.
    log_probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]]).double().log()
    labels = torch.tensor([0, 0, 1, 1])
    results = evaluate_predictions(
        Predictions(
            test=(log_probs, labels),
            corruptions={"fog": {3: log_probs[:2]}},
            corruption_index=torch.tensor([0, 1]),
        )
    )
    assert results["test"]["accuracy"] == 0.5 and results["test"]["n"] == 4
    same = pytest.approx(results["corruptions"]["fog"]["3"], nan_ok=True)  # one class: AUROC nan
    assert results["corruption_clean"] == same  # n = 2 included
    assert clean_reference(results) is results["corruption_clean"]
    assert "| clean | 100.00 |" in corruption_markdown(results)


def test_temperature_scaling_rescales_the_corruptions_as_if_from_their_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(40, 3, generator=gen, dtype=torch.float64) * 3  # (N, K) test logits
    zc = torch.randn(20, 3, generator=gen, dtype=torch.float64) * 3  # (N_c, K) corrupted logits
    # Labels that mostly follow the logits: the fitted T is then finite and far from 1.
    noise = torch.randint(0, 3, (40,), generator=gen)
    labels = torch.where(torch.rand(40, generator=gen) < 0.7, z.argmax(-1), noise)  # (N,)
    index_c = torch.arange(20)  # the corrupted images: the first 20
    predictions = Predictions(
        test=(z.log_softmax(-1), labels),
        corruptions={"fog": {2: zc.log_softmax(-1)}},
        corruption_index=index_c,
        test_logits=z,
        val=(z[:30].float(), labels[:30]),
    )
    scaled = predictions.scaled(2.5)
    # Only log-probabilities are kept for corruptions; softmax ignores their per-image shift.
    torch.testing.assert_close(scaled.corruptions["fog"][2], (zc / 2.5).log_softmax(-1))
    assert scaled.corruption_index is index_c
    ts = temperature_scaled_results(predictions)
    assert "note" not in ts and abs(ts["temperature"] - 1.0) > 0.2
    expected = evaluate_predictions(
        Predictions(
            test=(z.log_softmax(-1), labels),
            corruptions={"fog": {2: (zc / ts["temperature"]).log_softmax(-1)}},
            corruption_index=index_c,
        )
    )
    assert ts["corruptions"]["fog"]["2"]["nll"] == pytest.approx(
        expected["corruptions"]["fog"]["2"]["nll"]
    )
    # The summary is rebuilt from the rescaled predictions too (accuracy would not show it).
    assert ts["corruption_summary"]["all"]["ece"] == pytest.approx(
        expected["corruptions"]["fog"]["2"]["ece"]
    )
    assert ts["corruption_summary"]["all"]["ece"] != pytest.approx(
        evaluate_predictions(
            Predictions(
                test=(z.log_softmax(-1), labels),
                corruptions={"fog": {2: zc.log_softmax(-1)}},
                corruption_index=index_c,
            )
        )["corruption_summary"]["all"]["ece"]
    )


def test_corruption_table_puts_each_temperature_scaled_row_under_its_own() -> None:
    results = _fake_results()
    scaled = {**results["test"], "nll": 0.25}
    results["temperature_scaled"] = {
        "temperature": 1.5,
        "test": scaled,
        "corruption_summary": {"1": scaled, "3": scaled, "5": scaled, "all": scaled},
    }
    lines = corruption_markdown(results).splitlines()
    labels = [line.split(" | ")[0].removeprefix("| ") for line in lines if line.startswith("| ")]
    assert labels[:11] == [
        "Severity", "clean", "clean + TS", "1", "1 + TS", "3", "3 + TS", "5", "5 + TS",
        "all severities", "all severities + TS",
    ]  # fmt: skip
    assert "| 3 + TS | 90.00 | 0.2500 |" in "\n".join(lines)


def test_run_reports_every_corruption_and_severity_and_reevaluates_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The corruption figures are checked here; the others would cost seconds, not behaviour.
    for module in (report_module, ensemble_module):
        monkeypatch.setattr(module, "write_plots", lambda *args, **kwargs: [])
        monkeypatch.setattr(module, "write_confusion_plot", lambda *args, **kwargs: None)
    root = tmp_path / "data"
    write_image_folder(root / "ind", "train", {"cat": 12, "dog": 12, "fox": 12})
    write_image_folder(root / "ind", "test", {"cat": 5, "dog": 4, "fox": 4})
    write_image_folder(root / "ood", "test", {"owl": 5})
    out, cache = tmp_path / "run", tmp_path / "cache"
    recipe = tiny_recipe({"ind": root / "ind", "ood": root / "ood"}, out, epochs=1)
    recipe["fseb"]["reg_scale"] = 0.0  # PS-MAP: the same evaluation, a faster loop
    recipe["eval"] |= {
        "corruptions": ["gaussian_noise", "contrast"],
        "severities": [1, 5],
        "corruption_cache": str(cache),
    }
    results = run(recipe_from_dict(recipe))

    saved = json.loads((out / "results.json").read_text())
    assert set(saved["corruptions"]) == {"gaussian_noise", "contrast"}
    for by_severity in saved["corruptions"].values():
        assert set(by_severity) == {"1", "5"}
        for metrics in by_severity.values():
            assert metrics["n"] == N_TEST
            assert {"accuracy", "nll", "ece", "sel_pred_auc"} <= set(metrics)
    assert set(saved["corruption_summary"]) == {"1", "5", "all"}
    mean_acc = np.mean([saved["corruptions"][n]["5"]["accuracy"] for n in saved["corruptions"]])
    assert saved["corruption_summary"]["5"]["accuracy"] == pytest.approx(mean_acc)
    assert saved["test"]["n"] == N_TEST and "owls" in saved["ood"]  # the rest is unchanged
    assert (out / CORRUPTION_PLOT).is_file()
    assert "## Covariate shift: corrupted test split" in (out / "results.md").read_text()
    assert len(list(cache.rglob("*.npy"))) == 4

    # Re-evaluation reads the corrupted images from the cache and gives the same numbers; an
    # eval override adds a severity without touching recipe.yaml.
    calls = []
    original = C.corrupt
    monkeypatch.setattr(C, "corrupt", lambda *a, **k: calls.append(a[1:3]) or original(*a, **k))
    evaluated = evaluate_run_with_predictions(
        out, cpu=True, overrides=["eval.severities=[1, 3, 5]"]
    )
    again = evaluated.results
    assert calls == [("gaussian_noise", 3)] * N_TEST + [("contrast", 3)] * N_TEST
    for name, by_severity in results["corruptions"].items():
        assert set(again["corruptions"][name]) == {"1", "3", "5"}
        for sev, metrics in by_severity.items():
            for key, value in metrics.items():
                assert again["corruptions"][name][sev][key] == pytest.approx(value, abs=1e-9)
    assert "severities:\n  - 1\n  - 5\n" in (out / "recipe.yaml").read_text()

    # eval.corruption_limit corrupts a stratified subset: the clean test split stays whole, and
    # a deterministic corruption gives the full run's predictions at the chosen indices.
    subset = evaluate_run_with_predictions(out, cpu=True, overrides=["eval.corruption_limit=6"])
    limited = subset.results
    assert limited["test"]["n"] == N_TEST
    labels = evaluated.predictions.test[1]  # (N_TEST,)
    keep = torch.as_tensor(stratified_split(labels.numpy(), 6 / N_TEST, seed=0)[1])  # (6,)
    assert len(keep) == 6 and set(labels[keep].tolist()) == {0, 1, 2}
    assert torch.equal(subset.predictions.corruption_index, keep)
    # The clean row is taken on the same 6 images, so corrupted and clean rows compare alike.
    clean = classification_metrics(evaluated.predictions.test[0][keep], labels[keep])
    assert limited["corruption_clean"]["n"] == 6
    assert limited["corruption_clean"]["accuracy"] == pytest.approx(float(clean["accuracy"]))
    for sev in ("1", "5"):
        assert limited["corruptions"]["contrast"][sev]["n"] == 6
    full_lp = evaluated.predictions.corruptions["contrast"][5]  # (N_TEST, K)
    assert torch.allclose(subset.predictions.corruptions["contrast"][5], full_lp[keep], atol=1e-6)

    # An ensemble averages the corruptions and severities its members share.
    other = tmp_path / "run-seed1"
    recipe["output"]["dir"], recipe["train"]["seed"] = str(other), 1
    recipe["eval"]["severities"] = [5]
    run(recipe_from_dict(recipe))
    ensemble = evaluate_ensemble([out, other], tmp_path / "ensemble", cpu=True)
    assert {n: set(s) for n, s in ensemble["corruptions"].items()} == {
        "gaussian_noise": {"5"},
        "contrast": {"5"},
    }
    for member in ensemble["members"].values():
        assert set(member["corruptions"]) == {"gaussian_noise", "contrast"}
    assert (tmp_path / "ensemble" / CORRUPTION_PLOT).is_file()
    assert "Covariate shift" in (tmp_path / "ensemble" / "results.md").read_text()


def test_evaluate_cli_only_overrides_evaluation_settings(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        evaluate_main(["some_run", "--set", "train.epochs=3"])
    assert "--set takes eval.KEY=VALUE" in capsys.readouterr().err
