"""The method layer: the FS-EB and FS-VI maths, the objective, its predictor, the timm models and
the context points. Imports only :mod:`fseb_ft.data` and :mod:`fseb_ft.recipe` (and ``errors``,
``logs``)."""
