"""What a resume may change: every check of a checkpoint (``ckpt_path``) against this run's settings, in one place.

A resume continues the checkpoint's weights, optimiser, schedule, data position and random state, so a setting
changed on the command line would be recorded (``metrics.json``, ``config_resolved.yaml``, the loggers) without being
applied, or would change the run midway. Resuming training is refused when it changes

* a model setting the checkpoint holds (:func:`resume_changes`), except how fast it runs (``model.compile``,
  ``model.cuda_graphs``);
* a data setting that decides what a batch holds (``data.batch_size`` and every other except where the data is and
  how fast it is read: :data:`_FREE_DATA_KEYS`);
* the settings outside the model and the data that change training (:func:`training_settings`: the seed, the
  trainer's optimisation settings, the callbacks that stop training or choose the best checkpoint), which
  :class:`RunSettingsRecord` writes into every checkpoint;
* the number of processes (``trainer.devices`` x ``trainer.num_nodes``), also recorded there.

Only the length of training (``trainer.max_epochs``, ``trainer.max_steps``) may change, and how the same number of
processes is laid out (``trainer.devices`` against ``trainer.num_nodes``): the new value applies from the resumed step
and ``metrics.json`` records it under ``resume_changes``. A refusal is one :class:`UserError` naming every changed
key (old -> new) and the original values to pass, complete enough to resume when passed as printed. Evaluating a
checkpoint (``train=false``) records the optimisation settings its weights were trained with
(:func:`adopt_evaluation_settings`) and refuses another architecture (:func:`refuse_other_architecture`).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from tokenizers import Tokenizer

from ..common.errors import UserError
from ..modules.checkpoint import CheckpointError, check_compatible

log = logging.getLogger(__name__)

# Model settings that change neither the weights' meaning nor the optimisation (how fast, not what).
_FREE_MODEL_KEYS = {"compile", "cuda_graphs"}
# Data settings that say where the data is or how fast it is read, not what a batch holds. batch_size has its own
# check (check_resume_batch_size); a data file's path may differ between machines (its content is the tokenizer's
# and the cache key's business).
_FREE_DATA_KEYS = {"_target_", "batch_size", "cache_dir", "hf_cache_dir", "data_dir", "train_file", "validation_file",
                   "test_file", "tokenizer_file", "num_workers", "num_proc", "pin_memory", "eval_batch_size",
                   "hub_probe_timeout", "on_device", "static_shapes", "length_buckets"}
# Where the data is: free on their own, but part of the original values once the data differs (a run resumed with
# another data config must be told where the checkpoint's data was, or following the message fails again).
_LOCATION_KEYS = ("data_dir", "train_file", "validation_file", "test_file", "tokenizer_file")
OPTIMISATION_KEYS = ("lr", "weight_decay", "betas", "warmup_steps", "scheduler", "label_smoothing")

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


def _plain(value: Any) -> Any:
    """Tuples as lists (a checkpoint stores betas as a tuple, the config as a list)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (JSON is not: ``{"a": 1}`` fails to parse, ``{a: 1}`` does)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[\w./@:+-]+", text):
        try:  # plain unless Hydra would read it as something else (42, true, null, 1e-3)
            if OverridesParser.create().parse_override(f"k={text}").value() == text:
                return text
        except Exception:  # noqa: BLE001 (the grammar's own errors): quote it
            pass
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override(key: str, value: Any) -> str:
    """``key=value`` as a shell word that Hydra reads back as ``value``."""
    return shlex.quote(f"{key}={_hydra_value(_plain(value))}")


# --- what every checkpoint records ------------------------------------------------------------------------------

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
    """Writes this run's :func:`training_settings`, its processes and the changes of earlier resumes into every
    checkpoint."""

    def __init__(self, settings: dict[str, Any], changes: list[dict[str, Any]]):
        self.settings, self.changes = settings, changes

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {"settings": self.settings, "changes": self.changes,
                                      "world_size": trainer.world_size, "devices": trainer.num_devices,
                                      "num_nodes": trainer.num_nodes}


# --- before any data: the model's, the data's and the run's settings ---------------------------------------------

