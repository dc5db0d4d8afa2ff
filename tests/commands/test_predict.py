"""`fseb-ft predict`: a tiny trained run predicts a folder of PNGs, abstaining below a threshold
chosen on its validation split; model folders, JSON Lines, datasets and the errors a user makes."""

from __future__ import annotations

import builtins
import csv
import errno
import io
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import SafetensorError

import fseb_ft
import fseb_ft.predict as predict_module
from fseb_ft import api, cli
from fseb_ft.data.sources import build_splits
from fseb_ft.data.sources.sklearn_digits import load_sklearn_digits
from fseb_ft.data.transforms import eval_transform
from fseb_ft.evaluation.conformal import calibrate
from fseb_ft.evaluation.predictions import eval_loader
from fseb_ft.evaluation.selective import top_class_log_odds
from fseb_ft.finetune import run
from fseb_ft.prediction import loading as predictor
from fseb_ft.prediction import validation
from fseb_ft.prediction.loading import load_model
from fseb_ft.prediction.requests import LoadRequest, PredictRequest, RowRequest, RuleRequest
from fseb_ft.prediction.rows import format_rows, write_predictions
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs import rundir
from fseb_ft.runs.loading import load_run_model
from fseb_ft.runs.rundir import VAL_LOGITS, read_json, read_run, read_val_logits
from tests.helpers import digits_recipe, snapshot

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py

COLUMNS = ["image", "prediction", "probability", "log_odds", "abstain", "entropy", "ood_entropy"]
N_GOOD = 12  # readable PNGs in the image folder


def train_tiny_run(out: Path) -> Path:
    """A one-epoch PS-MAP run of the paper's CNN on digits 0-2, with temperature scaling."""
    run(recipe_from_dict(digits_recipe(out, temperature_scaling=True)))
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_run(tmp_path_factory.mktemp("run") / "digits")


def read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``folder`` read-only: ``chmod -R a-w``. Root writes through that, so for root the
    calls that create or replace files refuse paths inside ``folder``, raising what each raises
    in a read-only folder (checked without CAP_DAC_OVERRIDE): ``PermissionError`` from Python,
    ``SafetensorError`` naming ``os error 13`` from safetensors.
    """
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    if os.geteuid() != 0:
        return
    inside = folder.resolve()

    def permission_error(path: str) -> Exception:
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    def safetensors_error(path: str) -> Exception:
        return SafetensorError(
            f'Error while serializing: I/O error: Permission denied (os error 13) at path "{path}"'
        )

    def guard(
        call: Callable[..., Any],
        error: Callable[[str], Exception] = permission_error,
        writes: Callable[..., bool] = lambda *args, **kwargs: True,
    ) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            paths = [Path(a) for a in args if isinstance(a, str | os.PathLike)]
            if writes(*args, **kwargs) and any(p.resolve().is_relative_to(inside) for p in paths):
                raise error(str(paths[0]))
            return call(*args, **kwargs)

        return refused

    def writing(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> bool:
        return any(c in mode for c in "wax+")

    def creating(file: Any, flags: int, *args: Any, **kwargs: Any) -> bool:
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))

    monkeypatch.setattr(os, "open", guard(os.open, writes=creating))  # tempfile.mkstemp's
    monkeypatch.setattr(io, "open", guard(io.open, writes=writing))
    monkeypatch.setattr(builtins, "open", guard(builtins.open, writes=writing))
    monkeypatch.setattr(os, "replace", guard(os.replace))
    monkeypatch.setattr(os, "mkdir", guard(os.mkdir))
    monkeypatch.setattr(rundir, "save_file", guard(rundir.save_file, safetensors_error))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits as 8×8 PNGs in a folder and a subfolder, a text file and a broken PNG."""
    root = tmp_path_factory.mktemp("images")
    (root / "more").mkdir()
    digits = load_sklearn_digits([0, 1, 2], channels=1)
    for i in range(N_GOOD):
        image, _ = digits[i]  # (8, 8, 1) uint8
        Image.fromarray(image[:, :, 0]).save(root / ("more" if i % 2 else ".") / f"{i:02d}.png")
    (root / "notes.txt").write_text("not an image")
    (root / "broken.png").write_bytes(b"\x89PNG truncated")
    return root


