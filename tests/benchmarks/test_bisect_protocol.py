"""benchmarks.bisect_protocol: the commits that changed a short run's metrics."""

from __future__ import annotations

import pytest

from benchmarks.bisect_protocol import change_points, digest, first_change

SHAS = list("abcdefghij")
# The metric each commit's run gives: changed by d (1 → 2) and by g (2 → 3).
HISTORY = dict(zip(SHAS, [1, 1, 1, 2, 2, 2, 3, 3, 3, 3], strict=True))


def runner(failing: set[str] = frozenset()) -> tuple[list[str], object]:
    """A fake ``test``: the history's result, ``None`` for failing commits; logs each call."""
    calls: list[str] = []

    def test(sha: str) -> dict | None:
        calls.append(sha)
        return None if sha in failing else {"m": {"acc": HISTORY[sha]}}

    return calls, test


def test_every_change_is_found_in_logarithmic_runs() -> None:
    calls, test = runner()
    assert change_points(SHAS, test) == [("d", []), ("g", [])]
    assert len(set(calls)) <= 8  # 10 commits, two changes: far fewer than a linear walk


def test_a_failed_commit_next_to_the_change_is_named_beside_it() -> None:
    """d fails: the change is at e, or in d (whose run could not tell)."""
    _, test = runner({"d"})
    assert change_points(SHAS, test) == [("e", ["d"]), ("g", [])]


def test_failures_away_from_the_change_are_not_named() -> None:
    _, test = runner({"b", "h"})
    assert change_points(SHAS, test) == [("d", []), ("g", [])]


def test_no_change_between_equal_endpoints() -> None:
    _, test = runner()
    assert change_points(list("abc"), test) == []


def test_a_failed_endpoint_stops_the_search() -> None:
    _, test = runner({"j"})
    with pytest.raises(SystemExit, match="endpoint"):
        change_points(SHAS, test)


def test_first_change_needs_only_the_reference() -> None:
    _, test = runner()
    assert first_change(SHAS[3:], {"m": {"acc": 2}}, test) == (3, [])


def test_digest_keeps_test_metrics_and_every_ood_auroc() -> None:
    results = {
        "test": {"accuracy": 0.5, "nll": 1.25, "ece": 0.125, "brier": 0.7},
        "ood": {"mnist": {"entropy_auroc": 0.75, "n": 5}, "fmnist": {"entropy_auroc": 0.5}},
    }
    assert digest(results) == {
        "test.accuracy": 0.5,
        "test.nll": 1.25,
        "test.ece": 0.125,
        "ood.fmnist.entropy_auroc": 0.5,
        "ood.mnist.entropy_auroc": 0.75,
    }
