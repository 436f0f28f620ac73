"""Checks on the run folder and on a resume, before any data is prepared.

* A fresh run (no ``ckpt_path``) never writes into a folder that already holds a run: it would overwrite that
  run's ``last.ckpt`` and ``metrics.json``. It is refused, naming the folder and the two ways on.
* The run folder must be writable (a read-only folder would fail at the first file, after the data).
* A resume must use the interrupted run's ``data.batch_size``: the data position, the step count and the
  learning-rate schedule are all counted in its batches, so another size cannot continue exactly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .cli import UserError
from .data.cache import nearest_existing, writable


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


def check_run_folder(cfg: DictConfig) -> Path:
    """The run folder (``paths.output_dir``), checked inside the job (also for library callers and sweep jobs)."""
    folder = Path(str(cfg.paths.output_dir)).expanduser()
    check_folder(folder, resuming=bool(cfg.get("ckpt_path")))
    return folder


class RunFolderCheck(Callback):
    """The same checks as a Hydra callback (conf/hydra/default.yaml), before Hydra itself writes into the folder:
    its log file and ``.hydra/`` would fail with a raw traceback in a read-only folder, and would overwrite the
    config record of a run already there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(OmegaConf.select(config, "hydra.run.dir"))).expanduser()
        _exit_on_user_error(lambda: check_folder(folder, resuming=bool(config.get("ckpt_path"))))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).expanduser()
        # each job checks its own subfolder; here only whether the sweep folder can be written at all
        _exit_on_user_error(lambda: check_folder(folder, resuming=True, key="hydra.sweep.dir"))


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
