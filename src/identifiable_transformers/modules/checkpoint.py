"""Checkpoints: written with a checksum beside them, read as untrusted input.

* :class:`LastCheckpoint` keeps ``last.ckpt``, the newest training state, for resuming.
  Lightning's ``ModelCheckpoint(save_last=True)`` refreshes ``last.ckpt`` only when it also saves a
  top-k checkpoint, so with a monitored metric that did not improve, ``last.ckpt`` lags behind.
  This callback rewrites it at the end of every training epoch (after its validation), after a validation
  inside an epoch, every ``every_n_train_steps`` steps, and at the step a SIGTERM arrives, atomically: a run
  killed while writing keeps the previous file.
  Everything an exact resume needs is in it (see ``TextClassifier.on_save_checkpoint`` and
  ``TextDataModule.state_dict``).
* :class:`BestCheckpoint` is Lightning's ``ModelCheckpoint`` that also resumes exactly into a new
  run directory: Lightning forgets the best score when the directory changes, so a later epoch
  that only ties would become "best".
* Both write ``<file>.sha256`` (``sha256sum -c`` format) beside every checkpoint;
  :func:`read_checkpoint` checks it and turns a damaged, truncated or foreign file into a
  one-line :class:`CheckpointError` naming the path and what is wrong.
* :func:`data_module_from_checkpoint` rebuilds a run's ``TextDataModule`` from the data settings a
  checkpoint holds, as plain keyword arguments: a checkpoint is someone else's file, and its
  ``_target_`` is never instantiated (analyze.py ``split=...`` and the sweep report use it).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from ..common.files import atomic_path, atomic_write, fsync, temporary

SUFFIX = ".sha256"
# What a full disk while saving a checkpoint asks of the user (training.py adds how to resume).
DISK_FULL_FIX = "Free space on that disk, or write the run to another one (hydra.run.dir=DIR)."


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, damaged, not ours, or from another model."""


def checksum_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}{SUFFIX}")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_digests(path: Path, digests: list[str]) -> None:
    """Atomically write ``<path>.sha256``: one ``<hex>  <name>`` line per accepted digest."""
    atomic_write(checksum_path(path), "".join(f"{d}  {path.name}\n" for d in digests), "checksum", DISK_FULL_FIX)


def _read_digests(path: Path) -> list[str] | None:
    side = checksum_path(path)
    if not side.is_file():
        return None
    return [line.split()[0].lower() for line in side.read_text(errors="replace").splitlines() if line.strip()]


def write_checksum(path: str | os.PathLike) -> None:
    path = Path(path)
    _write_digests(path, [_file_digest(path)])


def read_checkpoint(path: str | os.PathLike, what: str = "checkpoint") -> tuple[dict[str, Any], bytes]:
    """Read a checkpoint written by train.py and check it; returns (the loaded dict, its bytes).

    Loaded with ``weights_only=True``: a checkpoint can hold tensors and plain values, never code.
    A missing ``.sha256`` beside the file (a checkpoint copied alone, or written before checksums)
    is a warning; a checksum that does not match is a :class:`CheckpointError`.
    """
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} is not a file: pass a .ckpt written by train.py "
                                "(e.g. logs/train/runs/<time>/checkpoints/last.ckpt)")
    data = p.read_bytes()
    if not data:
        raise CheckpointError(f"{what} {str(p)!r} is empty (0 bytes): not a checkpoint. Was the run killed while "
                              "copying it? Use another checkpoint, e.g. the run's last.ckpt.")
    digests = _read_digests(p)
    if digests is None:
        warnings.warn(f"{p} has no {p.name}{SUFFIX} beside it (copied alone, or written before checksums): "
                      "loading it unverified.", stacklevel=2)
    elif _digest(data) not in digests:
        raise CheckpointError(f"{what} {str(p)!r} does not match its checksum {p.name}{SUFFIX}: the file is damaged "
                              "(truncated, or bytes changed since it was written). Use another checkpoint; delete "
                              f"the {SUFFIX} file only if you know the change is intended.")
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # not a zip archive, or pickled objects other than tensors and plain values
        raise CheckpointError(f"{what} {str(p)!r} is not a readable PyTorch checkpoint: not a PyTorch file, or it "
                              "holds objects other than tensors and plain values (never loaded: that could run "
                              "code).") from None
    except Exception as e:  # noqa: BLE001 (torch raises RuntimeError, EOFError, ... for a broken archive)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        raise CheckpointError(f"{what} {str(p)!r} is not a readable PyTorch checkpoint ({first[:120]}): it is "
                              "truncated or damaged. Use another checkpoint, e.g. the run's last.ckpt.") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        keys = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{what} {str(p)!r} is not a checkpoint written by train.py (no state_dict and "
                              f"hyper_parameters; found {keys}).")
    return ckpt, data


