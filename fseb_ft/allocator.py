"""Keep freed memory inside the process on glibc CPU runs.

glibc serves each large tensor (over its mmap threshold, 128 KiB at first) with a fresh
``mmap`` and returns it with ``munmap`` when freed, so a CPU training step page-faults and
zeroes every activation buffer again. FS-EB's joint forward holds ``(B + M) / B`` times the
activations of PS-MAP, so it pays this disproportionately: measured on the FashionMNIST CNN
(``python -m benchmarks.overhead --models cnn``), FS-EB/PS-MAP went from 2.26 to 1.92 at M = B.
Raising the thresholds keeps freed blocks in the heap for reuse; the price is that the
process's resident memory stays at its peak.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

__all__ = ["DISABLE_ENV", "keep_freed_memory"]

DISABLE_ENV = "FSEB_FT_NO_MALLOPT"
"""Set this environment variable (to anything) to leave the C allocator alone."""

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 1 << 28))
_applied = False

logger = logging.getLogger("fseb_ft")


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory for reuse; True if it applied (Linux with glibc only).

    Process-wide and idempotent. A no-op elsewhere (macOS, Windows, musl) and when the
    ``FSEB_FT_NO_MALLOPT`` environment variable is set.
    """
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(DISABLE_ENV):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in _SETTINGS)
    if _applied:
        logger.info("glibc keeps freed memory for reuse (set %s=1 to disable)", DISABLE_ENV)
    return _applied
