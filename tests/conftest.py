"""Fixtures every test module gets.

Nothing heavy is imported here: pytest-xdist's controller loads this file too, and runs no test;
importing torch and fseb_ft for it alone would cost every suite run 6 s of CPU before any worker
starts. The fixtures import what they use."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from torch import Tensor

    from fseb_ft.evaluation.metrics import MetricInputs


def pytest_collection_finish(session: pytest.Session) -> None:
    """Put what collection built (torch, timm, fseb_ft, the test modules: millions of objects)
    out of the garbage collector's reach: Accelerate's ``free_memory``, which every
    re-evaluation calls, runs a full ``gc.collect()`` that would otherwise walk them all, a
    quarter to a half second each time in a worker that has run a few hundred tests."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _no_figures_in_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module marked ``no_figures`` draws none in its module-scoped fixtures either (its tiny
    runs, set up before any test's own fixtures)."""
    if not request.node.get_closest_marker("no_figures"):
        yield
        return
    from tests.helpers import skip_figures

    with pytest.MonkeyPatch.context() as monkeypatch:
        skip_figures(monkeypatch)
        yield


@pytest.fixture(autouse=True)
def _no_figures(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in a test (or module) marked ``no_figures`` draw no figures: half a tiny run's time,
    spent on what tests/runs/test_plots.py and the tests of a run's figures check."""
    if request.node.get_closest_marker("no_figures"):
        from tests.helpers import skip_figures

        skip_figures(monkeypatch)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The image folders of the tiny runs (:func:`tests.helpers.tiny_recipe`): three classes of
    12 training images, a test split of 5, 4 and 4 (``N_TEST``), an OOD set of ``N_OOD`` owls;
    the same pixels in every module (seeded by folder and split names). A module whose runs need
    other images defines its own ``folders``, which takes precedence."""
    from tests.helpers import N_OOD, image_folders

    return image_folders(
        tmp_path_factory.mktemp("data"),
        {"cat": 12, "dog": 12, "fox": 12},
        {"cat": 5, "dog": 4, "fox": 4},
        owls=N_OOD,
    )


@pytest.fixture
def fake_metric() -> Iterator[str]:
    """A metric registered as a contributor would add one (for K > 2, with no batched bootstrap
    form), removed again afterwards."""
    from fseb_ft.evaluation.metrics import METRIC_REGISTRY, metric

    @metric(
        "first_class_rate",
        title="First class (%)",
        scale=100.0,
        higher_is_better=True,
        applies=lambda k: k > 2,
    )
    def first_class_rate(x: MetricInputs) -> Tensor:
        return (x.probs.argmax(-1) == 0).double().mean()

    yield "first_class_rate"
    METRIC_REGISTRY.pop("first_class_rate")
