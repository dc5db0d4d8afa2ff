"""The images a loaded model predicts and its passes over them: image files or a recipe's
dataset spec, read without stopping at a bad file (:func:`gather_inputs`); the forward pass
giving their logits and, for the feature OOD scores, their penultimate features in the same pass
(:func:`outputs_and_read_errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from fseb_ft.data.files import find_images, read_image
from fseb_ft.data.images import LabeledImages
from fseb_ft.data.loaders import make_loader
from fseb_ft.data.pixels import set_max_image_pixels
from fseb_ft.data.sources import load_split
from fseb_ft.data.transforms import eval_transform
from fseb_ft.errors import first_line
from fseb_ft.logs import progress_bar
from fseb_ft.prediction.loading import LoadedModel
from fseb_ft.recipe import DatasetSpec
from fseb_ft.recipe.schema import build

__all__ = ["ImageInputs", "gather_inputs", "logits_and_read_errors", "outputs_and_read_errors"]


class ImageInputs(Dataset):
    """``(tensor (C, H, W), error)`` per input: an unreadable one gives zeros and its error."""

    def __init__(
        self, files: list[Path] | None, data: LabeledImages | None, loaded: LoadedModel
    ) -> None:
        self.files, self.data, self.channels = files, data, loaded.channels
        self.transform = eval_transform(loaded.spec.size, loaded.spec.mean, loaded.spec.std)
        self.shape = (loaded.channels, *loaded.spec.size)

    def __len__(self) -> int:
        # Files, or else a dataset (one of the two is given).
        return len(self.files) if self.files is not None else len(cast(LabeledImages, self.data))

    def __getitem__(self, index: int) -> tuple[Tensor, str]:
        try:
            if self.files is not None:
                image = read_image(self.files[index], self.channels)  # (H, W, C) uint8
            else:
                image = cast(LabeledImages, self.data)[index][0]  # (H, W, C) uint8
        except (OSError, ValueError) as err:
            # The decoder's own words (its wrapper repeats the file name the row already has).
            return torch.zeros(self.shape), first_line(err.__cause__ or err)
        return self.transform(image=image)["image"], ""  # (C, H', W') float32


def gather_inputs(
    loaded: LoadedModel, images: Sequence[str | Path], dataset: Any
) -> tuple[ImageInputs, list[str], list[str] | None, list[Path]]:
    """The inputs, their names, their labels' class names (datasets) and files passed over."""
    if dataset is not None and images:
        raise ValueError("give IMAGES or a dataset, not both")
    if loaded.recipe is not None:  # the run's data.max_image_pixels; a model folder: PIL's
        set_max_image_pixels(loaded.recipe.data.max_image_pixels)
    if dataset is None:
        files, skipped = find_images(images) if images else ([], [])
        if not files:
            raise ValueError("no images given: name files, folders or globs, or a dataset")
        return ImageInputs(files, None, loaded), [str(f) for f in files], None, skipped
    spec = (
        dataset
        if isinstance(dataset, DatasetSpec)
        else build(DatasetSpec, dict(dataset), "dataset")
    )
    data = load_split("dataset", spec, loaded.channels)
    names = [f"{data.identity}[{i}]" for i in range(len(data))]
    labels = [data.class_names[k] if k < len(data.class_names) else str(k) for k in data.labels]
    return ImageInputs(None, data, loaded), names, labels, []


def logits_and_read_errors(
    net: nn.Module,
    inputs: ImageInputs,
    loaded: LoadedModel,
    device: torch.device,
    desc: str,
    batch_size: int,
    num_workers: int,
    progress: bool,
) -> tuple[Tensor, list[str]]:
    """``net`` (``loaded``'s network, on ``device``) run over the images' ``inputs``: float32
    logits (N, K) on CPU in input order, and each input's read error ("" if none; an unreadable
    image's row is the logits of zeros, to be left out). Not
    :func:`fseb_ft.evaluation.predictions.predict_logits`, which scores a labelled split's loader.
    """
    logits, _, errors = outputs_and_read_errors(
        net, inputs, loaded, device, desc, batch_size, num_workers, progress
    )
    return logits, errors


@torch.no_grad()
def outputs_and_read_errors(
    net: nn.Module,
    inputs: ImageInputs,
    loaded: LoadedModel,
    device: torch.device,
    desc: str,
    batch_size: int,
    num_workers: int,
    progress: bool,
    network: nn.Module | None = None,
) -> tuple[Tensor, Tensor | None, list[str]]:
    """:func:`logits_and_read_errors`, with ``network`` (the timm network behind ``net``, on
    ``device``, in eval mode) also the float32 penultimate features (N, D) on CPU, those
    :func:`fseb_ft.evaluation.predictions.predict_features` computes; ``None`` without it."""
    loader = make_loader(inputs, batch_size, shuffle=False, num_workers=num_workers)
    logits, features, errors = [], [], []
    with progress_bar(total=len(inputs), desc=desc, unit="img", show=progress) as bar:
        for x, err in loader:
            z, h = _forward(net, network, x.to(device))
            logits.append(z.float().cpu())  # (B, K)
            if h is not None:
                features.append(h.float().flatten(1).cpu())  # (B, D)
            errors.extend(err)
            bar.update(len(err))
    out = torch.cat(logits)  # (N, K)
    if out.shape[1] != len(loaded.class_names):
        raise ValueError(
            f"{loaded.where} outputs {out.shape[1]} classes but names {len(loaded.class_names)}"
        )
    return out, torch.cat(features) if network is not None else None, errors


def _forward(net: nn.Module, network: nn.Module | None, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``net``'s outputs (B, K) of ``x`` and, with ``network``, its penultimate features: one
    ``forward_features`` for both when ``net`` is the network (timm's ``forward`` is
    ``forward_head(forward_features(x))``), else the network's own pass beside ``net``'s."""
    if network is None:
        return net(x), None
    timm_network = cast(Any, network)  # timm's methods, which nn.Module does not declare
    found = timm_network.forward_features(x)
    h = timm_network.forward_head(found, pre_logits=True)  # (B, D)
    return (timm_network.forward_head(found) if net is network else net(x)), h
