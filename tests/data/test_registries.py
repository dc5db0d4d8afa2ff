"""The data registries: the recipe's option lists name exactly the registered sources and
augmentations, and :func:`fseb_ft.data.sources.load_spec` and
:func:`fseb_ft.data.transforms.train_transform` dispatch on them."""

from __future__ import annotations

import re
from collections.abc import Iterator

import albumentations as A
import numpy as np
import pytest

import fseb_ft.engine.run_checks as run_checks
from fseb_ft.data.images import ArrayImages, LabeledImages
from fseb_ft.data.sources import load_spec, load_split, source
from fseb_ft.data.sources.registry import LOADERS
from fseb_ft.data.splits import TooFewClassesError
from fseb_ft.data.transforms import AUGMENTATIONS, augmentation, train_transform
from fseb_ft.recipe import DatasetSpec, options, recipe_from_dict
from fseb_ft.recipe.schema import ConfigError

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


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


def test_a_sources_hint_ends_the_error_of_training_images_of_one_class(
    fake_source: list[tuple[DatasetSpec, int, int]],
) -> None:
    @source("one_class", hint="Look at the fake folder.")
    def load_one_class(spec: DatasetSpec, channels: int, seed: int) -> LabeledImages:
        images = np.zeros((4, 2, 1), dtype=np.uint8)
        return ArrayImages(images, np.zeros(4, dtype=int), ["cat"], "one", channels)

    one_class = DatasetSpec(source="one_class", path="p")  # type: ignore[arg-type]
    fake_ones = DatasetSpec(source="fake", path="p", classes=(1,))  # type: ignore[arg-type]
    try:
        for spec, hint in [
            (one_class, "Look at the fake folder."),
            (fake_ones, "Check data.train's split, label column and classes."),  # the default
        ]:
            with pytest.raises(TooFewClassesError, match=f"has 1 class .*classes. {hint}$"):
                run_checks.require_training_classes(spec, load_spec(spec))
    finally:
        del LOADERS["one_class"]
    assert LOADERS["imagefolder"].hint.startswith("Point data.train.path at the folder whose")


def test_the_augmentations_are_the_recipes_in_its_order() -> None:
    # The order too: "augment must be one of [...]" lists the registry.
    assert tuple(AUGMENTATIONS) == options.AUGMENTATIONS


def test_train_transform_builds_a_registered_augmentation() -> None:
    @augmentation("upside_down")
    def upside_down(height: int, width: int) -> list[A.BasicTransform]:
        return [A.Resize(height, width), A.VerticalFlip(p=1.0)]

    try:
        image = np.arange(12, dtype=np.uint8).reshape(4, 3, 1).repeat(3, 2)  # (4, 3, 3)
        transform = train_transform((4, 3), (0.0,) * 3, (1 / 255,) * 3, "upside_down", seed=0)
        out = transform(image=image)["image"]  # (3, 4, 3): pixel values, as std is 1/255
        assert out[0].round().int().tolist() == image[::-1, :, 0].tolist()
        with pytest.raises(ValueError, match="augmentation 'upside_down' is registered twice"):
            augmentation("upside_down")(upside_down)
    finally:
        del AUGMENTATIONS["upside_down"]
    with pytest.raises(ValueError, match=r"augment must be one of \['none', 'flip', 'crop_flip', "):
        train_transform((4, 3), (0.0,) * 3, (1 / 255,) * 3, "upside_down")
