"""metrics_history.csv: an epoch without validation has empty val/* cells (history.py).

Lightning keeps the last validation's values in ``trainer.callback_metrics`` through later epochs, so a
history that reads them there would repeat them. Checked on a real run that validates every second
epoch, and on the callback alone with a stand-in trainer whose metrics are written by hand.
"""

from __future__ import annotations

import csv
from types import SimpleNamespace

import torch

from identifiable_transformers.run.history import FILENAME, MetricsHistory
from identifiable_transformers.run.training import run


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_run_validating_every_second_epoch_leaves_the_other_epochs_val_cells_empty(make_cfg, tmp_path):
    cfg = make_cfg("trainer.max_epochs=3", "trainer.check_val_every_n_epoch=2", "trainer.limit_train_batches=2",
                   "trainer.limit_val_batches=1", "test=false", "callbacks=[model_checkpoint,last_checkpoint]",
                   out="run")
    run(cfg)
    rows = _rows(tmp_path / "run" / FILENAME)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    val_keys = [k for k in rows[0] if k.startswith("val/")]
    assert "val/acc" in val_keys
    # validation ran after epoch 1 only (check_val_every_n_epoch=2 counts epochs from 1)
    assert rows[1]["val/acc"] != "" and 0.0 <= float(rows[1]["val/acc"]) <= 1.0
    for r in (rows[0], rows[2]):
        assert all(r[k] == "" for k in val_keys), r
    # every epoch has its own training metrics
    assert all(r["train/loss_epoch"] != "" for r in rows)


class _Trainer(SimpleNamespace):
    pass


def _trainer(epoch: int, step: int, metrics: dict) -> _Trainer:
    return _Trainer(sanity_checking=False, fast_dev_run=False, state=SimpleNamespace(fn="fit"), is_global_zero=True,
                    current_epoch=epoch, global_step=step,
                    callback_metrics={k: torch.tensor(v) for k, v in metrics.items()})


def test_the_history_callback_keeps_validation_values_to_their_own_epoch(tmp_path):
    cb = MetricsHistory(tmp_path)
    # epoch 0: trained and validated
    t = _trainer(0, 10, {"train/loss_epoch": 0.9, "val/acc": 0.6, "val/loss": 0.7})
    cb.on_validation_end(t, None)
    cb.on_train_epoch_end(t, None)
    # epoch 1: trained only; Lightning still holds epoch 0's val/* in callback_metrics
    t = _trainer(1, 20, {"train/loss_epoch": 0.5, "val/acc": 0.6, "val/loss": 0.7})
    cb.on_train_epoch_end(t, None)
    # epoch 2: validated again, with new values
    t = _trainer(2, 30, {"train/loss_epoch": 0.4, "val/acc": 0.8, "val/loss": 0.3})
    cb.on_validation_end(t, None)
    cb.on_train_epoch_end(t, None)
    rows = _rows(tmp_path / FILENAME)
    got = [(r["epoch"], r["step"], r["train/loss_epoch"], r["val/acc"], r["val/loss"]) for r in rows]
    assert got == [("0", "10", "0.8999999761581421", "0.6000000238418579", "0.699999988079071"),
                   ("1", "20", "0.5", "", ""),
                   ("2", "30", "0.4000000059604645", "0.800000011920929", "0.30000001192092896")]
    assert cb.final_metrics()["val/acc"] == float(torch.tensor(0.8))
