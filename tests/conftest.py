"""Fixtures every test module gets."""

from __future__ import annotations

import pytest

from tests.helpers import skip_figures


@pytest.fixture(autouse=True)
def _no_figures(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in a test (or module) marked ``no_figures`` draw no figures: half a tiny run's time,
    spent on what tests/test_plots.py and test_pipeline.py check."""
    if request.node.get_closest_marker("no_figures"):
        skip_figures(monkeypatch)
