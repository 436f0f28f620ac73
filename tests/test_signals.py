"""SIGTERM (what schedulers send) stops a run with status 143 and the command that resumes it; that command
finishes whatever was left: the interrupted epoch, the end-of-fit faithfulness stage, the test, metrics.json.

Through the command line (subprocesses of train.py): a callback of the test's own sends the process SIGTERM where
the environment variable KILL_AT says, so the signal arrives at a known point: as training step N starts, or inside
the end-of-fit stage (in its integrated gradients, after explanations.json is written). The reference is the same
run, uninterrupted, in this process.
"""

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from identifiable_transformers.common.interrupts import Terminated, sigterm_stops_the_run
from identifiable_transformers.run.training import run

ROOT = Path(__file__).resolve().parents[1]

KILLER = '''
import os
import signal

import lightning.pytorch as pl


class Killer(pl.Callback):
    """SIGTERM to this process where KILL_AT says: step:N (as training step N starts) or stage (end-of-fit stage)."""

    def __init__(self):
        self.at = os.environ.get("KILL_AT", "")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.at == f"step:{trainer.global_step}":
            os.kill(os.getpid(), signal.SIGTERM)

    def on_fit_start(self, trainer, pl_module):
        if self.at != "stage":
            return
        from identifiable_transformers.diagnostics.callbacks import faithfulness

        original = faithfulness.integrated_gradients

        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return original(*args, **kwargs)

        faithfulness.integrated_gradients = killed
'''

SETTINGS = ["trainer=cpu", "logger=none", "trainer.max_epochs=2", "trainer.limit_train_batches=5",
            "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "model.embed_dim=16", "model.ffn_dim=32", "data.batch_size=16",
            "data.max_length=64", "callbacks.identifiability.probe_size=8", "callbacks.faithfulness.ig_steps=8",
            "callbacks.faithfulness.adversarial_examples=2", "callbacks.faithfulness.adversarial_steps=10"]


