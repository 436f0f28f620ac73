"""Which folders hold a run, and which runs may use them (run_checks.py), with hand-made folders.

Every case is decided before any data is prepared, so each ``run(cfg)`` here either stops at the folder
check (a UserError) or gets past it and stops at the next check, on a crafted ckpt_path that is not a
checkpoint (a CheckpointError): which of the two errors comes back says what the folder check decided.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.modules.checkpoint import CheckpointError
from identifiable_transformers.run.checks import RunFolderCheck
from identifiable_transformers.run.resume import check_resume_batch_size
from identifiable_transformers.run.training import run

# the crafted checkpoints have no .sha256 beside them: read_checkpoint warns before it refuses them
pytestmark = pytest.mark.filterwarnings("ignore:.*sha256 beside it")


def _killed_run(folder: Path) -> Path:
    """What a run killed in its first epochs leaves: checkpoints, no metrics.json. Returns last.ckpt."""
    (folder / "checkpoints").mkdir(parents=True)
    last = folder / "checkpoints" / "last.ckpt"
    torch.save({"not": "a train.py checkpoint"}, last)  # read_checkpoint refuses it, after the folder check
    return last


def test_a_folder_with_only_checkpoints_holds_a_run(make_cfg, tmp_path):
    last = _killed_run(tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()
    with pytest.raises(UserError, match="already holds a run") as info:
        run(make_cfg(out="run"))
    assert "checkpoints/last.ckpt" in str(info.value) and f"ckpt_path={last}" in str(info.value)


def test_a_folder_with_only_checkpoints_is_refused_by_the_hydra_callback(tmp_path, capsys):
    _killed_run(tmp_path / "run")
    with pytest.raises(SystemExit) as info:
        RunFolderCheck().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "run")}},
                                                        "ckpt_path": None}))
    assert info.value.code == 1 and "already holds a run" in capsys.readouterr().err


def test_an_empty_folder_or_one_without_checkpoints_is_free(make_cfg, tmp_path):
    # the reference cases: nothing of a run's in them, so the folder check passes (the crafted
    # ckpt_path is what stops these runs)
    (tmp_path / "empty").mkdir()
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)
    (tmp_path / "other" / "checkpoints" / "notes.txt").write_text("not a checkpoint")
    bogus = tmp_path / "bogus.ckpt"
    torch.save({"not": "a checkpoint"}, bogus)
    for out in ("empty", "other"):
        with pytest.raises(CheckpointError):
            run(make_cfg(f"ckpt_path={bogus}", "train=false", out=out))


def test_a_resume_into_the_runs_own_folder_is_not_an_overwrite(make_cfg, tmp_path):
    last = _killed_run(tmp_path / "run")
    (tmp_path / "run" / "metrics.json").write_text("{}")  # even a finished run may be resumed in place
    with pytest.raises(CheckpointError, match="not a checkpoint written by train.py"):
        run(make_cfg(f"ckpt_path={last}", out="run"))  # past the folder check: the crafted file is refused
    with pytest.raises(CheckpointError):
        run(make_cfg(f"ckpt_path={last}", "train=false", out="run"))


def test_a_resume_into_the_runs_own_folder_passes_the_hydra_callback(tmp_path):
    last = _killed_run(tmp_path / "run")
    RunFolderCheck().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "run")}},
                                                    "ckpt_path": str(last)}))


def _ckpt(batch_size: int) -> dict:
    return {"state_dict": {}, "hyper_parameters": {"data_cfg": {"batch_size": batch_size}}}


def test_the_batch_size_check_applies_to_training_only(make_cfg):
    train = make_cfg("data.batch_size=16")
    evaluate = make_cfg("data.batch_size=16", "train=false")
    check_resume_batch_size(train, _ckpt(16), "x.ckpt")  # same size: a resume continues exactly
    with pytest.raises(UserError, match="data.batch_size=32, this run has data.batch_size=16"):
        check_resume_batch_size(train, _ckpt(32), "x.ckpt")
    # evaluation only: the batch size changes no metric, so any is fine
    check_resume_batch_size(evaluate, _ckpt(32), "x.ckpt")
    check_resume_batch_size(evaluate, _ckpt(16), "x.ckpt")
