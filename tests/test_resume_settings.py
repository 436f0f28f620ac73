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
