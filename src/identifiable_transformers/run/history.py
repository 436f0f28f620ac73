"""The per-epoch metrics of a run, as ``metrics_history.csv`` beside ``metrics.json``: a learning curve without W&B.

One row per training epoch: ``epoch``, ``step`` (the global step at its end), then every scalar metric the
run logs per epoch (``train/*``, ``val/*``, including ``val/acc_best`` and the diagnostics' ``val/ident/*`` and
``val/faith/*``), and the epoch's wall-clock seconds: ``time/train_s`` (the epoch less its validation) and
``time/val_s`` (validation with every per-epoch diagnostic; each diagnostic also logs its own ``*compute_s``).
Validation metrics are taken when that epoch's validation ends, so an epoch without validation has empty ``val/*``
cells instead of the previous epoch's values. The rows travel in the checkpoint, so a run resumed into a new folder
writes the whole history, and the file is rewritten (atomically) after every epoch, so a killed run keeps the epochs
it finished.
"""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from ..common.files import atomic_write

FILENAME = "metrics_history.csv"
TIME_PREFIX = "time/"  # the epoch's seconds: columns of the history, not metrics


def scalar_metrics(metrics: dict) -> dict[str, float]:
    """The scalar entries of Lightning's ``callback_metrics`` as floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) or getattr(v, "numel", lambda: 0)() == 1}


class MetricsHistory(pl.Callback):
    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / FILENAME
        self.rows: list[dict[str, Any]] = []
        self._val: dict[str, Any] | None = None  # this epoch's validation metrics, until the epoch ends
        self._epoch_start: float | None = None  # perf_counter at this process's start of the epoch
        self._val_start: float | None = None

    @property
    def state_key(self) -> str:
        return "MetricsHistory"

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "val": self._val}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stage = stage  # called before Lightning restores a checkpoint's callback states

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Only a resumed fit continues the history: trainer.test(ckpt_path=<best>) restores callback states
        # too, and would roll the history back to the best epoch's.
        if getattr(self, "_stage", "fit") == "fit":
            self.rows, self._val = list(state.get("rows") or []), state.get("val")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        val = {k: v for k, v in scalar_metrics(trainer.callback_metrics).items() if k.startswith("val/")}
        self._val = {"epoch": trainer.current_epoch, **val}
        if self._val_start is not None:
            self._val[f"{TIME_PREFIX}val_s"] = round(time.perf_counter() - self._val_start, 3)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        epoch = trainer.current_epoch
        train = {k: v for k, v in scalar_metrics(trainer.callback_metrics).items() if not k.startswith("val/")}
        last_val = self._val or {}
        val = {k: v for k, v in last_val.items() if k != "epoch"} if last_val.get("epoch") == epoch else {}
        if self._epoch_start is not None:  # blank for an epoch this process resumed after its start
            seconds = time.perf_counter() - self._epoch_start
            train[f"{TIME_PREFIX}train_s"] = round(seconds - val.get(f"{TIME_PREFIX}val_s", 0.0), 3)
            self._epoch_start = None
        self.rows = [r for r in self.rows if r["epoch"] != epoch]  # an epoch replayed after a resume: its newest row
        self.rows.append({"epoch": epoch, "step": trainer.global_step, **train, **val})
        self._val = None
        if trainer.is_global_zero:
            self.write()

    def final_metrics(self) -> dict[str, float]:
        """The last epoch's metrics (what ``callback_metrics`` holds at the end of a run that trained it); the
        epoch's seconds (``time/*``) are timings, not metrics: metrics.json holds the run's in ``timings``."""
        return {k: v for k, v in (self.rows[-1] if self.rows else {}).items()
                if k not in ("epoch", "step") and not k.startswith(TIME_PREFIX)}

    def write(self) -> Path:
        columns = ["epoch", "step", *sorted({k for row in self.rows for k in row} - {"epoch", "step"})]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.rows)
        return atomic_write(self.path, text.getvalue(), "learning curve", "Free space on that disk, or write the run "
                            "to another one (hydra.run.dir=DIR).")
