"""`fseb-ft export RUN --onnx model.onnx`: a tiny run (temperature, feature fit) exported once;
onnxruntime on the file gives what `fseb_ft.predict_images` gives on the same images, at two
batch sizes; its metadata; docs/cli.md's onnxruntime snippet runs on it; the errors a user meets.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from PIL import Image
from torch import Tensor, nn

from fseb_ft import cli, predict_images
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import FeatureOodFit, fit_feature_ood, mahalanobis_score
from fseb_ft.prediction import onnx_export
from fseb_ft.prediction.feature_fit import load_feature_fit
from fseb_ft.prediction.inputs import gather_inputs
from fseb_ft.prediction.loading import LoadedModel, load_model
from fseb_ft.prediction.onnx_graph import OUTPUTS, DeployedModel, mahalanobis_min, whitened
from tests.helpers import DIGITS_012, digits_recipe, skip_figures

TEST_SPEC = DIGITS_012
OOD_SPEC = {"source": "sklearn_digits", "split": "test", "classes": [7], "limit": 20}
COVERAGE = 0.9
MAX_P_GAP = 1e-4  # the parity bound on probabilities
SCORE_RTOL = 1e-5  # log-odds and scores: float32 network under two runtimes, float64 after it
# Mahalanobis multiplies the runtimes' float32 differences of the features (~1e-7) by the
# condition number of the fit's covariance (~6e7 for this one-epoch network): 5e-5 measured.
MAHALANOBIS_RTOL = 2e-4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-epoch PS-MAP run of the paper's CNN on digits 0-2 with a temperature and the
    feature fit of Mahalanobis and ViM."""
    from fseb_ft.engine.run import run_with_predictions
    from fseb_ft.recipe import recipe_from_dict

    out = tmp_path_factory.mktemp("run") / "digits"
    recipe = digits_recipe(
        out, temperature_scaling=True, ood_scores=["entropy", "mahalanobis", "vim"]
    )
    with pytest.MonkeyPatch.context() as patch:
        skip_figures(patch)
        run_with_predictions(recipe_from_dict(recipe))
    return out


