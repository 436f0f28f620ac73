"""SIGTERM (what SLURM and most schedulers send) and Ctrl-C: a run stops with exit status 128 + signal and one
line saying what was kept and how to resume.

Inside ``trainer.fit``/``trainer.test`` Lightning's own SIGTERM handler only sets a flag; its loops stop after
the current batch by raising ``SIGTERMException`` (a ``SystemExit`` with status 0: a killed run looked finished).
``LastCheckpoint`` saves the training state at that batch first. Outside Lightning's loops (building the data,
the end-of-fit diagnostics that run after Lightning has put its handler back, the test metrics) nothing would
stop the run cleanly: the handler installed here raises :class:`Terminated` there at once. Lightning calls it
too while its own handler is in place (it keeps the handler it found); it then only records the signal.
Child processes forked while it is installed (data loader workers, ``datasets.map`` workers) end as SIGTERM
would end them without it.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

_owner: int | None = None  # the pid that installed the handler
_received: list[int] = []


class Terminated(BaseException):
    """SIGTERM, raised where Lightning does not handle it (a BaseException: no ``except Exception`` hides it)."""


def _on_sigterm(signum: int, frame) -> None:
    if os.getpid() != _owner:  # a forked worker inherited the handler: die as SIGTERM kills by default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return  # called by Lightning's handler: its loops stop after the current batch (SIGTERMException)
    raise Terminated(signum)


_forking = threading.local()  # the forking thread's signal mask while SIGTERM is blocked around its fork


def _block_sigterm_for_the_fork() -> None:
    """Before a fork while the handler is installed: SIGTERM blocked in the forking thread, so that one sent to the
    child before its after-fork hook has run waits in the kernel instead of being lost (see
    :func:`_child_takes_the_default`). In the parent a SIGTERM meanwhile waits at most for the fork."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _unblock_after_the_fork() -> None:
    mask, _forking.mask = getattr(_forking, "mask", None), None
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _child_takes_the_default() -> None:
    """In a process just forked while the handler is installed: SIGTERM's default action again, then SIGTERM
    unblocked, so that SIGTERM ends the child in the kernel whatever it is doing, one sent before this point too.

    The inherited handler alone loses such a signal. A child that has not yet run when SIGTERM reaches it (under load
    it waits for a CPU) takes it in the interpreter's C handler, which only notes it, and the interpreter's own
    after-fork step then clears that note: the child runs on. A ``datasets.map`` pool does exactly this when the
    group's SIGTERM kills its workers: the pool's thread forks a replacement, the parent's ``Pool.terminate`` sends
    it SIGTERM at once, and then, holding the task queue's lock, joins it; the replacement that survived waits for
    that lock for ever (tests/test_interrupt_cache.py, 3 of 6 runs under load without the reset; 1 of 30 with the
    reset alone; gdb and py-spy showed this child, SIGTERM uncaught and none pending). Blocked around the fork
    (:func:`_block_sigterm_for_the_fork`), the signal waits in the kernel and ends the child here. The child's one
    thread is its main thread even when it was forked from another, so ``signal.signal`` works here
    (tests/test_signals.py)."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _unblock_after_the_fork()


if hasattr(os, "register_at_fork"):  # POSIX: where processes fork
    os.register_at_fork(before=_block_sigterm_for_the_fork, after_in_parent=_unblock_after_the_fork,
                        after_in_child=_child_takes_the_default)


def received_sigterm() -> bool:
    """Whether SIGTERM arrived while :func:`sigterm_stops_the_run` was active (also when Lightning handled it)."""
    return bool(_received)


@contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    """Make SIGTERM stop the run: :class:`Terminated` outside Lightning's loops, a record of it inside them."""
    global _owner
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return
    previous, previous_owner = signal.getsignal(signal.SIGTERM), _owner
    _owner = os.getpid()
    _received.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _owner = previous_owner


class CtrlC:
    """Whether Ctrl-C was pressed inside :func:`workers_leave_ctrl_c_to_the_parent`."""

    pressed = False


@contextmanager
def workers_leave_ctrl_c_to_the_parent() -> Iterator[CtrlC]:
    """Ctrl-C reaches every process of the terminal's process group: ``datasets.map`` workers would each print a
    traceback, and the parent, waiting for them in a ``finally``, replace its KeyboardInterrupt by a multiprocess
    TimeoutError. Inside this block, processes forked from this one ignore SIGINT (the pool ends them when the
    parent leaves it), and the parent's KeyboardInterrupt is noted in the yielded :class:`CtrlC`, so that what the
    pool raises instead can be told from a real failure."""
    state = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    parent = os.getpid()
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        if os.getpid() != parent or previous == signal.SIG_IGN:
            return  # a worker: the parent ends the pool
        state.pressed = True
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def where_it_stopped(trainer) -> str:
    """Where a run stopped, for the message (``trainer``: None before it was built)."""
    if trainer is None:
        return " before training started"
    if trainer.state.fn == "test":
        return f" while testing (training finished at step {trainer.global_step})"
    if trainer.fit_loop.done:
        return f" after training (finished at step {trainer.global_step}), before the end-of-fit diagnostics were done"
    return f" at epoch {trainer.current_epoch}, step {trainer.global_step}"


def last_checkpoint_path(cfg: DictConfig, output_dir: Path) -> Path | None:
    """Where this run keeps ``last.ckpt`` (``callbacks.last_checkpoint``); None when that callback is off."""
    node = OmegaConf.select(cfg, "callbacks.last_checkpoint")
    if not node or "_target_" not in node:
        return None
    return Path(str(node.get("dirpath") or output_dir / "checkpoints")).expanduser() / str(node.get("filename",
                                                                                                    "last.ckpt"))


def resume_command(ckpt: Path, output_dir: Path) -> str:
    """The command that resumes this run from ``ckpt`` into its own folder: the same overrides (Hydra's), then
    ``ckpt_path`` and ``hydra.run.dir``."""
    overrides = ["<the same overrides>"]
    if HydraConfig.initialized():
        overrides = [shlex.quote(o) for o in HydraConfig.get().overrides.task
                     if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    return " ".join(["python train.py", *overrides, shlex.quote(f"ckpt_path={ckpt.resolve()}"),
                     shlex.quote(f"hydra.run.dir={output_dir.resolve()}")])


def how_to_resume(cfg: DictConfig, output_dir: Path) -> str:
    """One sentence: the command that finishes this run (training, the end-of-fit diagnostics, the test and
    metrics.json, whatever was left), or why there is nothing to resume from."""
    last = last_checkpoint_path(cfg, output_dir)
    given = cfg.get("ckpt_path")
    if last is not None and last.is_file():
        return f"Resume it, into the same folder, with: {resume_command(last, output_dir)}"
    if given and Path(str(given)).expanduser().is_file():  # a resume stopped before it saved a state of its own
        command = resume_command(Path(str(given)).expanduser(), output_dir)
        return f"It saved no state of its own yet; resume again with: {command}"
    if last is None:
        return "No checkpoint exists to resume from (callbacks.last_checkpoint is off): run the command again."
    return (f"No checkpoint exists to resume from yet ({last} is written after each validation, each epoch and every "
            "callbacks.last_checkpoint.every_n_train_steps steps): run the command again.")
