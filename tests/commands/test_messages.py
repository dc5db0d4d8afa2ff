"""Error and warning messages say what actually happened and what applies to this run."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import timm
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

import fseb_ft.push as push
from fseb_ft import cli
from fseb_ft.data.files import read_image
from fseb_ft.data.screening import check_image
from fseb_ft.engine.callbacks import TrainState
from fseb_ft.engine.loop import NonFiniteLossError, _epoch_line, _non_finite_message
from fseb_ft.finetune import run
from fseb_ft.logs import configure_logging
from fseb_ft.method.models import create_model
from fseb_ft.method.regularizer import CholeskyJitterWarning, function_space_term
from fseb_ft.prediction import predict_images
from fseb_ft.recipe import ModelConfig, recipe_from_dict
from fseb_ft.runs import upload
from tests.helpers import poison_loss, tiny_recipe, write_image_folder

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens


def test_nan_before_any_epoch_finished_names_no_checkpoint_and_fits_an_fp32_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    write_image_folder(data, "train", {"cat": 6, "dog": 6})
    write_image_folder(data, "test", {"cat": 2, "dog": 2})
    raw = tiny_recipe({"ind": data, "ood": data}, tmp_path / "run", epochs=1)
    raw["data"]["augment"] = "none"
    recipe = recipe_from_dict(raw)
    poison_loss(monkeypatch)
    with pytest.raises(NonFiniteLossError) as err:
        run(recipe)
    message = str(err.value)
    assert "non-finite in epoch 1" in message and "no epoch had finished" in message
    assert "checkpoints" not in message and not (tmp_path / "run" / "checkpoints").exists()
    assert "mixed_precision" not in message  # a float32 run
    assert "lower optim.lr" in message and "raise fseb.prior_cov_diag" in message


def test_nan_message_suggests_only_what_applies(tmp_path: Path) -> None:
    raw = {"data": {"train": {"source": "imagefolder", "path": str(tmp_path)}}}
    raw["output"] = {"dir": str(tmp_path)}
    means = {"loss": float("nan")}
    bf16 = SimpleNamespace(mixed_precision="bf16", native_amp=True, distributed_type="NO")
    fp32 = SimpleNamespace(mixed_precision="no", native_amp=False, distributed_type="NO")
    # Accelerate keeps a requested fp16 on CPU but autocasts nothing: the run was fp32.
    fp16_on_cpu = SimpleNamespace(mixed_precision="fp16", native_amp=False, distributed_type="NO")
    fseb = recipe_from_dict(raw)
    psmap = recipe_from_dict({**raw, "fseb": {"reg_scale": 0}})
    text = _non_finite_message(
        fseb.optim, fseb.fseb.reg_scale, tmp_path, bf16, 0, TrainState(), means
    )
    assert "train.mixed_precision=no (this run used bf16)" in text
    assert "mixed_precision" not in _non_finite_message(
        fseb.optim, fseb.fseb.reg_scale, tmp_path, fp32, 0, TrainState(), means
    )
    assert "mixed_precision" not in _non_finite_message(
        fseb.optim, fseb.fseb.reg_scale, tmp_path, fp16_on_cpu, 0, TrainState(), means
    )
    assert "prior_cov_diag" not in _non_finite_message(
        psmap.optim, psmap.fseb.reg_scale, tmp_path, fp32, 0, TrainState(), means
    )


def test_push_of_a_folder_that_is_not_a_run_says_so_without_hub_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        push.main([str(tmp_path), "user/name"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is not a run directory (it has no recipe.yaml)" in err
    assert "token" not in err and "Nothing was lost" not in err

    with pytest.raises(FileNotFoundError) as raised:
        upload.push_run(tmp_path, "user/name", endpoint=UNREACHABLE)
    assert not isinstance(raised.value, upload.HubPushError)
    assert "is not a finished fseb-ft run: recipe.yaml is missing" in str(raised.value)
    assert "Nothing was lost" not in str(raised.value) and "token" not in str(raised.value)


def test_a_local_dir_pointing_nowhere_says_so_and_blames_no_hub(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(OSError) as err:
        create_model(ModelConfig(name=f"local-dir:{missing}"), num_classes=3)
    message = str(err.value)
    assert f"the folder {missing} does not exist" in message
    assert "Hub" not in message.replace("Hub format", "") and "unreachable" not in message


@pytest.mark.parametrize("offline", [False, True])
def test_pretrained_weights_offline_point_to_hf_hub_offline_and_local_dir(
    monkeypatch: pytest.MonkeyPatch, offline: bool
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        try:
            raise OSError("[Errno -2] Name or service not known")
        except OSError as dns:
            raise LocalEntryNotFoundError("cannot find the requested files") from dns

    monkeypatch.setattr(timm, "create_model", no_network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(OSError) as err:
        create_model(ModelConfig(name="resnet18"), num_classes=3)
    message = str(err.value)
    assert "local-dir:" in message and "model.pretrained=false" in message
    if offline:
        assert "HF_HUB_OFFLINE=1 is set and they are not in the Hugging Face cache" in message
    else:
        assert "Set HF_HUB_OFFLINE=1" in message and "Name or service not known" in message


def test_an_unreachable_hub_fails_at_once_without_retrying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    waits: list[float] = []  # huggingface_hub's back-off would sleep 23 s in all
    monkeypatch.setattr(time, "sleep", waits.append)
    with pytest.raises(OSError) as err, caplog.at_level(logging.WARNING):
        create_model(ModelConfig(name="hf-hub:fseb-ft/no-such-model"), num_classes=3)
    assert waits == []
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]
    message = str(err.value)
    assert "could not fetch pretrained weights" in message and "Set HF_HUB_OFFLINE=1" in message
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # the cache-only try is undone


def test_huggingface_hub_lines_go_through_the_one_log_handler() -> None:
    configure_logging()
    # Its own stderr handler printed every line (each retry) a second time beside the root's.
    assert logging.getLogger("huggingface_hub").handlers == []
    assert logging.getLogger("huggingface_hub").propagate


def test_an_empty_image_file_is_called_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert check_image(empty) == check_image(b"") == "empty file (0 bytes)"  # before training
    with pytest.raises(ValueError) as err:  # fseb-ft predict: its note shows the cause
        read_image(empty, channels=3)
    assert str(err.value.__cause__) == "empty file (0 bytes)"
    assert str(err.value).endswith(f"(file {empty}): empty file (0 bytes)")


@pytest.mark.parametrize("value", ["1.5", "0", "-0.1"])
def test_coverage_out_of_range_names_one_range(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", "runs/x", "images/", "--coverage", value])
    assert stop.value.code == 2
    expected = f"argument --coverage: must lie in (0, 1], got {float(value):g}"
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected)
    with pytest.raises(ValueError, match=r"^coverage must lie in \(0, 1\], got "):
        predict_images("runs/x", ["images/"], coverage=float(value))


def _exactly_rank_6_features() -> torch.Tensor:
    """16 distinct context points whose features span exactly 6 directions: integer products in
    float64 are exact, so ``Kc = H Hᵀ + 1 1ᵀ`` has rank 7 on every machine, not to rounding."""
    g = torch.Generator().manual_seed(0)
    A = torch.randint(-3, 4, (16, 6), generator=g).double()  # (16, 6)
    B = torch.randint(-3, 4, (6, 40), generator=g).double()  # (6, 40)
    return A @ B  # (16, 40)


def test_jitter_warning_on_singular_kc_without_duplicates_says_what_happened() -> None:
    H = _exactly_rank_6_features()
    F = torch.randn(16, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function_space_term(F, H, 1.0, 0.0)
    (warning,) = [w for w in caught if issubclass(w.category, CholeskyJitterWarning)]
    message = str(warning.message)
    assert "numerical rank 7 of 16" in message and "no two context points are identical" in message
    assert "uplicate context points" not in message and "prior_cov_diag = 0" in message
    assert "Raise fseb.prior_cov_diag" in message


def test_jitter_warning_when_the_blas_factorises_a_singular_kc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some CPUs' BLAS round a singular Kc's last pivots to tiny positive numbers, and the plain
    Cholesky "succeeds": simulated here, so the verdict must come from the pivots, not the BLAS."""
    real = torch.linalg.cholesky_ex
    calls: list[int] = []

    def rounds_to_success(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        if len(calls) == 1:  # the plain factorisation: succeeds with pivots ~1e-14 of the diagonal
            level = A.diagonal().mean()
            return real(A + 1e-14 * level * torch.eye(A.shape[0], dtype=A.dtype))
        return real(A)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", rounds_to_success)
    H = _exactly_rank_6_features()
    F = torch.randn(16, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with pytest.warns(CholeskyJitterWarning, match="numerical rank 7 of 16"):
        out = function_space_term(F, H, 1.0, 0.0)
    # The jittered Kc bounds R_f: without it, the 1e-14 pivots put it beyond 1e10.
    assert len(calls) >= 2 and 0 < float(out) < 1e12


def test_jitter_warning_counts_duplicate_context_points() -> None:
    g = torch.Generator().manual_seed(1)
    H = torch.randn(4, 3, generator=g, dtype=torch.float64).repeat(3, 1)  # 12 points, 4 distinct
    F = torch.randn(12, 2, generator=g, dtype=torch.float64)
    with pytest.warns(CholeskyJitterWarning, match="8 of the 12 context points repeat an earlier"):
        function_space_term(F, H, 1.0, 0.0)


@pytest.mark.parametrize(
    ("select", "shown", "lines"),
    [
        ("nll", "", 1),
        ("accuracy", "", 1),
        ("ece", ", ece 0.01234 |", 1),
        ("ood_digits_5_9_train_auroc", "\n  val ood_digits_5_9_train_auroc 0.9876", 2),
    ],
)
def test_the_epoch_summary_fits_80_columns_with_the_key_numbers(
    select: str, shown: str, lines: int
) -> None:
    record = {
        "epoch": 7, "step": 70, "train_loss": 0.41234, "train_nll": 0.39, "train_fs_reg": 12.5,
        "train_param_reg": 70085.16, "lr": 0.01, "param_norm": 374.2, "val_accuracy": 0.91234,
        "val_nll": 0.30121, "val_ece": 0.01234, "val_brier": 0.2, "val_chance_accuracy": 0.34,
        "val_ood_digits_5_9_train_auroc": 0.9876, "seconds": 12.34,
    }  # fmt: skip
    text = _epoch_line(record, select, epochs=20)
    assert text.startswith("epoch 7/20: train loss 0.4123 | val acc 91.23%, nll 0.3012")
    assert "| 12.3 s" in text and shown in text and "param_reg" not in text
    assert [len(line) <= 80 for line in text.splitlines()] == [True] * lines
    # A long run going badly: the widest numbers still fit.
    record |= {"epoch": 100, "train_loss": 70085.16, "val_nll": 12345.6, "seconds": 1234.56}
    assert all(len(line) <= 80 for line in _epoch_line(record, select, 100).splitlines())
