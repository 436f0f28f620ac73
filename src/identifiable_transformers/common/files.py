"""Writing files so that a kill or a full disk never leaves a truncated file under its final name.

Every file the project writes goes through :func:`atomic_path` (or :func:`atomic_write`): the bytes go to a
hidden temporary name in the same folder (``.<name>.tmp-<pid>``), are flushed to the disk, and only then is the
file renamed to its final name (``os.replace``: atomic on one file system). A run killed while writing keeps the
previous file, or none. A full disk (``ENOSPC``, or a quota: ``EDQUOT``) removes the temporary file and becomes a
:class:`DiskFullError`: one line naming the file, the free space and the fix.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(UserError):
    """The disk (or the user's quota) is full: nothing was left half-written under a final name."""


def is_disk_full(err: BaseException) -> bool:
    """An OSError that says the disk or quota is full (pyarrow's IO errors carry no errno, only the text)."""
    if not isinstance(err, OSError):
        return False
    return err.errno in _FULL or "No space left on device" in str(err) or "Disk quota exceeded" in str(err)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def free_space(path: str | os.PathLike) -> str:
    """The free space of the file system holding ``path`` (or its nearest existing parent), e.g. ``12.0 KB``."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return _human(shutil.disk_usage(p).free)
    except OSError:  # pragma: no cover
        return "unknown"


def disk_full_error(path: str | os.PathLike, what: str = "", fix: str = "") -> DiskFullError:
    """The :class:`DiskFullError` for a write of ``path`` that failed on a full disk. ``what`` names the file's
    role (``"checkpoint"``); ``fix`` is the sentence saying where to write instead (a default names the folder)."""
    path = Path(path)
    fix = fix or "Free space there, or write to another disk."
    return DiskFullError(f"the disk is full: writing the {what + ' ' if what else ''}{path} failed "
                         f"({free_space(path.parent)} free on that disk; nothing was left half-written under "
                         f"{path.name}). {fix}")


def temp_name(path: str | os.PathLike) -> Path:
    """The hidden temporary name ``path`` is written under before the rename (same folder, so same disk)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync(path: Path) -> None:
    """Flush ``path``'s bytes to the disk: some file systems report a full disk only here (NFS, delayed
    allocation), and a rename must never publish bytes that are not there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def temporary(path: str | os.PathLike, what: str = "", fix: str = "") -> Iterator[Path]:
    """``with temporary(p) as tmp: ...``: the temporary name of ``p``, for a caller that renames it itself.

    On any exception the temporary file is removed and ``p`` is left as it was; a full disk becomes a
    :class:`DiskFullError` (see :func:`disk_full_error` for ``what`` and ``fix``)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(path, what, fix) from None
        raise


@contextmanager
def atomic_path(path: str | os.PathLike, what: str = "", fix: str = "") -> Iterator[Path]:
    """``with atomic_path(p) as tmp: <write tmp>``: ``p`` appears only once ``tmp`` is complete (flushed to the
    disk, then renamed); failures as :func:`temporary`."""
    with temporary(path, what, fix) as tmp:
        yield tmp
        fsync(tmp)
        os.replace(tmp, path)


def atomic_write(path: str | os.PathLike, data: str | bytes, what: str = "", fix: str = "") -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; returns ``path``."""
    path = Path(path)
    with atomic_path(path, what, fix) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (where a ``mkdir(parents=True)`` would start)."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable(path: Path) -> bool:
    """Whether a folder could be created or written at ``path`` by this process (a read-only mount, or
    permissions, say no; root passes permission bits, as its writes would)."""
    base = nearest_existing(path)
    return base.is_dir() and os.access(base, os.W_OK | os.X_OK)
