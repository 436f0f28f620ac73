"""Checks on the run folder and on a resume, before any data is prepared.

* A fresh run (no ``ckpt_path``) never writes into a folder that already holds a run: it would overwrite that
  run's ``last.ckpt`` and ``metrics.json``. It is refused, naming the folder and the two ways on.
* The run folder must be writable (a read-only folder would fail at the first file, after the data).
* A resume must use the interrupted run's ``data.batch_size``: the data position, the step count and the
  learning-rate schedule are all counted in its batches, so another size cannot continue exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .cli import UserError
from .data.cache import nearest_existing, writable


def finished_run_files(folder: Path) -> list[str]:
    """What in ``folder`` says a run already wrote there (its metrics or its checkpoints)."""
    found = ["metrics.json"] if (folder / "metrics.json").is_file() else []
    found += sorted(f"checkpoints/{p.name}" for p in (folder / "checkpoints").glob("*.ckpt"))
    return found


def check_run_folder(cfg: DictConfig) -> Path:
    """The run folder (``paths.output_dir``), checked: writable, and not another run's unless resuming."""
    folder = Path(str(cfg.paths.output_dir)).expanduser()
    base = nearest_existing(folder)
    if not base.is_dir():
        raise UserError(f"the run folder {folder} cannot be created: {base} is a file. Pass another "
                        "hydra.run.dir=DIR (hydra.sweep.dir=DIR in a --multirun).")
    if not writable(folder):
        raise UserError(f"the run folder {folder} is not writable ({base} is read-only for this user): pass a "
                        "writable hydra.run.dir=DIR (hydra.sweep.dir=DIR in a --multirun).")
    found = finished_run_files(folder)
    if found and not cfg.get("ckpt_path"):
        last = folder / "checkpoints" / "last.ckpt"
        resume = f"resume it with ckpt_path={last}" if last.is_file() else "resume it with ckpt_path=<its last.ckpt>"
        raise UserError(f"the run folder {folder} already holds a run ({', '.join(found[:3])}), which this run would "
                        f"overwrite: pass another hydra.run.dir=DIR for a new run, or {resume}.")
    return folder


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
