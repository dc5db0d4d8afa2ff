"""Freezing and LP-FT (``model.freeze``, ``train.linear_probe_epochs``) as a training callback.

The optimiser holds every parameter from the start
(:func:`fseb_ft.engine.optimizers.build_optimizer`); each epoch begins by setting which ones
require a gradient. A frozen parameter gets none, so the optimiser skips it and its momentum, and
it stays bit-identical. Which parameters are frozen is a function of the epoch alone, so a run
resumed mid-LP-FT freezes as the uninterrupted one did.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fseb_ft.engine.callbacks import Callback, TrainerView
from fseb_ft.method.parts import ModelPartsError, frozen_names, head_names
from fseb_ft.recipe import Recipe

__all__ = ["Freeze", "freeze_callback"]


class Freeze(Callback):
    """Hold ``frozen`` fixed from epoch ``probe_epochs`` on, and every parameter but ``head``'s
        before it (the linear probe). BatchNorm layers whose parameters are all fixed run in eval
        mode, so their running statistics stay fixed too and the frozen part computes what it did at
        the start. After training each parameter requires a gradient as it did before training (a
    parameter the model fixed itself stays fixed, and is never unfrozen by the schedule).

        No state to save: the epoch says what is frozen, and a resumed run sets it again.
    """

    def __init__(self, frozen: Sequence[str], head: Sequence[str], probe_epochs: int) -> None:
        """``frozen``, ``head``: parameter names of the unwrapped model
        (:mod:`fseb_ft.method.parts`); ``probe_epochs``: ``train.linear_probe_epochs``."""
        self.frozen, self.head, self.probe_epochs = set(frozen), set(head), probe_epochs
        self._own: dict[str, bool] = {}  # the model's requires_grad flags before training

    def on_train_begin(self, trainer: TrainerView) -> None:
        model = trainer.accelerator.unwrap_model(trainer.objective.model)
        self._own = {n: p.requires_grad for n, p in model.named_parameters()}
        if trainer.accelerator.num_processes > 1:
            # DDP's reducer fixes at wrapping time which parameters it synchronises.
            raise ModelPartsError(
                "model.freeze and train.linear_probe_epochs train in one process only: DDP "
                "fixes the synchronised parameters when it wraps the model; launch one process"
            )

    def on_epoch_begin(self, trainer: TrainerView, epoch: int) -> None:
        model = trainer.accelerator.unwrap_model(trainer.objective.model)
        fixed = self._fixed(model, epoch)
        for name, param in model.named_parameters():
            param.requires_grad_(self._own.get(name, True) and name not in fixed)
        for prefix, module in model.named_modules():
            names = [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters()]
            norm = isinstance(module, nn.modules.batchnorm._BatchNorm)
            if norm and names and fixed.issuperset(names):
                module.eval()

    def on_train_end(self, trainer: TrainerView) -> None:
        model = trainer.accelerator.unwrap_model(trainer.objective.model)
        for name, param in model.named_parameters():
            param.requires_grad_(self._own.get(name, True))

    def _fixed(self, model: nn.Module, epoch: int) -> set[str]:
        """The names frozen in epoch ``epoch`` (0-based)."""
        if epoch < self.probe_epochs:
            return {n for n, _ in model.named_parameters() if n not in self.head}
        return self.frozen


def freeze_callback(model: nn.Module, recipe: Recipe) -> list[Freeze]:
    """``[Freeze(...)]`` for ``model`` as ``model.freeze`` and ``train.linear_probe_epochs``
    ask, ``[]`` when neither does (checked here, at start: an integer ``model.freeze`` needs the
    model's stages)."""
    probe_epochs = recipe.train.linear_probe_epochs
    frozen = frozen_names(model, recipe.model.freeze, recipe.model.name)
    if not frozen and probe_epochs == 0:
        return []
    key = "train.linear_probe_epochs" if probe_epochs else "model.freeze"
    return [Freeze(frozen, head_names(model, key, recipe.model.name), probe_epochs)]
