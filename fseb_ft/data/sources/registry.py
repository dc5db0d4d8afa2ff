"""The sources by name: ``@source("imagefolder")`` registers the loader a recipe's
``DatasetSpec.source`` names.

A loader maps ``(spec, channels, seed)`` to :class:`~fseb_ft.data.images.LabeledImages`: the
source's images, before :func:`fseb_ft.data.sources.load_spec` applies the spec's ``classes``,
``fraction`` and ``limit``. Each module of :mod:`fseb_ft.data.sources` registers one; the
recipe's option list (:data:`fseb_ft.recipe.options.SOURCES`) must name the same sources, which
a test checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fseb_ft.data.images import LabeledImages
from fseb_ft.recipe import DatasetSpec

__all__ = ["DEFAULT_HINT", "LOADERS", "Loader", "Source", "find_source", "source"]

Loader = Callable[[DatasetSpec, int, int], LabeledImages]
"""``(spec, channels, seed) -> LabeledImages``: one split of a source, as the spec names it."""


DEFAULT_HINT = "Check data.train's split, label column and classes."
"""A source's :attr:`Source.hint` unless it registers its own."""


@dataclass(frozen=True)
class Source:
    """A registered source: its name, its loader, whether the loader applies ``classes``, and
    the hint of its one-class error."""

    name: str
    load: Loader
    selects_classes: bool = False
    """True when the loader itself keeps and relabels ``spec.classes`` (``sklearn_digits``
    does, to name its identity after them); otherwise :func:`load_spec` selects them."""
    hint: str = DEFAULT_HINT
    """What to check when this source's training images are of fewer than two classes."""


LOADERS: dict[str, Source] = {}
"""Every registered source by name, in the order their modules were imported."""


def source(
    name: str, *, selects_classes: bool = False, hint: str = DEFAULT_HINT
) -> Callable[[Loader], Loader]:
    """Register the decorated loader as source ``name``, with its :attr:`Source.hint`; a name
    registered twice is refused."""

    def register(load: Loader) -> Loader:
        if name in LOADERS:
            raise ValueError(f"source {name!r} is registered twice ({LOADERS[name].load})")
        LOADERS[name] = Source(name, load, selects_classes, hint)
        return load

    return register


def find_source(name: str) -> Source:
    """The registered source ``name``; an unknown one fails as the recipe's validation does."""
    if name not in LOADERS:
        raise ValueError(f"source={name!r}: allowed values are {sorted(LOADERS)}")
    return LOADERS[name]