@pytest.fixture(scope="module")
def exported(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run exported by the command, abstaining at coverage 0.9 on its validation split."""
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    with redirect_stdout(io.StringIO()):
        cli.main(["export", str(run_dir), "--onnx", str(path), "--coverage", str(COVERAGE),
                  "--no-progress"])  # fmt: skip
    return path


def _images(run_dir: Path, spec: dict[str, Any]) -> Tensor:
    """The images of ``spec`` as predict prepares them: ``(N, C, H, W)`` float32."""
    inputs = gather_inputs(load_model(run_dir), [], spec)[0]
    return torch.stack([x for x, _ in inputs])


def _session(path: Path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(path: Path, images: Tensor) -> dict[str, np.ndarray]:
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {"images": images.numpy()}), strict=True))


def _predicted(run_dir: Path, spec: dict[str, Any], ood: str) -> list[dict[str, Any]]:
    found = predict_images(
        run_dir, dataset=spec, coverage=COVERAGE, top_k=3, ood=ood, progress=False
    )
    return found.rows


@pytest.mark.parametrize("spec", [TEST_SPEC, OOD_SPEC], ids=["test", "ood"])
def test_onnxruntime_gives_what_predict_gives_on_the_same_images(
    run_dir: Path, exported: Path, spec: dict[str, Any]
) -> None:
    out = _run(exported, _images(run_dir, spec))
    names = json.loads(_session(exported).get_modelmeta().custom_metadata_map["class_names"])
    for ood in ("energy", "mahalanobis", "vim"):
        rows = _predicted(run_dir, spec, ood)
        assert len(rows) == len(out["predicted"])
        expected = np.array([[r[f"top{j}_probability"] for j in (1, 2, 3)] for r in rows])
        ranked = -np.sort(-out["probabilities"], axis=1)  # the rows rank the classes
        assert np.abs(ranked - expected).max() <= MAX_P_GAP
        assert [names[k] for k in out["predicted"]] == [r["prediction"] for r in rows]
        assert out["abstain"].tolist() == [r["abstain"] for r in rows]
        for key, column in (("log_odds", "log_odds"), ("entropy", "entropy"), (ood, f"ood_{ood}")):
            want = np.array([r[column] for r in rows])
            rtol = MAHALANOBIS_RTOL if key == "mahalanobis" else SCORE_RTOL
            np.testing.assert_allclose(out[key], want, rtol=rtol, atol=SCORE_RTOL)


def test_the_graph_in_torch_computes_what_predict_computes(run_dir: Path) -> None:
    """The module that is exported, run by torch: predict's numbers to float64 rounding, so the
    two cannot drift apart whatever the runtime adds."""
    loaded = load_model(run_dir)
    rows = _predicted(run_dir, TEST_SPEC, "mahalanobis")
    rule = predict_images(run_dir, dataset=TEST_SPEC, coverage=COVERAGE, progress=False)
    threshold = rule.meta["abstention"]["log_odds_threshold"]
    graph = DeployedModel(loaded.model, loaded.temperature, threshold, _fit(loaded))
    with torch.no_grad():
        out = dict(zip(graph.output_names, graph(_images(run_dir, TEST_SPEC)), strict=True))
    assert out["abstain"].tolist() == [r["abstain"] for r in rows]
    assert 0 < sum(out["abstain"].tolist()) < len(rows)  # the threshold splits these images
    for key, column in (("log_odds", "log_odds"), ("entropy", "entropy"),
                        ("mahalanobis", "ood_mahalanobis")):  # fmt: skip
        want = torch.tensor([r[column] for r in rows], dtype=torch.float64)
        torch.testing.assert_close(out[key], want, rtol=1e-9, atol=1e-12)
    top = out["probabilities"].max(dim=1).values
    torch.testing.assert_close(top, torch.tensor([r["probability"] for r in rows],
                               dtype=torch.float64), rtol=1e-12, atol=1e-15)  # fmt: skip


def _fit(loaded: LoadedModel) -> FeatureOodFit:
    return cast(FeatureOodFit, load_feature_fit(loaded, "mahalanobis"))


def test_the_batch_axis_is_dynamic(run_dir: Path, exported: Path) -> None:
    images = _images(run_dir, TEST_SPEC)[:8]
    whole = _run(exported, images)
    for size in (1, 5):
        part = _run(exported, images[:size])
        assert part["probabilities"].shape == (size, 3)
        np.testing.assert_allclose(part["probabilities"], whole["probabilities"][:size], atol=1e-6)
        assert part["predicted"].tolist() == whole["predicted"][:size].tolist()
    assert _session(exported).get_inputs()[0].shape[0] == "batch"


def test_the_metadata_says_what_the_graph_needs_and_does(run_dir: Path, exported: Path) -> None:
    meta = _session(exported).get_modelmeta().custom_metadata_map
    loaded = load_model(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert json.loads(meta["class_names"]) == loaded.class_names == ["0", "1", "2"]
    assert json.loads(meta["temperature"]) == results["temperature_scaled"]["temperature"]
    spec = json.loads(meta["input"])
    assert (spec["channels"], spec["height"], spec["width"]) == (1, 28, 28)
    assert (spec["mean"], spec["std"], spec["layout"]) == ([0.5], [0.5], "NCHW")
    rule = json.loads(meta["abstention"])
    meta_predict = predict_images(run_dir, dataset=TEST_SPEC, coverage=COVERAGE, progress=False)
    assert rule == meta_predict.meta["abstention"]  # the rule predict chooses, as chosen
    assert (rule["criterion"], rule["target"]) == ("coverage", COVERAGE)
    outputs = json.loads(meta["outputs"])
    assert list(outputs) == [o.name for o in _session(exported).get_outputs()]
    assert list(outputs) == list(OUTPUTS)  # the fit has ViM's classifier: every output
    assert json.loads(meta["model"]) == "run digits"
    assert "mean network" not in json.loads(meta["network"])
    assert onnx.load(str(exported)).opset_import[0].version >= onnx_export.OPSETS.start


def test_mahalanobis_for_tracing_equals_the_evaluations(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    train = torch.randn(60, 5, generator=generator, dtype=torch.float64)
    labels = torch.arange(60) % 3
    fit = fit_feature_ood(train, labels)
    new = 3 * torch.randn(7, 5, generator=generator, dtype=torch.float64)
    np.testing.assert_allclose(
        mahalanobis_min(new, *whitened(fit)), mahalanobis_score(fit, new), rtol=1e-10
    )


def _snippet() -> str:
    """docs/cli.md's onnxruntime snippet: the python block of "Export to ONNX"."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## Export to ONNX", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_the_docs_snippet_runs_on_an_exported_file(
    run_dir: Path, exported: Path, tmp_path: Path
) -> None:
    code = _snippet()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    assert "fseb_ft" not in code
    data = gather_inputs(load_model(run_dir), [], OOD_SPEC)[0].data
    photo = tmp_path / "photo.png"
    Image.fromarray(data[0][0][:, :, 0]).save(photo)
    code = code.replace('"model.onnx"', repr(str(exported)))
    code = code.replace('"photo.jpg"', repr(str(photo)))
    printed = io.StringIO()
    with redirect_stdout(printed):
        exec(compile(code, "docs/cli.md", "exec"), {})
    name, probability, abstain = printed.getvalue().split()
    row = predict_images(run_dir, [photo], coverage=COVERAGE, progress=False).rows[0]
    assert name == row["prediction"] and abstain == str(row["abstain"])
    assert abs(float(probability) - row["probability"]) <= MAX_P_GAP


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(["export", *argv, "--no-progress"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fseb-ft: error: "), err
    return lines[0]


def test_a_run_without_a_kept_threshold_says_what_to_pass(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails([str(run_dir), "--onnx", str(tmp_path / "m.onnx")], capsys)
    assert "keeps no abstention threshold" in line
    assert "--coverage C" in line and "--max-risk R" in line and "--threshold T" in line
    assert not (tmp_path / "m.onnx").exists()


def test_a_model_folder_without_a_validation_split_takes_a_threshold(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "copied-model"
    shutil.copytree(run_dir / "model", folder)  # outside its run: no validation split
    line = _fails([str(folder), "--onnx", str(tmp_path / "m.onnx")], capsys)
    assert f"model folder {folder} keeps no abstention threshold" in line
    assert "pass --threshold T" in line and "export its run folder with --coverage C" in line
    line = _fails([str(folder), "--onnx", str(tmp_path / "m.onnx"), "--coverage", "0.9"], capsys)
    assert "--coverage chooses the threshold on a run's validation split" in line
    assert "export the run folder, or give --threshold T" in line


def test_a_missing_extra_names_the_install_command(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import fails as if not installed
    line = _fails([str(run_dir), "--onnx", str(tmp_path / "m.onnx"), "--threshold", "0.5"], capsys)
    assert "onnxscript" in line and "pip install 'fseb_ft[onnx]'" in line


def test_a_path_that_cannot_be_written_is_refused(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "file").write_text("")
    line = _fails([str(run_dir), "--onnx", str(tmp_path / "file" / "m.onnx")], capsys)
    assert "--onnx" in line and "is a file" in line
    line = _fails([str(run_dir), "--onnx", str(tmp_path)], capsys)
    assert "is a folder" in line

    def refused(path: Path, data: bytes, what: str | None = None) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(onnx_export, "write_bytes", refused)  # the OS refuses the file itself
    out = tmp_path / "m.onnx"
    with pytest.raises(FsebError, match=re.escape(f"--onnx {out} cannot be written (Permission")):
        onnx_export._write(out, onnx.ModelProto())


class _Branchy(nn.Module):
    """A network whose features depend on its input's values: torch.export cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward_features(self, x: Tensor) -> Tensor:
        h = x.flatten(1)[:, :4]
        return h if h.sum() > 0 else -h

    def forward_head(self, h: Tensor, pre_logits: bool = False) -> Tensor:
        return h if pre_logits else self.head(h)


def test_a_network_the_exporter_cannot_trace_is_named(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def branchy(model: str) -> LoadedModel:
        loaded = load_model(model)
        loaded.model, loaded.class_names = _Branchy(), ["a", "b"]
        loaded.feature_fit_file = lambda: None
        loaded.run_dir = None  # --threshold alone: the run's validation logits stay as they are
        return loaded

    monkeypatch.setattr(onnx_export, "load_model", branchy)
    line = _fails([str(run_dir), "--onnx", str(tmp_path / "m.onnx"), "--threshold", "0.5"], capsys)
    assert f"cannot export run {run_dir} to ONNX" in line and "(_Branchy)" in line
    assert "data-dependent" in line
    assert not (tmp_path / "m.onnx").exists()


def test_an_fsvi_run_is_exported_as_its_mean_network_and_says_so(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Predictive(nn.Module):  # stands for FS-VI's Monte-Carlo predictive around the network
        def __init__(self, network: nn.Module) -> None:
            super().__init__()
            self.network = network

        def forward(self, x: Tensor) -> Tensor:
            return self.network(x) + 0.5 * torch.randn(1)

    def fsvi(model: str) -> LoadedModel:
        loaded = load_model(model)
        loaded.model, loaded.network = Predictive(loaded.model), loaded.model
        loaded.run_dir = None  # --threshold alone: the run's validation logits stay as they are
        return loaded

    monkeypatch.setattr(onnx_export, "load_model", fsvi)
    out = tmp_path / "m.onnx"
    with caplog.at_level(logging.INFO, logger=onnx_export.__name__):
        found = onnx_export.export_onnx(
            onnx_export.OnnxExport(str(run_dir), out, threshold=0.0, opset=18, progress=False)
        )
    assert found.mean_network and "mean network" in json.loads(found.metadata["network"])
    assert any("holds its mean network" in r.getMessage() for r in caplog.records)
    images = _images(run_dir, TEST_SPEC)[:4]
    network = load_model(run_dir).model
    with torch.no_grad():
        want = torch.softmax(network(images).double() / load_model(run_dir).temperature, -1)
    graph = _run(out, images)
    np.testing.assert_allclose(graph["probabilities"], want.numpy(), atol=MAX_P_GAP)
    assert not graph["abstain"].any()  # --threshold 0: log-odds below −inf, never
    assert onnx.load(str(out)).opset_import[0].version == 18


@pytest.mark.parametrize(
    ("asked", "problem"),
    [
        ({"coverage": 0.9, "max_risk": 0.1}, "at most one of coverage, max_risk and threshold"),
        ({"coverage": 0.0}, "coverage must lie in (0, 1], got 0"),
        ({"opset": 17}, "opset must be in 18..23"),
    ],
)
def test_a_request_is_checked_when_made(asked: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        onnx_export.OnnxExport("run", Path("m.onnx"), **asked)


def test_the_parity_benchmark_reports_agreement_on_the_tiny_run(
    run_dir: Path,
    exported: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import onnx_parity

    def export(argv: list[str]) -> None:  # `fseb-ft export` is tested above: its file, copied
        assert argv[argv.index("--coverage") + 1] == str(COVERAGE)
        shutil.copy(exported, argv[argv.index("--onnx") + 1])

    monkeypatch.setattr(onnx_parity.cli, "main", export)
    summary = onnx_parity.main([str(run_dir), "--dataset", json.dumps(TEST_SPEC),
                                "--onnx", str(tmp_path / "m.onnx")])  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert summary["max_abs_dp"] <= MAX_P_GAP and summary["images"] == 161
    assert summary["predicted_agreement"] == summary["abstain_agreement"] == 1.0
    assert summary["entropy_max_rel_diff"] <= SCORE_RTOL and summary["onnxruntime_ms_per_image"] > 0
