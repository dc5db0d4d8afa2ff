"""Creating the timm backbone (timm names, ``hf-hub:``, ``local-dir:``) and its data config."""

from __future__ import annotations

from dataclasses import dataclass

import timm
from timm.data import resolve_data_config
from torch import nn

from fseb_ft.config import DataConfig, ModelConfig

__all__ = ["InputSpec", "create_model", "input_spec"]


@dataclass(frozen=True)
class InputSpec:
    """How images must be prepared for the model."""

    size: tuple[int, int]
    """(height, width) fed to the model."""
    mean: tuple[float, ...]
    """Per-channel normalisation mean in [0, 1] units."""
    std: tuple[float, ...]
    """Per-channel normalisation std in [0, 1] units."""


def create_model(cfg: ModelConfig, num_classes: int, in_chans: int = 3) -> nn.Module:
    """Create the classifier with a fresh ``num_classes`` head.

    The same call gives the starting weights and, copied, φ0: a pretrained backbone when
    ``cfg.pretrained`` (timm resets only the classifier), otherwise timm's initialisation under
    the caller's seed. ``hf-hub:`` and ``local-dir:`` go through timm's own loaders, so a folder
    written by :func:`timm.models.save_for_hf` (or by ``fseb_ft.hub``) loads offline.
    """
    try:
        return timm.create_model(
            cfg.name,
            pretrained=cfg.pretrained,
            num_classes=num_classes,
            in_chans=in_chans,
            drop_rate=cfg.drop_rate,
            drop_path_rate=cfg.drop_path_rate,
        )
    except RuntimeError as err:
        if "Unknown model" in str(err):
            raise ValueError(
                f"model.name={cfg.name!r} is not a timm model; use a name from "
                "timm.list_models(), 'hf-hub:org/name' or 'local-dir:/path/to/folder'"
            ) from err
        raise
    except OSError as err:
        raise OSError(
            f"could not fetch pretrained weights for model.name={cfg.name!r}: {err}. The Hugging "
            "Face Hub may be unreachable: retry with network access, point model.name at a "
            "'local-dir:' folder in timm's Hub format, or set model.pretrained=false."
        ) from err


def input_spec(model: nn.Module, model_cfg: ModelConfig, data_cfg: DataConfig) -> InputSpec:
    """Input size and normalisation: the model's pretrained data config unless the recipe says."""
    resolved = resolve_data_config(model=model)
    _, h, w = resolved["input_size"]
    size = (model_cfg.input_size, model_cfg.input_size) if model_cfg.input_size else (h, w)
    mean = tuple(data_cfg.mean or resolved["mean"])
    std = tuple(data_cfg.std or resolved["std"])
    if len(mean) != data_cfg.channels:
        # Grayscale input to a model whose data config is RGB: average the channel statistics.
        mean = (sum(mean) / len(mean),) * data_cfg.channels
        std = (sum(std) / len(std),) * data_cfg.channels
    return InputSpec(size=size, mean=mean, std=std)
