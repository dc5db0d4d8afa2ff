"""Last-layer Laplace on the CPU: the kron fit, and its predictive by the Jacobians and in closed
form.

    OMP_NUM_THREADS=1 python -m benchmarks.laplace_speed [--train 9000] [--predict 10000]
        [--features 1280] [--classes 10] [--val 1000] [--diag]

Random float64 features (``--train`` training, ``--predict`` predicted, ``--features`` wide) of
a random linear classifier of ``--classes`` classes, labels drawn from its softmax. Timed, each
once, in float64 on the CPU:

- ``kron_fit``: :func:`fseb_ft.evaluation.laplace.fit_last_layer_laplace` with the Kronecker
  GGN and the marginal-likelihood prior (a run's defaults);
- ``jacobian_predictive``: ``Var[f_c]`` of the predicted features by laplace-torch's generic
  path, the ``(B, K, P)`` last-layer Jacobians and its ``functional_variance`` (fseb_ft's
  fallback, and its only path before the closed form);
- ``closed_form_predictive``: :func:`fseb_ft.evaluation.laplace.kron_output_variance`;
- ``validation_grid``: :func:`fseb_ft.evaluation.laplace.validation_grid_search` on the first
  ``--val`` training features (``eval.laplace_prior: validation``: laplace-torch's 100 grid
  points, each point's predictive in closed form);
- with ``--diag``, the diagonal fit at a fixed prior precision, fseb_ft's
  (:func:`~fseb_ft.evaluation.laplace.linear_ggn_diagonal` as laplace-torch's backend) and
  laplace-torch's own default backend.

It prints the seconds side by side and the largest absolute differences between the two
variances and between the two probit predictives; the last line is a JSON object of them all.
laplace-torch is imported before any timing.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fseb_ft.evaluation import laplace as llla


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()``'s value and its wall-clock seconds."""
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def problem(n_train: int, n_predict: int, d: int, k: int) -> dict[str, Tensor]:
    """Seeded random features, a classifier whose logits have unit-order spread, labels drawn
    from its softmax."""
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    h, weight, bias = draw(n_train, d), 2.0 * draw(k, d) / math.sqrt(d), draw(k)
    labels = torch.multinomial(torch.softmax(h @ weight.T + bias, -1), 1, generator=generator)
    return {"h": h, "y": labels[:, 0], "w": weight, "b": bias, "x": draw(n_predict, d)}


def probit(f_mu: Tensor, f_var: Tensor) -> Tensor:
    """The probit predictive ``softmax(κ ⊙ f_μ)`` ``(N, K)``."""
    return torch.softmax(f_mu * torch.rsqrt(1.0 + math.pi / 8.0 * f_var), -1)


def diag_fits(data: dict[str, Tensor]) -> dict[str, float]:
    """Seconds of the diagonal fit, fseb_ft's and laplace-torch's default backend's."""
    _, ours = timed(lambda: llla.fit_last_layer_laplace(*_fit_args(data), "diag", 1.0))
    reference = llla.laplace_torch().Laplace(
        llla._head(data["w"], data["b"], data["h"].device),
        "classification",
        subset_of_weights="last_layer",
        hessian_structure="diag",
        last_layer_name="1",
    )
    k, d = data["w"].shape
    batch = llla._batch_size(k, (d + 1) * k)  # fseb_ft's batches
    _, theirs = timed(lambda: reference.fit(llla._loader(data["h"], data["y"], batch)))
    return {"diag_fit": ours, "diag_fit_laplace_torch_backend": theirs}


def _fit_args(data: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return data["h"], data["y"], data["w"], data["b"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=9000)
    parser.add_argument("--predict", type=int, default=10_000)
    parser.add_argument("--features", type=int, default=1280)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--val", type=int, default=1000, help="validation features of the grid")
    parser.add_argument("--diag", action="store_true", help="also time the diagonal fits")
    args = parser.parse_args()
    llla.laplace_torch()
    data = problem(args.train, args.predict, args.features, args.classes)
    fit, fit_s = timed(lambda: llla.fit_last_layer_laplace(*_fit_args(data), "kron", "marglik"))
    la = fit.posterior
    (f_mu, jacobian_var), jacobian_s = timed(lambda: llla._jacobian_variance(la, data["x"]))
    closed_var, closed_s = timed(
        lambda: llla.kron_output_variance(la.posterior_precision, data["x"])
    )
    result: dict[str, Any] = {
        "n_train": args.train,
        "n_predict": args.predict,
        "features": args.features,
        "classes": args.classes,
        "threads": torch.get_num_threads(),
        "prior_precision": fit.prior_precision,
        "kron_fit": fit_s,
        "jacobian_predictive": jacobian_s,
        "closed_form_predictive": closed_s,
        "max_abs_diff_variance": float((closed_var - jacobian_var).abs().max()),
        "max_abs_diff_probit": float(
            (probit(f_mu, closed_var) - probit(f_mu, jacobian_var)).abs().max()
        ),
    }
    val = (data["h"][: args.val], data["y"][: args.val])
    _, result["validation_grid"] = timed(lambda: llla.validation_grid_search(la, *val))
    if args.diag:
        result |= diag_fits(data)
    print(
        f"kron fit {fit_s:.1f} s | predictive of {args.predict}: Jacobians {jacobian_s:.1f} s, "
        f"closed form {closed_s:.2f} s | max |ΔVar| {result['max_abs_diff_variance']:.1e}, "
        f"max |Δp| {result['max_abs_diff_probit']:.1e}"
    )
    print(f"validation grid (100 points, {args.val} images): {result['validation_grid']:.1f} s")
    if args.diag:
        print(
            f"diag fit: fseb_ft {result['diag_fit']:.1f} s, laplace-torch's backend "
            f"{result['diag_fit_laplace_torch_backend']:.1f} s"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
