"""The last-layer Laplace (fseb_ft.evaluation.laplace) against laplace-torch's own call on a whole
network, in float64: fitted on the features, it must give the same probit predictive; its closed
forms (the kron variance, the diag GGN) against laplace-torch's generic Jacobian paths."""

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
from fseb_ft.evaluation.laplace import (
    fit_last_layer_laplace,
    kron_output_variance,
    laplace_logits,
    laplace_torch,
    linear_ggn_diagonal,
)
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


def _validation_nll(reference: object, trained: dict) -> torch.Tensor:
    """``(100,)`` laplace-torch's own probit predictive's mean validation NLL at each grid point."""
    nll = []
    for precision in llla.PRIOR_GRID:
        reference.prior_precision = precision
        probs = reference(trained["x_val"], pred_type="glm", link_approx="probit")  # (N_val, K)
        nll.append(nn.functional.nll_loss(probs.log(), trained["y_val"]))
    return torch.stack(nll)


@pytest.mark.parametrize("hessian", ["kron", "full", "diag"])
def test_validation_prior_minimises_the_validation_nll_of_laplace_torchs_predictive(
    trained: dict, hessian: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fseb_ft's grid is laplace-torch's, its criterion the mean validation NLL of laplace-torch's
    own probit predictive at each point; laplace-torch's grid search is not called."""
    tuning = laplace_torch().baselaplace.BaseLaplace.optimize_prior_precision
    calls: list[object] = []

    def spy(self: object, *args: object, **kwargs: object) -> object:
        calls.append(kwargs.get("method", args[1] if len(args) > 1 else None))
        return tuning(self, *args, **kwargs)

    monkeypatch.setattr(laplace_torch().baselaplace.BaseLaplace, "optimize_prior_precision", spy)
    fit = _ours(trained, hessian, "validation")
    assert calls == []
    nll = _validation_nll(_reference(trained, hessian), trained)
    assert fit.prior_method == "validation"
    assert fit.prior_precision == float(llla.PRIOR_GRID[nll.argmin()])


def test_laplace_torchs_grid_search_compares_running_means(trained: dict) -> None:
    """Why fseb_ft does not call it: laplace-torch 0.3's ``gridsearch`` never resets its
    ``RunningNLLMetric``, so at each point it scores the mean NLL over the grid so far."""
    reference = _reference(trained, "kron")
    nll = _validation_nll(reference, trained)
    val = DataLoader(TensorDataset(trained["x_val"], trained["y_val"]), batch_size=N_VAL)
    with pytest.warns(UserWarning, match="link_approx"):
        reference.optimize_prior_precision(
            pred_type="glm", method="gridsearch", val_loader=val, link_approx="probit"
        )
    running = nll.cumsum(0) / torch.arange(1, len(nll) + 1)  # (100,)
    assert float(reference.prior_precision) == float(llla.PRIOR_GRID[running.argmin()])
    assert float(reference.prior_precision) != float(llla.PRIOR_GRID[nll.argmin()])


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


def _random_fit(
    d: int, k: int, bias: bool, hessian: str
) -> tuple[llla.LaplaceFit, TensorDataset, torch.Tensor]:
    """LLLA fitted at prior precision 0.3 on 40 random float64 features of a random classifier:
    the fit, its training set and 9 new features."""
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    h, weight, b = draw(40, d), draw(k, d), draw(k) if bias else None
    labels = torch.randint(0, k, (40,), generator=generator)
    fit = fit_last_layer_laplace(h, labels, weight, b, hessian, 0.3)
    return fit, TensorDataset(h, labels), draw(9, d)


def _jacobian_variance(la, x: torch.Tensor) -> torch.Tensor:  # laplace-torch's generic Var[f]
    jacobians, _ = la.backend.last_layer_jacobians(x)  # (N, K, P)
    return la.functional_variance(jacobians).diagonal(dim1=1, dim2=2)  # (N, K)


@pytest.mark.parametrize(
    ("d", "k", "bias", "prior", "temperature"),
    [
        (7, 3, True, None, 1.0),
        (7, 3, False, None, 1.0),
        (4, 6, True, None, 0.5),  # fewer features than classes; a tempered posterior
        (12, 2, False, None, 1.0),
        (5, 4, True, [0.5, 2.0], 1.0),  # a prior precision per block: weight, bias
    ],
)
def test_kron_variance_is_laplace_torchs_functional_variance(
    d: int, k: int, bias: bool, prior: list[float] | None, temperature: float
) -> None:
    fit, _, x = _random_fit(d, k, bias, "kron")
    la = fit.posterior
    la.temperature = temperature
    if prior is not None:
        la.prior_precision = torch.tensor(prior, dtype=torch.float64)
    got = kron_output_variance(la.posterior_precision, x)
    want = _jacobian_variance(la, x)
    assert got is not None and got.shape == (9, k)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)


