"""The Hub model folder of a run (timm format + card) and its upload, all offline.

One real tiny run (test_byobnet, 16 px, 1 epoch) feeds most tests. Uploads go to a fake Hub on
a loopback port (repo creation, branch, README validation) and the commit itself is captured
where ``upload_folder`` hands its real ``CommitOperationAdd`` list over, so the file list is the
one ``huggingface_hub`` would send. Nothing contacts huggingface.co.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import huggingface_hub
import huggingface_hub._upload_pipeline as upload_pipeline
import numpy as np
import pytest
import timm
import torch
import yaml
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from PIL import Image

import fseb_ft.engine.run as run_module
from fseb_ft import cli
from fseb_ft.data.files import read_image
from fseb_ft.data.transforms import eval_transform
from fseb_ft.evaluation.feature_ood import fit_feature_ood
from fseb_ft.recipe import ConfigError, OutputConfig, dump_recipe, recipe_from_dict
from fseb_ft.runs import export, upload
from fseb_ft.runs.feature_fit import write_feature_fit
from fseb_ft.runs.published import scrub
from fseb_ft.runs.rundir import COMPARISON_PLOTS
from fseb_ft.runs.tables import markdown_table
from tests.helpers import exif_twins, write_image_folder

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused
REPO_ID = "user/tiny-fseb"
BASE_FILES = {"config.json", "model.safetensors", "fseb.json", "README.md", "training_recipe.yaml"}
TEST_IMAGE_SIZE = (44, 30)  # (H, W) of the tiny run's test images; the model takes 16 x 16


def tiny_recipe(data: Path, ood: Path, out: Path) -> dict[str, Any]:
    return {
        "model": {"name": "test_byobnet", "pretrained": False, "input_size": 16},
        "data": {
            "train": {"source": "imagefolder", "path": str(data), "split": "train"},
            "test": {"source": "imagefolder", "path": str(data), "split": "test"},
            "ood": {"owls": {"source": "imagefolder", "path": str(ood), "split": "test"}},
            "val_fraction": 0.25,
            "augment": "flip",
            "mean": [0.4, 0.5, 0.6],
            "std": [0.2, 0.25, 0.3],
            "batch_size": 8,
            "num_workers": 0,
        },
        "context": {"kind": "train", "perturb": True, "pool_size": 12, "batch_size": 4},
        "fseb": {"reg_scale": 0.5, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0},
        "optim": {"lr": 0.05},
        "train": {"epochs": 1, "cpu": True, "trackers": []},
        "eval": {"batch_size": 8},
        "output": {"dir": str(out), "push_to_hub": REPO_ID, "private": True},
    }


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A finished FS-EB run whose push (to a closed loopback port) failed."""
    root = tmp_path_factory.mktemp("hub")
    write_image_folder(root / "ind", "train", {"cat": 8, "dog": 8, "fox": 8})
    # Test images larger than the 16 px input and not square, as users' photos are: evaluation
    # must resize them exactly as the card's snippet does.
    write_image_folder(root / "ind", "test", {"cat": 3, "dog": 3, "fox": 3}, size=TEST_IMAGE_SIZE)
    write_image_folder(root / "ood", "test", {"owl": 4})
    out = root / "compare" / "fseb"
    out.mkdir(parents=True)
    # A plot in the run directory (the plotting code writes these) must travel with the model.
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(out / "reliability.png")
    recipe = recipe_from_dict(tiny_recipe(root / "ind", root / "ood", out))

    shared: dict[str, Any] = {}
    original_share, original_evaluate = upload.share_run, run_module._evaluate

    def spy(model, *args, **kwargs):  # the exact model run() exports, and its logits
        shared["model"] = copy.deepcopy(model).eval()
        return original_share(model, *args, **kwargs)

    def evaluate_spy(*args, **kwargs):  # what the run evaluated, as the failed push raises
        shared["evaluated"] = original_evaluate(*args, **kwargs)
        return shared["evaluated"]

    records = _Records()
    logging.getLogger("fseb_ft.runs.upload").addHandler(records)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_module, "share_run", spy)  # the name run() calls
        mp.setattr(run_module, "_evaluate", evaluate_spy)
        mp.setenv("HF_ENDPOINT", UNREACHABLE)
        with pytest.raises(upload.HubPushError) as failed:
            run_module.run_with_predictions(recipe)
    logging.getLogger("fseb_ft.runs.upload").removeHandler(records)
    return SimpleNamespace(
        dir=out,
        folder=out / "model",
        recipe=recipe,
        results=json.loads((out / "results.json").read_text()),
        predictions=shared["evaluated"].predictions,
        model=shared["model"],
        log=records.messages,
        error=str(failed.value),
    )


