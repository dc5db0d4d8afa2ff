"""The class-balanced training sampler (``train.sampler: balanced``).

Each epoch draws as many training images as there are, with replacement, every class equally
likely. The draws are seeded from (seed, epoch) in :meth:`BalancedSampler.__iter__`, as the
shuffled loader is, so a resumed run draws the epochs it still has to train exactly as an
uninterrupted run would.

Several processes: Accelerate's prepared loader keeps the sampler and shards its batches
(``BatchSamplerShard``: every process iterates the same sampler and takes its own batches), and
calls the sampler's ``set_epoch`` from the loader's. The same seed in every process gives the
same draws there, so the processes share out one epoch's draws, without overlap.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np
import torch
from torch.utils.data import WeightedRandomSampler

from fseb_ft.data.transforms import epoch_seed

__all__ = ["BalancedSampler"]


class BalancedSampler(WeightedRandomSampler):
    """``len(labels)`` draws per epoch, with replacement, each image with probability
    ``1 / (K' · N_{y})`` (every one of the K' classes present drawn with probability 1/K');
    the draws of epoch e are those of ``epoch_seed(seed, e)``."""

    def __init__(self, labels: np.ndarray, seed: int) -> None:
        """``labels``: the training labels (N,); ``seed``: ``train.seed``."""
        from sklearn.utils.class_weight import compute_sample_weight  # only this sampler needs it

        weights = compute_sample_weight("balanced", labels)  # (N,): N / (K' · N_{y_n})
        # torch takes the weights as a tensor; its annotation says Sequence[float].
        probabilities = cast(Sequence[float], torch.from_numpy(weights))
        super().__init__(probabilities, num_samples=len(labels), replacement=True)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s images next (0-based; the loop calls it every epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return super().__iter__()
