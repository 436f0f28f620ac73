"""Ctrl-C or SIGTERM while the tokenized cache is built with worker processes (datasets' multiprocess map): one line,
exit status 130 or 143, no worker tracebacks, and nothing left in the cache.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, parent and workers: the test does the
same (the run in a session of its own). A module of the test's own, named as a callback's _target_ (so the config
check imports it before the data is prepared), slows the tokenization down and marks when the workers are in it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SLOW = '''
import os
import time
from pathlib import Path

import lightning.pytorch as pl

from identifiable_transformers.data import build

def _slow(encode):
    def slow(*args, **kwargs):
        Path(os.environ["MARK_DIR"], f"worker-{os.getpid()}").touch()
        time.sleep(30)  # the test's signal ends the build long before: however busy the machine, it meets the workers
        return encode(*args, **kwargs)

    return slow


build.encode_ids = _slow(build.encode_ids)
build.encode_with_rationales = _slow(build.encode_with_rationales)  # the synthetic tasks carry rationales


class Slow(pl.Callback):
    pass
'''


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None when it is gone or a zombie. With the
    start time a process is told from a later one that got its pid (a busy machine reuses pids quickly)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between two reads
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


@pytest.mark.parametrize("signum, to, status, says", [
    (signal.SIGINT, "group", 130, "Interrupted: Ctrl-C while building the tokenized data of 'synthetic_presence'"),
    (signal.SIGTERM, "group", 143, "Interrupted: SIGTERM while building the tokenized data of 'synthetic_presence'"),
    (signal.SIGTERM, "parent", 143, "Interrupted: SIGTERM while building the tokenized data of 'synthetic_presence'"),
])
def test_a_signal_during_a_multiprocess_cache_build_is_one_line_its_status_and_no_cache(tmp_path, signum, to, status,
                                                                                      says):
    """Ctrl-C reaches the whole process group (the terminal); SIGTERM the group (SLURM) or the parent (kill PID)."""
    (tmp_path / "slowtok.py").write_text(SLOW)
    marks, cache = tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    env = {**os.environ, "HYDRA_FULL_ERROR": "", "MARK_DIR": str(marks), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "data=synthetic_presence", "data.synthetic.size=8000",
         "+data.num_proc=2", "trainer=cpu", "logger=none", "+callbacks.slow._target_=slowtok.Slow",
         f"paths.cache_dir={cache}", f"hydra.run.dir={tmp_path / 'run'}", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(list(marks.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until both workers tokenize
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        workers = {int(p.name.split("-")[1]) for p in marks.iterdir()}
        assert os.getpid() not in workers and proc.pid not in workers and len(workers) == 2
        started = {pid: _started(pid) for pid in workers}  # each sleeps 30 s in its first batch: alive now
        if to == "group":
            os.killpg(proc.pid, signum)  # Ctrl-C in the terminal; SIGTERM from SLURM
        else:
            os.kill(proc.pid, signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == status, stderr[-3000:]
    assert "Traceback" not in stderr and "TimeoutError" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(says), stderr[-3000:]
    assert [line for line in lines if line.startswith(("Interrupted", "Error"))] == lines[-1:]
    assert [p for p in cache.rglob("*") if p.is_file() and p.name != "prepare_data.lock"] == []  # no partial cache
    deadline = time.monotonic() + 30  # the workers are gone too (the pool ends them as the parent leaves)
    while any(_started(pid) == started[pid] for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(started[pid] is not None and _started(pid) != started[pid] for pid in workers)
