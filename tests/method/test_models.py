"""Model creation: timm names, local-dir folders, the paper's CNN, input specs, clear errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import timm
import torch
from timm.models import save_for_hf

from fseb_ft.logs import configure_logging
from fseb_ft.method.models import create_model, input_spec
from fseb_ft.method.objective import timm_features
from fseb_ft.recipe import ConfigError, DataConfig, DatasetSpec, ModelConfig, recipe_from_dict

DIGITS = DataConfig(train=DatasetSpec(source="sklearn_digits"))


def test_paper_cnn_has_the_reference_architecture() -> None:
    model = timm.create_model("fseb_cnn", num_classes=10)
    # conv 1→32 (320) + conv 32→64 (18 496) + dense 3136→256 (803 072) + dense 256→10 (2 570)
    assert sum(p.numel() for p in model.parameters()) == 320 + 18_496 + 803_072 + 2_570
    x = torch.randn(3, 1, 28, 28)
    assert model(x).shape == (3, 10)
    assert timm_features(model, x).shape == (3, 256)
    assert (timm_features(model, x) >= 0).all()  # post-ReLU hidden layer
    model.reset_classifier(4)
    assert model(x).shape == (3, 4)


def test_create_model_resets_the_head_and_reads_the_data_config() -> None:
    cfg = ModelConfig(name="fseb_cnn", pretrained=False)
    model = create_model(cfg, num_classes=5, in_chans=1)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 5)
    spec = input_spec(model, cfg, DataConfig(train=DIGITS.train, channels=1))
    assert spec.size == (28, 28) and spec.mean == (0.5,) and spec.std == (0.5,)
    # An RGB pipeline on a model whose statistics are grayscale repeats them per channel.
    spec3 = input_spec(model, ModelConfig(name="fseb_cnn", input_size=32), DIGITS)
    assert spec3.size == (32, 32) and spec3.mean == (0.5, 0.5, 0.5)


def test_local_dir_folder_gives_starting_weights_and_a_new_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = timm.create_model("test_byobnet", num_classes=7)
    save_for_hf(source, tmp_path / "folder")
    cfg = ModelConfig(name=f"local-dir:{tmp_path / 'folder'}", pretrained=True)
    model = create_model(cfg, num_classes=3)
    assert model.get_classifier().out_features == 3
    body = {k: v for k, v in source.state_dict().items() if not k.startswith("head")}
    loaded = model.state_dict()
    for key, value in body.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def test_zero_head_starts_at_uniform_predictions_and_keeps_the_body(tmp_path: Path) -> None:
    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_byobnet", num_classes=7), tmp_path / "folder")
    name = f"local-dir:{tmp_path / 'folder'}"
    timm_head = create_model(ModelConfig(name=name, head_init="timm"), num_classes=3).eval()
    zero_head = create_model(ModelConfig(name=name, head_init="zeros"), num_classes=3).eval()
    x = torch.randn(4, 3, 32, 32)
    assert timm_head(x).abs().max() > 0
    assert torch.equal(zero_head(x), torch.zeros(4, 3))  # logits = the FS-EB prior mean
    torch.testing.assert_close(timm_features(zero_head, x), timm_features(timm_head, x))
    with pytest.raises(ValueError, match=r"head_init=zeros: .* no parameters"):
        create_model(ModelConfig(name="fseb_cnn", pretrained=False, head_init="zeros"), 0, 1)
    with pytest.raises(ConfigError, match=r"model.head_init='normal'.*'timm', 'zeros'"):
        recipe_from_dict(
            {"model": {"head_init": "normal"}, "data": {"train": {"source": "sklearn_digits"}}}
        )


def test_default_head_is_zero_for_a_pretrained_backbone_and_timm_from_scratch(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_byobnet", num_classes=7), tmp_path / "folder")
    pretrained = create_model(ModelConfig(name=f"local-dir:{tmp_path / 'folder'}"), 3)
    assert ModelConfig().head_init == "auto"
    assert all(torch.count_nonzero(p) == 0 for p in pretrained.get_classifier().parameters())
    scratch = create_model(ModelConfig(name="test_byobnet", pretrained=False), 3)
    assert torch.count_nonzero(scratch.get_classifier().weight) > 0


def test_unknown_model_and_missing_weights_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model.name='no_such_net' is not a timm model"):
        create_model(ModelConfig(name="no_such_net"), num_classes=3)
    with pytest.raises((OSError, FileNotFoundError, RuntimeError)):
        create_model(ModelConfig(name=f"local-dir:{tmp_path / 'missing'}"), num_classes=3)


@pytest.mark.parametrize("verbose", [False, True])
def test_loading_a_backbone_logs_timm_info_lines_only_when_verbose(
    tmp_path: Path, verbose: bool, caplog: pytest.LogCaptureFixture
) -> None:
    save_for_hf(timm.create_model("test_byobnet", num_classes=7), tmp_path / "folder")
    configure_logging(verbose)
    try:
        with caplog.at_level(logging.NOTSET):
            create_model(ModelConfig(name=f"local-dir:{tmp_path / 'folder'}"), num_classes=3)
    finally:
        configure_logging(False)
    timm_lines = [r for r in caplog.records if r.name.startswith("timm")]
    # timm says "Loaded … from checkpoint" and names the head keys it left out, at INFO.
    assert bool(timm_lines) == verbose
