"""Writes that either complete or leave nothing behind, and fail with one clear line.

Every writer here writes to a temporary path beside its target and renames it into place, so a
reader (or the next run) sees the old complete file or the new one. A full disk surfaces from
each library differently — ``torch.save`` as a ``RuntimeError`` from ``inline_container.cc``
(``unexpected pos``, ``file write failed``), safetensors as ``No space left on device (os
error 28)``, Python as ``OSError(ENOSPC)`` — and :func:`cleaned_on_failure` turns all of them
into one :class:`DiskFullError` naming the directory, after removing the partial output. A write
the OS refuses (a read-only folder) is an ``OSError`` with its errno whichever library wrote
(:func:`is_not_writable`), so a caller whose write is optional, such as a cache, can go on.

A killed process cannot clean up; :func:`remove_orphans` removes what it left at the start of
the next run.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fseb_ft.errors import FsebError

__all__ = [
    "ORPHAN_PATTERNS",
    "DiskFullError",
    "cleaned_on_failure",
    "default_file_mode",
    "is_disk_full",
    "is_not_writable",
    "publish",
    "remove",
    "remove_orphans",
    "write_bytes",
    "write_text",
]

ORPHAN_PATTERNS = (".tmp*", "*.tmp", ".model-export-*")
"""Temporary names of interrupted writes: checkpoint ``.tmp-epoch-*`` folders, safetensors'
``.tmpXXXXXX`` files, ``*.tmp`` files and model-export folders."""
_ORPHAN_DIRS = (".", "model", "checkpoints")
"""Folders of a run directory (relative to it) that writers put temporary paths in."""
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")
"""What torch's ``inline_container.cc`` says when the OS accepted fewer bytes than written."""
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
"""Why the OS refuses a write to a folder: its permissions, or a read-only file system."""


class DiskFullError(FsebError, OSError):
    """A write ran out of space; its partial output was removed, earlier files are intact."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a write that ran out of space."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in text or "os error 28" in text:
            return True
        if "inline_container.cc" in text and any(s in text for s in _TORCH_WRITE_FAILED):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_not_writable(err: BaseException) -> bool:
    """Whether ``err`` is a write the OS refused: permission denied or a read-only file system."""
    return _refused_errno(err) is not None


def _refused_errno(err: BaseException) -> int | None:
    """The errno of a write the OS refused in ``err`` or the exceptions it was raised from, also
    where a library reports it only as text (safetensors: ``Permission denied (os error 13)``)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _NOT_WRITABLE:
            return current.errno
        text = str(current)
        for code in _NOT_WRITABLE:
            if f"(os error {code})" in text:
                return code
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def cleaned_on_failure(*temps: Path, what: str, hint: str = "") -> Iterator[None]:
    """Remove ``temps`` (files or folders) if the block fails; a full disk becomes one error.

    Args:
        temps: the temporary paths the block writes.
        what: what was being written, for the message (e.g. "checkpoint epoch-0003").
        hint: what the user can do next, appended to the message.

    Raises:
        DiskFullError: the block ran out of space (whatever the writer raised).
        OSError: the OS refused the write (``EACCES``, ``EPERM``, ``EROFS``; a
            :class:`PermissionError` for the first two), naming the folder, whatever the writer
            raised: safetensors raises its own error.
    """
    try:
        yield
    except BaseException as err:
        for temp in temps:
            remove(temp)
        if isinstance(err, Exception) and is_disk_full(err):
            where = _existing_parent(temps[0]) if temps else Path.cwd()
            free = shutil.disk_usage(where).free
            raise DiskFullError(
                f"no space left on device in {where}: could not write {what} "
                f"({_size(free)} free there after removing the partial files). "
                f"Free some space{'; ' + hint if hint else ''}."
            ) from err
        code = _refused_errno(err) if isinstance(err, Exception) else None
        if code is not None and not isinstance(err, OSError):
            where = _existing_parent(temps[0]) if temps else Path.cwd()
            raise OSError(code, os.strerror(code), str(where)) from err
        raise


def publish(temp: Path, final: Path) -> None:
    """Give ``temp`` (a file, or a folder's files) ordinary permissions and rename it to ``final``.

    Some writers create private files (safetensors writes mode 0600 through a temporary file);
    the published files get ``0666 & ~umask`` like any other file the run writes.
    """
    mode = default_file_mode()
    files = [temp] if temp.is_file() else [p for p in temp.rglob("*") if p.is_file()]
    for path in files:
        os.chmod(path, mode)
    os.replace(temp, final)


def temp_beside(path: Path) -> Path:
    """A temporary name beside ``path`` (``.NAME.<random>.tmp``) that no other writer uses: the
    workers of a sweep, threads of one process among them, write the same files at once."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def write_text(path: Path, text: str, what: str | None = None) -> None:
    """Write ``text`` to ``path`` atomically (a :func:`temp_beside` file, then rename)."""
    temp = temp_beside(path)
    with cleaned_on_failure(temp, what=what or str(path.name)):
        temp.write_text(text, encoding="utf-8")
    publish(temp, path)


def write_bytes(path: Path, data: bytes, what: str | None = None) -> None:
    """Write ``data`` to ``path`` atomically (a :func:`temp_beside` file, then rename)."""
    temp = temp_beside(path)
    with cleaned_on_failure(temp, what=what or str(path.name)):
        temp.write_bytes(data)
    publish(temp, path)


def remove_orphans(run_dir: Path) -> list[Path]:
    """Remove the temporary files and folders a killed run left in ``run_dir``; return them."""
    found = {
        path
        for sub in _ORPHAN_DIRS
        if (run_dir / sub).is_dir()
        for pattern in ORPHAN_PATTERNS
        for path in (run_dir / sub).glob(pattern)
    }
    for path in found:
        remove(path)
    return sorted(found)


def default_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666 & ~umask``."""
    # The umask can only be read by setting it; set a restrictive one for the instant.
    umask = os.umask(0o077)
    os.umask(umask)
    return 0o666 & ~umask


def remove(path: Path) -> None:
    """Delete a file or a folder tree; a missing one is fine, a symlink is not followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _existing_parent(path: Path) -> Path:
    path = path.absolute().parent
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:.3g} TB"
