"""The evaluation's passes (fseb_ft.evaluation.predictions.predict_splits): with feature OOD
scores, each evaluated set is forwarded once, its penultimate features recorded in its logits
pass, and the scores equal those of a separate feature pass per set; a predictor that is not the
network itself (FS-VI's Monte-Carlo predictive) gets the separate pass, with the same scores."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from torch import Tensor, nn

from fseb_ft.data.images import ArrayImages
from fseb_ft.data.inputs import InputSpec
from fseb_ft.data.splits import Splits
from fseb_ft.errors import FsebError
from fseb_ft.evaluation.features import feature_scores, predict_features
from fseb_ft.evaluation.predictions import eval_loader, predict_splits
from fseb_ft.recipe import EvalConfig
from fseb_ft.recipe.options import FEATURE_OOD_SCORES
from tests.helpers import LogProbs, TinyNet

SIZES = {"train": 30, "val": 9, "test": 11, "near": 7, "far": 5}
SPEC = InputSpec((4, 4), (0.5,) * 3, (0.25,) * 3)
CFG = EvalConfig(batch_size=4, ood_scores=("entropy", *FEATURE_OOD_SCORES))


def _images(name: str, n: int) -> ArrayImages:
    rng = np.random.default_rng(len(name) * 100 + n)
    pixels = rng.integers(0, 256, size=(n, 4, 4, 3), dtype=np.uint8)
    return ArrayImages(pixels, np.arange(n) % 3, ["a", "b", "c"], identity=name)


def _splits() -> Splits:
    sets = {name: _images(name, n) for name, n in SIZES.items()}
    ood = {"near": sets["near"], "far": sets["far"]}
    return Splits(train=sets["train"], val=sets["val"], test=sets["test"], ood=ood)


class _Counted(TinyNet):
    """A TinyNet of 4×4 RGB images that counts the images its backbone sees."""

    def __init__(self) -> None:
        super().__init__(d_in=48, width=5, k=3)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(48, 5), nn.Tanh())
        self.seen = 0

    def forward_features(self, x: Tensor) -> Tensor:
        self.seen += x.shape[0]
        return super().forward_features(x)


def _two_pass_scores(net: nn.Module, splits: Splits, accelerator: Accelerator) -> dict:
    """The feature scores from a feature pass of their own over every set."""

    def features(data: ArrayImages) -> tuple[Tensor, Tensor]:
        loader = accelerator.prepare(eval_loader(data, SPEC, CFG.batch_size, 0, 0))
        return predict_features(net, loader, accelerator)

    ood = {name: features(data)[0] for name, data in splits.ood.items()}
    train = features(splits.train)
    return feature_scores(net, CFG.ood_scores, train, features(splits.test)[0], ood)


@pytest.mark.parametrize("wrapped", [False, True])
def test_each_set_is_forwarded_once_and_scored_as_by_its_own_feature_pass(wrapped: bool) -> None:
    torch.manual_seed(0)
    net, splits, accelerator = _Counted().eval(), _splits(), Accelerator(cpu=True)
    model = LogProbs(net) if wrapped else net
    found = predict_splits(model, splits, SPEC, CFG, accelerator, 0, 0, network=net)
    evaluated = SIZES["test"] + SIZES["near"] + SIZES["far"]
    # The training split once for the fit; each evaluated set once, or twice around a predictor.
    assert net.seen == SIZES["train"] + (2 if wrapped else 1) * evaluated
    want = _two_pass_scores(net, splits, accelerator)
    assert set(found.test_feature_scores) == set(FEATURE_OOD_SCORES)
    for name, values in want["test_feature_scores"].items():
        torch.testing.assert_close(found.test_feature_scores[name], values, rtol=0, atol=0)
        for ood in ("near", "far"):
            got = found.ood_feature_scores[ood][name]
            torch.testing.assert_close(got, want["ood_feature_scores"][ood][name], rtol=0, atol=0)
    assert torch.equal(found.feature_fit.means, want["feature_fit"].means)
    # Feature scores alone fit no last-layer Laplace (it needs eval.laplace, and laplace-torch).
    assert found.laplace is None and not found.fit


def test_a_classifier_llla_cannot_fit_is_refused_before_any_pass() -> None:
    net = _Counted().eval()
    net.head = nn.Sequential(net.head)  # not an nn.Linear
    cfg = dataclasses.replace(CFG, laplace=True)
    with pytest.raises(FsebError, match=r"eval\.laplace needs a linear classifier"):
        predict_splits(net, _splits(), SPEC, cfg, Accelerator(cpu=True), 0, 0)
    assert net.seen == 0