def _train(args: list[str], tmp_path: Path, kill_at: str = "") -> subprocess.CompletedProcess:
    """The process signals itself (os.kill of its own pid): a child of tests/cli_runner.py's zygote will do."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "", "KILL_AT": kill_at, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return run_cli([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, timeout=600, env=env)


def _resume_args(stderr: str) -> list[str]:
    """The overrides of the resume command the interrupted run printed (its last line)."""
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("Interrupted: SIGTERM received"), stderr[-2000:]
    command = shlex.split(line.split("with: ", 1)[1])
    assert command[:2] == ["python", "train.py"], line
    return command[2:]


def test_sigterm_mid_epoch_and_in_the_end_of_fit_stage_resume_to_the_uninterrupted_result(make_cfg, tmp_path,
                                                                                          cache_dir):
    (tmp_path / "killer.py").write_text(KILLER)
    folder = tmp_path / "run"
    args = [*SETTINGS, "+callbacks.killer._target_=killer.Killer", f"hydra.run.dir={folder}",
            f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path / 'logs'}"]

    # 1. SIGTERM as step 3 starts: that step ends, its state is kept in last.ckpt, exit 143, the resume command
    first = _train(args, tmp_path, kill_at="step:3")
    assert first.returncode == 143, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    resume = _resume_args(first.stderr)
    last = folder / "checkpoints" / "last.ckpt"
    assert f"ckpt_path={last}" in resume and f"hydra.run.dir={folder}" in resume
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 4  # the step that was running
    assert not (folder / "metrics.json").exists()

    # 2. the printed command resumes; this time SIGTERM comes inside the end-of-fit faithfulness stage
    second = _train(resume, tmp_path, kill_at="stage")
    assert second.returncode == 143, second.stderr[-3000:]
    assert "after training" in second.stderr.strip().splitlines()[-1]
    assert _resume_args(second.stderr) == resume
    ident = folder / "identifiability"
    explained = json.loads((ident / "explanations.json").read_text())  # written before the stage's expensive part
    assert not (ident / "faithfulness_final.json").exists() and not (folder / "metrics.json").exists()

    # 3. the same command again: nothing left to train; the stage, the test and metrics.json are finished
    third = _train(resume, tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (ident / "faithfulness_final.json").is_file()
    assert json.loads((ident / "explanations.json").read_text()) == explained  # the same weights scored again
    resumed = json.loads((folder / "metrics.json").read_text())["metrics"]

    # the reference: the same run, never interrupted
    reference = run(make_cfg(*SETTINGS, fast=False, out="straight"))["metrics"]
    compared = ("test/", "val/faith/final/", "val/acc_best", "train/loss_epoch")
    keys = [k for k in reference if k.startswith(compared) and not k.endswith("compute_s")]
    assert "test/acc" in keys and any(k.startswith("val/faith/final/integrated_gradients/") for k in keys)
    for k in keys:
        assert math.isclose(resumed[k], reference[k], rel_tol=1e-4, abs_tol=1e-5), (k, resumed[k], reference[k])


def test_sigterm_outside_lightnings_loops_raises_at_once_and_the_handler_is_put_back():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with sigterm_stops_the_run():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes of the main thread
                pass
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("from_thread", [False, True])
def test_a_process_forked_while_the_handler_is_installed_takes_sigterms_default_action(from_thread):
    """From the main thread or from another (a datasets.map pool refilling itself), the child takes SIGTERM's default
    action: the kernel's view of the child (/proc/PID/status, SigCgt: the signals it catches) must show SIGTERM
    uncaught, and SIGTERM must end the child while it waits on a lock that is never released."""
    import signal
    import threading

    ready_r, ready_w = os.pipe()

    def child_waits_forever():
        os.write(ready_w, b"1")  # past os.fork's after-fork hooks
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # never returns: only a signal's default action ends this process

    pids = []

    def fork():
        pid = os.fork()
        if pid == 0:
            child_waits_forever()
        pids.append(pid)

    with sigterm_stops_the_run():
        if from_thread:
            t = threading.Thread(target=fork)
            t.start()
            t.join()
        else:
            fork()
    (pid,) = pids
    try:
        assert os.read(ready_r, 1) == b"1"
        caught = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if line.startswith("SigCgt:")).split()[1], 16)
        assert not caught & (1 << (signal.SIGTERM - 1))  # not caught: the default action
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(ready_r)
        os.close(ready_w)


def test_a_child_forked_from_another_thread_is_its_own_main_thread_and_sets_handlers():
    """What the reset at fork relies on, from either thread: the child's one thread is its main thread, so
    ``signal.signal`` works there (no fallback is needed), and a Python handler runs there, also inside a lock wait.
    The child reports over a pipe; its exit status says which handler ended it."""
    import signal
    import threading

    report_r, report_w = os.pipe()
    pids = []

    def fork():
        pid = os.fork()
        if pid == 0:
            try:
                main = threading.current_thread() is threading.main_thread()
                signal.signal(signal.SIGTERM, lambda *_: os._exit(7))  # raises ValueError outside the main thread
                os.write(report_w, b"main" if main else b"other")
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()  # only the handler ends this wait
            finally:
                os._exit(1)
        pids.append(pid)

    t = threading.Thread(target=fork)
    t.start()
    t.join()
    (pid,) = pids
    try:
        assert os.read(report_r, 5) == b"main"
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7  # the child's own Python handler ran
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(report_r)
        os.close(report_w)


RACE = """
import os, signal, sys, threading, time
from identifiable_transformers.common.interrupts import sigterm_stops_the_run

os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one CPU: the parent runs on after each fork
pids = []


def fork_and_terminate():  # what a pool's thread and Pool.terminate do to a replacement worker
    pid = os.fork()
    if pid == 0:
        time.sleep(2)
        os._exit(3)  # survived its SIGTERM
    os.kill(pid, signal.SIGTERM)
    pids.append(pid)


with sigterm_stops_the_run():
    for _ in range(40):
        t = threading.Thread(target=fork_and_terminate)
        t.start()
        t.join()
statuses = [os.waitpid(pid, 0)[1] for pid in pids]
print(sum(not (os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGTERM) for s in statuses))
"""


def test_a_sigterm_sent_right_after_the_fork_ends_the_child():
    """SIGTERM sent to a child that has not run yet (a pool's replacement worker, terminated at once): the child's
    interpreter took it in its C handler and cleared it after the fork, and the child ran on (7 of 40 forks before
    SIGTERM was blocked around the fork; tests/test_interrupt_cache.py's remaining hang). Pinned to one CPU, the
    parent sends it before the child runs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0"], "children that survived their SIGTERM: " + proc.stdout