def _expected_files(run_dir: Path) -> set[str]:
    """The five folder files plus every plot of the run (the plotting code may add more)."""
    pngs = {p.name for p in run_dir.glob("*.png")}
    assert "reliability.png" in pngs
    return BASE_FILES | pngs


def _inputs() -> torch.Tensor:
    return torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def test_run_writes_a_timm_folder_that_loads_with_identical_logits(tiny_run) -> None:
    folder = tiny_run.folder
    assert {p.name for p in folder.iterdir()} == _expected_files(tiny_run.dir)
    assert not list(tiny_run.dir.glob(".model-export-*"))  # scratch folder cleaned up

    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert loaded.num_classes == 3
    x = _inputs()
    with torch.no_grad():
        assert torch.equal(loaded(x), tiny_run.model(x))

    data_cfg = timm.data.resolve_data_config(model=loaded)
    assert data_cfg["input_size"] == (3, 16, 16)
    assert tuple(data_cfg["mean"]) == pytest.approx((0.4, 0.5, 0.6))
    assert tuple(data_cfg["std"]) == pytest.approx((0.2, 0.25, 0.3))
    assert data_cfg["crop_pct"] == 1.0
    assert loaded.pretrained_cfg["label_names"] == ["cat", "dog", "fox"]


def _card_snippet(card: str, folder: Path) -> str:
    """The card's "How to use" code, loading ``folder`` and reading the file ``image_path``."""
    code = card.split("## How to use")[1].split("```python\n")[1].split("```")[0]
    hub_line = f'model = timm.create_model("hf-hub:{REPO_ID}", pretrained=True).eval()\n'
    local_line = 'model = timm.create_model("local-dir:{}", pretrained=True).eval()\n'
    placeholder = local_line.format("PATH/TO/model")  # the card is published: no local path
    assert code.count(hub_line) == 1 and code.count(f"# {placeholder}") == 1
    assert code.count('Image.open("image.jpg")') == 1
    code = code.replace(hub_line, "").replace(f"# {placeholder}", local_line.format(folder))
    return code.replace('Image.open("image.jpg")', "Image.open(image_path)")


def test_card_snippet_reproduces_the_runs_test_predictions(tiny_run) -> None:
    snippet = _card_snippet((tiny_run.folder / "README.md").read_text(), tiny_run.folder)
    test_dir = tiny_run.dir.parents[1] / "ind"
    files = datasets.load_dataset("imagefolder", data_dir=str(test_dir), split="test")
    files = files.cast_column("image", datasets.Image(decode=False))  # the run's sample order
    probs = []
    for item in files:
        scope: dict[str, Any] = {"image_path": item["image"]["path"]}
        exec(compile(snippet, "model card", "exec"), scope)  # the card's code, as users run it
        probs.append(scope["probs"])
    log_probs, labels = tiny_run.predictions.test
    assert torch.equal(torch.tensor(files["label"]), labels)
    torch.testing.assert_close(torch.stack(probs), log_probs.exp(), rtol=0, atol=1e-5)
    accuracy = json.loads((tiny_run.dir / "results.json").read_text())["test"]["accuracy"]
    assert (torch.stack(probs).argmax(-1) == labels).double().mean().item() == pytest.approx(
        accuracy, abs=1e-6
    )


