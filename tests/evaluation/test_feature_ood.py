"""The feature-space OOD scores (fseb_ft.evaluation.feature_ood): far points score higher, and
each score equals scikit-learn's and pytorch-ood's on the same small features."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load, save
from sklearn.covariance import EmpiricalCovariance
from sklearn.neighbors import NearestNeighbors

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.feature_ood import (
    FEATURE_SCORES,
    feature_ood_score,
    fit_feature_ood,
    fit_from_tensors,
    fit_scores,
    fit_tensors,
    vim_principal_dim,
)


def _two_gaussians() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training features of two Gaussian classes in 4-D, centred at ±2 on the first axis, and
    a 2-class linear classifier that separates them."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(40) % 2
    centres = torch.tensor([[-2.0, 0, 0, 0], [2.0, 0, 0, 0]])
    features = centres[labels] + torch.randn(40, 4, generator=g) * torch.tensor([1, 0.5, 0.5, 2])
    weight = torch.tensor([[-1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    return features, labels, weight, torch.tensor([0.1, -0.1])


@pytest.mark.parametrize("name", FEATURE_SCORES)
def test_a_far_point_scores_higher_than_in_distribution_points(name: str) -> None:
    features, labels, weight, bias = _two_gaussians()
    fit = fit_feature_ood(features, labels, weight, bias, k=5, principal_dim=2)
    inside = torch.tensor([[-2.0, 0, 0, 0], [2.0, 0, 0, 0], [2.0, 0.2, -0.2, 1.0]])
    far = torch.tensor([[0.0, 8.0, -8.0, 0.0]])  # between the classes, off their spread
    scores = feature_ood_score(name, fit, torch.cat([inside, far]))
    assert scores.dtype == torch.float64 and scores.shape == (4,)
    assert scores[3] > scores[:3].max()


def test_mahalanobis_is_sklearns_with_the_shared_class_covariance() -> None:
    features, labels, _, _ = _two_gaussians()
    x = features.double().numpy()
    y = labels.numpy()
    means = np.stack([x[y == c].mean(0) for c in (0, 1)])
    shared = EmpiricalCovariance().fit(x - means[y])  # Lee et al.'s tied covariance
    queries = np.array([[0.0, 1, 2, 3], [-2, 0, 0, 0], [5, -1, 0.5, 4]])
    want = np.min([shared.mahalanobis(queries - m) for m in means], axis=0)
    fit = fit_feature_ood(features, labels, ridge=0.0)
    got = feature_ood_score("mahalanobis", fit, torch.from_numpy(queries))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9)


def test_relative_mahalanobis_subtracts_the_background_distance() -> None:
    features, labels, _, _ = _two_gaussians()
    queries = torch.tensor([[0.0, 1, 2, 3], [-2, 0, 0, 0], [5, -1, 0.5, 4]])
    fit = fit_feature_ood(features, labels, ridge=0.0)
    background = EmpiricalCovariance().fit(features.double().numpy())
    want = feature_ood_score("mahalanobis", fit, queries).numpy() - background.mahalanobis(
        queries.double().numpy()
    )
    got = feature_ood_score("relative_mahalanobis", fit, queries)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("k", "used"), [(5, 5), (50, 40)])  # k is capped at N = 40
def test_knn_is_sklearns_kth_neighbour_distance_on_unit_features(k: int, used: int) -> None:
    features, labels, _, _ = _two_gaussians()
    unit = features.double().numpy()
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    queries = np.array([[0.0, 1, 2, 3], [-2, 0, 0, 0], [5, -1, 0.5, 4]])
    distances, _ = (
        NearestNeighbors(n_neighbors=used)
        .fit(unit)
        .kneighbors(queries / np.linalg.norm(queries, axis=1, keepdims=True))
    )
    fit = fit_feature_ood(features, labels, k=k)
    got = feature_ood_score("knn", fit, torch.from_numpy(queries))
    np.testing.assert_allclose(got.numpy(), distances[:, -1], rtol=1e-7, atol=1e-7)


def test_the_scores_equal_pytorch_oods_detectors_up_to_their_scale() -> None:
    """pytorch-ood's Mahalanobis is ½ min_k d_k and its RMD min_k d_k − d_0, both with the
    unnormalised scatter (N Σ) as covariance: ours are 2N and N times theirs; KNN and ViM (the
    same principal dimension) are equal."""
    detector = pytest.importorskip("pytorch_ood.detector")
    features, labels, weight, bias = _two_gaussians()
    n = len(labels)
    queries = torch.tensor([[0.0, 1, 2, 3], [-2, 0, 0, 0], [5, -1, 0.5, 4], [0, 8, -8, 0]])
    fit = fit_feature_ood(features, labels, weight, bias, k=5, ridge=0.0, principal_dim=2)
    theirs = {
        "mahalanobis": (detector.Mahalanobis(None), 2 * n),
        "relative_mahalanobis": (detector.RMD(None), n),
        "knn": (detector.KNN(None, k=5), 1),
        "vim": (detector.ViM(None, d=2, w=weight, b=bias), 1),
    }
    for name, (reference, scale) in theirs.items():
        want = reference.fit_features(features, labels).predict_features(queries).double()
        got = feature_ood_score(name, fit, queries)
        torch.testing.assert_close(got, scale * want, rtol=1e-4, atol=1e-4, msg=name)


def test_vim_needs_the_classifier_and_a_principal_dimension_below_d() -> None:
    features, labels, weight, bias = _two_gaussians()
    with pytest.raises(ValueError, match="needs a fit with the classifier"):
        feature_ood_score("vim", fit_feature_ood(features, labels), features)
    with pytest.raises(ValueError, match=r"principal dimension must be in \[1, 4\)"):
        fit_feature_ood(features, labels, weight, bias, principal_dim=4)
    assert [vim_principal_dim(d) for d in (4, 512, 768, 2048)] == [2, 256, 512, 1000]


@pytest.mark.parametrize("with_vim", [True, False])
def test_a_fit_survives_safetensors_bit_for_bit_and_scores_alike(with_vim: bool) -> None:
    features, labels, weight, bias = _two_gaussians()
    head = (weight, bias) if with_vim else ()
    fit = fit_feature_ood(features, labels, *head, k=5, principal_dim=2)
    back = fit_from_tensors(load(save(fit_tensors(fit))))
    assert fit_scores(back) == (FEATURE_SCORES if with_vim else FEATURE_SCORES[:3])
    assert back.train_unit.dtype == torch.float32 and back.chol.dtype == torch.float64
    assert (back.k, back.alpha) == (fit.k, fit.alpha)
    queries = torch.cat([features[:5], torch.tensor([[0.0, 8.0, -8.0, 0.0]])])
    for name in fit_scores(fit):
        assert torch.equal(
            feature_ood_score(name, back, queries), feature_ood_score(name, fit, queries)
        )
    tensors = fit_tensors(fit)
    del tensors["chol" if not with_vim else "residual"]
    with pytest.raises(ValueError, match=r"not a feature-score fit: \['(chol|residual)'\] missing"):
        fit_from_tensors(tensors)


def test_features_of_another_width_and_unknown_names_are_refused() -> None:
    features, labels, _, _ = _two_gaussians()
    fit = fit_feature_ood(features, labels)
    with pytest.raises(ValueError, match="must have 4 columns"):
        feature_ood_score("knn", fit, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="must be one of"):
        feature_ood_score("gram", fit, features)


def test_ood_metrics_report_a_feature_score_only_where_its_values_are_given() -> None:
    from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY, ood_metrics

    assert [s for s, r in OOD_SCORE_REGISTRY.items() if r.needs_features] == list(FEATURE_SCORES)
    features, labels, weight, bias = _two_gaussians()
    fit = fit_feature_ood(features, labels, weight, bias, k=5, principal_dim=2)
    far = features * 10 + 20
    probs_in, probs_out = torch.full((40, 2), 0.5), torch.full((40, 2), 0.5)
    values_in = {"mahalanobis": feature_ood_score("mahalanobis", fit, features)}
    values_out = {"mahalanobis": feature_ood_score("mahalanobis", fit, far)}
    found = ood_metrics(
        probs_in, probs_out, ("entropy", "mahalanobis", "vim"), None, None, values_in, values_out
    )
    assert set(found) == {
        f"{s}_{m}" for s in ("entropy", "mahalanobis") for m in ("auroc", "aupr", "fpr95")
    }
    assert found["mahalanobis_auroc"] == 1.0  # every far point is farther than every training one
    assert (
        set(ood_metrics(probs_in, probs_out, ("mahalanobis",))) == set()
    )  # an ensemble: no values


def test_mahalanobis_in_chunks_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    import fseb_ft.evaluation.feature_ood as module

    g = torch.Generator().manual_seed(1)
    h, means = torch.randn(37, 6, generator=g).double(), torch.randn(5, 6, generator=g).double()
    chol = torch.linalg.cholesky(torch.eye(6, dtype=torch.float64) * 2.0)
    whole = module.mahalanobis_distances(h, means, chol)
    monkeypatch.setattr(module, "_MAHALANOBIS_ELEMENTS", 7 * 30)  # 7 rows of K·D = 30 at once
    chunked = module.mahalanobis_distances(h, means, chol)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=0)
    assert whole.shape == (37, 5)


def test_features_that_do_not_vary_are_refused_in_one_line() -> None:
    with pytest.raises(FsebError, match="do not vary"):
        fit_feature_ood(torch.ones(10, 3), torch.arange(10) % 2)
