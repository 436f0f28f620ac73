"""W&B for this project: Lightning's ``WandbLogger`` with per-epoch metrics on an ``epoch`` axis, media
logged on their epoch's step, and what a run adds at its end (``metrics.json``, best values).
See docs/training.md, "W&B"."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

__all__ = ["EPOCH_METRICS", "WandbLogger", "define_epoch_metrics", "log_epoch_media", "log_run_end", "logged_step",
           "wandb_loggers"]

# Per-epoch keys and their summary. Keys logged every step (train/loss_step, lr-*) keep Lightning's
# trainer/global_step axis. The val/* glob also covers val/ident/*, val/faith/* and their tables.
EPOCH_METRICS: dict[str, str | None] = {
    "val/acc": "max",
    "val/acc_best": "max",
    "val/f1": "max",
    "val/loss": "min",
    "train/acc": "max",
    "train/f1": "max",
    "train/loss_epoch": "min",
    "val/*": None,
}


def define_epoch_metrics(run) -> None:
    """Put per-epoch metrics on the ``epoch`` axis with max/min summaries.

    W&B uses the first glob defined that matches a key, so this must run before Lightning's catch-all
    ``*`` -> ``trainer/global_step`` (``WandbLogger.experiment`` below does that).
    """
    run.define_metric("epoch")
    for key, summary in EPOCH_METRICS.items():
        run.define_metric(key, step_metric="epoch", step_sync=True, **({"summary": summary} if summary else {}))


class WandbLogger(_LightningWandbLogger):
    """Lightning's ``WandbLogger`` whose new runs define the epoch axis (``define_epoch_metrics``).

    Lightning's ``experiment`` defines ``*`` -> ``trainer/global_step`` right after ``wandb.init``;
    a glob defined later would lose to it, so a fresh run is started here with ours first.

    Lightning passes ``anonymous=None`` to ``wandb.init`` whatever it is given; W&B has dropped the setting
    and prints "The anonymous setting has no effect" for any value, so it is not passed on.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self):
        import wandb

        fresh = self._experiment is None and wandb.run is None and getattr(self, "_attach_id", None) is None
        if fresh and not self._wandb_init.get("sync_tensorboard"):  # (tensorboard sync: Lightning's own axes)
            if self._offline:
                os.environ["WANDB_MODE"] = "dryrun"  # as Lightning does
            run = wandb.init(**self._wandb_init)
            define_epoch_metrics(run)
            run.define_metric("trainer/global_step")
            run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
            self._experiment = run
        return super().experiment


def wandb_loggers(trainer) -> list[_LightningWandbLogger]:
    return [lg for lg in getattr(trainer, "loggers", []) if isinstance(lg, _LightningWandbLogger)]


def logged_step(trainer) -> int:
    """The ``trainer/global_step`` Lightning logs the current epoch's metrics with (during validation
    it is one behind ``trainer.global_step``: the step counter moves after the validation run)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def log_epoch_media(trainer, data: dict[str, Any], epoch: int, step: int, same_row: bool) -> None:
    """Log images or tables of epoch ``epoch`` with the ``epoch`` and ``trainer/global_step`` values
    Lightning gives that epoch's scalars.

    ``same_row``: the data is logged before Lightning logs the epoch's scalars (a callback's
    ``on_validation_epoch_end``): W&B holds it (``commit=False``) and writes it in the same history
    row. Otherwise (figures finished later in a thread) it gets a row of its own.
    """
    for logger in wandb_loggers(trainer):
        logger.experiment.log({**data, "epoch": epoch, "trainer/global_step": step}, commit=not same_row)


def log_run_end(loggers: list, output_dir: Path, result: dict[str, Any]) -> None:
    """Put ``metrics.json``, the resolved config and the best values into every W&B run."""
    best = {k: result.get(k) for k in ("best_val_acc", "best_epoch", "best_model_path", "epochs_run", "runtime_s")}
    for run in (lg.experiment for lg in loggers if isinstance(lg, _LightningWandbLogger)):
        run.summary.update({k: v for k, v in best.items() if v is not None})
        for name in ("metrics.json", "config_resolved.yaml"):
            if (output_dir / name).is_file():
                run.save(str(output_dir / name), base_path=str(output_dir), policy="now")