def test_card_snippet_reads_a_16_bit_image_as_training_does_not_as_white(
    tiny_run, tmp_path: Path
) -> None:
    snippet = _card_snippet((tiny_run.folder / "README.md").read_text(), tiny_run.folder)
    gray = np.linspace(0, 255, 256).astype(np.uint8).reshape(16, 16)  # (16, 16)
    Image.fromarray(gray).save(tmp_path / "8.png")
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "16.png")  # v·257 >> 8 = v
    assert np.array_equal(read_image(tmp_path / "16.png", 3), read_image(tmp_path / "8.png", 3))
    probs = []
    for name in ("8.png", "16.png"):
        scope: dict[str, Any] = {"image_path": str(tmp_path / name)}
        exec(compile(snippet, "model card", "exec"), scope)
        probs.append(scope["probs"])
    torch.testing.assert_close(probs[1], probs[0], rtol=0, atol=1e-6)


def test_card_snippet_reads_an_exif_rotated_photo_upright_as_training_does(
    tiny_run, tmp_path: Path
) -> None:
    snippet = _card_snippet((tiny_run.folder / "README.md").read_text(), tiny_run.folder)
    twins = exif_twins(tmp_path, 32, 16)  # the upright photo, and it stored sideways
    assert np.array_equal(read_image(twins[1], 3), read_image(twins[0], 3))
    probs = []
    for path in twins:
        scope: dict[str, Any] = {"image_path": str(path)}
        exec(compile(snippet, "model card", "exec"), scope)
        probs.append(scope["probs"])
    torch.testing.assert_close(probs[1], probs[0], rtol=0, atol=0)


def test_config_json_carries_the_runs_input_and_labels(tiny_run) -> None:
    cfg = json.loads((tiny_run.folder / "config.json").read_text())
    assert cfg["architecture"] == "test_byobnet"
    assert cfg["num_classes"] == 3
    assert cfg["label_names"] == ["cat", "dog", "fox"]
    pre = cfg["pretrained_cfg"]
    assert pre["input_size"] == [3, 16, 16]
    assert pre["mean"] == pytest.approx([0.4, 0.5, 0.6])
    assert pre["std"] == pytest.approx([0.2, 0.25, 0.3])
    assert pre["num_classes"] == 3
    assert pre["label_names"] == ["cat", "dog", "fox"]
    assert pre["license"] == "other"  # trained from initialisation on data of unknown terms


def test_fseb_json_records_regulariser_context_data_and_source(tiny_run) -> None:
    meta = json.loads((tiny_run.folder / "fseb.json").read_text())
    info = json.loads((tiny_run.dir / "run.json").read_text())
    assert set(meta) >= {"fseb_ft_version", "method", "fseb", "context", "data", "source_model"}
    assert meta["method"] == "FS-EB"
    assert meta["fseb"]["reg_scale"] == 0.5 and meta["fseb"]["prior_cov_diag"] == 1.0
    # run.json keeps the full paths; the published fseb.json names each folder only.
    root = str(tiny_run.dir.parents[1])
    assert info["data"]["train"].startswith(f"imagefolder:{root}/ind:train#")
    assert meta["context"] == scrub(info["context"]) and len(meta["context"]["fingerprint"]) == 64
    assert meta["data"] == scrub(info["data"]) and meta["data"]["train"].startswith(
        "imagefolder:ind:"
    )
    assert meta["source_model"]["name"] == "test_byobnet"
    assert meta["source_model"]["hub_id"] is None  # pretrained: false
    assert meta["results"]["test"] == pytest.approx(tiny_run.results["test"])


