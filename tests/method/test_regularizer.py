"""The FS-EB regulariser against naive float64 references (design §1)."""

from __future__ import annotations

import warnings

import pytest
import torch

from fseb_ft.method.regularizer import (
    CholeskyJitterWarning,
    function_space_term,
    parameter_term,
    prior_covariance,
    select_solver,
)


def _naive_kc(H: torch.Tensor, s: float, d: float) -> torch.Tensor:
    H = H.double()
    M = H.shape[0]
    return s * (H @ H.T + torch.ones(M, M, dtype=torch.float64)) + d * torch.eye(
        M, dtype=torch.float64
    )


def _naive_term(F: torch.Tensor, H: torch.Tensor, s: float, d: float) -> torch.Tensor:
    Kinv = torch.linalg.inv(_naive_kc(H, s, d))
    F = F.double()
    return 0.5 * sum(F[:, k] @ Kinv @ F[:, k] for k in range(F.shape[1]))


def _data(M: int, D: int, K: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(M, D, generator=g, dtype=torch.float64)
    F = torch.randn(M, K, generator=g, dtype=torch.float64)
    return F, H


def test_prior_covariance_formula() -> None:
    _, H = _data(6, 3, 2)
    torch.testing.assert_close(prior_covariance(H, 0.3, 0.7), _naive_kc(H, 0.3, 0.7))


@pytest.mark.parametrize(
    ("M", "D", "s", "d"),
    [(40, 5, 0.01, 1.0), (8, 30, 0.01, 1.0), (64, 16, 1e-5, 1e-2), (32, 31, 1.0, 0.5)],
)
def test_solvers_match_naive_inverse(M: int, D: int, s: float, d: float) -> None:
    F, H = _data(M, D, 4, seed=M + D)
    ref = _naive_term(F, H, s, d)
    chol = function_space_term(F, H, s, d, solver="cholesky")
    wood = function_space_term(F, H, s, d, solver="woodbury")
    auto = function_space_term(F, H, s, d)
    for value in (chol, wood, auto):
        assert value.dtype == torch.float64
        torch.testing.assert_close(value, ref, rtol=1e-8, atol=1e-8)


def test_auto_picks_woodbury_only_when_cheaper() -> None:
    assert select_solver(129, 127, 1.0, 1.0) == "woodbury"
    assert select_solver(128, 127, 1.0, 1.0) == "cholesky"
    assert select_solver(1000, 10, 1.0, 0.0) == "cholesky"  # d = 0: not diagonal + low rank
    assert select_solver(1000, 10, 0.0, 1.0) == "cholesky"


@pytest.mark.parametrize("solver", ["cholesky", "woodbury"])
def test_gradient_wrt_logits_is_kc_inverse_f(solver: str) -> None:
    F, H = _data(24, 6, 3, seed=3)
    F.requires_grad_(True)
    function_space_term(F, H, 0.05, 0.2, solver=solver).backward()
    expected = torch.linalg.solve(_naive_kc(H, 0.05, 0.2), F.detach())
    torch.testing.assert_close(F.grad, expected, rtol=1e-8, atol=1e-10)


def test_float32_logits_come_back_float32_with_float64_accuracy() -> None:
    F, H = _data(16, 4, 3, seed=5)
    out = function_space_term(F.float(), H.float(), 0.1, 0.5)
    assert out.dtype == torch.float32
    ref = _naive_term(F.float().double(), H.float().double(), 0.1, 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=0)


def test_bf16_autocast_is_finite_and_close_to_fp32() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 5)
    x = torch.randn(32, 8)
    H = torch.randn(32, 8)
    ref = function_space_term(head(x), H, 0.01, 1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(x)
        assert logits.dtype == torch.bfloat16
        out = function_space_term(logits, H.bfloat16(), 0.01, 1.0)
    assert out.dtype == torch.float32
    assert torch.isfinite(out)
    # bf16 keeps ~3 significant digits of the logits and features.
    torch.testing.assert_close(out, ref, rtol=3e-2, atol=0)
    out.backward()
    assert torch.isfinite(head.weight.grad).all()


def test_duplicate_points_with_zero_diag_take_the_jitter_path() -> None:
    g = torch.Generator().manual_seed(1)
    H = torch.randn(4, 3, generator=g, dtype=torch.float64).repeat(3, 1)  # 12 points, rank ≤ 4
    F = torch.randn(12, 2, generator=g, dtype=torch.float64)
    with pytest.warns(CholeskyJitterWarning, match="prior_cov_diag"):
        out = function_space_term(F, H, 1.0, 0.0)
    assert torch.isfinite(out) and out > 0


def test_well_conditioned_kc_does_not_warn() -> None:
    F, H = _data(12, 3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        function_space_term(F, H, 1.0, 1.0)


def test_nan_features_fail_with_a_clear_error() -> None:
    F, H = _data(6, 3, 2)
    H[0, 0] = float("nan")
    with pytest.raises(torch.linalg.LinAlgError, match="NaN"):
        function_space_term(F, H, 1.0, 1.0, solver="cholesky")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scale": -1.0, "diag": 1.0}, "prior_cov_scale"),
        ({"scale": 1.0, "diag": float("nan")}, "prior_cov_diag"),
        ({"scale": 0.0, "diag": 0.0}, "both 0"),
        ({"scale": 1.0, "diag": 0.0, "solver": "woodbury"}, "woodbury"),
        ({"scale": 1.0, "diag": 1.0, "solver": "qr"}, "solver"),
    ],
)
def test_bad_hyper_parameters_are_named(kwargs: dict, match: str) -> None:
    F, H = _data(6, 3, 2)
    with pytest.raises(ValueError, match=match):
        function_space_term(F, H, **kwargs)


