"""Creating the timm backbone (timm names, ``hf-hub:``, ``local-dir:``) and its data config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import huggingface_hub
import timm
import torch
from timm.data import resolve_data_config
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from fseb_ft.data.hub_access import hub_or_cache
from fseb_ft.data.inputs import InputSpec
from fseb_ft.recipe import DataConfig, ModelConfig

__all__ = [
    "PaperCNN",
    "create_model",
    "fseb_cnn",
    "head_init",
    "input_spec",
    "planned_input_size",
]


def create_model(cfg: ModelConfig, num_classes: int, in_chans: int = 3) -> nn.Module:
    """Create the classifier with a fresh ``num_classes`` head.

    The same call gives the starting weights and, copied, φ0: a pretrained backbone when
    ``cfg.pretrained`` (timm resets only the classifier), otherwise timm's initialisation under
    the caller's seed. ``hf-hub:`` and ``local-dir:`` go through timm's own loaders, so a folder
    written by :func:`timm.models.save_for_hf` (or by ``fseb_ft.push``) loads offline.
    """
    try:
        model = _timm_model(
            cfg,
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
        raise OSError(_load_failure(cfg, err)) from err
    if head_init(cfg) == "zeros":
        zero_classifier(model)
    return model


def _timm_model(cfg: ModelConfig, **kwargs: Any) -> nn.Module:
    """``timm.create_model(cfg.name, **kwargs)``; with the Hub unreachable, from the cache only,
    at once (:func:`~fseb_ft.data.hub_access.hub_or_cache`)."""
    if not cfg.pretrained or cfg.name.startswith("local-dir:"):
        return timm.create_model(cfg.name, **kwargs)
    with hub_or_cache() as unreachable:
        try:
            return timm.create_model(cfg.name, **kwargs)
        except OSError as err:
            if unreachable is None:
                raise
            raise OSError(f"the Hub did not answer; not in the cache: {err}") from unreachable


def head_init(cfg: ModelConfig) -> str:
    """``model.head_init`` resolved: ``auto`` is ``zeros`` when pretrained, else ``timm``."""
    if cfg.head_init == "auto":
        return "zeros" if cfg.pretrained else "timm"
    return cfg.head_init


def _load_failure(cfg: ModelConfig, err: OSError) -> str:
    """Why ``timm.create_model`` could not read the model, and what to do next."""
    if cfg.name.startswith("local-dir:"):
        folder = Path(cfg.name.removeprefix("local-dir:")).expanduser()
        found = "does not exist" if not folder.exists() else f"cannot be loaded ({err})"
        return (
            f"model.name={cfg.name!r}: the folder {folder} {found}. A 'local-dir:' folder holds "
            "config.json and model.safetensors in timm's Hub format, as "
            "timm.models.save_for_hf or a run's model/ folder writes them."
        )
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return (
            f"could not load pretrained weights for model.name={cfg.name!r}: HF_HUB_OFFLINE=1 is "
            f"set and they are not in the Hugging Face cache ({err}). Download them once with "
            "network access, point model.name at a 'local-dir:' folder in timm's Hub format, or "
            "set model.pretrained=false."
        )
    cause: BaseException = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    return (
        f"could not fetch pretrained weights for model.name={cfg.name!r} from the Hugging Face "
        f"Hub ({type(cause).__name__}: {cause}). Offline? Set HF_HUB_OFFLINE=1 to use the local "
        "cache without trying the network, point model.name at a 'local-dir:' "
        "folder in timm's Hub format, or set model.pretrained=false."
    )


def zero_classifier(model: nn.Module) -> None:
    """Set the classifier's weights and bias to zero (``model.head_init: zeros``).

    Logits start at 0 — uniform predictions, the FS-EB prior mean — whatever the backbone's
    feature scale; the first step then moves only the head, as in BiT-style fine-tuning.
    """
    head = cast(Any, model).get_classifier()  # a timm model's
    params = list(head.parameters()) if isinstance(head, nn.Module) else []
    if not params:
        raise ValueError(
            f"model.head_init=zeros: {type(model).__name__}.get_classifier() has no parameters "
            "to zero (num_classes=0?)"
        )
    with torch.no_grad():
        for param in params:
            param.zero_()


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


def planned_input_size(cfg: ModelConfig) -> tuple[int, int] | None:
    """The (height, width) :func:`input_spec` will give, where known without creating the
    model: ``model.input_size``, else a timm model's registered pretrained config; ``None`` for
    ``hf-hub:`` and ``local-dir:`` models, whose config is read when they load."""
    if cfg.input_size:
        return cfg.input_size, cfg.input_size
    try:
        pretrained = None if ":" in cfg.name else timm.models.get_pretrained_cfg(cfg.name)
    except RuntimeError:  # an unknown tag: creating the model says so
        return None
    if pretrained is None or not pretrained.input_size:
        return None
    _, height, width = pretrained.input_size
    return height, width


class PaperCNN(nn.Module):
    """The FashionMNIST CNN of the paper's reference configuration.

    Its settings are in docs/method.md, "Hyper-parameters and reference values".

    conv3×3-32 → ReLU → maxpool2 → conv3×3-64 → ReLU → maxpool2 → dense 256 → ReLU → dense K,
    'same' padding as in the reference (flax) code. It follows timm's interface:
    ``forward_features`` returns the flattened conv maps, ``forward_head(pre_logits=True)`` the
    256-d hidden layer — the features ``h(x; φ0)`` of the FS-EB prior.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_chans: int = 1,
        img_size: int = 28,
        hidden: int = 256,
        drop_rate: float = 0.0,
        **kwargs: object,
    ) -> None:
        super().__init__()
        unknown = set(kwargs) - {"drop_path_rate"}
        if unknown:
            raise TypeError(f"PaperCNN got unexpected arguments {sorted(unknown)}")
        self.num_classes = num_classes
        self.num_features = self.head_hidden_size = hidden
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        side = img_size // 4
        self.pre_logits = nn.Sequential(nn.Linear(64 * side * side, hidden), nn.ReLU(inplace=True))
        self.drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(hidden, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Flattened convolutional features (N, 64·(S/4)²)."""
        return self.features(x).flatten(1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Hidden features (N, 256) when ``pre_logits``, else logits (N, K)."""
        x = self.pre_logits(x)  # (N, hidden)
        return x if pre_logits else self.head(self.drop(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, K)."""
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        """The final linear layer (timm interface)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh ``num_classes`` one (timm interface)."""
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()


default_cfgs = generate_default_cfgs(
    {
        "fseb_cnn.untrained": {
            "input_size": (1, 28, 28),
            "mean": (0.5,),
            "std": (0.5,),
            "crop_pct": 1.0,
            "interpolation": "bilinear",
            "num_classes": 10,
            "first_conv": "features.0",
            "classifier": "head",
        }
    }
)


@register_model
def fseb_cnn(pretrained: bool = False, **kwargs: Any) -> PaperCNN:
    """timm entry point: ``timm.create_model("fseb_cnn", num_classes=K, in_chans=C)``.

    Registered when ``fseb_ft.method.models`` is imported; it has no pretrained weights.
    """
    return build_model_with_cfg(PaperCNN, "fseb_cnn", pretrained, **kwargs)
