"""The behaviour fingerprint (benchmarks/fingerprint.py): today's code gives the committed
``benchmarks/fingerprint.json``, and a change is reported by part, value and size."""

from __future__ import annotations

import copy

import pytest

from benchmarks import fingerprint


def test_code_gives_the_committed_fingerprint() -> None:
    if not fingerprint.exact_here():
        pytest.skip("OpenCV runs no AVX2 code here: the context's hue jitter rounds differently")
    committed = fingerprint.read_committed()
    assert committed is not None, (
        "no benchmarks/fingerprint.json: python -m benchmarks.fingerprint --write"
    )
    _, changes = fingerprint.resolve(fingerprint.compute(), committed)
    assert not changes, fingerprint.report(changes, committed)


def test_a_change_is_named_by_part_and_value_and_the_rest_keep_their_hash() -> None:
    committed = fingerprint.read_committed()
    found = copy.deepcopy({name: part["values"] for name, part in committed["parts"].items()})
    found["pixels"]["csv"]["timm"] = "0" * 16
    norm = found["training"]["fseb"]["trained"]["norm"]
    found["training"]["fseb"]["trained"]["norm"] = norm * (1 + 1e-6)
    found["metrics"]["ood"]["entropy_auroc"] += 1e-13  # within the tolerance: unchanged
    document, changes = fingerprint.resolve(found, committed)
    assert sorted(changes) == ["pixels", "training"]
    message = fingerprint.report(changes, committed)
    assert "pixels.csv.timm: " in message
    assert "training.fseb.trained.norm: " in message
    assert "relative difference 1.0e-06 > tolerance 1e-09" in message
    for name, part in document["parts"].items():
        same = part["hash"] == committed["parts"][name]["hash"]
        assert same == (name not in changes), name
    assert document["parts"]["metrics"]["values"] == committed["parts"]["metrics"]["values"]


def test_missing_and_new_values_are_named() -> None:
    old = {"a": [1.0, 2.0], "b": 1}
    new = {"a": [1.0], "c": 1}
    assert fingerprint.differences("p", old, new, 1e-9) == [
        "p.b: no longer computed",
        "p.c: new",
        "p.a: 2 values -> 1",
    ]
