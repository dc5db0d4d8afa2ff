"""What the commands log: fseb_ft's own lines, and the libraries' only when asked (``-v``).

Accelerate logs a line for every file of every checkpoint at INFO, timm each checkpoint it loads
and the classifier keys it leaves out, matplotlib its font cache;
people running a command want progress bars and results, so those libraries log warnings only
unless ``verbose``. While a progress bar is drawn, log lines and warnings go above it
(:func:`above_progress_bars`), not into its line.
"""

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["QUIET_LIBRARIES", "above_progress_bars", "configure_logging"]

QUIET_LIBRARIES = ("accelerate", "datasets", "huggingface_hub", "matplotlib", "optuna", "timm")
"""Libraries whose INFO lines are hidden unless ``verbose``."""


def configure_logging(verbose: bool = False) -> None:
    """INFO lines of fseb_ft on stderr, the libraries' only when ``verbose``; warnings logged."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    # huggingface_hub gives its logger a stderr handler of its own when imported: beside the root
    # handler, each of its lines (a warning per retry of a request) printed twice.
    import huggingface_hub.utils.logging  # noqa: F401  (adds that handler now, not later)

    logging.getLogger("huggingface_hub").handlers.clear()
    # Regulariser warnings (Cholesky jitter) go to the log like everything else.
    logging.captureWarnings(True)


@contextmanager
def above_progress_bars() -> Iterator[None]:
    """Within, log lines and warnings are written with ``tqdm.write``: above a live bar.

    The console handlers of the root logger are tqdm's (``logging_redirect_tqdm``; one is added
    when there is none), and every warning is logged to ``py.warnings``, as
    ``logging.captureWarnings`` logs it (the commands turn that on, the Python API does not).
    Both are undone on exit.
    """
    shown = warnings.showwarning
    # Not logging.captureWarnings(True): after a catch_warnings block has restored the hook, its
    # own record says "already captured" and the call does nothing.
    warnings.showwarning = _log_warning
    try:
        with logging_redirect_tqdm(tqdm_class=tqdm):
            yield
    finally:
        warnings.showwarning = shown


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` that logs the formatted warning to ``py.warnings``."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    logging.getLogger("py.warnings").warning("%s", text)
