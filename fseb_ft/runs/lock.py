"""One training at a time in a run folder: a lock file held for the whole run.

Two trainings started into one ``output.dir`` would both write its checkpoints, weights and
results. The first holds an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` while it runs; a second
is refused with the holder's process id. The operating system releases a ``flock`` when its
process ends, however it ends, so the file a killed run leaves behind holds nothing and the next
run takes it over; a finished run removes it. Only the main process of a launch locks (the others
of an ``accelerate launch`` or ``torchrun`` share its run); where ``fcntl`` does not exist
(Windows) nothing is locked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from fseb_ft.errors import FsebError
from fseb_ft.runs.rundir import LOCK_FILE, check_output_dir

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]  # no module there: run_lock checks for None

__all__ = ["RunInUseError", "run_lock"]


class RunInUseError(FsebError, RuntimeError):
    """Another training holds the run folder's lock."""


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock within (creating the folder; removed again if it stays empty).

    Raises:
        ConfigError: ``run_dir`` is, or lies inside, a file.
        RunInUseError: another process holds the lock.
    """
    check_output_dir(run_dir)
    # torchrun and accelerate launch number their processes in RANK; a plain run has none.
    if fcntl is None or os.environ.get("RANK", "0") != "0":
        yield
        return
    created = not run_dir.exists()
    path = run_dir / LOCK_FILE
    fd = _acquire(path)
    try:
        yield
    finally:
        # Unlinked before it is released: a process waiting on this file then sees that the
        # path no longer names it, and locks a new one (_acquire).
        path.unlink(missing_ok=True)
        os.close(fd)
        if created:
            with suppress(OSError):  # not empty: the run wrote something
                run_dir.rmdir()


def _acquire(path: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive lock, the holder's pid written."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder was removed by a run that ended: make it again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUseError(
                f"output.dir {path.parent} is in use by another training (process {holder} "
                f"holds {path}); wait for it to end, or give another output.dir"
            ) from None
        if _names(path, fd):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # locked a file that a finished run had just removed: try the path again


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False
