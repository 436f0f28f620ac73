"""One run per folder at a time: an exclusive lock on the run folder, taken before anything is written there.

The lock is ``fcntl.flock`` on ``<folder>/.run.lock``. The kernel holds it for the process and drops it when the
process ends, however it ends (exit, SIGKILL, a crash): a lock file left by a dead run is no obstacle, and no pid
has to be guessed stale. The file holds the owner's pid and host, for the message a second run gets. A second
process that wants the folder while the first runs is refused with a :class:`~.cli.UserError`; the same process
asking again (Hydra's callback, then ``training.run``) gets its lock back.

Only global rank 0 locks (see :func:`launched_rank`). ``flock`` works on local disks and on NFSv4 (Linux
emulates it with a byte-range lock there).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from ..common.errors import UserError

LOCK_NAME = ".run.lock"
_held: dict[str, int] = {}  # real path of the folder -> the open file descriptor that holds its lock


class FolderInUseError(UserError):
    """Another process holds the run folder's lock."""


def _key(folder: str | os.PathLike) -> str:
    return os.path.realpath(os.path.expanduser(str(folder)))


def launched_rank() -> int:
    """This process's global rank as its launcher set it (Lightning's order of variables); 0 when none is set. Only
    rank 0 locks: the other ranks of a multi-process run share its folder."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key, "").strip().isdigit():
            return int(os.environ[key])
    return 0


def holds_lock(folder: str | os.PathLike) -> bool:
    """Whether this process holds ``folder``'s lock."""
    return _key(folder) in _held


def lock_run_folder(folder: str | os.PathLike, key: str = "hydra.run.dir") -> bool:
    """Create ``folder`` and take its lock; True if taken now, False if this process held it already.

    A :class:`FolderInUseError` naming the other process when another one holds it (``key`` is the setting
    that names the folder, for the message)."""
    folder = Path(os.path.expanduser(str(folder)))
    k = _key(folder)
    if k in _held or launched_rank() != 0:
        return False  # held already; or another rank of the same run (Lightning's DDP children, SLURM tasks)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise UserError(f"the run folder {folder} holds a folder named {LOCK_NAME} where the run's lock file belongs: "
                        f"remove it (rmdir {folder / LOCK_NAME}), or pass another {key}=DIR.") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = ""
        for _ in range(20):  # the holder writes its pid just after taking the lock: give it a moment
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip()
            if owner:
                break
            time.sleep(0.05)
        owner = owner or "another process"
        os.close(fd)
        raise FolderInUseError(f"the run folder {folder} is in use by another run ({owner}): two runs in one folder "
                               f"would overwrite each other's checkpoints and metrics. Pass another {key}=DIR, or "
                               "wait until that run ends.") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _held[k] = fd
    return True


def unlock_run_folder(folder: str | os.PathLike) -> None:
    """Release ``folder``'s lock if this process holds it (the lock file stays: deleting it would race)."""
    fd = _held.pop(_key(folder), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor drops the flock
