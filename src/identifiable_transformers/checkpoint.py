"""``last.ckpt``: the newest training state, kept for resuming.

Lightning's ``ModelCheckpoint(save_last=True)`` refreshes ``last.ckpt`` only when it also saves a
top-k checkpoint, so with a monitored metric that did not improve, ``last.ckpt`` lags behind.
This callback rewrites it after every validation, at the end of every training epoch and every
``every_n_train_steps`` steps, atomically: a run killed while writing keeps the previous file.
Everything an exact resume needs is in it (see ``TextClassifier.on_save_checkpoint`` and
``TextDataModule.state_dict``).
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint


class LastCheckpoint(Checkpoint):  # a Checkpoint, so Lightning runs it after the other callbacks
    def __init__(self, dirpath: str | os.PathLike, every_n_train_steps: int = 0, filename: str = "last.ckpt"):
        if int(every_n_train_steps) < 0:
            raise ValueError(f"every_n_train_steps={every_n_train_steps} must be >= 0 (0: only at epoch ends)")
        self.path = Path(dirpath) / filename
        self.every_n_train_steps = int(every_n_train_steps)
        self._saved_step: int | None = None

    def _save(self, trainer: pl.Trainer) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        trainer.save_checkpoint(tmp)  # every rank takes part; rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, self.path)
        self._saved_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0:
            self._save(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._saved_step != trainer.global_step:  # no validation ran at the end of this epoch
            self._save(trainer)
