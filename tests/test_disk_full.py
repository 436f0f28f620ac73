"""A full disk ends a run with one Error line naming the file, the free space and the fix, and never leaves a
truncated file under a final name (checkpoints, their .sha256, metrics.json, the learning curve, the cache).

Simulated: the write fails with ENOSPC after half of its bytes (what a full disk does). Real: train.py on a 1 MB
tmpfs (mounted in a private user namespace; skipped where that is not allowed).
"""

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest

from identifiable_transformers.common.files import DiskFullError, atomic_write
from identifiable_transformers.run.training import run

ROOT = Path(__file__).resolve().parents[1]


def _full(path, data: bytes):
    """Write half of ``data`` to ``path``, then fail as a full disk does."""
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    atomic_write(target, '{"old": 1}')
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: _full(self, data))
    with pytest.raises(DiskFullError) as err:
        atomic_write(target, json.dumps({"new": list(range(1000))}), "metrics")
    message = str(err.value)
    assert message.startswith(f"the disk is full: writing the metrics {target} failed (")
    assert " free on that disk" in message and "\n" not in message
    assert json.loads(target.read_text()) == {"old": 1}  # the previous file, whole
    assert _files(tmp_path) == ["metrics.json"]  # the half-written temporary is gone


def test_a_full_disk_at_the_first_checkpoint_is_one_error_and_leaves_no_truncated_checkpoint(make_cfg, tmp_path,
                                                                                             monkeypatch):
    real = pl.Trainer.save_checkpoint

    def save(trainer, filepath, *args, **kwargs):
        real(trainer, filepath, *args, **kwargs)
        _full(filepath, Path(filepath).read_bytes())

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", save)
    with pytest.raises(DiskFullError) as err:
        run(make_cfg("callbacks.identifiability.plots=false"))
    message = str(err.value)
    folder = tmp_path / "run"
    assert f"writing the checkpoint {folder / 'checkpoints'}" in message and "hydra.run.dir=DIR" in message
    assert "No checkpoint exists to resume from yet" in message  # it was the first one
    assert not [f for f in _files(folder) if "ckpt" in f], _files(folder)  # no checkpoint, no checksum, no temporary
    assert not (folder / "metrics.json").exists()


class _FullStream:
    """A log file on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass


def test_a_full_disk_later_names_the_checkpoint_to_resume_from(make_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(logging, "raiseExceptions", True)  # Python's default, restored after the test
    real_write = atomic_write

    def write(path, data, *args, **kwargs):  # metrics.json, written last, meets the full disk
        if Path(path).name != "metrics.json":
            return real_write(path, data, *args, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(Path, "write_bytes", lambda self, d: _full(self, d))
            return real_write(path, data, *args, **kwargs)

    import identifiable_transformers.run.training as training

    monkeypatch.setattr(training, "atomic_write", write)
    with pytest.raises(DiskFullError) as err:
        run(make_cfg("callbacks.identifiability.plots=false", "callbacks.faithfulness=null"))
    folder = tmp_path / "run"
    last = folder / "checkpoints" / "last.ckpt"
    assert f"writing the metrics {folder / 'metrics.json'} failed" in str(err.value)
    assert f"ckpt_path={last}" in str(err.value) and f"hydra.run.dir={folder}" in str(err.value)
    assert last.is_file() and not (folder / "metrics.json").exists()
    assert not [f for f in _files(folder) if ".tmp-" in f]
    # The job's log file is on the full disk too: its later lines fail without a "--- Logging error ---" traceback.
    capsys.readouterr()
    handler = logging.StreamHandler(_FullStream())
    logger = logging.getLogger("identifiable_transformers.test_disk_full")
    logger.addHandler(handler)
    try:
        logger.warning("a line the full disk cannot take")
    finally:
        logger.removeHandler(handler)
    assert "Logging error" not in capsys.readouterr().err


def test_a_full_disk_while_the_cache_is_built_is_one_error_and_leaves_no_cache(make_cfg, tmp_path, monkeypatch):
    import datasets

    def save(self, path, *args, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        _full(Path(path) / "data-00000-of-00001.arrow", b"x" * 1000)

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", save)
    cache = tmp_path / "fresh-cache"
    cfg = make_cfg("data=synthetic_presence", "data.synthetic.size=200")
    cfg.paths.cache_dir = str(cache)
    with pytest.raises(DiskFullError) as err:
        run(cfg)
    message = str(err.value)
    assert "building the tokenized data of 'synthetic_presence'" in message and "paths.cache_dir=DIR" in message
    assert [p.name for p in cache.rglob("*") if p.is_file() and p.name != "prepare_data.lock"] == []


def _can_mount_tmpfs(tmp_path: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                          capture_output=True)
    probe.rmdir()
    return done.returncode == 0


def test_train_py_on_a_full_tmpfs(tmp_path, cache_dir):
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private namespace here (unshare -rm)")
    folder, listing = tmp_path / "disk", tmp_path / "listing.txt"
    folder.mkdir()
    args = ["trainer=cpu", "logger=none", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false",
            "model.embed_dim=16", "model.ffn_dim=32", "data.batch_size=16", "data.max_length=64",
            "callbacks.identifiability.plots=false", "callbacks.faithfulness=null",
            f"hydra.run.dir={folder / 'run'}", f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path / 'logs'}"]
    # 1 MB: the config, log and tokenizer fit; the first checkpoint (about 2 MB with its tokenizer) does not
    script = (f"mount -t tmpfs -o size=1m tmpfs {folder} && {sys.executable} {ROOT / 'train.py'} "
              + " ".join(args) + f"; rc=$?; find {folder} -type f -printf '%P %s\\n' > {listing}; exit $rc")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith("Error: the disk is full: writing the checkpoint ") and "free on that disk" in errors[0]
    files = dict(line.rsplit(" ", 1) for line in listing.read_text().splitlines())
    assert "run/tokenizer.json" in files  # the run got that far
    assert not [f for f in files if f.endswith((".ckpt", ".sha256")) or ".tmp-" in f], files
