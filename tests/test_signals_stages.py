"""A signal at every stage of a run ends it with 128 + signal and never with a metrics.json: SIGTERM as a training
step starts, during the last validation (at its last batch, where Lightning's loop does not stop), in
``on_train_end`` (Lightning's handler notes the signal and its loops have nothing left to stop), in the end-of-fit
stage (after Lightning has put its handler back), during the test; Ctrl-C inside ``fit`` (Lightning turns it into
``sys.exit(1)``) ends with 130, not SIGTERM's 143.

In this process, on a tiny run without the diagnostics callbacks: a callback of the test's own sends the signal at
the chosen hook, so it arrives at a known point (the handler runs at the next bytecode, inside that hook).
"""

import os
import signal

import lightning.pytorch as pl
import pytest
import torch

from identifiable_transformers.common.errors import Interrupted
from identifiable_transformers.run import training

CALLBACKS = "callbacks=[model_checkpoint,last_checkpoint]"  # no diagnostics: fast


class Killer(pl.Callback):
    """Send ``signum`` to this process once, at ``hook`` (when ``when(trainer, batch_idx)`` holds)."""

    def __init__(self, hook: str, signum: int = signal.SIGTERM, when=lambda trainer, batch_idx: True):
        self.signum, self.when, self.sent = signum, when, False
        setattr(self, hook, self._fire)

    def _fire(self, trainer, *args):
        batch_idx = args[-1] if args and isinstance(args[-1], int) else None
        if self.sent or getattr(trainer, "sanity_checking", False) or not self.when(trainer, batch_idx):
            return
        self.sent = True
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # what Python's default SIGINT handler raises
        os.kill(os.getpid(), self.signum)


def _killed(cfg, killer: Killer, monkeypatch) -> Interrupted:
    instantiate = training._instantiate_dict
    sigint = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(training, "_instantiate_dict", lambda node: [*instantiate(node), killer])
    try:
        with pytest.raises(Interrupted) as err:
            training.run(cfg)
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores SIGINT after a Ctrl-C
    assert killer.sent
    return err.value


LAST_EPOCH = 1  # trainer.max_epochs=2

STAGES = {  # name: (hook, when, what the message says about where it stopped)
    "mid_epoch": ("on_train_batch_start", lambda t, i: t.global_step == 1, "at epoch 0, step 2"),  # that step ends
    "last_validation_first_batch": ("on_validation_batch_start",
                                    lambda t, i: t.current_epoch == LAST_EPOCH and i == 0, "at epoch 1"),
    "last_validation_last_batch": ("on_validation_batch_start",
                                   lambda t, i: t.current_epoch == LAST_EPOCH and i == 1, "after training"),
    "on_train_end": ("on_train_end", lambda t, i: True, "after training"),
    "end_of_fit_stage": ("on_fit_end", lambda t, i: True, "after training"),
    "test": ("on_test_batch_start", lambda t, i: True, "while testing"),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_sigterm_at_every_stage_ends_with_143_and_no_metrics(make_cfg, tmp_path, monkeypatch, stage):
    hook, when, where = STAGES[stage]
    cfg = make_cfg(CALLBACKS, "trainer.max_epochs=2", "trainer.limit_train_batches=3")
    err = _killed(cfg, Killer(hook, when=when), monkeypatch)
    assert (err.code, err.signum) == (143, signal.SIGTERM)
    assert str(err).startswith("SIGTERM received") and where in str(err), str(err)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert f"ckpt_path={last}" in str(err) and last.is_file()
    if stage == "mid_epoch":  # the step that was running when the signal came is kept
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2
    assert not (tmp_path / "run" / "metrics.json").exists()  # a killed run never looks finished


def test_ctrl_c_inside_fit_ends_with_130(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg(CALLBACKS)
    err = _killed(cfg, Killer("on_train_batch_start", signal.SIGINT, lambda t, i: t.global_step == 2), monkeypatch)
    assert (err.code, err.signum) == (130, signal.SIGINT)
    assert str(err).startswith("Ctrl-C at epoch 0, step 2"), str(err)
    assert not (tmp_path / "run" / "metrics.json").exists()
