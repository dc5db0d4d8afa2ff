"""Keep freed memory inside the training process on glibc CPU runs, and only there.

glibc serves each large tensor (over its mmap threshold, 128 KiB at first) with a fresh
``mmap`` and returns it with ``munmap`` when freed, so a CPU training step page-faults and
zeroes every activation buffer again. FS-EB's joint forward holds ``(B + M) / B`` times the
activations of PS-MAP, so it pays this disproportionately: measured on the FashionMNIST CNN
(``python -m benchmarks.overhead --models cnn``), FS-EB/PS-MAP went from 2.26 to 1.92 at M = B.
Raising the thresholds keeps freed blocks in the heap for reuse; the price is that the
process's resident memory stays at its peak (one training step's activations).

Forked children (DataLoader workers, which fork after the heap has grown: the validation
loader's at the end of epoch 1, the context loader's every epoch) would inherit the settings and
that heap, mostly free pages shared copy-on-write. Each time the parent (or a child) then reused
one of those pages it was copied, so every generation of workers ended up holding its own copy
of the parent's peak, until the kernel's OOM killer stopped the run (docs/performance.md,
"Memory"). So every child forked after :func:`keep_freed_memory` restores glibc's default
thresholds and calls ``malloc_trim(0)``, which drops the child's view of the inherited free pages
(the parent keeps its own); a child then holds only what it uses itself.

Limits: glibc on Linux only (a no-op on macOS, Windows and musl); the child hook runs for forks
made through Python (``os.fork``, ``multiprocessing``'s default ``fork`` context, which the
DataLoader uses), not for forks from C code; and the training process itself still keeps its
peak until it exits (``FSEB_FT_NO_MALLOPT=1`` opts out; see docs/performance.md, "Memory").
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

__all__ = ["DISABLE_ENV", "keep_freed_memory"]

DISABLE_ENV = "FSEB_FT_NO_MALLOPT"
"""Set this environment variable (to anything) to leave the C allocator alone."""

# glibc's mallopt parameters (malloc.h) and their defaults (mallopt(3)): 128 KiB each.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 1 << 28))
_DEFAULTS = tuple((param, 128 * 1024) for param, _ in _SETTINGS)
_applied = False
_libc: ctypes.CDLL | None = None

logger = logging.getLogger("fseb_ft")


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory for reuse; True if it applied (Linux with glibc only).

    Process-wide and idempotent; children forked afterwards get glibc's defaults back (see the
    module docstring). A no-op elsewhere (macOS, Windows, musl) and when the
    ``FSEB_FT_NO_MALLOPT`` environment variable is set.
    """
    global _applied, _libc
    if _applied:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(DISABLE_ENV):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    except (OSError, AttributeError):
        return False
    if _libc is None:  # once per process: children inherit the registration
        os.register_at_fork(after_in_child=_release_in_child)
    _libc = libc
    _applied = all(libc.mallopt(param, value) == 1 for param, value in _SETTINGS)
    if _applied:
        logger.debug("glibc keeps freed memory for reuse (set %s=1 to disable)", DISABLE_ENV)
    return _applied


def _release_in_child() -> None:
    """In a forked child: glibc's default thresholds, and the inherited free pages dropped."""
    global _applied
    if _applied and _libc is not None:
        for param, value in _DEFAULTS:
            _libc.mallopt(param, value)
        _libc.malloc_trim(0)
        _applied = False
