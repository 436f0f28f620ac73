"""A resume continues the checkpoint's optimiser, schedule and data: a setting changed on the command line would
be recorded without being applied. Resuming training with any other model or data setting is refused, naming each
changed key (old -> new); evaluating a checkpoint records the optimisation settings its weights were trained with.
The reference values are read from the checkpoint file itself."""

import json

import pytest
import torch
import yaml

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.training import run


@pytest.fixture
def trained(make_cfg):
    result = run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", "test=false", out="first"))
    last = result["best_model_path"].rsplit("/", 1)[0] + "/last.ckpt"
    return last, torch.load(last, map_location="cpu", weights_only=True)["hyper_parameters"]


CHANGES = [
    {"model.lr": 0.01},
    {"model.weight_decay": 0.5, "model.warmup_steps": 7},
    {"model.scheduler": "cosine"},
    {"model.betas": [0.8, 0.9]},
    {"model.label_smoothing": 0.1},
    {"model.dropout": 0.3},
    {"model.activation": "gelu"},  # same shapes, another computation
    {"data.max_length": 48},
]


def test_resuming_training_with_changed_settings_is_refused_naming_them(make_cfg, trained, tmp_path):
    last, hp = trained
    for i, changes in enumerate(CHANGES):
        overrides = [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in changes.items()]
        with pytest.raises(UserError) as err:
            run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={last}", *overrides,
                         out=f"resumed{i}"))
        message = str(err.value)
        for key, new in changes.items():
            section, name = key.split(".")
            old = hp[name] if section == "model" else hp["data_cfg"][name]
            if isinstance(old, (list, tuple)):
                old, new = list(old), list(new)
            assert f"{key} {old!r} -> {new!r}" in message, message
        assert "Resume with the original values (" in message and "start a new run without ckpt_path" in message
        assert "\n" not in message
        assert [p.name for p in (tmp_path / f"resumed{i}").iterdir()] == [".run.lock"]  # refused before any work


def test_the_same_settings_resume(make_cfg, trained, tmp_path):
    last, hp = trained
    # model.compile and the data's where-and-how-fast settings may differ; the run resumes (nothing left to train)
    result = run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={last}", "data.num_workers=0",
                          "data.eval_batch_size=7", "test=false", out="resumed"))
    assert result["config"]["model"]["lr"] == hp["lr"]


def test_evaluating_records_the_optimisation_settings_the_weights_were_trained_with(make_cfg, trained, tmp_path):
    last, hp = trained
    assert hp["lr"] != 0.05 and hp["warmup_steps"] != 3
    run(make_cfg("train=false", f"ckpt_path={last}", "model.lr=0.05", "model.warmup_steps=3", out="evaluated"))
    folder = tmp_path / "evaluated"
    recorded = json.loads((folder / "metrics.json").read_text())["config"]["model"]
    resolved = yaml.safe_load((folder / "config_resolved.yaml").read_text())["model"]
    for record in (recorded, resolved):
        assert (record["lr"], record["warmup_steps"]) == (hp["lr"], hp["warmup_steps"])
    with pytest.raises(UserError, match=r"model.activation 'relu' -> 'gelu'.*Pass the settings it was trained with"):
        run(make_cfg("train=false", f"ckpt_path={last}", "model.activation=gelu", out="other"))


RUN_CHANGES = [  # each changes what training computes, or which checkpoint is the best; none is a model setting
    ({"seed": 7}, "seed 42 -> 7", "seed=42"),
    ({"trainer.accumulate_grad_batches": 2}, "trainer.accumulate_grad_batches 1 -> 2", "trainer.accumulate_grad_batches=1"),
    ({"trainer.gradient_clip_val": 0.01}, "trainer.gradient_clip_val 1.0 -> 0.01", "trainer.gradient_clip_val=1.0"),
    ({"trainer.precision": "bf16-mixed"}, "trainer.precision '32-true' -> 'bf16-mixed'", "trainer.precision=32-true"),
    ({"trainer.limit_train_batches": 3}, "trainer.limit_train_batches 4 -> 3", "trainer.limit_train_batches=4"),
    ({"callbacks.model_checkpoint.monitor": "val/f1"}, "callbacks.model_checkpoint.monitor 'val/acc' -> 'val/f1'",
     "callbacks.model_checkpoint.monitor=val/acc"),
]


@pytest.mark.parametrize("changes, named, original", RUN_CHANGES)
def test_resuming_with_other_run_settings_is_refused_naming_them(make_cfg, trained, tmp_path, changes, named,
                                                                  original):
    last, _ = trained
    with pytest.raises(UserError) as err:
        run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={last}",
                     *(f"{k}={v}" for k, v in changes.items()), out="resumed"))
    message = str(err.value)
    assert named in message and f"Resume with the original values ({original})" in message, message
    assert [p.name for p in (tmp_path / "resumed").iterdir()] == [".run.lock"]  # refused before any work


def test_a_longer_run_is_applied_from_the_resumed_step_and_recorded(make_cfg, trained, tmp_path):
    last, _ = trained
    step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    assert step == 4  # one epoch of 4 batches (conftest FAST)
    result = run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={last}", "trainer.max_epochs=2",
                          "test=false", out="longer"))
    assert result["epochs_run"] == 2
    recorded = json.loads((tmp_path / "longer" / "metrics.json").read_text())["resume_changes"]
    assert recorded == [{"step": 4, "changes": {"trainer.max_epochs": [1, 2]}}]
    # the record travels on: the longer run's own checkpoint holds the new value and the change
    saved = torch.load(tmp_path / "longer" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 8 and saved["run_settings"]["settings"]["trainer.max_epochs"] == 2
    assert saved["run_settings"]["changes"] == recorded


def test_resuming_training_on_another_number_of_processes_is_refused(make_cfg, trained, tmp_path):
    last, _ = trained
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["run_settings"]["world_size"] == 1  # recorded by the run
    ckpt["run_settings"]["world_size"] = 2  # as a 2-process (ddp) run writes it
    two = tmp_path / "two.ckpt"
    torch.save(ckpt, two)
    with pytest.raises(UserError, match=r"was trained on 2 process\(es\) .*this run has 1: .*Resume on the same number"):
        run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={two}", out="resumed"))
    result = run(make_cfg("callbacks=[model_checkpoint,last_checkpoint]", f"ckpt_path={two}", "train=false",
                          out="evaluated"))  # evaluation on another number of processes is fine
    assert "test/acc" in result["metrics"]
