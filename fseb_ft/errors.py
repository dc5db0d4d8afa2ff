"""The errors a user can cause and fix, as one family: the ``fseb-ft`` command prints their
message in one line instead of a traceback (``--debug`` or ``FSEB_FT_DEBUG=1`` shows it).

Each concrete error also derives from the builtin it refines (``ValueError`` for a bad recipe,
``OSError`` for a full disk, ``RuntimeError`` for a diverged run), so callers of the Python API
can catch either.
"""

__all__ = ["FsebError", "first_line"]


class FsebError(Exception):
    """Base of fseb_ft's user-facing errors: the message says what happened and what to do."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
