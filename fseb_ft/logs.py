"""What the commands log: fseb_ft's own lines, and the libraries' only when asked (``-v``).

Accelerate logs a line for every file of every checkpoint at INFO, timm each checkpoint it loads
and the classifier keys it leaves out, matplotlib its font cache;
people running a command want progress bars and results, so those libraries log warnings only
unless ``verbose``.
"""

import logging

__all__ = ["QUIET_LIBRARIES", "configure_logging"]

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
