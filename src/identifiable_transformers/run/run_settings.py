"""The settings outside the model and the data that change training: recorded in every checkpoint, checked on resume.

The model's and the data's settings travel in the checkpoint's hyper-parameters (:mod:`.checks` compares them).
The others that decide what training computes are the seed, the trainer's optimisation settings (gradient
accumulation and clipping, precision, the epoch's length) and the callbacks that decide when training stops and
which checkpoint is the best. A resume with another value would be recorded (``metrics.json``,
``config_resolved.yaml``) as if it held from the start, or silently lose to the restored state (EarlyStopping's
patience is restored from the checkpoint): it is refused, naming each key (old -> new). Only the length of training
(``trainer.max_epochs``, ``trainer.max_steps``) may change, to extend or shorten a run: the new value applies from the
resumed step, and ``metrics.json`` records it under ``resume_changes`` (each resume's step and ``{key: [old, new]}``).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
from omegaconf import DictConfig, OmegaConf

from ..common.errors import UserError
from .checks import _override, _plain

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "run_settings"
# trainer settings that change what a training step computes, or which batches an epoch holds
TRAINER_KEYS = ("accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "precision",
                "limit_train_batches", "overfit_batches", "min_epochs", "min_steps", "max_epochs", "max_steps")
# the length of training: a resume may change it (more epochs); the change is recorded at the resumed step
EXTENDABLE = ("trainer.max_epochs", "trainer.max_steps")
# settings of the callbacks that stop training (EarlyStopping) or choose the best checkpoint (ModelCheckpoint)
CALLBACK_KEYS = ("monitor", "mode", "patience", "min_delta", "stopping_threshold", "divergence_threshold",
                 "check_finite")
_DECIDING_CALLBACKS = ("EarlyStopping", "ModelCheckpoint", "BestCheckpoint")


def training_settings(cfg: DictConfig) -> dict[str, Any]:
    """``{"seed": 42, "trainer.gradient_clip_val": 1.0, "callbacks.early_stopping.patience": 3, ...}``."""
    out: dict[str, Any] = {"seed": cfg.get("seed")}
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True) if cfg.get("trainer") else {}
    out.update({f"trainer.{k}": _plain(trainer[k]) for k in TRAINER_KEYS if k in trainer})
    callbacks = OmegaConf.to_container(cfg.callbacks, resolve=True) if cfg.get("callbacks") else {}
    for name, node in sorted(callbacks.items()):
        if isinstance(node, dict) and str(node.get("_target_", "")).endswith(_DECIDING_CALLBACKS):
            out.update({f"callbacks.{name}.{k}": _plain(node[k]) for k in CALLBACK_KEYS if k in node})
    return out


class RunSettingsRecord(pl.Callback):
    """Writes this run's :func:`training_settings` and the changes of earlier resumes into every checkpoint."""

    def __init__(self, settings: dict[str, Any], changes: list[dict[str, Any]]):
        self.settings, self.changes = settings, changes

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {"settings": self.settings, "changes": self.changes,
                                      "world_size": trainer.world_size}


def recorded_world_size(ckpt: dict[str, Any]) -> int | None:
    """The number of processes the checkpoint's run trained on; None for checkpoints written before it was recorded."""
    saved = (ckpt.get(CHECKPOINT_KEY) or {}).get("world_size")
    return None if saved is None else int(saved)


def check_resume_world_size(saved: int | None, trainer: pl.Trainer, path: str) -> None:
    """Refuse to resume training on another number of processes (``trainer.devices`` x ``trainer.num_nodes``) than
    ``saved`` (:func:`recorded_world_size`): each step's global batch and the rows each rank reads would change
    midway, while the run's records say it trained on one setting throughout. None is not checked."""
    if saved is None or saved == trainer.world_size:
        return
    raise UserError(f"ckpt_path {path!r} was trained on {saved} process(es) (trainer.devices x trainer.num_nodes); "
                    f"this run has {trainer.world_size}: every step's global batch and the rows each process reads "
                    "would change midway. Resume on the same number of processes (set trainer.devices and "
                    "trainer.num_nodes to give that), or start a new run without ckpt_path.")


def check_resume_run_settings(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """Refuse a resume (training) that changes a :func:`training_settings` value other than the length of training
    (a :class:`UserError` naming each key, old -> new, and the original values to pass). Returns the record of
    changes to keep: the checkpoint's, plus this resume's step and changed lengths (logged as a warning)."""
    saved = ckpt.get(CHECKPOINT_KEY)
    if not cfg.get("train") or not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return []  # evaluation; or a checkpoint written before these settings were recorded
    ours = training_settings(cfg)
    changed = {k: (old, ours[k]) for k, old in saved["settings"].items() if k in ours and _plain(old) != ours[k]}
    refused = {k: v for k, v in changed.items() if k not in EXTENDABLE}
    if refused:
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in refused.items())
        original = " ".join(_override(k, old) for k, (old, _) in refused.items())
        raise UserError(f"ckpt_path {path!r} was trained with other settings than this run has: {listed}. A resume "
                        "continues the checkpoint's run: the new value would change the run midway, or be recorded "
                        f"as if it held from the start. Resume with the original values ({original}), or start a new "
                        "run without ckpt_path to use the new ones.")
    changes = list(saved.get("changes") or [])
    if changed:
        step = int(ckpt.get("global_step", 0))
        log.warning("resuming at step %d with %s: applied from this step on (metrics.json: resume_changes)", step,
                    ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items()))
        changes.append({"step": step, "changes": {k: [old, new] for k, (old, new) in changed.items()}})
    return changes
