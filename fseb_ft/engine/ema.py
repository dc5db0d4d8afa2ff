"""The exponential moving average of the network's weights (``train.ema_decay``), as a callback.

timm's :class:`~timm.utils.ModelEmaV3` keeps the average: a copy of the network whose every
floating-point entry of its ``state_dict`` (parameters and buffers: BatchNorm's running
statistics are averaged too; its integer batch count is copied) moves, after each optimiser step
``t``, to ``e_t = d · e_{t−1} + (1 − d) · θ_t`` with ``d = train.ema_decay`` (no warm-up; timm's
first update, ``t = 1``, copies ``θ_1``). It averages the network only: not φ0, the objective's
frozen copy, nor the method's own state (FS-VI's σ), which is the trained one whatever the
network's weights (docs/method.md, "EMA"). The average is checkpointed through Accelerate beside
the model, so a resumed run continues it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from timm.utils import ModelEmaV3
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fseb_ft.engine.callbacks import Callback, TrainerView, Validation
from fseb_ft.evaluation.metrics import classification_metrics
from fseb_ft.evaluation.predictions import predict_logits
from fseb_ft.method.parts import unwrap_model

__all__ = ["WeightEMA"]


class WeightEMA(Callback):
    """Average the network's weights after every optimiser step; with ``evaluate``, the network
    holds the average from :meth:`on_validation_begin` to :meth:`on_epoch_end`, so validation,
    the selection and the best weights (hence the evaluation and the exported model) are the
    average's; without it, the average's validation accuracy and NLL are recorded beside the
    trained weights' (``val_ema_accuracy``, ``val_ema_nll``).
    """

    def __init__(
        self,
        model: nn.Module,
        decay: float,
        *,
        evaluate: bool = True,
        val_loader: DataLoader | None = None,
    ) -> None:
        """``model``: the network (wrapped or not) at its start, on its device; ``decay``:
        ``train.ema_decay``; ``evaluate``: ``train.ema_eval``; ``val_loader``: the prepared
        validation loader, which ``evaluate=False`` predicts the average on."""
        if not evaluate and val_loader is None:
            raise ValueError("evaluate=False validates the average itself: give val_loader")
        self.ema = ModelEmaV3(unwrap_model(model), decay=decay)
        self.evaluate, self.val_loader = evaluate, val_loader
        self._trained: dict[str, Tensor] | None = None  # the trained weights while swapped out

    def checkpointed(self) -> list[Any]:
        return [self.ema]

    def on_step_end(self, trainer: TrainerView, terms: Mapping[str, Tensor]) -> None:
        self.ema.update(unwrap_model(trainer.objective.model), step=trainer.state.step)

    def on_validation_begin(self, trainer: TrainerView) -> None:
        if not self.evaluate:
            return
        network = unwrap_model(trainer.objective.model)
        self._trained = {k: v.detach().clone() for k, v in network.state_dict().items()}
        # In place (load_state_dict copies), so the optimiser keeps its parameters.
        network.load_state_dict(self.ema.module.state_dict())

    def on_validation_end(self, trainer: TrainerView, validation: Validation) -> None:
        if self.evaluate:
            return
        # The method's predictor around the average (FS-VI: its draws around the average's μ).
        predictor = trainer.objective.predictor(trainer.config.seed, network=self.ema.module)
        assert self.val_loader is not None  # checked in __init__
        logits, labels = predict_logits(predictor, self.val_loader, trainer.accelerator)
        found = classification_metrics(torch.log_softmax(logits, dim=-1), labels)
        validation.metrics["ema_accuracy"] = float(found["accuracy"])
        validation.metrics["ema_nll"] = float(found["nll"])

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        # The best weights are saved: the trained ones go back for the checkpoint and training.
        if self._trained is not None:
            unwrap_model(trainer.objective.model).load_state_dict(self._trained)
            self._trained = None
