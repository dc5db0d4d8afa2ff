"""A Hugging Face Space of a model's demo page (``fseb-ft demo RUN --write-app FOLDER``): the
model folder copied to ``FOLDER/model``, an ``app.py`` that serves
:mod:`fseb_ft.prediction.demo_page` on it, the ``requirements.txt`` the Space installs and a
``README.md`` whose front matter (``sdk: gradio``, ``app_file: app.py``) makes the folder a Space.

A Space has the model folder, not the run: no validation split to choose a threshold, calibrate
the conformal sets or the OOD flag on. So the model must keep its threshold (``fseb-ft predict
RUN --coverage 0.9 --keep``), and the Space's page shows the top classes and the decision at that
threshold, without the set and the flag.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from fseb_ft.errors import FsebError
from fseb_ft.prediction.loading import load_model
from fseb_ft.prediction.page_decisions import keeps_rule
from fseb_ft.runs.atomic import cleaned_on_failure, publish, remove, temp_beside, write_text
from fseb_ft.runs.export import is_exported
from fseb_ft.runs.rundir import MODEL_DIR

__all__ = ["SPACE_MODEL", "write_space"]

SPACE_MODEL = "model"
"""The model folder's name inside the Space."""

_APP = '''"""The demo page of the fseb_ft model in ./{model} as a Hugging Face Space.

Written by `fseb-ft demo --write-app`; `python app.py` serves it locally too.
"""

from pathlib import Path

from fseb_ft.prediction.demo_page import build_page, reliability_of
from fseb_ft.prediction.page_decisions import PagePredictor, PageSettings

MODEL = Path(__file__).parent / "{model}"
page = build_page(PagePredictor(MODEL, PageSettings()), reliability_of(MODEL), {title!r})

if __name__ == "__main__":
    page.launch()
'''

_REQUIREMENTS = """\
# What the Space installs. fseb_ft is not on PyPI: point the first line where it installs from,
# e.g. fseb_ft[demo] @ git+https://github.com/OWNER/REPO@COMMIT (or a wheel committed here).
fseb_ft[demo]=={version}
{gradio}
"""

_README = """\
---
title: {title}
sdk: gradio
{sdk_version}app_file: app.py
pinned: false
---

The demo page of an fseb_ft model (`{model}/`, its model card there): drop an image to see the
temperature-scaled top classes and whether the model abstains at the threshold it keeps.
Written by `fseb-ft demo RUN --write-app`.
"""


def write_space(model: str | Path, folder: Path) -> Path:
    """Write the Space of ``model`` (a run, or a model folder) into the new ``folder``.

    Raises:
        FsebError: ``folder`` exists and is not empty; ``model`` is a Hub name, a run not
            exported, or keeps no threshold.
    """
    source = _model_folder(model)
    loaded = load_model(source)
    if not keeps_rule(loaded):
        raise FsebError(
            f"--write-app: {loaded.where} keeps no abstention threshold, and a Space has no "
            "validation split to choose one on: keep one first (fseb-ft predict RUN IMAGES "
            "--coverage 0.9 --keep)"
        )
    if folder.exists() and any(folder.iterdir()):
        raise FsebError(f"--write-app {folder} is not empty: give a new folder")
    named = source.resolve().parent if source.name == MODEL_DIR else source.resolve()
    title = f"fseb_ft demo: {named.name}"
    temp = temp_beside(folder)
    with cleaned_on_failure(temp, what=f"the Space {folder}"):
        shutil.copytree(source, temp / SPACE_MODEL)
        write_text(temp / "app.py", _APP.format(model=SPACE_MODEL, title=title))
        write_text(temp / "requirements.txt", _requirements())
        write_text(temp / "README.md", _readme(title))
        if folder.exists():
            remove(folder)  # empty
        publish(temp, folder)
    return folder


def _model_folder(model: str | Path) -> Path:
    """The model folder of ``model``: a run's exported ``model/``, or ``model`` itself."""
    if str(model).startswith("hf-hub:"):
        raise FsebError(
            f"--write-app copies a model folder, and {model} is on the Hub: give the run or a "
            "downloaded model folder"
        )
    path = Path(model)
    if (path / "config.json").is_file():
        return path
    if is_exported(path):
        return path / MODEL_DIR
    raise FsebError(
        f"--write-app copies the run's model folder, and {path} has none: give a finished run "
        "(its model/) or a model folder"
    )


def _gradio_version() -> str | None:
    """The installed Gradio's version, the one the Space then runs; ``None``: not installed."""
    try:
        return importlib.metadata.version("gradio")
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirements() -> str:
    from fseb_ft import __version__  # the package's version: no training stack loaded

    gradio = _gradio_version()
    pin = f"gradio=={gradio}" if gradio else "gradio"
    return _REQUIREMENTS.format(version=__version__, gradio=pin)


def _readme(title: str) -> str:
    gradio = _gradio_version()
    return _README.format(
        title=title, model=SPACE_MODEL, sdk_version=f"sdk_version: {gradio}\n" if gradio else ""
    )
