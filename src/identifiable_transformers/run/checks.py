"""Checks on the run folder and on a resume, before any data is prepared.

* A fresh run (no ``ckpt_path``) never writes into a folder that already holds a run: it would overwrite that
  run's ``last.ckpt`` and ``metrics.json``. It is refused, naming the folder and the two ways on.
* Two runs never share a folder at the same time: the folder is locked (:mod:`.run_lock`) before anything is
  written there, and checked again under the lock.
* The run folder must be writable (a read-only folder would fail at the first file, after the data).
* A resume must use the interrupted run's ``data.batch_size``: the data position, the step count and the
  learning-rate schedule are all counted in its batches, so another size cannot continue exactly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from ..common.errors import UserError
from ..common.files import nearest_existing, writable
from .lock import lock_run_folder, unlock_run_folder


def finished_run_files(folder: Path) -> list[str]:
    """What in ``folder`` says a run already wrote there (its metrics or its checkpoints)."""
    found = ["metrics.json"] if (folder / "metrics.json").is_file() else []
    found += sorted(f"checkpoints/{p.name}" for p in (folder / "checkpoints").glob("*.ckpt"))
    return found


def check_folder(folder: Path, resuming: bool, key: str = "hydra.run.dir") -> None:
    """A :class:`UserError` when ``folder`` cannot hold this run: not creatable, not writable, or another run's
    (unless ``resuming``). ``key`` is the setting that names the folder, for the message."""
    base = nearest_existing(folder)
    if not base.is_dir():
        raise UserError(f"the run folder {folder} cannot be created: {base} is a file. Pass another {key}=DIR.")
    if not writable(folder):
        raise UserError(f"the run folder {folder} is not writable ({base} is read-only for this user): pass a "
                        f"writable {key}=DIR.")
    found = finished_run_files(folder)
    if found and not resuming:
        last = folder / "checkpoints" / "last.ckpt"
        resume = f"resume it with ckpt_path={last}" if last.is_file() else "resume it with ckpt_path=<its last.ckpt>"
        raise UserError(f"the run folder {folder} already holds a run ({', '.join(found[:3])}), which this run would "
                        f"overwrite: pass another {key}=DIR for a new run, or {resume}.")


def claim_folder(folder: Path, resuming: bool, key: str = "hydra.run.dir") -> bool:
    """Check ``folder`` (:func:`check_folder`), lock it for this process (:mod:`.run_lock`) and check it again
    under the lock: two runs started at the same moment both pass the first check, one of them gets the lock,
    and the other is refused, as is a run that finds the folder finished by the time it holds the lock.
    True if the lock was taken now (the caller releases it), False if this process held it already."""
    check_folder(folder, resuming, key)  # nothing is created in a folder that cannot hold the run
    taken = lock_run_folder(folder, key)
    try:
        check_folder(folder, resuming, key)
    except BaseException:
        if taken:
            unlock_run_folder(folder)
        raise
    return taken


def check_run_folder(cfg: DictConfig) -> tuple[Path, bool]:
    """The run folder (``paths.output_dir``), checked and locked inside the job (also for library callers and sweep
    jobs); returns it and whether its lock was taken here (then the caller releases it)."""
    folder = Path(str(cfg.paths.output_dir)).expanduser()
    return folder, claim_folder(folder, resuming=bool(cfg.get("ckpt_path")))


class RunFolderCheck(Callback):
    """The same checks as a Hydra callback (conf/hydra/default.yaml), before Hydra itself writes into the folder:
    its log file and ``.hydra/`` would fail with a raw traceback in a read-only folder, and would overwrite the
    config record of a run already there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # locked before Hydra writes its log and .hydra/ there; held until this process ends
        folder = Path(str(OmegaConf.select(config, "hydra.run.dir"))).expanduser()
        _exit_on_user_error(lambda: claim_folder(folder, resuming=bool(config.get("ckpt_path"))))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).expanduser()
        # each job checks and locks its own subfolder; here whether the sweep folder can be written at all, and a
        # lock on it for the whole sweep: a second sweep into the same folder would write into the same job folders
        _exit_on_user_error(lambda: claim_folder(folder, resuming=True, key="hydra.sweep.dir"))


def _exit_on_user_error(check: Callable[[], None]) -> None:
    try:
        check()
    except UserError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"Error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def check_resume_batch_size(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> None:
    """Refuse to resume training with another data.batch_size than the checkpoint was trained with."""
    if not cfg.get("train"):
        return  # evaluation only: the batch size does not change the metrics
    data_cfg = (ckpt.get("hyper_parameters") or {}).get("data_cfg") or {}
    theirs, ours = data_cfg.get("batch_size"), cfg.data.get("batch_size")
    if theirs is None or ours is None or int(theirs) == int(ours):
        return
    raise UserError(f"ckpt_path {path!r} was trained with data.batch_size={theirs}, this run has "
                    f"data.batch_size={ours}: the resumed run would not continue the same batches, steps and "
                    f"learning-rate schedule. Resume with data.batch_size={theirs}, or start a new run "
                    "without ckpt_path.")


# A resume continues the checkpoint's optimiser, schedule, weights and data position: a setting changed on the
# command line would be recorded (metrics.json, config_resolved.yaml, the loggers) without being applied (the
# optimiser's and the schedule's: restored from the checkpoint), or change the run midway (dropout, the data).
OPTIMISATION_KEYS = ("lr", "weight_decay", "betas", "warmup_steps", "scheduler", "label_smoothing")
# Model settings that change neither the weights' meaning nor the optimisation (how fast, not what): a resume
# applies the new value.
_FREE_MODEL_KEYS = {"compile", "cuda_graphs"}
# Data settings that say where the data is or how fast it is read, not what a batch holds. batch_size has its own
# check (check_resume_batch_size); a data file's path may differ between machines (its content is the tokenizer's
# and the cache key's business).
_FREE_DATA_KEYS = {"_target_", "batch_size", "cache_dir", "hf_cache_dir", "data_dir", "train_file", "validation_file",
                   "test_file", "tokenizer_file", "num_workers", "num_proc", "pin_memory", "eval_batch_size",
                   "hub_probe_timeout", "on_device", "static_shapes", "length_buckets"}


def _plain(value: Any) -> Any:
    """Tuples as lists (a checkpoint stores betas as a tuple, the config as a list)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


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


def _override(key: str, value: Any) -> str:
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, (list, tuple, dict)):
        return f"'{key}={json.dumps(_plain(value))}'"
    return f"{key}={value}"


def check_resume_settings(cfg: DictConfig, ckpt: dict[str, Any], path: str) -> None:
    """Refuse to resume training with settings other than those the checkpoint was trained with: a
    :class:`UserError` naming each changed key (old -> new) and the two ways on."""
    if not cfg.get("train"):
        return  # evaluation: see adopt_evaluation_settings
    changes = resume_changes(cfg, ckpt)
    if not changes:
        return
    listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
    original = " ".join(_override(k, old) for k, (old, _) in changes.items())
    raise UserError(f"ckpt_path {path!r} was trained with other settings than this run has: {listed}. A resume "
                    "continues the checkpoint's run (its weights, optimiser, schedule and data position are "
                    "restored): a new value would be recorded but not applied, or change the run midway. Resume "
                    f"with the original values ({original}), or start a new run without ckpt_path to use the new "
                    "ones.")


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
    original = " ".join(_override(k, old) for k, (old, _) in changes.items())
    raise UserError(f"ckpt_path {path!r} was trained with other model settings than this run has: {listed}: its "
                    f"weights would compute something else. Pass the settings it was trained with ({original}).")
