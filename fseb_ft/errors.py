"""The errors a user can cause and fix, as one family: the ``fseb-ft`` command prints their
message in one line instead of a traceback (``--debug`` or ``FSEB_FT_DEBUG=1`` shows it).

Each concrete error also derives from the builtin it refines (``ValueError`` for a bad recipe,
``OSError`` for a full disk, ``RuntimeError`` for a diverged run), so callers of the Python API
can catch either.
"""

__all__ = ["FsebError"]


class FsebError(Exception):
    """Base of fseb_ft's user-facing errors: the message says what happened and what to do."""
