"""WiSE-FT's maths (fseb_ft.evaluation.wise): the interpolation against a hand computation, its end
points the two networks' own predictions, the BatchNorm statistics re-estimated on the training
images in between, and α chosen on validation NLL where the best one is known."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fseb_ft.evaluation.wise import choose_alpha, fit_alpha, interpolated_state, set_alpha


class _Tiny(nn.Module):
    """A timm-like network: BatchNorm on the input, a 1×1 conv backbone, a linear classifier."""

    def __init__(self, channels: int = 2, classes: int = 3, bias: bool = True) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, channels, 1, bias=bias)
        self.head = nn.Linear(channels, classes, bias=bias)

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(self.norm(x)).mean((2, 3)))


def _pair(seed: int = 0) -> tuple[_Tiny, _Tiny]:
    """(start, tuned): two float64 networks with different weights and running statistics."""
    torch.manual_seed(seed)
    start, tuned = _Tiny().double(), _Tiny().double()
    with torch.no_grad():
        tuned.norm.running_mean.fill_(0.5)
        tuned.norm.running_var.fill_(2.0)
        tuned.norm.num_batches_tracked.fill_(7)
    return start.eval(), tuned.eval()


def test_interpolation_against_a_hand_computation() -> None:
    start = {
        "conv.weight": torch.tensor([0.0, 4.0], dtype=torch.float64),
        "norm.num_batches_tracked": torch.tensor(3),
        "head.weight": torch.tensor([1.0, 1.0], dtype=torch.float64),
    }
    tuned = {
        "conv.weight": torch.tensor([8.0, 0.0], dtype=torch.float64),
        "norm.num_batches_tracked": torch.tensor(9),
        "head.weight": torch.tensor([2.0, -2.0], dtype=torch.float64),
    }
    got = interpolated_state(start, tuned, 0.25, keep={"head.weight"})
    # (1 − 0.25) · [0, 4] + 0.25 · [8, 0] = [2, 3]; the head and the batch count are tuned's.
    assert torch.equal(got["conv.weight"], torch.tensor([2.0, 3.0], dtype=torch.float64))
    assert torch.equal(got["head.weight"], tuned["head.weight"])
    assert got["norm.num_batches_tracked"].item() == 9


def test_the_end_points_are_the_tuned_network_and_the_start_backbone_with_the_tuned_head() -> None:
    start, tuned = _pair()
    x = torch.randn(5, 2, 3, 3, dtype=torch.float64)
    train = [(torch.randn(4, 2, 3, 3, dtype=torch.float64), torch.zeros(4))]
    network = _Tiny().double().eval()

    set_alpha(network, start, tuned, 1.0, train)
    assert torch.equal(network(x), tuned(x))
    assert torch.equal(network.norm.running_mean, tuned.norm.running_mean)  # not re-estimated

    set_alpha(network, start, tuned, 0.0, train)
    by_hand = _Tiny().double().eval()
    by_hand.load_state_dict(start.state_dict())
    by_hand.head.load_state_dict(tuned.head.state_dict())
    assert torch.equal(network(x), by_hand(x))


def test_batchnorm_statistics_are_re_estimated_on_the_training_images_in_between() -> None:
    start, tuned = _pair()
    # Two batches whose per-channel means are 1 and 3 (channel 0) and -2 and 0 (channel 1):
    # update_bn's cumulative average over them is 2 and -1, exactly.
    first = torch.stack([torch.full((3, 3), 1.0), torch.full((3, 3), -2.0)])
    second = torch.stack([torch.full((3, 3), 3.0), torch.full((3, 3), 0.0)])
    train = [(first[None].double(), torch.zeros(1)), (second[None].double(), torch.zeros(1))]
    network = _Tiny().double().eval()

    set_alpha(network, start, tuned, 0.5, train)

    assert network.norm.running_mean.tolist() == [2.0, -1.0]
    assert not network.training  # update_bn restores the mode it found
    set_alpha(network, start, tuned, 0.5, None)  # without images: the interpolated statistics
    half = (start.norm.running_mean + tuned.norm.running_mean) / 2
    assert torch.equal(network.norm.running_mean, half)


def test_alpha_is_the_one_of_the_lowest_validation_nll() -> None:
    """logits = [w x, −w x] with x = 1, w = (1 − α)·0 + α·log 3: three validation images of class 0
    and one of class 1 are fitted best by p₀ = σ(2w) = 3/4, i.e. w = log(3) / 2, α = 0.5."""

    class Scalar(nn.Module):
        def __init__(self, w: float) -> None:
            super().__init__()
            self.backbone = nn.Linear(1, 1, bias=False)
            self.head = nn.Linear(1, 2, bias=False)
            with torch.no_grad():
                self.backbone.weight.fill_(w)
                self.head.weight.copy_(torch.tensor([[1.0], [-1.0]]))

        def get_classifier(self) -> nn.Module:
            return self.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.backbone(x))

    start, tuned = Scalar(0.0), Scalar(math.log(3))
    val = DataLoader(TensorDataset(torch.ones(4, 1), torch.tensor([0, 0, 0, 1])), batch_size=2)
    network = Scalar(0.0)
    alphas = (0.0, 0.25, 0.5, 0.75, 1.0)

    fit = fit_alpha(network, start, tuned, alphas, [], val, Accelerator(cpu=True))

    assert fit.alpha == 0.5 and fit.alphas == alphas
    assert min(fit.val_nll) == fit.val_nll[2]
    assert network.backbone.weight.item() == pytest.approx(math.log(3) / 2, rel=1e-6)
    assert fit.record() == {"alpha": 0.5, "alphas": list(alphas), "val_nll": list(fit.val_nll)}


def test_a_tie_keeps_the_first_alpha_of_the_grid_and_alpha_1_is_explained() -> None:
    fit = choose_alpha([0.0, 0.5, 1.0], [2.0, 1.0, 1.0])
    assert fit.alpha == 0.5 and "note" not in fit.record()
    kept = choose_alpha([0.0, 0.5, 1.0], [2.0, 1.0, 0.5]).record()
    assert kept["alpha"] == 1.0 and "the fine-tuned network itself" in str(kept["note"])