def _some(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_compatible(ckpt: dict[str, Any], module: torch.nn.Module, path: str | os.PathLike,
                     what: str = "checkpoint", vocabulary_fix: str = "") -> None:
    """A :class:`CheckpointError` listing the differing hyper-parameters and tensor shapes when the
    checkpoint's weights do not fit ``module`` (a model of another size). ``vocabulary_fix`` (a sentence) ends
    the message when the vocabulary sizes differ: how the caller's user passes the checkpoint's own vocabulary
    (no model setting gives it)."""
    theirs = ckpt["state_dict"]
    ours = module.state_dict()
    shapes = {k: (tuple(theirs[k].shape), tuple(v.shape)) for k, v in ours.items()
              if k in theirs and hasattr(theirs[k], "shape") and tuple(theirs[k].shape) != tuple(v.shape)}
    missing, unexpected = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if not (shapes or missing or unexpected):
        return
    hp_theirs, hp_ours = ckpt.get("hyper_parameters") or {}, dict(getattr(module, "hparams", {}))
    skip = {"tokenizer_json", "data_cfg", "label_names"}
    hp = {k: (hp_theirs[k], hp_ours[k]) for k in hp_ours
          if k in hp_theirs and k not in skip and hp_theirs[k] != hp_ours[k]}
    parts = [f"hyper-parameters (checkpoint vs this run): {hp}"] if hp else []
    if shapes:
        pairs = list(shapes.items())[:5]
        parts.append("shapes (checkpoint vs this run): " + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in pairs))
    # Both lists are named: a deeper checkpoint has only unexpected weights (model.layers.1.*), a
    # shallower one only missing ones; Lightning's strict load would fail on either with a raw error.
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected weight(s), in the checkpoint but not in this model: "
                     f"{_some(unexpected)}")
    if missing:
        parts.append(f"{len(missing)} missing weight(s), in this model but not in the checkpoint: {_some(missing)}")
    fix = " Pass the model settings it was trained with."
    if "vocab_size" in hp and vocabulary_fix:
        (theirs_v, ours_v), others = hp["vocab_size"], set(hp) - {"vocab_size"}
        fix = (f" Its vocabulary has {theirs_v} entries, this run's {ours_v}: {vocabulary_fix}"
               + (" Pass the model settings it was trained with too." if others else ""))
    raise CheckpointError(f"{what} {str(path)!r} holds a model of another size or kind; " + "; ".join(parts)
                          + "." + fix)


# The data modules a checkpoint's data_cfg may name, compared whole: a prefix test would let
# ``identifiable_transformers.data_evil.X`` through.
DATA_MODULE_TARGETS = ("identifiable_transformers.data.TextDataModule",
                       "identifiable_transformers.data.datamodule.TextDataModule")
# model=pretrained's data module (the same data, the checkpoint's own tokenizer), by its exact name and by the name
# it had before the hf/ package (checkpoints written then). hf/ builds on this package (its module subclasses
# ClassifierModule), so the class is never imported from here: the caller passes it (``data_modules``), or it is
# found among the TextDataModule subclasses already defined, which it is wherever hf/ has been imported.
PRETRAINED_DATA_TARGETS = ("identifiable_transformers.hf.data.PretrainedTextDataModule",
                           "identifiable_transformers.data.pretrained.PretrainedTextDataModule")


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def default_data_modules() -> dict[str, type]:
    """``{checkpoint target: class}``: ``TextDataModule`` under its names, and the pretrained data module under its
    names when a layer above has defined it (the class whose path is the first of :data:`PRETRAINED_DATA_TARGETS`)."""
    from ..data import TextDataModule

    found = {name: TextDataModule for name in DATA_MODULE_TARGETS}
    pretrained = [c for c in _subclasses(TextDataModule) if _class_path(c) == PRETRAINED_DATA_TARGETS[0]]
    found.update({name: pretrained[0] for name in PRETRAINED_DATA_TARGETS} if pretrained else {})
    return found


