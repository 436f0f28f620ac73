"""Atomic writes (common/files.py): the bytes reach the disk (fsync) under the temporary name before the rename
publishes them, so a file system that reports a full disk only at fsync (NFS, delayed allocation) leaves the old
file whole; a full disk is recognised by its message too, since pyarrow's write errors carry no errno."""

import errno
import json
import os
from pathlib import Path

import pytest

from identifiable_transformers.common.files import DiskFullError, atomic_write, is_disk_full
from identifiable_transformers.run.training import run

# What pyarrow raises when a write meets a full disk: an OSError whose errno is None.
PYARROW_FULL = "Error writing bytes to file. Detail: [errno 28] No space left on device"


def _fd_path(fd: int) -> Path:
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_the_bytes_are_flushed_under_the_temporary_name_before_the_rename(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    atomic_write(target, "old")
    seen = []
    real = os.fsync

    def fsync(fd):
        path = _fd_path(fd)
        seen.append((path.name, path.read_text(), target.read_text()))  # what is flushed, what the name still holds
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write(target, "new")
    assert seen == [(f".metrics.json.tmp-{os.getpid()}", "new", "old")]
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_file_system_that_reports_the_full_disk_at_fsync_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    atomic_write(target, '{"old": 1}')

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DiskFullError, match=r"^the disk is full: writing the metrics .*metrics.json failed"):
        atomic_write(target, json.dumps({"new": 2}), "metrics")
    assert json.loads(target.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temporary left


def test_a_full_disk_without_an_errno_is_a_full_disk(tmp_path, monkeypatch):
    assert is_disk_full(OSError(PYARROW_FULL)) and is_disk_full(OSError("Disk quota exceeded"))
    assert is_disk_full(OSError(errno.ENOSPC, "")) and is_disk_full(OSError(errno.EDQUOT, ""))
    assert not is_disk_full(OSError(errno.EACCES, os.strerror(errno.EACCES))) and not is_disk_full(ValueError(
        "No space left on device"))

    target = tmp_path / "metrics.json"
    atomic_write(target, "old")

    def write_bytes(self, data):
        raise OSError(PYARROW_FULL)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    with pytest.raises(DiskFullError):
        atomic_write(target, "new")
    assert target.read_text() == "old"


def test_pyarrow_meeting_a_full_disk_while_the_cache_is_built_is_one_error(make_cfg, tmp_path, monkeypatch):
    import datasets

    def save(self, path, *args, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"x" * 100)
        raise OSError(PYARROW_FULL)

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", save)
    cfg = make_cfg("data=synthetic_presence", "data.synthetic.size=200")
    cfg.paths.cache_dir = str(tmp_path / "fresh-cache")
    with pytest.raises(DiskFullError, match="building the tokenized data of 'synthetic_presence'"):
        run(cfg)
    assert [p.name for p in (tmp_path / "fresh-cache").rglob("*") if p.is_file() and p.name != "prepare_data.lock"
            ] == []
