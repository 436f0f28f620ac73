"""Checks on the run folder and on a resume, before any data is prepared.

* A fresh run (no ``ckpt_path``) never writes into a folder that already holds a run: it would overwrite that
  run's ``last.ckpt`` and ``metrics.json``. It is refused, naming the folder and the two ways on.
* Two runs never share a folder at the same time: the folder is locked (:mod:`.run_lock`) before anything is
  written there, and checked again under the lock.
* The run folder must be writable (a read-only folder would fail at the first file, after the data).

What a resume may change is :mod:`.resume`'s business.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

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
