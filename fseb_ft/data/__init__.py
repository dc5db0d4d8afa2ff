"""The data layer: images from every source as uint8 arrays, their splits, screening, transforms
and corruptions. Imports only :mod:`fseb_ft.recipe` (and ``errors``, ``logs``)."""
