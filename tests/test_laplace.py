"""The last-layer Laplace (fseb_ft.evaluation.laplace) against laplace-torch's own call on a whole
network, in float64: fitted on the features, it must give the same probit predictive."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fseb_ft.errors import FsebError
from fseb_ft.evaluation import laplace as llla
from fseb_ft.evaluation.features import linear_classifier
from fseb_ft.evaluation.laplace import fit_last_layer_laplace, laplace_logits, laplace_torch
from fseb_ft.evaluation.predictions import predict_logits, predict_with_features
from tests.helpers import TinyNet

N_TRAIN, N_VAL, N_TEST = 60, 24, 17


@pytest.fixture(scope="module")
def trained() -> dict[str, torch.Tensor | nn.Module]:
    """A float64 TinyNet trained to its MAP on a 3-class problem, and its splits."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    centres = 1.5 * torch.randn(3, 6, generator=generator, dtype=torch.float64)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % 3
        return centres[y] + torch.randn(n, 6, generator=generator, dtype=torch.float64), y

    (x, y), (x_val, y_val), (x_test, _) = draw(N_TRAIN), draw(N_VAL), draw(N_TEST)
    net = TinyNet(d_in=6, width=5, k=3).double()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    net.eval()
    return {"net": net, "x": x, "y": y, "x_val": x_val, "y_val": y_val, "x_test": x_test}


def _features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return net.forward_head(net.forward_features(x), pre_logits=True)  # (N, D)


def _ours(trained: dict, hessian: str, prior: str | float) -> llla.LaplaceFit:
    net = trained["net"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # laplace-torch's and torch's warnings are not the user's
        return fit_last_layer_laplace(
            _features(net, trained["x"]),
            trained["y"],
            net.head.weight.detach(),
            net.head.bias.detach(),
            hessian,
            prior,
            (_features(net, trained["x_val"]), trained["y_val"]),
        )


def _reference(trained: dict, hessian: str):  # laplace-torch's own last-layer Laplace
    la = laplace_torch().Laplace(
        trained["net"], "classification", subset_of_weights="last_layer", hessian_structure=hessian
    )
    # One batch, as fseb_ft's batches of these few images: the GGN sums in the same order.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script` is deprecated", FutureWarning)
        la.fit(DataLoader(TensorDataset(trained["x"], trained["y"]), batch_size=N_TRAIN))
    return la


@pytest.mark.parametrize("hessian", ["kron", "full", "diag"])
def test_predictive_equals_laplace_torch_on_the_whole_network(trained: dict, hessian: str) -> None:
    net, x_test = trained["net"], trained["x_test"]
    fit = _ours(trained, hessian, 0.7)
    reference = _reference(trained, hessian)
    reference.prior_precision = 0.7
    want = reference(x_test, pred_type="glm", link_approx="probit")  # (N, K)
    got = torch.softmax(laplace_logits(fit, _features(net, x_test)), -1)
    assert fit.prior_precision == 0.7 and fit.prior_method == "fixed"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)

    with pytest.warns(UserWarning, match="link_approx"):  # laplace-torch's; fseb_ft's is quiet
        reference.optimize_prior_precision(pred_type="glm", method="marglik")
    fit = _ours(trained, hessian, "marglik")
    assert fit.record() == {
        "hessian": hessian,
        "prior_method": "marglik",
        "prior_precision": pytest.approx(float(reference.prior_precision), rel=1e-9),
    }
    want = reference(x_test, pred_type="glm", link_approx="probit")
    got = torch.softmax(laplace_logits(fit, _features(net, x_test)), -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_validation_prior_is_laplace_torchs_grid_search_on_the_validation_nll(
    trained: dict,
) -> None:
    fit = _ours(trained, "kron", "validation")
    reference = _reference(trained, "kron")
    val = DataLoader(TensorDataset(trained["x_val"], trained["y_val"]), batch_size=N_VAL)
    with pytest.warns(UserWarning, match="link_approx"):
        reference.optimize_prior_precision(
            pred_type="glm", method="gridsearch", val_loader=val, link_approx="probit"
        )
    assert fit.prior_method == "validation"
    assert fit.prior_precision == float(reference.prior_precision)


@pytest.mark.parametrize("hessian", ["kron", "full", "diag"])
def test_llla_only_tempers_the_map_logits(trained: dict, hessian: str) -> None:
    """κ = (1 + π/8 · Var[f])^(-1/2) ≤ 1 scales each MAP logit towards 0 (a variance is ≥ 0),
    and here, where the classes' variances are alike, the predicted class stays the MAP's (not
    guaranteed in general: κ differs by class)."""
    net, x_test = trained["net"], trained["x_test"]
    with torch.no_grad():
        map_logits = net(x_test)  # (N, K)
    got = laplace_logits(_ours(trained, hessian, "marglik"), _features(net, x_test))
    kappa = got / map_logits  # (N, K)
    assert ((kappa > 0) & (kappa <= 1)).all() and (kappa < 1).any()
    assert torch.equal(got.argmax(-1), map_logits.argmax(-1))


def test_full_hessian_of_a_large_head_is_refused(
    trained: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llla, "FULL_MAX_WEIGHTS", 17)  # the TinyNet head has (5 + 1) · 3 = 18
    with pytest.raises(FsebError, match=r"18 weights \(5 features \+ 1, times 3 classes\)"):
        _ours(trained, "full", "marglik")
    assert _ours(trained, "kron", 1.0).hessian == "kron"


def test_missing_laplace_torch_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "laplace", None)  # import laplace → ImportError
    with pytest.raises(FsebError) as err:
        laplace_torch()
    assert str(err.value) == "eval.laplace needs laplace-torch: pip install 'fseb_ft[laplace]'"


def test_the_evaluation_passes_record_the_classifiers_input_and_keep_the_logits() -> None:
    net = TinyNet(d_in=6, width=5, k=3, bn=True).eval()
    data = TensorDataset(torch.randn(11, 6), torch.arange(11) % 3)
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(data, batch_size=4))
    logits, labels = predict_logits(net, loader, accelerator)
    again, labels_again, features = predict_with_features(net, loader, accelerator, net.head)
    assert torch.equal(again, logits) and torch.equal(labels_again, labels)
    with torch.no_grad():
        want = net.forward_head(net.forward_features(data.tensors[0]), pre_logits=True)
    torch.testing.assert_close(features, want, rtol=0, atol=0)
    assert not net.head._forward_hooks  # the hook is gone after the pass


def test_a_classifier_that_is_not_linear_is_refused_in_one_line() -> None:
    net = TinyNet()
    net.head = nn.Sequential(nn.Linear(5, 3))
    with pytest.raises(FsebError, match=r"^eval.laplace needs a linear classifier .* Sequential$"):
        linear_classifier(net, "eval.laplace")
