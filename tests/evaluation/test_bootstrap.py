"""Bootstrap intervals (eval.bootstrap): scipy's percentile interval, the same resamples for
every metric and for both runs of a paired difference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fseb_ft.evaluation.bootstrap import (
    Bootstrap,
    metric_intervals,
    ood_intervals,
    paired_difference_intervals,
)
from fseb_ft.evaluation.metrics import METRIC_REGISTRY, bundle, classification_metrics
from fseb_ft.evaluation.ood import ood_metrics, ood_score
from fseb_ft.evaluation.resampled import detection_statistic, metric_statistics
from fseb_ft.recipe import ConfigError
from fseb_ft.recipe.reporting import EvalConfig

N, K = 40, 2
_TASK_METRICS = [name for name, m in METRIC_REGISTRY.items() if m.task]
DRAWN = Bootstrap(resamples=100, confidence=0.9, seed=3)


def _case(seed: int = 0, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Rounded logits: tied confidences, as a real model's saturated ones are.
    logits = (torch.randn(N, k, generator=g) * 2).round(decimals=1)
    return torch.log_softmax(logits, -1), torch.randint(0, k, (N,), generator=g)


def test_every_batched_metric_equals_the_registered_one_on_a_resample() -> None:
    log_probs, labels = _case(k=2)
    drawn = torch.randint(0, N, (N,), generator=torch.Generator().manual_seed(1))
    expected = classification_metrics(log_probs[drawn], labels[drawn])
    counts = np.bincount(drawn.numpy(), minlength=N).astype(float)[:, None]  # (N, 1)
    found = metric_statistics(log_probs, labels, list(expected))
    for name, stat in zip(expected, found, strict=True):
        assert stat(counts)[0] == pytest.approx(float(expected[name]), abs=1e-12), name
    probs_out = torch.log_softmax(torch.randn(30, 2, generator=torch.Generator()), -1).exp()
    s_in, s_out = ood_score("entropy", log_probs.exp()), ood_score("entropy", probs_out)
    found = detection_statistic(s_in, s_out)(counts, np.ones((30, 1)))[:, 0]
    reference = ood_metrics(log_probs[drawn].exp(), probs_out)
    assert found == pytest.approx([float(v) for v in reference.values()], abs=1e-12)


@pytest.mark.parametrize("k", [2, 3])
def test_every_batched_task_metric_equals_scikit_learns_on_each_resample(k: int) -> None:
    log_probs, labels = _case(seed=k, k=k)
    labels[:3] = torch.arange(3) % k  # each class labelled, for the draws of the first images
    names = [m.name for m in bundle(k, _TASK_METRICS) if m.task and not m.per_class]
    generator = torch.Generator().manual_seed(2)
    draws = [torch.randint(0, N, (N,), generator=generator) for _ in range(20)]
    # Degenerate resamples: one image (one class, every ranking metric NaN), two of one class
    # and one of another (a class missing for K = 3), the first k images (every class once).
    draws += [torch.ones(N, dtype=torch.long), torch.tensor([0, 0, 1]), torch.arange(k)]
    # The 20 highest-scored images of label 0, each once, and 10 of label 1: one and two false
    # positives are exactly 95 % and 90 % specificity, thresholds the sensitivities count in.
    negatives, positives = (labels == 0).nonzero()[:, 0], (labels == 1).nonzero()[:, 0]
    ranked = negatives[log_probs[negatives, 1].argsort(descending=True)]
    draws.insert(0, torch.cat([ranked[:20], positives[:10]]))
    counts = np.stack([np.bincount(d.numpy(), minlength=N) for d in draws], 1)  # (N, B)
    statistics = metric_statistics(log_probs, labels, names)
    found = np.stack([f(counts.astype(float)) for f in statistics])  # (M, B)
    for b, drawn in enumerate(draws):
        expected = classification_metrics(log_probs[drawn], labels[drawn], names)
        reference = [float(expected[name]) for name in names]
        assert found[:, b] == pytest.approx(reference, abs=1e-12, nan_ok=True), (b, names)
    assert np.isnan(found[names.index("average_precision"), -3])  # one class: undefined
    assert np.isfinite(found[:, -1]).all()  # every class once: all defined


def test_a_metric_without_a_batched_form_is_computed_on_each_resample(fake_metric: str) -> None:
    log_probs, labels = _case(k=3)
    drawn = torch.randint(0, N, (N,), generator=torch.Generator().manual_seed(4))
    counts = np.bincount(drawn.numpy(), minlength=N).astype(float)[:, None]  # (N, 1)
    [found] = metric_statistics(log_probs, labels, [fake_metric])
    expected = classification_metrics(log_probs[drawn], labels[drawn])[fake_metric]
    assert found(counts)[0] == pytest.approx(float(expected), abs=1e-12)


def test_intervals_equal_scipys_percentile_bootstrap_of_the_registered_metrics() -> None:
    log_probs, labels = _case()
    names = ["accuracy", "nll", "ece", "aurc", "auroc_positive"]
    found = metric_intervals(log_probs, labels, names, DRAWN)
    point = classification_metrics(log_probs, labels)

    def registered(*by_class: np.ndarray) -> np.ndarray:  # one resample, the slow way
        i = torch.from_numpy(np.concatenate(by_class))
        got = classification_metrics(log_probs[i], labels[i])
        return np.array([float(got[n]) for n in names])

    # Resampled within each class: each class's indices a sample of its own.
    reference = stats.bootstrap(
        tuple(np.flatnonzero(labels.numpy() == c) for c in range(K)),
        registered,
        n_resamples=DRAWN.resamples,
        confidence_level=DRAWN.confidence,
        method="percentile",
        vectorized=False,
        rng=np.random.default_rng(DRAWN.seed),
    ).confidence_interval
    for j, name in enumerate(names):
        assert found[name] == pytest.approx([reference.low[j], reference.high[j]], abs=1e-12)
        assert found[name][0] <= float(point[name]) <= found[name][1], name
    assert metric_intervals(log_probs, labels, names, DRAWN) == found  # same seed, same interval


def test_a_paired_difference_uses_the_same_resamples_for_both_runs() -> None:
    a, b = _case(0), _case(1)
    b = (b[0], a[1])  # another model on the same images
    names = ["accuracy", "nll"]
    same = paired_difference_intervals(a, a, names, DRAWN)
    assert same == {"accuracy": [0.0, 0.0], "nll": [0.0, 0.0]}
    diff = paired_difference_intervals(a, b, names, DRAWN)
    alone = metric_intervals(*a, names, DRAWN)
    assert diff != same and diff["nll"][0] < diff["nll"][1]
    assert alone["nll"][0] < alone["nll"][1]
    s_in, s_out = {"entropy": torch.rand(N, dtype=torch.float64)}, {"entropy": torch.rand(25)}
    zero = ood_intervals(s_in, s_out, DRAWN, minus=(s_in, s_out))
    assert set(zero) == {"entropy_auroc", "entropy_aupr", "entropy_fpr95"}
    assert all(pair == [0.0, 0.0] for pair in zero.values())


def test_bootstrap_keys_are_checked() -> None:
    assert EvalConfig().bootstrap == 1000 and EvalConfig(bootstrap=0).bootstrap == 0
    with pytest.raises(ConfigError, match=r"bootstrap=10: must be 0"):
        EvalConfig(bootstrap=10)
    with pytest.raises(ConfigError, match=r"bootstrap_confidence=1.0"):
        EvalConfig(bootstrap_confidence=1.0)


def test_a_rare_class_keeps_its_interval_and_tiny_samples_have_none() -> None:
    g = torch.Generator().manual_seed(5)
    labels = torch.zeros(300, dtype=torch.long)
    labels[:3] = 1  # 3 positives in 300: a plain resample has none 5 % of the time
    log_probs = torch.log_softmax(torch.randn(300, 2, generator=g) + 2 * labels[:, None], -1)
    auroc = metric_intervals(log_probs, labels, ["auroc_positive"], DRAWN)["auroc_positive"]
    assert None not in auroc and auroc[0] < auroc[1]
    # A class of one image is in every resample as it is; the other is resampled.
    labels[1:3] = 0
    assert None not in metric_intervals(log_probs, labels, ["accuracy"], DRAWN)["accuracy"]
    one = metric_intervals(log_probs[:1], labels[:1], ["accuracy", "nll"], DRAWN)
    assert one == {"accuracy": [None, None], "nll": [None, None]}
    s_in, s_out = {"entropy": torch.rand(N, dtype=torch.float64)}, {"entropy": torch.rand(1)}
    found = ood_intervals(s_in, s_out, DRAWN)  # one OOD image
    assert set(found) == {"entropy_auroc", "entropy_aupr", "entropy_fpr95"}
    assert all(pair == [None, None] for pair in found.values())
    assert ood_intervals({}, {}, DRAWN) == {}  # no score can be computed (an ensemble's energy)