def test_kron_predictive_takes_the_closed_form_and_falls_back_for_a_damped_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fit, _, x = _random_fit(5, 3, True, "kron")
    la = fit.posterior
    calls = []
    generic = la.functional_variance
    monkeypatch.setattr(la, "functional_variance", lambda js: calls.append(js) or generic(js))

    closed = laplace_logits(fit, x)
    assert not calls  # no Jacobians: the closed form
    want = la(x, pred_type="glm", link_approx="probit")  # laplace-torch's own, by Jacobians
    torch.testing.assert_close(torch.softmax(closed, -1), want, rtol=0, atol=1e-12)

    # laplace-torch 0.3 drops `damping` when it scales H into the posterior precision, so a
    # damped one is built by hand: the closed form does not handle it and must step aside.
    precision = la.posterior_precision
    damped = type(precision)(
        precision.eigenvectors, precision.eigenvalues, precision.deltas, damping=True
    )
    monkeypatch.setattr(type(la), "posterior_precision", property(lambda self: damped))
    assert kron_output_variance(damped, x) is None
    calls.clear()
    fallback = laplace_logits(fit, x)
    assert calls
    want = la(x, pred_type="glm", link_approx="probit")
    torch.testing.assert_close(torch.softmax(fallback, -1), want, rtol=0, atol=1e-12)
    assert not torch.allclose(fallback, closed)  # the damping mattered: the test can fail


@pytest.mark.parametrize("bias", [True, False])
def test_diag_fit_is_laplace_torchs_own_fit(bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same diagonal GGN, loss and N as laplace-torch's default backend, which contracts
    the (B, K, P) Jacobians; in one batch there, in three here."""
    p = (6 + bias) * 4
    monkeypatch.setattr(llla, "_JACOBIAN_BYTES", 8 * 4 * p * 16)  # batches of 16 of 40 images
    fit, train, _ = _random_fit(6, 4, bias, "diag")
    reference = laplace_torch().Laplace(
        fit.posterior.model.model,  # the nn.Sequential holding the classifier
        "classification",
        subset_of_weights="last_layer",
        hessian_structure="diag",
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script` is deprecated", FutureWarning)
        reference.fit(DataLoader(train, batch_size=40))
    assert isinstance(fit.posterior.backend, llla._linear_ggn_backend())  # fseb_ft's diagonal
    assert fit.posterior.H.shape == (p,) and fit.posterior.n_data == reference.n_data == 40
    torch.testing.assert_close(fit.posterior.H, reference.H, rtol=1e-12, atol=0)
    torch.testing.assert_close(fit.posterior.loss, reference.loss, rtol=1e-12, atol=0)


def test_linear_ggn_diagonal_by_hand() -> None:
    """Two classes at logits 0: p = 1/2, p − p² = 1/4 for each; h = (1, 2) gives the weights'
    1/4 · h² per class row, the biases 1/4."""
    features = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    logits = torch.zeros(1, 2, dtype=torch.float64)
    want = torch.tensor([0.25, 1.0, 0.25, 1.0, 0.25, 0.25], dtype=torch.float64)
    assert torch.equal(linear_ggn_diagonal(features, logits, bias=True), want)
    assert torch.equal(linear_ggn_diagonal(features, logits, bias=False), want[:4])


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
    with torch.no_grad():  # in the same batches of 4: a matmul's rounding may depend on its size
        want = torch.cat(
            [
                net.forward_head(net.forward_features(x), pre_logits=True)
                for x in data.tensors[0].split(4)
            ]
        )
    torch.testing.assert_close(features, want, rtol=0, atol=0)
    assert not net.head._forward_hooks  # the hook is gone after the pass


def test_a_classifier_that_is_not_linear_is_refused_in_one_line() -> None:
    net = TinyNet()
    net.head = nn.Sequential(nn.Linear(5, 3))
    with pytest.raises(FsebError, match=r"^eval.laplace needs a linear classifier .* Sequential$"):
        linear_classifier(net, "eval.laplace")