def test_every_file_of_the_run_has_the_mode_a_plain_open_gives(tiny_run, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    mode = plain.stat().st_mode & 0o777  # 0o666 & ~umask
    files = [p for p in tiny_run.dir.rglob("*") if p.is_file()]
    assert tiny_run.folder / "model.safetensors" in files  # safetensors writes it 0600
    assert {str(p.relative_to(tiny_run.dir)): oct(p.stat().st_mode & 0o777) for p in files} == {
        str(p.relative_to(tiny_run.dir)): oct(mode) for p in files
    }


def test_card_has_hub_metadata_results_plots_recipe_and_usage(tiny_run) -> None:
    text = (tiny_run.folder / "README.md").read_text()
    card = ModelCard(text)
    assert card.data.library_name == "timm"
    assert card.data.license == "other" and "**License: not known**" in text
    assert {"image-classification", "timm", "fseb-ft"} <= set(card.data.tags)
    assert card.data.base_model is None  # trained from initialisation, not from a Hub model
    # The model-index of the results (tests/runs/test_model_index.py): the folders by their names.
    found = {(r.dataset_name, r.metric_name): r for r in card.data.eval_results}
    accuracy = found["ind", "Acc. (%)"]
    assert accuracy.metric_value == round(100 * tiny_run.results["test"]["accuracy"], 2)
    assert (accuracy.dataset_type, accuracy.dataset_split) == ("local:ind", "test")
    assert found["owls", "OOD AUROC (%), predictive entropy"].dataset_type == "local:ood"
    row = markdown_table({"FS-EB · test_byobnet": tiny_run.results}).splitlines()[2]
    assert row in text  # the numbers of results.json, as the results table prints them
    assert "![Reliability diagram (test split)](reliability.png)" in text
    assert "<details>" in text and "reg_scale: 0.5" in text  # the resolved recipe
    assert f'timm.create_model("hf-hub:{REPO_ID}", pretrained=True)' in text
    assert 'create_model("local-dir:PATH/TO/model"' in text
    assert "trained from its random initialisation" in text


def test_failed_push_is_raised_without_retry_waits_with_the_retry_command_once_the_run_ends(
    tiny_run,
) -> None:
    assert tiny_run.results["test"]["n"] == 9 and "training" in tiny_run.results
    assert (tiny_run.folder / "model.safetensors").is_file()
    assert not [m for m in tiny_run.log if m.startswith("could not push")]  # raised, not logged
    assert tiny_run.error.startswith("could not push")
    assert UNREACHABLE in tiny_run.error and "ConnectError" in tiny_run.error
    assert f"fseb-ft push {tiny_run.dir} {REPO_ID} --private" in tiny_run.error

    waits: list[float] = []  # a client that retried with backoff would sleep between tries
    refused = pytest.raises(upload.HubPushError, match="Retry with")
    with pytest.MonkeyPatch.context() as mp, refused as err:
        mp.setattr(time, "sleep", waits.append)
        upload.push_run(tiny_run.dir, REPO_ID, endpoint=UNREACHABLE, refresh_card=False)
    assert waits == []
    assert f"--endpoint {UNREACHABLE}" in str(err.value)


def test_a_failed_push_ends_the_train_command_with_the_table_and_one_error_line(
    tiny_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(dump_recipe(tiny_run.recipe))

    def push_failed(recipe: Any) -> None:  # the run is complete (tiny_run's files) but not pushed
        raise upload.HubPushError(tiny_run.error)

    monkeypatch.setattr("fseb_ft.finetune.run", push_failed)
    with pytest.raises(SystemExit) as stop:
        cli.main([str(recipe_file)])
    assert stop.value.code == 1
    out, err = capsys.readouterr()
    assert out.startswith("| Method | Acc. (%)") and f"written to {tiny_run.dir}" in out
    assert err.startswith("fseb-ft: error: could not push") and "Traceback" not in err


def test_the_card_shows_the_sibling_psmap_run_or_a_given_baseline(tiny_run, tmp_path: Path) -> None:
    run_dir = tmp_path / "compare" / "fseb"
    shutil.copytree(tiny_run.dir, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    psmap = tmp_path / "compare" / "psmap"
    psmap.mkdir()
    other = copy.deepcopy(tiny_run.results)
    other["test"]["accuracy"] = 0.123456
    (psmap / "results.json").write_text(json.dumps(other))
    raw = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    raw["fseb"]["reg_scale"] = 0.0
    (psmap / "recipe.yaml").write_text(yaml.safe_dump(raw))

    text = export.write_model_card(run_dir).read_text()
    rows = {"FS-EB · test_byobnet": tiny_run.results, "PS-MAP · test_byobnet": other}
    table = markdown_table(rows)
    assert table in text and "12.35" in table

    text = export.write_model_card(run_dir, baseline={"Mine": other}).read_text()
    assert "| Mine |" in text and "PS-MAP · test_byobnet |" not in text


def test_a_published_model_folder_names_no_local_path(tmp_path: Path) -> None:
    data = "/home/alice/data/my_data"
    recipe = recipe_from_dict(
        {
            "model": {"name": "local-dir:/home/alice/weights/effnet", "pretrained": True},
            "data": {
                "train": {"source": "imagefolder", "path": data, "split": "train"},
                "test": {"source": "imagefolder", "path": f"{data}/", "split": "test"},
            },
            "output": {"dir": str(tmp_path / "run")},
        }
    )
    train = f"imagefolder:{data}:train#0123"
    info = {
        "num_classes": 2,
        "class_names": ["cat", "dog"],
        "input": {"size": [16, 16], "mean": [0.5] * 3, "std": [0.5] * 3},
        "data": {"train": train, "val": f"{train}|val", "test": f"imagefolder:{data}:test#4567"},
        "context": {"kind": "train", "sources": [train], "fingerprint": "ab" * 32},
        "bad_images": {"data.train": [f"{data}/train/cat/broken.jpg"]},
    }
    results = {"test": {"accuracy": 0.5, "nll": 1.0, "n": 4}, "ood": {}}
    results["training"] = {"warnings": [f"{data}/train/dog has 1 image"]}
    # test_byobnet stands in for the local weights; its timm config says apache-2.0, which a
    # local folder's config is no record of.
    model = timm.create_model("test_byobnet", num_classes=2)
    folder = export.save_model_folder(model, tmp_path / "run", recipe, info, results)

    published = ("README.md", "config.json", "fseb.json", "training_recipe.yaml")
    for name in published:
        text = (folder / name).read_text()
        assert "/home/" not in text and str(tmp_path) not in text, name
    card = ModelCard((folder / "README.md").read_text())
    assert card.data.license == "other" and "**License: not known**" in card.text
    assert "# FS-EB · effnet\n" in card.text and "| FS-EB · effnet |" in card.text
    assert "fine-tuned from the local weights `effnet`" in card.text
    assert "on the `train` split of `my_data` (" in card.text  # its folder: no fingerprint
    assert "#0123" not in card.text.split("## Method")[0]  # the provenance paragraph
    assert "`my_data/train/cat/broken.jpg`" in card.text
    assert "`fseb-ft training_recipe.yaml`" in card.text and "`PATH/TO/…` placeholders" in card.text
    meta = json.loads((folder / "fseb.json").read_text())
    assert meta["data"]["train"] == "imagefolder:my_data:train#0123"
    assert meta["source_model"]["name"] == "local-dir:effnet"
    # The published recipe is the run's with placeholders for its paths, and it loads.
    raw = yaml.safe_load((folder / "training_recipe.yaml").read_text())
    expected = yaml.safe_load(dump_recipe(recipe))
    expected["model"]["name"] = "local-dir:PATH/TO/effnet"
    expected["data"]["train"]["path"] = expected["data"]["test"]["path"] = "PATH/TO/my_data"
    expected["output"]["dir"] = "PATH/TO/run"
    assert raw == expected
    assert recipe_from_dict(raw).fseb == recipe.fseb


def test_the_card_shows_only_the_runs_own_plots(tiny_run, fake_hub, tmp_path: Path) -> None:
    # A single run trained into the output folder of --compare, beside the comparison's plots.
    run_dir = tmp_path / "compare"
    shutil.copytree(tiny_run.dir, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    for name in COMPARISON_PLOTS:
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(run_dir / name)

    upload.push_run(run_dir, REPO_ID, token="hf_test", endpoint=fake_hub.url)
    text = (run_dir / "model" / "README.md").read_text()
    assert "](reliability.png)" in text and "comparison" not in text
    (commit,) = fake_hub.commits
    assert _sent_paths(commit) == _expected_files(tiny_run.dir)
    assert not list((run_dir / "model").glob("comparison*"))


def test_push_of_a_compare_folder_names_its_runs_and_the_command_for_each(
    tiny_run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compare = tmp_path / "my runs"
    for name in ("psmap", "fseb"):
        shutil.copytree(tiny_run.dir, compare / name, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["push", str(compare), "user/tiny", "--private"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert line.startswith("fseb-ft push: error: ") and "holds 2 run(s) (fseb, psmap)" in line
    for name in ("fseb", "psmap"):
        assert upload.retry_command(compare / name, f"user/tiny-{name}", private=True) in line


class _FakeHub(BaseHTTPRequestHandler):
    """Answers what ``create_repo``, ``create_branch`` and README validation ask."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append((self.path, body))  # type: ignore[attr-defined]
        if self.path == "/api/repos/create":
            host, port = self.server.server_address[:2]
            reply = {"url": f"http://{host}:{port}/{body['organization']}/{body['name']}"}
        elif self.path == "/api/validate-yaml":
            reply = {"errors": [], "warnings": []}
        else:
            reply = {}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A loopback Hub plus the commit that ``upload_folder`` would send (captured, not sent)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    commits: list[dict[str, Any]] = []

    def fake_create_commit(self, *, repo_id, operations, revision=None, **kwargs):
        commits.append({"repo_id": repo_id, "ops": list(operations), "revision": revision})
        return SimpleNamespace(commit_url=f"{self.endpoint}/{repo_id}/commit/0")

    def fake_pipelined(api, *, repo_id, add_operations, delete_operations, revision, **kwargs):
        ops = [*delete_operations, *add_operations]
        commits.append({"repo_id": repo_id, "ops": ops, "revision": revision})
        return SimpleNamespace(commit_url=f"{api.endpoint}/{repo_id}/commit/0")

    # Whichever path this huggingface_hub takes (hf_xet pipeline or a single create_commit).
    monkeypatch.setattr(HfApi, "create_commit", fake_create_commit)
    monkeypatch.setattr(upload_pipeline, "pipelined_upload", fake_pipelined)
    host, port = server.server_address[:2]
    yield SimpleNamespace(url=f"http://{host}:{port}", requests=server.requests, commits=commits)
    server.shutdown()
    server.server_close()


def _sent_paths(commit: dict[str, Any]) -> set[str]:
    assert all(isinstance(op, CommitOperationAdd) for op in commit["ops"])
    return {op.path_in_repo for op in commit["ops"]}


def test_push_sends_exactly_the_model_folder(tiny_run, fake_hub, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run.dir, run_dir)
    folder = run_dir / "model"
    for junk in ("model.tmp", ".README.md.tmp", "notes.txt", "optimizer.bin"):
        (folder / junk).write_text("not for the Hub")
    features = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    fit = write_feature_fit(run_dir, fit_feature_ood(features, torch.arange(6) % 2))

    url = upload.push_folder(
        folder, REPO_ID, private=True, revision="dev", token="hf_test", endpoint=fake_hub.url
    )
    assert url == f"{fake_hub.url}/{REPO_ID}/commit/0"
    (commit,) = fake_hub.commits
    assert commit["repo_id"] == REPO_ID and commit["revision"] == "dev"
    assert _sent_paths(commit) == _expected_files(run_dir) | {fit.name}  # predict's fit too
    sent = {op.path_in_repo: op for op in commit["ops"]}
    assert Path(sent["model.safetensors"].path_or_fileobj) == folder / "model.safetensors"

    paths = [path for path, _ in fake_hub.requests]
    assert paths == [
        "/api/repos/create",
        f"/api/models/{REPO_ID}/branch/dev",
        "/api/validate-yaml",
    ]
    create = fake_hub.requests[0][1]
    assert (create["organization"], create["name"]) == tuple(REPO_ID.split("/"))
    assert create["visibility"] == "private"
    assert fake_hub.requests[2][1]["content"] == (folder / "README.md").read_text()


def test_cli_push_exports_a_missing_folder_and_uploads_it(
    tiny_run, fake_hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run_dir = tmp_path / "old-run"
    shutil.copytree(tiny_run.dir, run_dir)
    for path in (run_dir / "model").iterdir():
        if path.name != "model.safetensors":
            path.unlink()  # a run from before model folders existed

    argv = ["fseb-ft", "push", str(run_dir), "someone/other", "--revision", "v1"]
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(sys, "argv", [*argv, "--endpoint", fake_hub.url])
    cli.main()
    assert "pushed" in capsys.readouterr().out
    (commit,) = fake_hub.commits
    assert commit["repo_id"] == "someone/other" and commit["revision"] == "v1"
    assert _sent_paths(commit) == _expected_files(run_dir)
    assert fake_hub.requests[0][1]["visibility"] == "private"  # the recipe's output.private
    assert 'create_model("hf-hub:someone/other"' in (run_dir / "model" / "README.md").read_text()

    loaded = timm.create_model(f"local-dir:{run_dir / 'model'}", pretrained=True).eval()
    x = _inputs()
    with torch.no_grad():
        assert torch.equal(loaded(x), tiny_run.model(x))

    monkeypatch.setattr(sys, "argv", [*argv, "--no-private", "--endpoint", UNREACHABLE])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "could not push" in err
    assert f"fseb-ft push {run_dir} someone/other --revision v1 --endpoint {UNREACHABLE}" in err


def test_one_channel_fseb_model_round_trips(tmp_path: Path) -> None:
    import fseb_ft.method.models  # noqa: F401  (registers fseb_cnn with timm)

    model = timm.create_model("fseb_cnn", num_classes=4, in_chans=1).eval()
    recipe = recipe_from_dict(
        {
            "model": {"name": "fseb_cnn", "pretrained": False},
            "data": {"train": {"source": "sklearn_digits"}, "channels": 1},
            "fseb": {"reg_scale": 0.0},
            "output": {"dir": str(tmp_path), "license": "mit"},
        }
    )
    info = {
        "num_classes": 4,
        "class_names": ["0", "1", "2"],  # fewer names than outputs: padded with indices
        "input": {"size": [28, 28], "mean": [0.5], "std": [0.5]},
        "data": {"train": "sklearn.load_digits[0,1,2]"},
        "context": None,
    }
    results = {"test": {"accuracy": 0.5, "nll": 1.0, "n": 3}, "ood": {}}
    folder = export.save_model_folder(model, tmp_path, recipe, info, results)

    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    config = timm.data.resolve_data_config(model=loaded)
    assert config["input_size"] == (1, 28, 28)
    # The card's transform for this model is fseb_ft's evaluation transform, bit for bit.
    image = np.random.default_rng(2).integers(0, 256, (40, 33, 1), dtype=np.uint8)  # (H, W, 1)
    expected = timm.data.create_transform(**config)(Image.fromarray(image[:, :, 0]))
    assert torch.equal(eval_transform((28, 28), (0.5,), (0.5,))(image=image)["image"], expected)
    assert loaded.pretrained_cfg["label_names"] == ["0", "1", "2", "3"]
    text = (folder / "README.md").read_text()
    assert ModelCard(text).data.license == "mit" and "ps-map" in ModelCard(text).data.tags
    assert "License: not known" not in text  # the recipe's output.license
    assert "import fseb_ft.method.models" in text and '.convert("L")' in text
    assert json.loads((folder / "fseb.json").read_text())["context"] is None


@pytest.mark.parametrize(
    ("name", "base_model"),
    [("test_byobnet", "timm/test_byobnet.r160_in1k"), ("hf-hub:org/tiny@v1", "org/tiny")],
)
def test_card_names_the_hub_model_it_was_fine_tuned_from(
    name: str, base_model: str, tmp_path: Path
) -> None:
    model = timm.create_model("test_byobnet", num_classes=2)  # stands in for the fine-tuned one
    recipe = recipe_from_dict(
        {
            "model": {"name": name, "pretrained": True},
            "data": {"train": {"source": "sklearn_digits"}},
            "output": {"dir": str(tmp_path)},
        }
    )
    info = {"num_classes": 2, "class_names": ["a", "b"], "input": {"size": [16, 16],
            "mean": [0.5] * 3, "std": [0.5] * 3}}  # fmt: skip
    folder = export.save_model_folder(model, tmp_path, recipe, info, {"test": {"n": 0}})
    card = ModelCard((folder / "README.md").read_text())
    assert card.data.base_model == base_model
    assert card.data.license == "apache-2.0"  # timm's record of the source weights' license
    assert "License: not known" not in card.text
    assert f"fine-tuned from [`{base_model}`](https://huggingface.co/{base_model})" in card.text


def test_output_config_checks_the_repo_id() -> None:
    assert OutputConfig(push_to_hub="user/name").push_to_hub == "user/name"
    for bad in ("name", "a/b/c", "user/ name", "/name"):
        with pytest.raises(ConfigError, match="push_to_hub"):
            OutputConfig(push_to_hub=bad)


def test_retry_command_quotes_paths() -> None:
    cmd = upload.retry_command(Path("runs/my run"), "u/n", private=True, revision="dev")
    assert cmd == "fseb-ft push 'runs/my run' u/n --private --revision dev"
    assert huggingface_hub.__version__  # the client these tests exercise


def _finished_looking_run(tmp_path: Path) -> tuple[Path, Any]:
    """A run folder with a recipe (pushing to REPO_ID) and nothing else."""
    raw = tiny_recipe(tmp_path / "ind", tmp_path / "ood", tmp_path / "run")
    recipe = recipe_from_dict(raw)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "recipe.yaml").write_text(dump_recipe(recipe))
    return tmp_path / "run", recipe


def test_share_run_logs_what_the_disk_refuses_and_lets_a_bug_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir, recipe = _finished_looking_run(tmp_path)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(upload, "save_model_folder", disk_full)
    with caplog.at_level(logging.ERROR, logger="fseb_ft.runs.upload"):
        assert upload.share_run(torch.nn.Linear(1, 1), run_dir, recipe, {}, {}) is None
    (record,) = caplog.records
    assert record.getMessage().startswith(f"could not write the model folder {run_dir / 'model'}")
    assert f"fseb-ft push {run_dir} {REPO_ID} --private" in record.getMessage()

    def missing_title(*args: Any, **kwargs: Any) -> None:
        raise KeyError("no title for the OOD score 'new'")  # a bug, not the disk

    monkeypatch.setattr(upload, "save_model_folder", missing_title)
    with pytest.raises(KeyError, match="no title"):
        upload.share_run(torch.nn.Linear(1, 1), run_dir, recipe, {}, {})


def test_push_errors_are_fseb_ft_errors_and_the_retry_line_stays_a_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = _finished_looking_run(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(["push", str(run_dir), "user/name"])
    assert stop.value.code == 1
    assert capsys.readouterr().err == (
        f"fseb-ft: error: {run_dir} is not a finished fseb-ft run: run.json is missing (nothing "
        "was sent) (--debug shows where)\n"
    )

    for name in ("config.json", "fseb.json"):  # an exported folder: straight to the upload
        (run_dir / "model").mkdir(exist_ok=True)
        (run_dir / "model" / name).write_text("{}")

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the Hub refused")

    monkeypatch.setattr(upload, "push_folder", refused)
    with pytest.raises(SystemExit) as stop:
        cli.main(["push", str(run_dir), "user/name", "--keep-card"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fseb-ft: error: could not push {run_dir / 'model'} to the Hub repo")
    assert "ConnectionError: the Hub refused" in err
    assert f"  {upload.retry_command(run_dir, 'user/name', private=True)}\n" in err
