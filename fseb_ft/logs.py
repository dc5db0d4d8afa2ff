"""What the commands log: fseb_ft's own lines, and the libraries' only when asked (``-v``).

Accelerate logs a line for every file of every checkpoint at INFO, timm each checkpoint it loads
and the classifier keys it leaves out, matplotlib its font cache;
people running a command want progress bars and results, so those libraries log warnings only
unless ``verbose``. Progress bars are drawn only where a person watches them (:func:`progress_bar`):
in a log file or a pipe each redraw would be one more line of noise. While a bar is drawn, log
lines and warnings go above it (:func:`above_progress_bars`), not into its line, and a warning
of fseb_ft's repeated from the same place (a ``CholeskyJitterWarning`` at every step) is logged
once, with the count of its repeats at the end.
"""

import logging
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from tqdm import tqdm as terminal_tqdm
from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as chosen_tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["QUIET_LIBRARIES", "above_progress_bars", "configure_logging", "progress_bar"]

QUIET_LIBRARIES = (
    "accelerate", "datasets", "gradio", "httpx", "huggingface_hub", "matplotlib", "optuna", "timm"
)  # fmt: skip
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


def progress_bar(
    iterable: Iterable[Any] | None = None, *, show: bool = True, **kwargs: Any
) -> tqdm:
    """A tqdm progress bar over ``iterable`` (``kwargs`` are tqdm's), drawn when ``show`` and
    someone watches: stderr is a terminal, or a notebook shows tqdm's widget. Elsewhere (a log
    file, a pipe, a scheduler's output) it is disabled; it still iterates, counts nothing."""
    return tqdm(iterable, disable=not (show and _watched()), **kwargs)


def _watched() -> bool:
    """Whether a progress bar is seen as it redraws, not written out frame by frame."""
    if chosen_tqdm is not terminal_tqdm:  # tqdm.auto chose the notebook's widget: no terminal
        return True
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def above_progress_bars() -> Iterator[None]:
    """Within, log lines and warnings are written with ``tqdm.write``: above a live bar.

    The console handlers of the root logger are tqdm's (``logging_redirect_tqdm``; one is added
    when there is none), and every warning is logged to ``py.warnings``, as
    ``logging.captureWarnings`` logs it (the commands turn that on, the Python API does not),
    fseb_ft's own once per place (:class:`_WarningLog`). Both are undone on exit.
    """
    shown = warnings.showwarning
    log = _WarningLog()
    # Not logging.captureWarnings(True): after a catch_warnings block has restored the hook, its
    # own record says "already captured" and the call does nothing.
    warnings.showwarning = log.show
    try:
        with logging_redirect_tqdm(tqdm_class=tqdm):
            yield
            log.summarise()
    finally:
        warnings.showwarning = shown


class _WarningLog:
    """``warnings.showwarning`` that logs each warning to ``py.warnings``, fseb_ft's own once
    per category and place.

    Python's default filter shows a warning once per place only while its text is the same; a
    ``CholeskyJitterWarning`` names the numbers of its step, so each step's was new. Repeats are
    counted instead, and :meth:`summarise` logs the count. A filter that asks for every
    occurrence of the category (``python -W always``) is obeyed.
    """

    def __init__(self) -> None:
        self.repeats: Counter[tuple[type[Warning], str, int]] = Counter()

    def show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        """Log the formatted warning, unless it repeats one of fseb_ft's from the same place."""
        place = (category, filename, lineno)
        own = category.__module__.split(".")[0] == "fseb_ft"
        if own and not _always_shown(message, category):
            self.repeats[place] += 1
            if self.repeats[place] > 1:
                return
        text = warnings.formatwarning(message, category, filename, lineno, line)
        logging.getLogger("py.warnings").warning("%s", text)

    def summarise(self) -> None:
        """Log how often each warning that was logged once repeated."""
        for (category, filename, lineno), count in self.repeats.items():
            if count > 1:
                logging.getLogger("py.warnings").warning(
                    "%s (%s:%d) repeated %d more times; python -W always shows each",
                    category.__name__,
                    filename,
                    lineno,
                    count - 1,
                )


def _always_shown(message: Warning | str, category: type[Warning]) -> bool:
    """Whether the first warnings filter that matches ``message`` says ``always``. Filters on a
    module or line count as matching: such a filter is what a person sets to see repeats."""
    text = str(message)
    for action, pattern, filtered, _module, _lineno in warnings.filters:
        if (pattern is None or pattern.match(text)) and issubclass(category, filtered):
            return action == "always"
    return False