def test_shape_mismatch_is_named() -> None:
    F, H = _data(6, 3, 2)
    with pytest.raises(ValueError, match="same number of context points"):
        function_space_term(F, H[:5], 1.0, 1.0)
    with pytest.raises(ValueError, match="logits must be"):
        function_space_term(F[:, 0], H, 1.0, 1.0)


def test_parameter_term_matches_naive() -> None:
    g = torch.Generator().manual_seed(2)
    params = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    anchors = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    flat = torch.cat([p.flatten() for p in params]).double()
    flat_a = torch.cat([a.flatten() for a in anchors]).double()
    torch.testing.assert_close(
        parameter_term(params, 0.1).double(), (flat**2).sum() / 0.2, rtol=1e-6, atol=0
    )
    torch.testing.assert_close(
        parameter_term(params, 0.1, anchors).double(),
        ((flat - flat_a) ** 2).sum() / 0.2,
        rtol=1e-6,
        atol=0,
    )
    with pytest.raises(ValueError, match="prior_var"):
        parameter_term(params, 0.0)
    with pytest.raises(ValueError, match="one to one"):
        parameter_term(params, 1.0, anchors[:1])


def test_parameter_term_gradients_are_exact() -> None:
    """R_θ's fused backward, 2 (θ − a) / (2 · prior_var) per tensor, against finite differences
    in float64, with and without anchors, a 0-dim parameter among them."""
    g = torch.Generator().manual_seed(3)
    shapes = [(3, 4), (), (5,)]
    params = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]
    anchors = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    assert torch.autograd.gradcheck(lambda *p: parameter_term(p, 0.3), params)
    assert torch.autograd.gradcheck(lambda *p: parameter_term(p, 0.3, anchors), params)


def test_parameter_term_of_bf16_parameters_sums_in_float32() -> None:
    params = [torch.full((300,), 1.0 + 2**-7, dtype=torch.bfloat16, requires_grad=True)]
    out = parameter_term(params, 0.5)  # 300 · (1 + 2⁻⁷)² exactly, which bf16 cannot hold
    assert out.dtype == torch.float32
    assert float(out.detach()) == pytest.approx(300 * (1 + 2**-7) ** 2, rel=1e-6)
    out.backward()
    assert params[0].grad.dtype == torch.bfloat16
    assert torch.equal(params[0].grad, 2 * params[0].detach())


def test_device_path_selects_the_jittered_factor_without_host_sync() -> None:
    # The accelerator path is plain tensor code, so it is checked on CPU directly.
    from fseb_ft.method.regularizer import _DEVICE_FALLBACK_JITTER, _cholesky_on_device

    g = torch.Generator().manual_seed(4)
    H = torch.randn(5, 3, generator=g, dtype=torch.float64)
    good = prior_covariance(H, 1.0, 1.0)
    torch.testing.assert_close(_cholesky_on_device(good), torch.linalg.cholesky(good))
    singular = prior_covariance(H.repeat(3, 1), 1.0, 0.0)  # duplicate points, d = 0
    level = singular.diagonal().abs().mean()
    expected = torch.linalg.cholesky(
        singular + _DEVICE_FALLBACK_JITTER * level * torch.eye(15, dtype=torch.float64)
    )
    torch.testing.assert_close(_cholesky_on_device(singular), expected)
    broken = good.clone()
    broken[0, 0] = float("nan")
    assert torch.isnan(_cholesky_on_device(broken)).all()


def test_device_path_treats_a_tiny_pivot_as_singular(monkeypatch: pytest.MonkeyPatch) -> None:
    """A singular matrix that the BLAS factorises with a pivot of rounding size (as some CPUs'
    do) gets the jittered factor on the device path too."""
    from fseb_ft.method.regularizer import _DEVICE_FALLBACK_JITTER, _cholesky_on_device

    H = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0]], dtype=torch.float64)  # rows 0 = 1
    singular = prior_covariance(H, 1.0, 0.0)  # (3, 3), exactly rank 2
    eye = torch.eye(3, dtype=torch.float64)
    level = singular.diagonal().mean()
    real = torch.linalg.cholesky_ex
    rounded = real(singular + 1e-15 * level * eye)  # what a "successful" BLAS returns
    monkeypatch.setattr(
        torch.linalg,
        "cholesky_ex",
        lambda A: rounded if torch.equal(A, singular) else real(A),
    )
    expected = real(singular + _DEVICE_FALLBACK_JITTER * level * eye)[0]
    torch.testing.assert_close(_cholesky_on_device(singular), expected)


def test_pivot_threshold_accepts_well_conditioned_and_rejects_rank_deficient() -> None:
    from fseb_ft.method.regularizer import _well_conditioned

    exact = torch.tensor([[4.0, 2.0], [2.0, 2.0]], dtype=torch.float64)  # L = [[2, 0], [1, 1]]
    L = torch.linalg.cholesky(exact)
    assert bool(_well_conditioned(L, exact.diagonal().mean()))
    tiny = torch.tensor([[2.0, 0.0], [1.0, 1e-7]], dtype=torch.float64)  # last pivot 1e-14
    assert not bool(_well_conditioned(tiny, torch.tensor(3.0, dtype=torch.float64)))
