"""The sources' registry: the recipe's option list names exactly the registered sources, and
:func:`fseb_ft.data.sources.load_spec` dispatches on it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from fseb_ft.data.images import ArrayImages, LabeledImages
from fseb_ft.data.sources import load_spec, load_split, source
from fseb_ft.data.sources.registry import LOADERS
from fseb_ft.recipe import DatasetSpec, options, recipe_from_dict
from fseb_ft.recipe.schema import ConfigError


@pytest.fixture
def fake_source() -> Iterator[list[tuple[DatasetSpec, int, int]]]:
    """Source ``fake`` (12 images, labels 0, 1, 2 in turn), registered for one test; the calls
    it received."""
    calls: list[tuple[DatasetSpec, int, int]] = []

    @source("fake")
    def load_fake(spec: DatasetSpec, channels: int, seed: int) -> LabeledImages:
        calls.append((spec, channels, seed))
        images = np.arange(12, dtype=np.uint8).reshape(12, 1, 1).repeat(2, 1)  # (12, 2, 1)
        return ArrayImages(images, np.arange(12) % 3, None, f"fake:{spec.path}", channels)

    try:
        yield calls
    finally:
        del LOADERS["fake"]


def test_the_registry_names_the_recipes_sources_each_in_its_own_module() -> None:
    assert sorted(LOADERS) == sorted(options.SOURCES), "options.SOURCES and the registry differ"
    assert len(LOADERS) == len(options.SOURCES)
    for name, registered in LOADERS.items():
        assert registered.name == name
        assert registered.load.__module__ == f"fseb_ft.data.sources.{name}"


def test_an_unknown_source_fails_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^data.train.source='nope': allowed values are \["):
        recipe_from_dict({"data": {"train": {"source": "nope", "path": "x"}}})
    unvalidated = DatasetSpec(source="nope", path="x")  # type: ignore[arg-type]
    line = f"data.x: source='nope': allowed values are {sorted(options.SOURCES)}"
    with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
        load_split("data.x", unvalidated)
    with pytest.raises(ValueError, match=r"^source='nope'"):
        load_spec(unvalidated)


def test_load_spec_dispatches_to_a_registered_source(
    fake_source: list[tuple[DatasetSpec, int, int]],
) -> None:
    spec = DatasetSpec(source="fake", path="p", classes=(2, 0))  # type: ignore[arg-type]
    data = load_spec(spec, channels=1, seed=5)
    assert fake_source == [(spec, 1, 5)]
    # load_spec, not the loader, keeps and relabels the spec's classes.
    assert data.identity.startswith("fake:p|") and data.identity.endswith("|classes:2,0")
    assert data.labels.tolist() == [1, 0] * 4 and data.class_names == ["2", "0"]
    assert data[0][0].shape == (2, 1, 1)
    limited = load_spec(DatasetSpec(source="fake", path="p", limit=5))  # type: ignore[arg-type]
    assert len(limited) == 5 and fake_source[-1][1:] == (3, 0)


def test_a_source_registered_twice_is_refused(
    fake_source: list[tuple[DatasetSpec, int, int]],
) -> None:
    with pytest.raises(ValueError, match="source 'fake' is registered twice"):
        source("fake")(lambda spec, channels, seed: None)  # type: ignore[arg-type,return-value]
    assert "fake" in LOADERS
