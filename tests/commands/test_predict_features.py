"""`fseb-ft predict --ood-score mahalanobis|relative_mahalanobis|knn|vim`: a tiny run whose
evaluation computed the feature scores keeps their fit, and predict scores its test images with
it, image for image as the evaluation did; a model without the fit stops with the command that
writes it, and `fseb-ft evaluate` writes it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fseb_ft import cli
from fseb_ft.engine.reevaluate import evaluate_run
from fseb_ft.engine.run import run_with_predictions
from fseb_ft.evaluation.feature_ood import FeatureOodFit, fit_tensors
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.prediction import loading, predict_images
from fseb_ft.prediction.loading import load_model
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.recipe.options import FEATURE_OOD_SCORES
from fseb_ft.runs.feature_fit import read_feature_fit, write_feature_fit
from fseb_ft.runs.rundir import FEATURE_OOD_FIT, read_json
from tests.helpers import LogProbs, skip_figures

SCORES = ["entropy", *FEATURE_OOD_SCORES]
TEST_SPEC = {"source": "sklearn_digits", "split": "test", "classes": [0, 1, 2]}
SPEC_TEXT = "{source: sklearn_digits, split: test, classes: [0, 1, 2]}"  # the same, for --dataset
EVAL_BATCH = 256  # predict in the evaluation's batches: the same features, bit for bit on CPU


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Predictions]:
    """A one-epoch PS-MAP run of the paper's CNN on digits 0-2 scored by every feature score,
    and the predictions its evaluation made."""
    out = tmp_path_factory.mktemp("run") / "digits"
    recipe = {
        "model": {"name": "fseb_cnn", "pretrained": False},
        "data": {
            "train": {"source": "sklearn_digits", "split": "train", "classes": [0, 1, 2]},
            "test": TEST_SPEC,
            "channels": 1,
            "val_fraction": 0.3,
            "batch_size": 32,
            "num_workers": 0,
        },
        "fseb": {"reg_scale": 0.0},
        "optim": {"lr": 0.05},
        "train": {"epochs": 1, "cpu": True},
        "eval": {"ood_scores": SCORES, "batch_size": EVAL_BATCH},
        "output": {"dir": str(out)},
    }
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        predictions = run_with_predictions(recipe_from_dict(recipe)).predictions
    return out, predictions


def _scores(model: object, name: str) -> Tensor:
    """The ``ood_<name>`` column of predict's rows for the run's test images."""
    found = predict_images(
        model, dataset=TEST_SPEC, ood=name, batch_size=EVAL_BATCH, threshold=0.5, progress=False
    )
    assert found.meta["ood_score"] == name
    return torch.tensor([row[f"ood_{name}"] for row in found.rows], dtype=torch.float64)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", *argv, "--no-progress"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("name", FEATURE_OOD_SCORES)
def test_predict_gives_each_test_image_the_feature_score_the_evaluation_gave_it(
    evaluated: tuple[Path, Predictions], name: str
) -> None:
    run_dir, predictions = evaluated
    want = predictions.test_feature_scores[name]  # (N,) float64, the evaluation's
    torch.testing.assert_close(_scores(run_dir, name), want, rtol=1e-6, atol=1e-9)


def test_the_run_keeps_the_fit_its_evaluation_scored_with_and_lists_its_scores(
    evaluated: tuple[Path, Predictions],
) -> None:
    run_dir, predictions = evaluated
    fit = predictions.feature_fit
    assert fit is not None and fit.weight is not None  # a linear head: ViM's part is fitted
    kept = read_feature_fit(run_dir / FEATURE_OOD_FIT)
    for key, value in fit_tensors(fit).items():
        stored = fit_tensors(kept)[key]
        assert stored.dtype == value.dtype and torch.equal(stored, value.cpu()), key
    assert kept.train_unit.dtype == torch.float32  # the N × D bulk; the rest float64
    assert (kept.k, kept.alpha) == (fit.k, fit.alpha)
    fseb = read_json(run_dir / "model" / "fseb.json")
    assert fseb["feature_ood_scores"] == list(FEATURE_OOD_SCORES)


def test_the_command_names_the_score_in_its_rows_meta_and_summary(
    evaluated: tuple[Path, Predictions], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = evaluated
    out = tmp_path / "p.csv"
    cli.main(["predict", str(run_dir), "--dataset", SPEC_TEXT, "--ood-score", "knn",
              "--out", str(out), "--batch-size", str(EVAL_BATCH), "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "OOD score: ood_knn, k-th nearest-neighbour distance (penultimate features), fitted" in (
        printed
    )
    assert read_json(tmp_path / "p.meta.json")["ood_score"] == "knn"
    header = out.read_text().splitlines()[0].split(",")
    assert "ood_knn" in header and "ood_entropy" not in header
    default = predict_images(run_dir, dataset=TEST_SPEC, threshold=0.5, progress=False)
    assert default.meta["ood_score"] == "entropy"  # the default stays a score of the outputs


def test_a_predictor_around_the_network_is_scored_by_the_networks_features(
    evaluated: tuple[Path, Predictions],
) -> None:
    run_dir, predictions = evaluated
    loaded = load_model(run_dir)
    wrapped = dataclasses.replace(loaded, model=LogProbs(loaded.model), network=loaded.model)
    torch.testing.assert_close(
        _scores(wrapped, "vim"), predictions.test_feature_scores["vim"], rtol=1e-6, atol=1e-9
    )


@pytest.mark.no_figures  # of the re-evaluation: it is about the feature fit
def test_without_the_fit_predict_names_the_evaluate_command_which_writes_it(
    evaluated: tuple[Path, Predictions], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, predictions = evaluated
    old = shutil.copytree(run_dir, tmp_path / "old", ignore=shutil.ignore_patterns("checkpoints"))
    (old / FEATURE_OOD_FIT).unlink()  # a run evaluated before runs kept the fit
    message = _fails([str(old), "--dataset", SPEC_TEXT, "--ood-score", "mahalanobis"], capsys)
    assert "and run " + str(old) + " keeps none: run `fseb-ft evaluate " + str(old) in message
    assert "eval.ood_scores=[entropy,mahalanobis,relative_mahalanobis,knn,vim]`" in message
    folder = shutil.copytree(old / "model", tmp_path / "exported")
    message = _fails([str(folder), "--dataset", SPEC_TEXT, "--ood-score", "knn"], capsys)
    assert f"model folder {folder} keeps none" in message and "it was exported from" in message
    evaluate_run(old, cpu=True)  # re-evaluation fits and keeps it, and fseb.json lists it
    assert read_json(old / "model" / "fseb.json")["feature_ood_scores"] == list(FEATURE_OOD_SCORES)
    want = predictions.test_feature_scores["mahalanobis"]  # the same weights, so the same fit
    torch.testing.assert_close(_scores(old, "mahalanobis"), want, rtol=1e-6, atol=1e-9)


def test_a_hub_model_without_the_fit_names_the_push_and_is_not_downloaded(
    evaluated: tuple[Path, Predictions],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir, _ = evaluated
    folder = shutil.copytree(run_dir / "model", tmp_path / "repo")
    (folder / FEATURE_OOD_FIT.name).unlink()
    fseb = read_json(folder / "fseb.json") | {"feature_ood_scores": []}  # as exported without it
    (folder / "fseb.json").write_text(json.dumps(fseb))
    downloads: list[str] = []

    def download(repo: str, name: str, revision: str | None = None) -> str:
        downloads.append(name)
        return str(folder / name)

    create = loading.timm.create_model
    monkeypatch.setattr(
        loading.timm, "create_model", lambda *a, **kw: create(f"local-dir:{folder}", **kw)
    )
    monkeypatch.setattr(loading, "hf_hub_download", download)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # no request at all
    message = _fails(["hf-hub:someone/digits", "--dataset", SPEC_TEXT, "--ood-score", "vim"],
                     capsys)  # fmt: skip
    assert "hf-hub:someone/digits keeps none" in message
    assert "then `fseb-ft push RUN someone/digits`" in message
    assert downloads == ["fseb.json"]


def test_a_fit_of_other_weights_is_refused(
    evaluated: tuple[Path, Predictions], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, predictions = evaluated
    fit = predictions.feature_fit
    assert isinstance(fit, FeatureOodFit) and fit.weight is not None
    copy = shutil.copytree(run_dir, tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoints"))
    write_feature_fit(copy, dataclasses.replace(fit, weight=fit.weight + 1))
    message = _fails([str(copy), "--dataset", SPEC_TEXT, "--ood-score", "knn"], capsys)
    assert "feature OOD fit was made for other weights than its own" in message
