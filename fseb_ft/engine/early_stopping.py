"""Early stopping (``train.early_stopping``): stop once the selection metric has not improved
for a patience of epochs, as a callback.

"Improved" is the loop's own selection: an epoch improves when the loop saves its weights as
the best (``train.select_metric`` in its registered direction, NaN never beating a number), so
the epochs waited are ``state.epoch − state.best_epoch``. Both are in every checkpoint's
``trainer_state.json``, so a resumed run goes on counting where the killed one was, and a rerun
of a run that stopped stops again before training (docs/method.md, "Early stopping").
"""

from __future__ import annotations

from fseb_ft.engine.callbacks import Callback, TrainerView

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stop training after ``patience`` epochs in a row without a new best validation
    ``train.select_metric``; the best epoch's weights are those the run keeps and exports.
    Why it stopped is :attr:`~fseb_ft.engine.callbacks.TrainState.stopped`, in the training
    record of ``run.json`` and ``results.json``."""

    def __init__(self, patience: int) -> None:
        """``patience``: ``train.early_stopping``, ≥ 1 epoch."""
        if patience < 1:
            raise ValueError(f"patience must be ≥ 1 epoch, got {patience}")
        self.patience = patience

    def on_train_begin(self, trainer: TrainerView) -> None:
        # A rerun of a run that stopped resumes after its last epoch: it stays stopped.
        if trainer.state.stopped is not None:
            trainer.should_stop = True

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, float]) -> None:
        state = trainer.state
        waited = self._waited(trainer)
        if waited < self.patience or state.epoch >= trainer.config.epochs:
            return
        metric = trainer.config.select_metric
        state.stopped = (
            f"early stopping: val_{metric} did not improve for {waited} epoch"
            f"{'s' if waited > 1 else ''} after its best, "
            f"epoch {state.best_epoch} (train.early_stopping={self.patience}); stopped after "
            f"epoch {state.epoch} of {trainer.config.epochs}"
        )
        trainer.accelerator.print(state.stopped)
        trainer.should_stop = True

    @staticmethod
    def _waited(trainer: TrainerView) -> int:
        """Epochs since the best one (0 when the last epoch is the best)."""
        return trainer.state.epoch - trainer.state.best_epoch
