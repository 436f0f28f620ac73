"""One run per folder at a time: the run folder is locked before anything is written there.

Two processes racing for one folder: exactly one gets it, the other is refused naming the holder. A lock left by
a process that died (SIGKILL) is no obstacle. Through train.py: a run into a folder another process holds ends with
one Error line and status 1 before Hydra writes its log or .hydra/ there.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from identifiable_transformers.run.checks import claim_folder
from identifiable_transformers.run.lock import LOCK_NAME, FolderInUseError, holds_lock, launched_rank, unlock_run_folder

ROOT = Path(__file__).resolve().parents[1]

# Waits for the "go" file, claims the folder, reports, then holds it until the "stop" file appears.
CLAIM = """
import sys, time
from pathlib import Path
from identifiable_transformers.run.checks import claim_folder
folder, go, stop = map(Path, sys.argv[1:4])
while not go.exists():
    time.sleep(0.005)
try:
    claim_folder(folder, resuming=False)
except Exception as e:
    print("refused:", e, flush=True)
    sys.exit(0)
print("got", flush=True)
while not stop.exists():
    time.sleep(0.01)
"""


def _claimer(folder: Path, go: Path, stop: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", CLAIM, str(folder), str(go), str(stop)], stdout=subprocess.PIPE,
                            text=True, env=env)


def _wait_for(proc: subprocess.Popen, folder: Path) -> None:
    """Until ``proc`` holds the lock (its pid is in the lock file)."""
    deadline = time.monotonic() + 300  # importing the package takes seconds on a busy machine
    while time.monotonic() < deadline and proc.poll() is None:
        lock = folder / LOCK_NAME
        if lock.is_file() and f"pid {proc.pid} " in lock.read_text():
            return
        time.sleep(0.01)
    raise AssertionError("the holder never took the lock")


def test_two_processes_racing_for_one_folder_one_gets_it(tmp_path):
    folder, go, stop = tmp_path / "run", tmp_path / "go", tmp_path / "stop"
    procs = [_claimer(folder, go, stop) for _ in range(2)]
    time.sleep(1.0)  # both started and waiting (imports done or nearly): then they race
    go.touch()
    try:
        first = [p.stdout.readline().strip() for p in procs]
    finally:
        stop.touch()
        for p in procs:
            p.wait(timeout=60)
    assert sorted(line.split(":")[0].split()[0] for line in first) == ["got", "refused"], first
    refused = next(line for line in first if line.startswith("refused"))
    winner = procs[[line == "got" for line in first].index(True)]
    assert f"in use by another run (pid {winner.pid} on " in refused and "Pass another hydra.run.dir=DIR" in refused


def test_a_lock_left_by_a_killed_run_is_no_obstacle_and_a_resume_may_use_its_folder(tmp_path):
    folder, go, stop = tmp_path / "run", tmp_path / "go", tmp_path / "stop"
    go.touch()
    holder = _claimer(folder, go, stop)
    _wait_for(holder, folder)
    with pytest.raises(FolderInUseError, match=f"pid {holder.pid} "):
        claim_folder(folder, resuming=True)  # held: refused even for a resume
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (folder / LOCK_NAME).read_text().startswith(f"pid {holder.pid} ")  # the dead run's file is still there
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"state")  # what the killed run left
    try:
        with pytest.raises(Exception, match="already holds a run"):
            claim_folder(folder, resuming=False)  # a fresh run would overwrite it
        assert not holds_lock(folder)  # and the refused claim let the lock go
        assert claim_folder(folder, resuming=True) is True  # its resume gets the folder
        assert holds_lock(folder) and (folder / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} ")
        assert claim_folder(folder, resuming=True) is False  # this process asking again (Hydra's callback, then run)
    finally:
        unlock_run_folder(folder)
    assert not holds_lock(folder)


def test_train_py_into_a_folder_in_use_is_refused_before_anything_is_written(tmp_path, cache_dir):
    folder, go, stop = tmp_path / "run", tmp_path / "go", tmp_path / "stop"
    go.touch()
    holder = _claimer(folder, go, stop)
    try:
        _wait_for(holder, folder)
        proc = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), "trainer=cpu", "logger=none", f"hydra.run.dir={folder}",
             f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path / 'logs'}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    finally:
        stop.touch()
        holder.wait(timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the run folder") and f"pid {holder.pid} " in lines[0]
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # no train.log, no .hydra/


def test_other_ranks_of_a_run_share_rank_0s_folder(tmp_path, monkeypatch):
    folder, go, stop = tmp_path / "run", tmp_path / "go", tmp_path / "stop"
    go.touch()
    holder = _claimer(folder, go, stop)  # rank 0
    try:
        _wait_for(holder, folder)
        monkeypatch.setenv("LOCAL_RANK", "1")  # what Lightning sets for the DDP process it launches
        assert claim_folder(folder, resuming=False) is False and not holds_lock(folder)
        monkeypatch.setenv("LOCAL_RANK", "0")
        with pytest.raises(FolderInUseError):
            claim_folder(folder, resuming=False)
    finally:
        stop.touch()
        holder.wait(timeout=60)


def test_a_multi_node_runs_global_rank_decides_not_its_local_rank(tmp_path, monkeypatch):
    # node 1 of a 2-node run, 8 processes per node: its first process has global rank 8 and local rank 0
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "8")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launched_rank() == 8
    assert claim_folder(tmp_path / "run", resuming=False) is False and not holds_lock(tmp_path / "run")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "3")  # not what Lightning sets, but RANK is the one that counts
    assert launched_rank() == 0
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launched_rank() == 0  # Lightning's order: LOCAL_RANK before SLURM_PROCID


def test_a_longer_stale_line_in_the_lock_file_is_replaced_whole(tmp_path):
    folder, go, stop = tmp_path / "run", tmp_path / "go", tmp_path / "stop"
    folder.mkdir()
    stale = f"pid 999999999 on {'a-very-long-host-name-of-a-node-long-gone' * 3}\n"
    (folder / LOCK_NAME).write_text(stale)  # left by a dead run on another machine
    go.touch()
    holder = _claimer(folder, go, stop)
    try:
        _wait_for(holder, folder)
        assert (folder / LOCK_NAME).read_text() == f"pid {holder.pid} on {socket.gethostname()}\n"
        with pytest.raises(FolderInUseError) as err:
            claim_folder(folder, resuming=False)
        assert f"in use by another run (pid {holder.pid} on {socket.gethostname()}):" in str(err.value)
        assert "\n" not in str(err.value) and "long-gone" not in str(err.value)
    finally:
        stop.touch()
        holder.wait(timeout=60)
