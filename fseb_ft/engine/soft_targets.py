"""Soft training targets: label smoothing and mixup / CutMix (``train.label_smoothing``,
``data.mixup``), as a callback that replaces each training batch before its forward.

timm makes them (:class:`timm.data.Mixup`, :func:`timm.data.mixup.mixup_target`); the
objective's likelihood reads them (:func:`fseb_ft.method.likelihood.likelihood_term`), the
function-space and parameter terms never do (docs/method.md, "Label smoothing and mixup").
Validation and selection predict the unmixed images, scored on their hard labels.
"""

from __future__ import annotations

import numpy as np
import torch
from timm.data import Mixup
from timm.data.mixup import mixup_target
from torch import Tensor

from fseb_ft.data.transforms import epoch_seed
from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.recipe import DataConfig, MixupConfig, TrainConfig

__all__ = ["SoftTargets", "mixing_seed", "soft_target_callbacks"]


def mixing_seed(seed: int, epoch: int, process: int) -> int:
    """The seed of mixup's draws in one epoch of one process of a run seeded ``seed``: from
    (seed, epoch) as the other per-epoch streams, so a resumed run mixes as an uninterrupted
    one, and apart per process, so processes mix their batches differently."""
    return int(np.random.SeedSequence([epoch_seed(seed, epoch), process]).generate_state(1)[0])


class SoftTargets(Callback):
    """Train on soft targets (B, K): the labels smoothed by ``smoothing`` (ε/K for every other
    class, ``1 − ε + ε/K`` for the label), and with ``mixup`` the batch mixed by timm's
    :class:`~timm.data.Mixup` (the images and their smoothed targets, in the same proportion).

    timm draws the mixing from numpy's global random stream; here it draws from this callback's
    own, seeded per epoch (:func:`mixing_seed`) and swapped in around each call, so the mixing
    neither disturbs nor depends on anything else's draws. No state to save: a resumed run
    reseeds its epoch as an uninterrupted one. timm mixes an even batch (pairs of images): an
    odd batch's last image is left unmixed, with its smoothed label.
    """

    def __init__(
        self, num_classes: int, smoothing: float = 0.0, mixup: MixupConfig | None = None
    ) -> None:
        """``num_classes``: K; ``smoothing``: ``train.label_smoothing``; ``mixup``:
        ``data.mixup`` (``None``: no mixing)."""
        self.num_classes, self.smoothing = num_classes, smoothing
        self.mixup = None
        if mixup is not None:
            self.mixup = Mixup(
                mixup_alpha=mixup.mixup_alpha,
                cutmix_alpha=mixup.cutmix_alpha,
                prob=mixup.prob,
                switch_prob=mixup.switch_prob,
                mode=mixup.mode,
                label_smoothing=smoothing,
                num_classes=num_classes,
            )
        self._seed = 0
        self._state = np.random.RandomState(mixing_seed(0, 0, 0)).get_state()

    def on_train_begin(self, trainer: TrainerView) -> None:
        self._seed = trainer.config.seed

    def on_epoch_begin(self, trainer: TrainerView, epoch: int) -> None:
        seed = mixing_seed(self._seed, epoch, trainer.accelerator.process_index)
        self._state = np.random.RandomState(seed).get_state()

    def on_batch_begin(self, trainer: TrainerView, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        even = len(x) - len(x) % 2
        if self.mixup is None or even == 0:
            return x, mixup_target(y, self.num_classes, smoothing=self.smoothing)
        saved = np.random.get_state()
        np.random.set_state(self._state)
        try:
            # timm mixes x[:even] in place (a view of x), and returns its targets (even, K).
            _, targets = self.mixup(x[:even], y[:even])
        finally:
            self._state = np.random.get_state()
            np.random.set_state(saved)
        if even < len(x):
            rest = mixup_target(y[even:], self.num_classes, smoothing=self.smoothing)  # (1, K)
            targets = torch.cat([targets, rest])  # (B, K)
        return x, targets


def soft_target_callbacks(
    train: TrainConfig, data: DataConfig, num_classes: int
) -> list[SoftTargets]:
    """The run's :class:`SoftTargets` when ``train.label_smoothing`` or ``data.mixup`` is on;
    none otherwise, so the loop trains on the labels as it always did."""
    if train.label_smoothing == 0 and data.mixup is None:
        return []
    return [SoftTargets(num_classes, train.label_smoothing, data.mixup)]
