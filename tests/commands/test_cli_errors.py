"""Errors a user can cause end in one `fseb-ft: error` line and an exit status, no traceback."""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
from datasets import Dataset

from fseb_ft import cli, logs
from fseb_ft import finetune as finetune_module
from fseb_ft.engine import run as run_module
from fseb_ft.method import devices
from fseb_ft.runs.atomic import DiskFullError
from tests.commands.test_predict import read_only
from tests.helpers import poison_loss, snapshot, write_image_folder

ROOT = Path(__file__).parents[2]
QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], code: int) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "ok", "train", {"cat": 4, "dog": 4})
    # owl: not a training class
    write_image_folder(root / "ok", "test", {"cat": 2, "dog": 2, "owl": 2})
    Dataset.from_dict({"image": [np.zeros((4, 4, 3), np.uint8)] * 4}).save_to_disk(root / "nolabel")
    (root / "a-file").write_text("")
    # A Kaggle root, as a new user pointed at it: its only sub-folder is train_images/.
    write_image_folder(root / "kaggle", "train_images", {".": 8})
    (root / "kaggle" / "train.csv").write_text("id_code,diagnosis\n")
    return root


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["nope.yaml"], 2, "recipe file 'nope.yaml' does not exist"),
        ([QUICKSTART, "fseb.reg_scal=1"], 2, "unknown key 'fseb.reg_scal'"),
        ([QUICKSTART, "train.epochs=0"], 2, "train.epochs=0: must be ≥ 1"),
        ([QUICKSTART, "fseb.reg_scale"], 2, "must look like section.key=value"),
        ([QUICKSTART, "--compare", "fseb.reg_scale=0"], 2, "fseb.reg_scale=0: --compare"),
        ([QUICKSTART, "sweep.space={fseb.nope: {low: 1, high: 2}}"], 2, "fseb.nope"),
        (["evaluate", "/no/such/run"], 2, "/no/such/run does not exist"),
        (["evaluate", "a", "--ensemble"], 2, "--ensemble needs at least two run directories"),
        (["push", "/no/such/run", "user/name"], 2, "is not a run directory"),
        (
            [QUICKSTART, "train.epochs=[1"],
            2,
            "override 'train.epochs=[1': its value is not valid YAML at line 1, column 3: "
            "expected ',' or ']'",
        ),
    ],
)
def test_command_line_mistakes(
    argv: list[str], code: int, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in _fails(argv, capsys, code)


def test_a_missing_positional_is_the_only_one_named_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The usage shows overrides (and predict's IMAGES) as optional, and so does the error."""
    for command, required in (("train", "recipe"), ("sweep", "recipe"), ("cache", "recipe"),
                              ("predict", "model")):  # fmt: skip
        line = _fails([command], capsys, 2)
        assert line.endswith(f"error: the following arguments are required: {required}"), line


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.train.source=imagefolder", "data.train.path={root}/missing"], "data.train: "),
        (["data.train.source=disk", "data.train.path={root}/nolabel"], "column 'label' not"),
        (
            ["data.train.source=imagefolder", "data.train.path={root}/ok",
             "data.train.classes=null", "data.test.source=imagefolder",
             "data.test.path={root}/ok", "data.test.classes=null", "data.ood={{}}"],
            "data.test (imagefolder:",
        ),
        (["model.name=no_such_net"], "model.name='no_such_net' is not a timm model"),
        (["model.name=local-dir:{root}/missing"], "does not exist"),
    ],
)  # fmt: skip
def test_data_and_model_mistakes_stop_before_training(
    overrides: list[str], expected: str, data: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    argv = [QUICKSTART, f"output.dir={tmp_path / 'run'}"]
    argv += [o.format(root=data) for o in overrides]
    line = _fails(argv, capsys, 1)
    assert line.startswith("fseb-ft: error: ") and expected in line
    assert line.endswith("(--debug shows where)")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [f"data.{split}.{key}={value}" for split in ("train", "test")
             for key, value in (("source", "imagefolder"), ("path", "{root}/kaggle"),
                                ("split", "train"), ("classes", "null"))],
            "data.train (imagefolder {root}/kaggle, split train) has 1 class ('train_images'): "
            "a classifier needs images of at least 2 classes. Point data.train.path at the "
            "folder whose sub-folders are the classes",
        ),
        (
            ["data.train.classes=[3]", "data.test.classes=[3]"],
            "data.train (sklearn_digits, split train, classes [3]) has 1 class ('3')",
        ),
    ],
)  # fmt: skip
def test_training_images_of_one_class_stop_before_anything_is_written(
    overrides: list[str], expected: str, data: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    earlier = tmp_path / "run" / "results.json"  # what train.resume=never would remove
    earlier.parent.mkdir()
    earlier.write_text("{}")
    # The test split is as wrong: the old code trained and reported 100 % accuracy, NLL -0.0000.
    argv = [QUICKSTART, f"output.dir={tmp_path / 'run'}", "train.resume=never", "data.ood={{}}"]
    argv += ["train.epochs=1"]
    line = _fails([*(a.format(root=data) for a in argv + overrides)], capsys, 1)
    assert line.startswith(f"fseb-ft: error: {expected.format(root=data)}")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["results.json"]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("{root}/a-file", "output.dir {root}/a-file is a file, not a folder"),
        ("{root}/a-file/run", "{root}/a-file/run lies inside {root}/a-file, which is a file"),
    ],
)  # fmt: skip
def test_an_output_dir_that_is_a_file_says_so(
    output: str, expected: str, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails([QUICKSTART, f"output.dir={output.format(root=data)}"], capsys, 2)
    assert expected.format(root=data) in line


def test_an_output_that_cannot_be_written_is_one_line_before_any_data_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    read_only(locked, monkeypatch)

    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("data were loaded")

    monkeypatch.setattr(run_module, "build_splits", no_data)
    line = _fails([QUICKSTART, f"output.dir={locked / 'run'}"], capsys, 2)
    assert f"output.dir {locked / 'run'} (made in {locked}) cannot be written to" in line
    line = _fails([QUICKSTART, f"output.dir={locked}", "--compare"], capsys, 2)
    assert f"output.dir {locked} cannot be written to (Permission denied)" in line
    out = locked / "p.csv"
    line = _fails(["predict", "/no/such/run", "x.png", "--out", str(out)], capsys, 1)
    assert f"--out {out}: its folder {locked} cannot be written to" in line
    (tmp_path / "folder.csv").mkdir()
    line = _fails(["predict", "/no/such/run", "x.png", "--out", str(tmp_path / "folder.csv")],
                  capsys, 1)  # fmt: skip
    assert "is a folder: give a file (.csv or .jsonl)" in line
    (tmp_path / "a-file").write_text("")
    argv = ["evaluate", "/no/run-a", "/no/run-b", "--ensemble", "--out", str(tmp_path / "a-file")]
    assert f"--out {tmp_path / 'a-file'} is a file, not a folder" in _fails(argv, capsys, 1)


def test_a_yaml_syntax_error_is_one_line_under_python_m(tmp_path: Path) -> None:
    # One real process (the README's form); the other forms run in-process below.
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("model: {name: resnet18\ndata: [\n")
    done = subprocess.run(
        [sys.executable, "-m", "fseb_ft.finetune", str(recipe)],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    prog, _, message = done.stderr.partition(": error: ")
    assert prog in ("fseb-ft", "python -m fseb_ft.finetune")
    assert message.startswith(f"recipe file {recipe} is not valid YAML at line 2, column 5: ")


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("fseb_ft", [QUICKSTART]),
        ("fseb_ft.finetune", [QUICKSTART]),
        ("fseb_ft.evaluate", ["runs/x"]),
        ("fseb_ft.sweep", [QUICKSTART]),
        ("fseb_ft.push", ["runs/x"]),
        ("fseb_ft.predict", ["runs/x", "images/"]),
    ],
)
def test_every_module_entry_point_ends_an_error_as_fseb_ft_does(
    module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    def full_disk(verbose: bool = False) -> None:
        raise OSError("no space left on device")

    # Every command sets up logging once its command line is read. `python -m fseb_ft.X` runs X
    # anew and so imports the patched one; `python -m fseb_ft` runs the imported finetune.
    monkeypatch.setattr(logs, "configure_logging", full_disk)
    monkeypatch.setattr(finetune_module, "configure_logging", full_disk)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(SystemExit) as stop, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert stop.value.code == 1
    assert (
        capsys.readouterr().err == "fseb-ft: error: no space left on device (--debug shows where)\n"
    )


def _tiny(tmp_path: Path) -> list[str]:
    return [QUICKSTART, f"output.dir={tmp_path / 'run'}", "train.epochs=1", "data.train.limit=40"]


def test_nan_loss_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    poison_loss(monkeypatch)
    assert "training loss became non-finite" in _fails(_tiny(tmp_path), capsys, 2)


def test_a_full_disk_is_one_line_and_keeps_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(*args, **kwargs):
        raise DiskFullError(f"no space left on device in {tmp_path}: could not write X")

    monkeypatch.setattr(run_module, "write_best_weights", full)  # the name run() calls
    line = _fails(_tiny(tmp_path), capsys, 1)
    assert "no space left on device" in line
    assert (tmp_path / "run" / "recipe.yaml").is_file()  # written before, still there


def test_an_interrupted_run_says_how_to_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune_module, "run", interrupted)
    line = _fails(_tiny(tmp_path), capsys, 130)
    assert line.startswith("fseb-ft: interrupted; nothing complete was lost")
    command = shlex.join(["fseb-ft", *_tiny(tmp_path)])
    assert line.endswith(f"rerun the same command to continue: {command}")