def _data_module_class(target: str, data_modules: dict[str, type] | None, what: str, fix: str) -> type:
    classes = default_data_modules() if data_modules is None else data_modules
    if target not in (*DATA_MODULE_TARGETS, *PRETRAINED_DATA_TARGETS):  # whatever the caller passed
        raise CheckpointError(f"{what}: its data_cfg names _target_={target!r}, not {DATA_MODULE_TARGETS[0]}: refused "
                              f"(a checkpoint's _target_ is never run).{fix}")
    if target not in classes:  # a program error: the caller neither passed nor imported the class
        raise RuntimeError(f"{what}: its data_cfg names {target}, a data module this process has not loaded: pass it "
                           "as data_modules={name: class} (identifiable_transformers.hf.data holds it).")
    return classes[target]


def _plain(value: Any) -> bool:
    """True for None, bool, int, float, str and lists/dicts of them (no tensors, no nested ``_target_``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and k != "_target_" and _plain(v) for k, v in value.items())
    return False


def data_module_kwargs(data_cfg: Any, what: str = "checkpoint", fix: str = "",
                       data_modules: dict[str, type] | None = None) -> dict[str, Any]:
    """The keyword arguments of the data module that ``data_cfg`` (a checkpoint's saved data settings) holds,
    checked: its ``_target_`` is exactly one of :data:`DATA_MODULE_TARGETS` or :data:`PRETRAINED_DATA_TARGETS` (or
    absent: ``TextDataModule``), every key is an argument of that class and every value a plain one. Anything else
    is a :class:`CheckpointError`; nothing in ``data_cfg`` is imported, called or resolved. ``what`` names the
    checkpoint in the message, ``fix`` (a sentence) ends it; ``data_modules`` maps those names to the classes
    (:func:`default_data_modules` when None)."""
    if not isinstance(data_cfg, dict):
        raise CheckpointError(f"{what}: its data_cfg is a {type(data_cfg).__name__}, not a mapping of data "
                              f"settings.{fix}")
    values = dict(data_cfg)
    target = values.pop("_target_", DATA_MODULE_TARGETS[0])
    allowed = set(inspect.signature(_data_module_class(target, data_modules, what, fix)).parameters)
    unknown = sorted(str(k) for k in values if k not in allowed)
    if unknown:
        raise CheckpointError(f"{what}: its data_cfg has keys {unknown} that TextDataModule does not take: "
                              f"refused.{fix}")
    odd = sorted(k for k, v in values.items() if not _plain(v))
    if odd:
        raise CheckpointError(f"{what}: its data_cfg has values for {odd} that are not plain settings (str, number, "
                              f"bool, null, or lists/mappings of them; no nested _target_): refused.{fix}")
    return values


def data_module_from_checkpoint(data_cfg: Any, cache_dir: str, what: str = "checkpoint", fix: str = "",
                                data_modules: dict[str, type] | None = None):
    """The data module ``data_cfg`` names, built from :func:`data_module_kwargs` with this machine's ``cache_dir``
    (the checkpoint's is the training machine's)."""
    target = data_cfg.get("_target_", DATA_MODULE_TARGETS[0]) if isinstance(data_cfg, dict) else None
    kwargs = data_module_kwargs(data_cfg, what, fix, data_modules)  # checks target too
    return _data_module_class(target, data_modules, what, fix)(**{**kwargs, "cache_dir": str(cache_dir)})


class LastCheckpoint(Checkpoint):  # a Checkpoint, so Lightning runs it after the other callbacks
    def __init__(self, dirpath: str | os.PathLike, every_n_train_steps: int = 0, filename: str = "last.ckpt"):
        if int(every_n_train_steps) < 0:
            raise ValueError(f"every_n_train_steps={every_n_train_steps} must be >= 0 (0: only at epoch ends)")
        self.path = Path(dirpath) / filename
        self.every_n_train_steps = int(every_n_train_steps)
        self._saved: tuple | None = None  # (step, best checkpoints) at the last save

    @staticmethod
    def _state(trainer: pl.Trainer) -> tuple:
        kept = [(c.best_model_path, tuple(sorted(c.best_k_models))) for c in trainer.checkpoint_callbacks
                if isinstance(c, ModelCheckpoint)]
        return trainer.global_step, kept

    def _save(self, trainer: pl.Trainer) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        with temporary(self.path, "checkpoint", DISK_FULL_FIX) as tmp:
            trainer.save_checkpoint(tmp, weights_only=False)  # the full state; every rank takes part, rank 0 writes
            if trainer.is_global_zero:
                fsync(tmp)
                new, old = _file_digest(tmp), _read_digests(self.path) or []
                # Both digests are accepted while the file is swapped: a kill between the two steps
                # leaves either file with a checksum that matches it.
                _write_digests(self.path, [new, *old[:1]])
                os.replace(tmp, self.path)
                _write_digests(self.path, [new])
        self._saved = self._state(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Never on an epoch's last batch: Lightning resumes a checkpoint saved there as a finished epoch and skips
        # its validation (a kill before it would lose that epoch's metrics and best checkpoint). The save after
        # that validation, or at the epoch end, follows at once.
        if batch_idx + 1 >= trainer.num_training_batches:
            return
        # SIGTERM (a scheduler ending the job): Lightning stops right after this batch, so keep it. On an
        # epoch's last batch the save after its validation (or the previous one) is what a resume gets.
        if trainer.received_sigterm or (
                self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0):
            self._save(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A validation inside the epoch (val_check_interval): save now. The one at the epoch's end is followed at
        # once by the epoch-end save, which is the one to resume from: saved here, a resume would replay the
        # epoch's end without its training metrics (Lightning does not checkpoint its logged epoch values), so
        # metrics_history.csv and metrics.json would lose that epoch's train/* values.
        progress = trainer.fit_loop.epoch_loop.batch_progress
        if not (progress.is_last_batch or progress.current.ready >= trainer.num_training_batches):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the epoch's validation and the best checkpoint's save (ModelCheckpoint saves at the epoch end):
        # last.ckpt knows the best checkpoint and holds the epoch's row of the history.
        if self._saved != self._state(trainer):
            self._save(trainer)


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with a checksum beside each file and an exact resume into a new directory.

    Resumed with a ``dirpath`` other than the checkpoint's, Lightning keeps only ``best_model_path``
    and forgets the score, so the next epoch becomes "best" even if it only ties. Here the kept
    checkpoints are copied into the new directory (with their checksums) and the whole state is
    restored, so the new run directory is self-contained and the best epoch is the uninterrupted
    run's. A kept checkpoint that no longer exists restarts the tracking, with a warning.
    """

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # Lightning's, but written to a temporary name and renamed: a full disk or a kill never leaves a
        # truncated epoch_XXX.ckpt under its final name (Lightning's own save writes the final name directly).
        with temporary(filepath, "checkpoint", DISK_FULL_FIX) as tmp:
            trainer.save_checkpoint(tmp, self.save_weights_only)
            if trainer.is_global_zero:
                fsync(tmp)
                os.replace(tmp, filepath)
                write_checksum(filepath)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        super()._remove_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            checksum_path(filepath).unlink(missing_ok=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old_dir = state_dict.get("dirpath")
        if old_dir is None or self.dirpath is None or os.path.realpath(old_dir) == os.path.realpath(self.dirpath):
            return super().load_state_dict(state_dict)
        kept = state_dict.get("best_k_models") or {}
        gone = [p for p in kept if not Path(p).is_file()]
        if gone:
            warnings.warn(f"the checkpoint(s) {gone} kept by the resumed run no longer exist: the best-checkpoint "
                          "tracking restarts from this run's epochs.", stacklevel=2)
            return
        moved = {old: str(Path(self.dirpath) / Path(old).name) for old in kept}
        if rank_zero_only.rank == 0:
            Path(self.dirpath).mkdir(parents=True, exist_ok=True)
            for old, new in moved.items():
                for src, dst in ((old, new), (checksum_path(old), checksum_path(new))):
                    if Path(src).is_file():
                        with atomic_path(dst, "checkpoint", DISK_FULL_FIX) as tmp:
                            shutil.copy2(src, tmp)
        super().load_state_dict({
            **state_dict, "dirpath": self.dirpath,
            "best_k_models": {moved[k]: v for k, v in kept.items()},
            "best_model_path": moved.get(state_dict.get("best_model_path"), ""),
            "kth_best_model_path": moved.get(state_dict.get("kth_best_model_path"), ""),
            "last_model_path": "",
        })