def resume_changes(cfg: DictConfig, ckpt: dict[str, Any], data: bool = True) -> dict[str, tuple[Any, Any]]:
    """``{"model.lr": (checkpoint's, this run's), ...}``: every model setting (and with ``data``, every data
    setting that decides what a batch holds) that the checkpoint holds with another value than ``cfg``."""
    hp = ckpt.get("hyper_parameters") or {}
    changes: dict[str, tuple[Any, Any]] = {}
    model = OmegaConf.to_container(cfg.model, resolve=True)
    for key, new in model.items():
        if key != "_target_" and key not in _FREE_MODEL_KEYS and key in hp and _plain(hp[key]) != _plain(new):
            changes[f"model.{key}"] = (hp[key], new)
    saved_data = hp.get("data_cfg")
    if data and isinstance(saved_data, dict):
        ours = OmegaConf.to_container(cfg.data, resolve=True)
        for key in sorted(set(saved_data) & set(ours) - _FREE_DATA_KEYS):
            if _plain(saved_data[key]) != _plain(ours[key]):
                changes[f"data.{key}"] = (saved_data[key], ours[key])
    return changes


def _data_locations(cfg: DictConfig, ckpt: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Where the checkpoint's data was, where it differs from this run's (:data:`_LOCATION_KEYS`)."""
    saved = (ckpt.get("hyper_parameters") or {}).get("data_cfg") or {}
    ours = OmegaConf.to_container(cfg.data, resolve=True)
    return {f"data.{k}": (saved[k], ours.get(k)) for k in _LOCATION_KEYS
            if k in saved and _plain(saved[k]) != _plain(ours.get(k))}


def _batch_size_change(cfg: DictConfig, ckpt: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    theirs = ((ckpt.get("hyper_parameters") or {}).get("data_cfg") or {}).get("batch_size")
    ours = cfg.data.get("batch_size")
    return {} if theirs is None or ours is None or int(theirs) == int(ours) else {"data.batch_size": (theirs, ours)}


def check_resume_batch_size(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> None:
    """Refuse to resume training with another data.batch_size than the checkpoint was trained with: the data
    position, the step count and the learning-rate schedule are all counted in its batches."""
    if not cfg.get("train") or not (changed := _batch_size_change(cfg, ckpt)):
        return
    theirs, ours = changed["data.batch_size"]
    raise UserError(f"ckpt_path {path!r} was trained with data.batch_size={theirs}, this run has "
                    f"data.batch_size={ours}: the resumed run would not continue the same batches, steps and "
                    f"learning-rate schedule. Resume with data.batch_size={theirs}, or start a new run "
                    "without ckpt_path.")


def _refusal(cfg: DictConfig, ckpt: dict[str, Any], path: str, refused: dict[str, tuple[Any, Any]]) -> UserError:
    listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in refused.items())
    if any(k.startswith("data.") for k in refused):  # and where that data was, or the original values fail again
        refused = {**refused, **_data_locations(cfg, ckpt)}
    original = " ".join(override(k, old) for k, (old, _) in refused.items())
    return UserError(f"ckpt_path {path!r} was trained with other settings than this run has: {listed}. A resume "
                     "continues the checkpoint's run (its weights, optimiser, schedule and data position are "
                     "restored): a new value would be recorded but not applied, or change the run midway. Resume "
                     f"with the original values ({original}), or start a new run without ckpt_path to use the new "
                     "ones.")


def check_resume_settings(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> None:
    """Refuse to resume training with model or data settings other than those the checkpoint was trained with."""
    if cfg.get("train") and (changes := resume_changes(cfg, ckpt)):
        raise _refusal(cfg, ckpt, path, changes)


def _run_settings_changes(cfg: DictConfig, ckpt: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    saved = ckpt.get(CHECKPOINT_KEY)
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return {}  # a checkpoint written before these settings were recorded
    ours = training_settings(cfg)
    return {k: (old, ours[k]) for k, old in saved["settings"].items() if k in ours and _plain(old) != ours[k]}


def check_resume(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> dict[str, tuple[Any, Any]]:
    """Before any data: refuse a training resume that changes a model, data or :func:`training_settings` value
    other than the length of training, in one :class:`UserError` naming every key (old -> new) and the original
    values to pass. Returns the changes it allows (the length of training), to be recorded."""
    if not cfg.get("train"):
        return {}  # evaluation: see adopt_evaluation_settings
    batch, settings, run = _batch_size_change(cfg, ckpt), resume_changes(cfg, ckpt), _run_settings_changes(cfg, ckpt)
    refused = {**batch, **settings, **{k: v for k, v in run.items() if k not in EXTENDABLE}}
    if batch and refused.keys() == batch.keys():
        check_resume_batch_size(cfg, ckpt, path)  # its own words: the data position is counted in batches
    if refused:
        raise _refusal(cfg, ckpt, path, refused)
    return run


def adopt_evaluation_settings(cfg: DictConfig, ckpt: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Evaluating a checkpoint (``train=false``) applies none of the optimisation settings, nor dropout: where this
    run's differ from the checkpoint's, ``cfg`` takes the checkpoint's (what its weights were trained with), so
    metrics.json and config_resolved.yaml record those. Returns what was replaced. A different architecture is
    refused by :func:`refuse_other_architecture`."""
    changes = {k: v for k, v in resume_changes(cfg, ckpt, data=False).items()
               if k.split(".", 1)[1] in (*OPTIMISATION_KEYS, "dropout")}
    with open_dict(cfg):
        for key, (old, _) in changes.items():
            OmegaConf.update(cfg, key, _plain(old), merge=False)
    return changes


def refuse_other_architecture(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> None:
    """A :class:`UserError` when ``cfg.model`` differs from the checkpoint's in a setting that changes what the
    weights compute without changing their shapes (``head_combine``, ``activation``, ``norm_first``, ...):
    the weights would load and compute something else."""
    changes = resume_changes(cfg, ckpt, data=False)
    if not changes:
        return
    listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
    original = " ".join(override(k, old) for k, (old, _) in changes.items())
    raise UserError(f"ckpt_path {path!r} was trained with other model settings than this run has: {listed}: its "
                    f"weights would compute something else. Pass the settings it was trained with ({original}).")


def recorded_changes(ckpt: dict[str, Any]) -> list[dict[str, Any]]:
    """The changes earlier resumes made (``[{"step": 4, "changes": {key: [old, new]}}, ...]``)."""
    return list((ckpt.get(CHECKPOINT_KEY) or {}).get("changes") or [])


def record_changes(record: list[dict[str, Any]], step: int, changed: dict[str, tuple[Any, Any]]) -> None:
    """Append this resume's allowed ``changed`` (applied from ``step`` on) to ``record``, which metrics.json and
    every later checkpoint carry, with a warning."""
    if not changed:
        return
    log.warning("resuming at step %d with %s: applied from this step on (metrics.json: resume_changes)", step,
                ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items()))
    record.append({"step": step, "changes": {k: [old, new] for k, (old, new) in changed.items()}})


# --- once the model exists: its shapes, its architecture, its tokenizer -----------------------------------------

def _words(tokenizer_json: str) -> dict:
    """What a tokenizer's ids mean: truncation and padding do not change it (a pretrained checkpoint's tokenizer
    truncates at data.max_length, which a resumed run may change)."""
    return {k: v for k, v in json.loads(tokenizer_json).items() if k not in ("truncation", "padding")}


def _its_tokenizer_file(ckpt: dict[str, Any], path: str) -> str:
    """The ``tokenizer.json`` of the checkpoint's run folder (``<run>/checkpoints/x.ckpt``) when it holds the
    checkpoint's own tokenizer; else a placeholder naming where to find it."""
    saved = (ckpt.get("hyper_parameters") or {}).get("tokenizer_json")
    candidate = Path(str(path)).expanduser().resolve().parent.parent / "tokenizer.json"
    try:
        if saved is not None and candidate.is_file() and _words(candidate.read_text()) == _words(saved):
            return shlex.quote(str(candidate))
    except (OSError, ValueError):  # unreadable, or not a tokenizer: not the one to name
        pass
    return "<its run folder>/tokenizer.json"


def check_resume_model(cfg: DictConfig, ckpt: dict[str, Any], model: pl.LightningModule, datamodule,
                       path: str) -> None:
    """The checkpoint's weights must fit ``model`` (shapes), compute the same thing (architecture) and read the
    same token ids as ``datamodule``'s tokenizer. Another vocabulary names its remedy: the checkpoint's own
    tokenizer file (``data.tokenizer_file``), e.g. for a checkpoint written before the vocabulary was built from
    the training rows alone."""
    pretrained = "name_or_path" in (ckpt.get("hyper_parameters") or {})  # its tokenizer is the model's own
    fix = "" if pretrained or "tokenizer_file" not in cfg.data else (
        f"it was trained with another tokenizer: pass it with data.tokenizer_file={_its_tokenizer_file(ckpt, path)}.")
    check_compatible(ckpt, model, path, what="ckpt_path", vocabulary_fix=fix)
    refuse_other_architecture(cfg, ckpt, path)  # same shapes, other computation (e.g. model.activation)
    check_same_tokenizer(ckpt, datamodule, path)


def check_same_tokenizer(ckpt: dict[str, Any], datamodule, path: str) -> None:
    """The checkpoint's token ids must mean the same words as the data's."""
    saved = (ckpt.get("hyper_parameters") or {}).get("tokenizer_json")
    if saved is None or _words(saved) == _words(datamodule.tokenizer.to_str()):
        return
    raise CheckpointError(
        f"ckpt_path {str(path)!r} was trained with another tokenizer than the one this data config builds "
        f"(vocabulary {Tokenizer.from_str(saved).get_vocab_size()} vs {datamodule.vocab_size}): its token "
        "ids would mean other words. Use the data settings it was trained with, or pass its tokenizer with "
        f"data.tokenizer_file={_its_tokenizer_file(ckpt, path)}.")


# --- once the trainer exists: the number of processes ------------------------------------------------------------

def recorded_processes(ckpt: dict[str, Any]) -> dict[str, int]:
    """``{"world_size": 2, "devices": 1, "num_nodes": 2}`` as the checkpoint's run trained; the keys a checkpoint
    written before they were recorded lacks are left out (devices and nodes when they do not give world_size)."""
    saved = ckpt.get(CHECKPOINT_KEY) or {}
    out = {k: int(saved[k]) for k in ("world_size", "devices", "num_nodes") if saved.get(k) is not None}
    if "world_size" not in out or out.get("devices", 0) * out.get("num_nodes", 0) != out["world_size"]:
        out.pop("devices", None), out.pop("num_nodes", None)
    return out


def check_resume_processes(saved: dict[str, int], trainer: pl.Trainer, path: str) -> dict[str, tuple[Any, Any]]:
    """Refuse to resume training on another number of processes (``trainer.devices`` x ``trainer.num_nodes``, both
    counted: 2 nodes of 1 device are 2 processes) than ``saved`` (:func:`recorded_processes`): each step's global
    batch and the rows each rank reads would change midway, while the run's records say it trained on one setting
    throughout. The same number laid out otherwise (1 node of 2 devices for 2 nodes of 1) reads the same rows in
    the same steps: returned as changes to record. Nothing recorded, nothing checked."""
    if "world_size" not in saved:
        return {}
    ours = {"trainer.devices": trainer.num_devices, "trainer.num_nodes": trainer.num_nodes}
    theirs = {"trainer.devices": saved.get("devices"), "trainer.num_nodes": saved.get("num_nodes")}
    world_size = trainer.num_devices * trainer.num_nodes
    if saved["world_size"] == world_size:
        return {k: (theirs[k], ours[k]) for k in ours if theirs[k] is not None and theirs[k] != ours[k]}
    layout = " x ".join(f"{k}={v}" for k, v in ours.items())
    fix = (" ".join(override(k, v) for k, v in theirs.items()) if None not in theirs.values()
           else "set trainer.devices and trainer.num_nodes to give that")
    raise UserError(f"ckpt_path {path!r} was trained on {saved['world_size']} process(es) (trainer.devices x "
                    f"trainer.num_nodes); this run has {world_size}: {layout}. Every step's global batch and the rows "
                    f"each process reads would change midway. Resume on the same number of processes ({fix}), or "
                    "start a new run without ckpt_path.")
