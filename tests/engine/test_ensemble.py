"""Ensembles of saved runs, plots written by runs and --compare, the evaluate CLI.

Two tiny runs (PS-MAP and FS-EB, one epoch, ``test_byobnet`` at 16 px) are trained once by
``compare()`` on a generated image folder, as in ``tests/engine/test_pipeline.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fseb_ft import evaluate
from fseb_ft.cli import main as cli
from fseb_ft.engine.ensemble import default_ensemble_dir, evaluate_ensemble
from fseb_ft.engine.reevaluate import evaluate_run_with_predictions
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.ood import ood_metrics
from fseb_ft.evaluation.temperature import fit_temperature
from fseb_ft.finetune import compare
from fseb_ft.runs.rundir import COMPARISON_PLOTS, PLOTS
from tests.helpers import N_OOD, N_TEST, skip_figures, tiny_recipe, write_image_folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ensemble")
    write_image_folder(root / "ind", "train", {"cat": 12, "dog": 12, "fox": 12})
    write_image_folder(root / "ind", "test", {"cat": 5, "dog": 4, "fox": 4})
    write_image_folder(root / "ood", "test", {"owl": N_OOD})
    recipe = root / "recipe.yaml"
    folders = {"ind": root / "ind", "ood": root / "ood"}
    recipe.write_text(yaml.safe_dump(tiny_recipe(folders, root / "compare", epochs=1)))
    compare(recipe)
    return {"root": root, "psmap": root / "compare" / "psmap", "fseb": root / "compare" / "fseb"}


def test_runs_and_compare_write_plots(runs: dict[str, Path]) -> None:
    for name in ("psmap", "fseb"):
        for plot in PLOTS:
            assert (runs[name] / plot).stat().st_size > 10_000, (name, plot)
    for plot in COMPARISON_PLOTS:
        assert (runs["root"] / "compare" / plot).stat().st_size > 10_000, plot


def test_ensemble_equals_metrics_of_the_naive_average(
    runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "ens"
    argv = [str(runs["psmap"]), str(runs["fseb"]), "--ensemble", "--out", str(out), "--cpu"]
    got = evaluate.main(argv)
    printed = capsys.readouterr().out
    skip_figures(monkeypatch)  # the ensemble's are checked below; the members' would cost seconds

    # The members' own predictions, from the Python API; the single-run CLI gives its record.
    single = evaluate.main([str(runs["psmap"]), "--cpu"])
    members = [evaluate_run_with_predictions(runs[name], cpu=True) for name in ("psmap", "fseb")]
    assert single == members[0].results
    labels = members[0].predictions.test[1]
    assert torch.equal(labels, members[1].predictions.test[1]) and len(labels) == N_TEST

    def naive_average(log_probs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([lp.double().exp() for lp in log_probs]).mean(0)  # (N, K)

    p_test = naive_average([m.predictions.test[0] for m in members])
    p_ood = naive_average([m.predictions.ood["owls"] for m in members])
    want_test = classification_metrics(p_test.log(), labels)
    want_ood = ood_metrics(p_test, p_ood)
    assert got["test"]["n"] == N_TEST and got["ood"]["owls"]["n"] == N_OOD
    for key, value in want_test.items():
        assert got["test"][key] == pytest.approx(value.item(), rel=1e-9, abs=1e-12), key
    for key, value in want_ood.items():
        assert got["ood"]["owls"][key] == pytest.approx(value.item(), rel=1e-9, abs=1e-12), key

    # Members are reported with their own metrics, and everything lands in --out.
    saved = json.loads((out / "results.json").read_text())
    assert saved["test"] == pytest.approx(got["test"])
    assert saved["runs"] == [str(runs["psmap"]), str(runs["fseb"])]
    rows = list(saved["members"])
    assert rows == ["PS-MAP · test_byobnet (psmap)", "FS-EB · test_byobnet (fseb)"]
    for row, member in zip(rows, members, strict=True):
        for key, value in member.results["test"].items():
            assert saved["members"][row]["test"][key] == pytest.approx(value, rel=1e-9), key
    md = (out / "results.md").read_text()
    for text in (*rows, "Ensemble of 2"):
        assert f"| {text} |" in md and f"| {text} |" in printed
    for plot in PLOTS:
        assert (out / plot).stat().st_size > 10_000, plot


def test_ensemble_temperature_is_fitted_on_the_shared_validation_split_only(
    runs: dict[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    skip_figures(monkeypatch)
    import fseb_ft.engine.ensemble as ensemble_module

    for name in ("write_plots", "write_confusion_plot", "write_corruption_plot"):
        monkeypatch.setattr(ensemble_module, name, lambda *args, **kwargs: None)
    ts = ["eval.temperature_scaling=true"]
    # Copies: re-evaluating a run rewrites its results, which the other tests read.
    copies = [tmp_path / name for name in ("psmap", "fseb", "other-val")]
    for name, copy in zip(("psmap", "fseb", "fseb"), copies, strict=True):
        shutil.copytree(runs[name], copy)
    members = [evaluate_run_with_predictions(copy, cpu=True, overrides=ts) for copy in copies[:2]]
    labels = members[0].predictions.val[1]
    p_val = torch.stack([m.predictions.val[0].double().softmax(-1) for m in members]).mean(0)
    want = fit_temperature(p_val.log(), labels).item()  # naive: the averaged probabilities
    # --compare trains both at one seed, so they hold out the same validation images.
    got = evaluate_ensemble(copies[:2], tmp_path / "ens", True, ts)
    scaled = got["temperature_scaled"]
    assert scaled.get("fitted_temperature", scaled["temperature"]) == pytest.approx(want, rel=1e-9)
    assert "| Ensemble of 2 + TS |" in (tmp_path / "ens" / "results.md").read_text()

    info = json.loads((copies[2] / "run.json").read_text())
    info["data"]["val"] += "|subset:other"  # as a member trained at another seed
    (copies[2] / "run.json").write_text(json.dumps(info))
    got = evaluate_ensemble([copies[0], copies[2]], tmp_path / "ens2", True, ts)
    assert "temperature_scaled" not in got
    assert "members hold out different validation images" in caplog.text


def test_mismatched_runs_are_refused_with_a_clear_error(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    def altered(name: str, change) -> Path:
        copy = tmp_path / name
        shutil.copytree(runs["fseb"], copy, ignore=shutil.ignore_patterns("checkpoints"))
        info = json.loads((copy / "run.json").read_text())
        change(info)
        (copy / "run.json").write_text(json.dumps(info))
        return copy

    other_classes = altered("classes", lambda i: i.update(class_names=["cat", "dog", "emu"]))
    with pytest.raises(ValueError, match=r"cannot ensemble .*psmap and .*classes: their classes"):
        evaluate_ensemble([runs["psmap"], other_classes], tmp_path / "out", cpu=True)
    other_test = altered("test", lambda i: i["data"].update(test="imagefolder:elsewhere"))
    with pytest.raises(ValueError, match=r"their test data differ.*imagefolder:elsewhere"):
        evaluate_ensemble([runs["psmap"], other_test], tmp_path / "out", cpu=True)
    no_ood = altered("ood", lambda i: i["data"].update(ood={}))
    with pytest.raises(ValueError, match=r"their OOD sets differ"):
        evaluate_ensemble([runs["psmap"], no_ood], tmp_path / "out", cpu=True)
    with pytest.raises(ValueError, match="listed twice"):
        evaluate_ensemble([runs["psmap"], runs["psmap"]], tmp_path / "out", cpu=True)
    with pytest.raises(ValueError, match="is a run directory"):
        evaluate_ensemble([runs["psmap"], runs["fseb"]], runs["fseb"], cpu=True)
    with pytest.raises(FileNotFoundError, match=r"not a finished run: recipe\.yaml is missing"):
        evaluate_ensemble([runs["psmap"], tmp_path], tmp_path / "out", cpu=True)
    assert not (tmp_path / "out").exists()


def test_cli_parses_several_run_dirs_and_dispatches(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    args = evaluate._parser("fseb-ft evaluate").parse_args(["a", "b", "c", "--ensemble"])
    assert args.run_dirs == [Path("a"), Path("b"), Path("c")]
    assert args.ensemble and args.out is None and not args.cpu
    for argv, message in (
        (["a", "--ensemble"], "--ensemble needs at least two run directories"),
        (["a", "b", "--out", "x"], "--out is only used with --ensemble"),
        ([], "the following arguments are required: RUN_DIR"),
    ):
        with pytest.raises(SystemExit):
            evaluate.main(argv)
        assert message in capsys.readouterr().err

    seen = []
    monkeypatch.setattr(evaluate, "main", lambda argv, prog: seen.append((argv, prog)))
    monkeypatch.setattr(sys, "argv", ["fseb-ft", "evaluate", "a", "b", "--ensemble"])
    cli()
    assert seen == [(["a", "b", "--ensemble"], "fseb-ft evaluate")]


def test_default_ensemble_dir() -> None:
    assert default_ensemble_dir(["runs/x/a", "runs/x/b"]) == Path("runs/x/ensemble")
    assert default_ensemble_dir(["runs/a", "other/b"]) == Path("ensemble")