def test_sigterm_ends_a_command_as_ctrl_c_does_with_status_143() -> None:
    # What `timeout` and job schedulers send: it ended the process silently (status -15).
    program = (
        "import os, signal, time\n"
        "from fseb_ft.cli import run_entry\n"
        "def main(argv, prog):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "run_entry(main, ['recipe.yaml', 'train.epochs=3'], prog='fseb-ft')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 143
    assert done.stderr == (
        "fseb-ft: terminated (SIGTERM); nothing complete was lost (a training keeps its last "
        "complete epoch): rerun the same command to continue: fseb-ft recipe.yaml train.epochs=3\n"
    )


def test_debug_shows_the_traceback(data: Path, tmp_path: Path) -> None:
    argv = [QUICKSTART, f"output.dir={tmp_path}", "model.name=no_such_net", "--debug"]
    with pytest.raises(ValueError, match="is not a timm model"):
        cli.main(argv)


def test_a_cholesky_failure_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # s (‖h‖² + 1) overflows float64: Kc has inf entries and cannot be factorised at all.
    line = _fails([*_tiny(tmp_path), "fseb.prior_cov_scale=1e308"], capsys, 1)
    assert "the prior covariance Kc (32×32) has NaN/inf entries" in line


def test_a_device_this_machine_lacks_is_one_usage_line_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for command in (["predict", "/no/such/run", "x.png"], ["evaluate", "/no/such/run"]):
        for device, why in (
            ("cuda", "is not on this machine"),
            ("mps", "is not on this machine"),
            ("foo", "is not a device"),
        ):
            line = _fails([*command, "--device", device], capsys, 2)
            assert f"argument --device: device {device!r} {why}; available here: cpu" in line
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(devices.DeviceError, match=r"available here: cpu, cuda:0, cuda:1$"):
        devices.resolve_device("cuda:2")
    line = _fails(["evaluate", "/no/such/run", "--device", "cuda:1"], capsys, 2)
    assert "CUDA_VISIBLE_DEVICES=1 picks that one" in line


def test_an_unreachable_hub_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    argv = [*_tiny(tmp_path), "model.name=hf-hub:fseb-ft/no-such-model", "model.pretrained=true"]
    line = _fails(argv, capsys, 1)
    assert "HF_HUB_OFFLINE=1 is set" in line and "local-dir:" in line
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.no_figures  # the refusal is about the run's files; figures are drawn elsewhere
def test_a_refused_rerun_leaves_the_finished_run_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(_tiny(tmp_path))
    run_dir = tmp_path / "run"
    before = snapshot(run_dir)
    assert "results.json" in before and any(k.startswith("checkpoints") for k in before)
    line = _fails([*_tiny(tmp_path), "optim.lr=0.5"], capsys, 2)
    assert "holds checkpoints of a run with a different recipe" in line
    assert snapshot(run_dir) == before


def test_accelerate_launch_q_leaves_the_error_line_alone(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """What docs/troubleshooting.md tells users of Accelerate's one-process launcher: without
    ``-q`` it follows a failed script with a ``CalledProcessError`` traceback, with ``-q`` it
    exits 1 and the script's line stays alone."""
    from accelerate.commands import launch

    script = "import sys; sys.stderr.write('fseb-ft: error: x\\n'); sys.exit(2)"
    child = ([sys.executable, "-c", script], dict(os.environ))
    monkeypatch.setattr(launch, "prepare_simple_launcher_cmd_env", lambda args: child)
    args = launch.launch_command_parser().parse_args(["-q", "-m", "fseb_ft.finetune", "r.yaml"])
    with pytest.raises(SystemExit) as stop:
        launch.simple_launcher(args)
    assert stop.value.code == 1 and capfd.readouterr().err == "fseb-ft: error: x\n"
    args.quiet = False
    with pytest.raises(subprocess.CalledProcessError):
        launch.simple_launcher(args)


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_the_docs_one_process_accelerate_launches_are_quiet(doc: str) -> None:
    launches = [
        line.strip()
        for line in (ROOT / doc).read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("accelerate launch") and "--multi_gpu" not in line
    ]
    assert launches and all(line.startswith("accelerate launch -q ") for line in launches)