def _predict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    cli.main(["predict", *argv, "--no-progress"])
    printed = capsys.readouterr()
    return printed.out + printed.err


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", *argv, "--no-progress"])
    assert stop.value.code in (1, 2)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _validation_confidence(run_dir: Path, temperature: float) -> torch.Tensor:
    """Top-class log-odds on the validation split, by the evaluation path (build_splits)."""
    recipe, info = read_run(run_dir)
    model = load_run_model(run_dir, recipe, info).eval()
    val = build_splits(recipe.data, recipe.train.seed).val
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in eval_loader(val, info.input, 64, 0, 0)])
    return top_class_log_odds(logits, temperature)  # (N_v,)


def test_each_option_value_has_its_own_name_in_the_help() -> None:
    # --conformal's coverage and --confidence's probability are different things.
    valued = [a for a in predict_module._parser("p")._actions if a.metavar]
    named = {a.metavar: a.dest for a in valued}
    assert named["P"] == "conformal" and named["C"] == "confidence"
    assert len(named) == len(valued)  # no two options share a name


def test_folder_to_csv_with_validation_coverage_within_one_image(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "predictions.csv"
    printed = _predict([str(run_dir), str(images), "--out", str(out), "--coverage", "0.8"], capsys)
    rows = _read_csv(out)
    assert list(rows[0]) == [*COLUMNS, "top1", "top1_probability", "top2", "top2_probability",
                             "top3", "top3_probability"]  # fmt: skip
    assert len(rows) == N_GOOD and {Path(r["image"]).name for r in rows} == {
        f"{i:02d}.png" for i in range(N_GOOD)
    }
    meta = read_json(tmp_path / "predictions.meta.json")
    rule, val = meta["abstention"], meta["abstention"]["validation"]
    temperature = read_json(run_dir / "results.json")["temperature_scaled"]["temperature"]
    assert meta["temperature"] == rule["temperature"] == temperature
    # The threshold, applied to the validation split as evaluation predicts it, accepts the
    # ⌈0.8 N⌉ most confident images: within one image of the target.
    confidence = _validation_confidence(run_dir, temperature)
    accepted = int((confidence >= rule["log_odds_threshold"] - 1e-9).sum())
    assert accepted == val["accepted"] and val["n"] == len(confidence)
    assert abs(accepted - 0.8 * len(confidence)) <= 1
    for row in rows:
        assert (row["abstain"] == "True") == (float(row["log_odds"]) < rule["log_odds_threshold"])
        assert float(row["probability"]) == pytest.approx(
            1 / (1 + math.exp(-float(row["log_odds"])))
        )
        assert row["prediction"] == row["top1"]
    assert f"validation: coverage {val['coverage']:.4f} ({accepted}/{val['n']} images)" in printed
    assert "1 unreadable image(s) left out" in printed and "broken.png" in printed
    assert "notes.txt" in printed and meta["left_out"] == [str(images / "notes.txt")]
    assert not (run_dir / "abstention.json").exists()  # a query, not a change of the run


def test_coverage_holds_where_probabilities_round_to_one(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.csv"
    # T = 1e-4 multiplies the logits by 10⁴: nearly every probability is exactly 1.0.
    printed = _predict([str(run_dir), str(images), "--coverage", "0.8", "--temperature", "1e-4",
                        "--out", str(out)], capsys)  # fmt: skip
    assert sum(float(r["probability"]) == 1.0 for r in _read_csv(out)) >= N_GOOD // 2
    val = read_json(tmp_path / "p.meta.json")["abstention"]["validation"]
    assert abs(val["accepted"] - 0.8 * val["n"]) <= 1
    assert "warning:" not in printed  # a temperature asked for is not a fit that went wrong


def test_probabilities_are_temperature_scaled_and_the_preprocessing_is_evaluations(
    run_dir: Path, images: Path
) -> None:
    recipe, info = read_run(run_dir)
    model = load_run_model(run_dir, recipe, info).eval()
    temperature = read_json(run_dir / "results.json")["temperature_scaled"]["temperature"]
    image = np.array(Image.open(images / "00.png"))[:, :, None]  # (8, 8, 1)
    x = eval_transform(info.input.size, info.input.mean, info.input.std)(image=image)["image"]
    with torch.no_grad():
        logits = model(x[None]).double()  # (1, K)
    scaled = api.predict_images(run_dir, images / "00.png", threshold=0.5, progress=False)
    raw = fseb_ft.predict_images(
        run_dir, [images / "00.png"], threshold=0.5, temperature=1.0, progress=False
    )
    for result, t in ((scaled, temperature), (raw, 1.0)):
        probs = torch.softmax(logits / t, -1)[0]  # (K,)
        assert result.rows[0]["probability"] == pytest.approx(float(probs.max()), rel=1e-5)
        assert result.rows[0]["prediction"] == info.class_names[int(probs.argmax())]
    assert scaled.rows[0]["probability"] != pytest.approx(raw.rows[0]["probability"])


def test_a_request_predicts_as_the_keyword_arguments_do(run_dir: Path, images: Path) -> None:
    keywords = fseb_ft.predict_images(
        run_dir, images, coverage=0.8, top_k=2, ood="energy", conformal=0.9, progress=False
    )
    request = PredictRequest(
        load=LoadRequest(progress=False),
        rule=RuleRequest(coverage=0.8),
        rows=RowRequest(top_k=2, ood="energy", conformal=0.9),
    )
    asked = fseb_ft.predict_images(run_dir, images, request=request)
    assert asked.rows == keywords.rows and asked.meta == keywords.meta
    assert {"top2", "ood_energy", "set"} <= set(asked.rows[0]) and "top3" not in asked.rows[0]
    assert asked.meta["abstention"]["target"] == 0.8


def test_a_16_bit_image_is_predicted_as_its_8_bit_pixels_not_as_white(
    run_dir: Path, images: Path, tmp_path: Path
) -> None:
    pixels = np.array(Image.open(images / "00.png"))  # (8, 8) uint8
    Image.fromarray(pixels.astype(np.uint16) * 257).save(tmp_path / "16.png")  # v·257 >> 8 = v
    Image.fromarray(np.full_like(pixels, 255)).save(tmp_path / "white.png")
    with Image.open(tmp_path / "16.png") as image:
        assert image.mode == "I;16"
    files = [images / "00.png", tmp_path / "16.png", tmp_path / "white.png"]
    rows = fseb_ft.predict_images(run_dir, files, threshold=0.5, progress=False).rows
    assert len(rows) == 3 and rows[1]["prediction"] == rows[0]["prediction"]
    assert rows[1]["probability"] == pytest.approx(rows[0]["probability"], rel=1e-6)
    assert rows[1]["probability"] != pytest.approx(rows[2]["probability"], rel=1e-3)  # not white


def test_max_risk_is_kept_with_the_run_and_its_model_folder_abstains_alike(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints"))
    out = tmp_path / "p.jsonl"
    argv = [str(copy), str(images), "--max-risk", "0.3", "--out", str(out), "--keep"]
    printed = _predict(argv, capsys)
    rule = read_json(tmp_path / "p.meta.json")["abstention"]
    assert rule["criterion"] == "max_risk" and rule["validation"]["risk"] <= 0.3
    assert "chosen on the validation split for risk ≤ 0.3" in printed
    kept_in = copy / "abstention.json"
    assert f"kept in {kept_in}: later `predict` calls and the model card use it" in printed
    assert read_json(tmp_path / "p.meta.json")["kept_in"] == str(kept_in)
    kept = read_json(copy / "abstention.json")
    assert kept["threshold"] == rule["threshold"]
    assert read_json(copy / "model" / "fseb.json")["abstention"] == kept
    card = (copy / "model" / "README.md").read_text()
    assert "fseb-ft predict" in card and f"below **{rule['threshold']:.4g}**" in card

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == N_GOOD and set(lines[0]) >= {*COLUMNS, "top3_probability"}

    # The model folder alone (as exported or pushed) keeps the run's threshold and temperature.
    folder = shutil.copytree(copy / "model", tmp_path / "exported")
    again = tmp_path / "again.jsonl"
    printed = _predict([str(folder), str(images), "--out", str(again)], capsys)
    assert "kept with the model" in printed
    meta = read_json(tmp_path / "again.meta.json")
    assert meta["abstention"]["threshold"] == rule["threshold"]
    assert meta["model"] == f"model folder {folder}"
    for a, b in zip(lines, (json.loads(x) for x in again.read_text().splitlines()), strict=True):
        assert a["abstain"] == b["abstain"] and a["prediction"] == b["prediction"]
        assert a["probability"] == pytest.approx(b["probability"], rel=1e-5)


def test_a_query_leaves_the_run_as_it_was(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    (copy / VAL_LOGITS).unlink(missing_ok=True)
    before = snapshot(copy)
    printed = _predict([str(copy), str(images), "--max-risk", "0.0001"], capsys)
    assert "kept in" not in printed
    after = snapshot(copy)
    after.pop(VAL_LOGITS, None)  # a cache of what validation predicts, not a behaviour
    assert after == before and not (copy / "abstention.json").exists()
    # The next plain call chooses its threshold afresh, as before the query.
    rule = api.predict_images(copy, images, progress=False).meta["abstention"]
    assert (rule["criterion"], rule["target"], rule["chosen_on"]) == ("coverage", 0.9, "validation")


def test_a_certified_max_risk_is_printed_kept_and_carded_with_its_cost(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    argv = [str(copy), str(images), "--max-risk", "0.3", "--confidence", "0.9", "--keep"]
    printed = _predict([*argv, "--out", str(tmp_path / "p.csv")], capsys)
    rule = read_json(tmp_path / "p.meta.json")["abstention"]
    cert = rule["certified"]
    assert (cert["confidence"], cert["method"]) == (0.9, "Clopper–Pearson, Learn-then-Test")
    assert "with probability ≥ 90 % (Clopper–Pearson, Learn-then-Test" in printed
    assert f"(empirical rule: {100 * cert['empirical_coverage']:.1f} %)" in printed
    assert rule["validation"]["coverage"] <= cert["empirical_coverage"]
    assert read_json(copy / "abstention.json")["certified"] == cert
    assert "over the draw of the validation split" in (copy / "model" / "README.md").read_text()
    empirical = api.predict_images(copy, images, max_risk=0.3, progress=False).meta["abstention"]
    assert rule["threshold"] >= empirical["threshold"]


def test_keep_stores_a_given_threshold_and_the_card_says_it_was_set_by_hand(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    _predict([str(copy), str(images / "00.png"), "--threshold", "0.6", "--keep"], capsys)
    assert read_json(copy / "abstention.json")["threshold"] == 0.6
    card = (copy / "model" / "README.md").read_text()
    assert "below **0.6**" in card and "set by hand; on the validation split it accepts" in card
    printed = _predict([str(copy), str(images / "00.png")], capsys)
    assert "abstain when max probability < 0.6" in printed and "kept with the model" in printed


def test_predict_only_reads_a_read_only_run(
    run_dir: Path,
    images: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    (copy / VAL_LOGITS).unlink(missing_ok=True)  # so the validation logits would be cached
    before = snapshot(copy)
    read_only(copy, monkeypatch)
    out = tmp_path / "p.csv"
    printed = _predict([str(copy), str(images), "--coverage", "0.8", "--out", str(out)], capsys)
    assert f"written to {out}" in printed and len(_read_csv(out)) == N_GOOD
    message = _fails([str(copy), str(images), "--coverage", "0.8", "--keep"], capsys)
    assert f"--keep could not write {copy / 'abstention.json'} (Permission denied)" in message
    assert snapshot(copy) == before


def test_a_second_choice_reuses_the_kept_validation_logits_until_the_weights_change(
    run_dir: Path, images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    (copy / VAL_LOGITS).unlink(missing_ok=True)
    first = api.predict_images(copy, images, coverage=0.8, progress=False)
    logits, labels = read_val_logits(copy)  # (N_v, K), (N_v,)
    recipe = read_run(copy)[0]
    assert labels.tolist() == build_splits(recipe.data, recipe.train.seed).val.labels.tolist()

    def no_second_pass(*args: object) -> None:
        raise AssertionError("the validation split was predicted again")

    monkeypatch.setattr(validation, "validation_split", no_second_pass)
    again = api.predict_images(copy, images, coverage=0.5, temperature=1.0, progress=False)
    rule, temperature = again.meta["abstention"], first.meta["temperature"]
    confidence = top_class_log_odds(logits, 1.0)  # (N_v,)
    assert rule["validation"]["accepted"] == int((confidence >= rule["log_odds_threshold"]).sum())
    assert abs(rule["validation"]["accepted"] - 0.5 * len(labels)) <= 1 and temperature != 1.0
    later = (copy / VAL_LOGITS).stat().st_mtime + 10
    os.utime(copy / "model" / "model.safetensors", (later, later))  # new best weights
    assert read_val_logits(copy) is None  # the logits are stale


def test_a_model_folder_takes_a_threshold_but_has_no_validation_split(
    run_dir: Path, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = shutil.copytree(run_dir / "model", tmp_path / "exported")
    message = _fails([str(folder), str(images), "--coverage", "0.9"], capsys)
    assert "chooses the threshold on a run's validation split" in message
    printed = _predict([str(folder), str(images / "00.png"), "--threshold", "0.99"], capsys)
    assert "validation: coverage and risk unknown" in printed
    assert "1 abstained" in printed
    printed = _predict([str(folder), str(images / "00.png")], capsys)
    assert "none kept or given, so nothing abstains" in printed and "0 abstained" in printed
    message = _fails([str(folder), str(images / "00.png"), "--threshold", "0.5", "--keep"], capsys)
    assert (
        f"--keep stores the threshold in a run folder (abstention.json), and MODEL is model "
        f"folder {folder}" in message
    )


def test_a_labelled_dataset_spec(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "{source: sklearn_digits, split: test, classes: [0, 1, 2]}"
    printed = _predict([str(run_dir), "--dataset", spec, "--threshold", "0"], capsys)
    assert "accuracy on the labelled dataset" in printed
    result = api.predict_images(run_dir, dataset={"source": "sklearn_digits", "split": "test",
                                "classes": [0, 1, 2]}, threshold=0.0, progress=False)  # fmt: skip
    results = read_json(run_dir / "results.json")
    assert result.meta["accuracy_all"] == pytest.approx(results["test"]["accuracy"])
    assert result.rows[0]["label"] in ("0", "1", "2")
    assert result.meta["unknown_labels"] == {"images": 0, "labels": []}
    assert len(result) == result.meta["images"] == len(result.rows)
    frame = result.to_pandas()
    assert list(frame.columns) == list(result.rows[0]) and len(frame) == len(result)
    assert frame["label"].tolist() == [row["label"] for row in result.rows]


def test_json_lines_keep_names_and_labels_as_written(tmp_path: Path) -> None:
    rows = [{"image": "photos/café.jpg", "prediction": "chat_noir", "set": ["chat_noir", "é"]}]
    text = format_rows(rows, "jsonl")
    assert "café" in text and "\\u" not in text and json.loads(text) == rows[0]
    write_predictions(tmp_path / "p.jsonl", "jsonl", rows, {})
    assert (tmp_path / "p.jsonl").read_text(encoding="utf-8") == text


def test_images_of_classes_the_model_does_not_know_are_left_out_of_the_accuracy(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = api.predict_images(run_dir, dataset={"source": "sklearn_digits", "split": "test",
                               "classes": [0, 1, 2]}, threshold=0.5, progress=False)  # fmt: skip
    spec = "{source: sklearn_digits, split: test, classes: [0, 1, 2, 3, 4]}"
    out = _predict([str(run_dir), "--dataset", spec, "--threshold", "0.5"], capsys)
    with_unknown = api.predict_images(run_dir, dataset={"source": "sklearn_digits", "split":
                                      "test", "classes": [0, 1, 2, 3, 4]}, threshold=0.5,
                                      progress=False)  # fmt: skip
    n_unknown = with_unknown.meta["images"] - known.meta["images"]
    assert n_unknown > 0
    assert with_unknown.meta["unknown_labels"] == {"images": n_unknown, "labels": ["3", "4"]}
    for key in ("accuracy_all", "accuracy_accepted"):
        assert with_unknown.meta[key] == known.meta[key]
    assert f"note: {n_unknown} image(s) with labels the model does not know (3, 4)" in out
    assert f"accuracy on the labelled dataset (its {known.meta['images']} of known classes)" in out


def test_without_out_the_rows_go_to_standard_output(
    run_dir: Path, images: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(["predict", str(run_dir), str(images), "--threshold", "0.5", "--no-progress"])
    printed = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(printed.out)))
    assert len(rows) == N_GOOD and {"prediction", "abstain"} <= set(rows[0])
    assert "threshold: abstain when" in printed.err and "--out FILE" in printed.err


def test_the_output_of_compare_means_its_fseb_run(run_dir: Path, tmp_path: Path) -> None:
    for name in ("psmap", "fseb"):
        shutil.copytree(run_dir, tmp_path / name, ignore=shutil.ignore_patterns("checkpoints"))
    assert load_model(tmp_path).where == f"run {tmp_path / 'fseb'}"
    assert load_model(tmp_path / "psmap" / "model").run_dir == tmp_path / "psmap"


def test_mistakes_end_in_one_line(
    run_dir: Path,
    images: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "empty").mkdir()
    assert "no images found in" in _fails([str(run_dir), str(tmp_path / "empty")], capsys)
    assert "does not exist" in _fails([str(run_dir), str(tmp_path / "nope.png")], capsys)
    assert "no file matches" in _fails([str(run_dir), str(tmp_path / "*.jpg")], capsys)
    message = _fails([str(tmp_path / "no-run"), str(images)], capsys)
    assert f"MODEL {tmp_path / 'no-run'} does not exist" in message
    message = _fails([str(tmp_path), str(images)], capsys)
    assert "is neither a run folder (recipe.yaml) nor a model folder" in message
    message = _fails([str(run_dir), str(images), "--out", str(tmp_path / "p.txt")], capsys)
    assert "use .csv or .jsonl, or give --format" in message
    assert "--coverage: must lie in (0, 1]" in _fails([str(run_dir), "--coverage", "2"], capsys)
    assert "give IMAGES" in _fails([str(run_dir)], capsys)

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nCheck your connection.")

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # no request at all
    monkeypatch.setattr(predictor.timm, "create_model", offline)
    message = _fails(["hf-hub:someone/model", str(images)], capsys)
    assert "could not load hf-hub:someone/model from the Hugging Face Hub (OSError: We " in message


def test_conformal_sets_share_the_thresholds_validation_pass_no_second_pass(
    run_dir: Path,
    images: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A read-only run without cached validation logits: nothing on disk spares a second pass.
    copy = shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    (copy / VAL_LOGITS).unlink(missing_ok=True)
    read_only(copy, monkeypatch)
    passes: list[tuple[torch.Tensor, torch.Tensor | None, list[str]]] = []
    predicted = validation.logits_and_read_errors

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(predicted(*args, **kwargs))
        return passes[-1]

    monkeypatch.setattr(validation, "logits_and_read_errors", counted)
    out, spec = tmp_path / "sets.csv", "{source: sklearn_digits, split: test, classes: [0, 1, 2]}"
    printed = _predict([str(copy), "--dataset", spec, "--conformal", "0.9", "--out", str(out),
                        "--conformal-method", "aps", "--threshold", "0"], capsys)  # fmt: skip
    assert len(passes) == 1  # the threshold's validation logits are the sets' too
    meta, rows = read_json(tmp_path / "sets.meta.json"), _read_csv(out)
    record = meta["conformal"]
    recipe = read_run(copy)[0]
    logits = passes[0][0]  # (N_v, K)
    labels = torch.as_tensor(build_splits(recipe.data, recipe.train.seed).val.labels)  # (N_v,)
    probs = torch.softmax(logits.double() / meta["temperature"], -1)
    cal = calibrate(probs, labels, 0.9, "aps")
    assert record["quantiles"] == pytest.approx(cal.quantiles.tolist())
    assert (record["method"], record["validation_images"]) == ("aps", len(labels))
    assert all(int(r["set_size"]) == len(r["set"].split("|")) >= 1 for r in rows)
    covered = sum(r["label"] in r["set"].split("|") for r in rows) / len(rows)
    assert record["empirical_coverage"] == pytest.approx(covered)
    assert record["mean_set_size"] == pytest.approx(np.mean([int(r["set_size"]) for r in rows]))
    assert "conformal sets: APS, target coverage 0.9 (marginal" in printed
    assert "; approximate, as they also chose the run's best epoch)" in printed
    assert f"conformal coverage on the labelled dataset: {covered:.4f}" in printed
    jsonl = api.predict_images(run_dir, [images / "00.png"], conformal=0.9, class_conditional=True,
                               progress=False)  # fmt: skip
    assert isinstance(jsonl.rows[0]["set"], list) and jsonl.meta["conformal"]["class_conditional"]
    folder = shutil.copytree(run_dir / "model", tmp_path / "exported")
    message = _fails([str(folder), str(images), "--conformal", "0.9"], capsys)
    assert "--conformal calibrates on a run's validation split, and model folder" in message
