"""Run folders and resumes: a finished run is never overwritten, a resumed finished run reports its metrics,
a kill between an epoch's last batch and its validation resumes exactly, and metrics_history.csv keeps every
epoch (CPU, real offline data, 4 batches per epoch)."""

import csv
import json

import lightning.pytorch as pl
import pytest
from omegaconf import OmegaConf

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.checks import RunFolderCheck
from identifiable_transformers.run.history import FILENAME
from identifiable_transformers.run.training import run

# 2 epochs of 4 steps; last.ckpt also every 2 steps (never on an epoch's last batch)
RUN = ["trainer.max_epochs=2", "trainer.deterministic=true", "callbacks=[model_checkpoint,last_checkpoint]",
       "callbacks.last_checkpoint.every_n_train_steps=2", "model.dropout=0.3", "test=false"]


def _history(folder):
    with open(folder / FILENAME, newline="") as f:
        # the epoch's seconds differ from run to run; everything else must not
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)]


def test_a_finished_run_is_kept_reported_on_resume_and_its_history_written(make_cfg, tmp_path):
    first = run(make_cfg(*RUN, out="a"))
    rows = _history(tmp_path / "a")
    # one row per epoch at its last step; val/acc_best is the running max of val/acc
    assert [(int(r["epoch"]), int(r["step"])) for r in rows] == [(0, 4), (1, 8)]
    accs = [float(r["val/acc"]) for r in rows]
    assert [float(r["val/acc_best"]) for r in rows] == pytest.approx([accs[0], max(accs)])
    last = {k: float(v) for k, v in rows[-1].items() if k not in ("epoch", "step")}
    assert last == pytest.approx(first["metrics"])  # the last row is what metrics.json reports
    assert {"train/acc", "train/loss_epoch", "val/loss", "val/f1"} <= set(last)
    with open(tmp_path / "a" / FILENAME, newline="") as f:  # each epoch's seconds, beside the metrics
        timed = list(csv.DictReader(f))
    assert all(float(r["time/train_s"]) > 0 and float(r["time/val_s"]) > 0 for r in timed)
    assert first["timings"]["fit_s"] >= sum(float(r["time/train_s"]) + float(r["time/val_s"]) for r in timed)
    assert not any(k.startswith("time/") for k in first["metrics"])  # timings, not metrics

    # a fresh run into that folder would overwrite last.ckpt and metrics.json: refused, before any data
    with pytest.raises(UserError) as info:
        run(make_cfg(*RUN, out="a"))
    msg = str(info.value)
    assert str(tmp_path / "a") in msg and "hydra.run.dir" in msg and "ckpt_path=" in msg
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["metrics"] == first["metrics"]

    # resuming with another batch size would not replay the same batches
    last_ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError, match="data.batch_size=16, this run has data.batch_size=8"):
        run(make_cfg(*RUN, f"ckpt_path={last_ckpt}", "data.batch_size=8", out="c"))

    # resuming the finished run: nothing left to train, the same metrics (val/acc_best too) and history
    again = run(make_cfg(*RUN, f"ckpt_path={last_ckpt}", out="b"))
    assert again["metrics"] == first["metrics"] and again["metrics"]["val/acc_best"] is not None
    assert (again["best_epoch"], again["best_val_acc"]) == (first["best_epoch"], first["best_val_acc"])
    assert _history(tmp_path / "b") == rows

    # a checkpoint written before the history: val/acc_best from the model's checkpointed best
    import torch

    from identifiable_transformers.modules.checkpoint import write_checksum

    old = torch.load(last_ckpt, map_location="cpu", weights_only=True)
    old["callbacks"] = {k: v for k, v in old["callbacks"].items() if k != "MetricsHistory"}
    torch.save(old, tmp_path / "old.ckpt")
    write_checksum(tmp_path / "old.ckpt")
    older = run(make_cfg(*RUN, f"ckpt_path={tmp_path / 'old.ckpt'}", out="d"))
    assert older["metrics"]["val/acc_best"] == first["metrics"]["val/acc_best"]


class _Killed(Exception):
    pass


class _KillBeforeValidation(pl.Callback):
    """Dies after epoch ``epoch``'s last training batch, when its validation starts."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_validation_start(self, trainer, *args):
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch:
            raise _Killed(self.epoch)


@pytest.mark.parametrize("epoch", [0, 1], ids=["first_epoch", "last_epoch"])
def test_a_kill_before_an_epochs_validation_resumes_exactly(make_cfg, tmp_path, monkeypatch, epoch):
    import identifiable_transformers.run.training as training

    straight = run(make_cfg(*RUN, out="straight"))
    instantiate = training._instantiate_dict
    monkeypatch.setattr(training, "_instantiate_dict", lambda node: [*instantiate(node), _KillBeforeValidation(epoch)])
    with pytest.raises(_Killed):
        run(make_cfg(*RUN, out="killed"))
    monkeypatch.setattr(training, "_instantiate_dict", instantiate)
    resumed = run(make_cfg(*RUN, f"ckpt_path={tmp_path / 'killed' / 'checkpoints' / 'last.ckpt'}", out="resumed"))
    # a last.ckpt written on the epoch's last batch made Lightning skip that validation: best epoch lost or wrong
    assert resumed["best_epoch"] is not None
    assert (resumed["best_epoch"], resumed["best_val_acc"]) == (straight["best_epoch"], straight["best_val_acc"])
    assert resumed["metrics"] == straight["metrics"]
    assert _history(tmp_path / "resumed") == _history(tmp_path / "straight")


def test_a_read_only_run_folder_is_refused_before_hydra_and_before_the_data(make_cfg, tmp_path, read_only, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    read_only(folder)
    cfg = make_cfg()
    with pytest.raises(UserError, match=f"the run folder {folder} is not writable .* pass a writable hydra.run.dir"):
        run(cfg)
    assert list(folder.iterdir()) == []
    # train.py: Hydra's own log file and .hydra/ would fail first, with a traceback; its callback ends it cleanly
    with pytest.raises(SystemExit) as info:
        RunFolderCheck().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(folder)}}, "ckpt_path": None}))
    assert info.value.code == 1
    assert capsys.readouterr().err.strip() == f"Error: the run folder {folder} is not writable ({folder} is " \
        "read-only for this user): pass a writable hydra.run.dir=DIR."


def test_a_read_only_cache_serves_a_run(make_cfg, tmp_path, cache_dir, read_only):
    import shutil

    run(make_cfg(out="first"))  # builds the entry in the session cache, if no test did yet
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy, ignore=shutil.ignore_patterns("*.lock"))
    read_only(copy)
    before = {str(p) for p in copy.rglob("*")}
    cfg = make_cfg(out="second")
    cfg.paths.cache_dir = str(copy)  # data.cache_dir follows
    assert run(cfg)["metrics"]["test/acc"] >= 0
    assert {str(p) for p in copy.rglob("*")} == before  # no lock file, nothing built
