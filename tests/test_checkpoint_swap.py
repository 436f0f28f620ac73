"""last.ckpt survives a kill in the middle of its swap; the data module's own class path is accepted.

The swap writes the new state to a temporary file and renames it over last.ckpt, with a checksum file
beside it. A kill can land between any two steps; whichever last.ckpt is then on disk must match its
checksum (read_checkpoint accepts it). Simulated here by making the rename onto last.ckpt fail, with a
stand-in trainer whose ``save_checkpoint`` writes a small genuine checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from identifiable_transformers import checkpoint as ckpt_mod
from identifiable_transformers.data import TextDataModule
from identifiable_transformers.modules.checkpoint import (
    CheckpointError,
    LastCheckpoint,
    data_module_kwargs,
    read_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]


class _Killed(Exception):
    pass


def _trainer(step: int):
    def save_checkpoint(path, weights_only=False):
        torch.save({"state_dict": {"w": torch.full((3,), float(step))}, "hyper_parameters": {}, "global_step": step},
                   path)

    # a validation inside the epoch (val_check_interval), which saves last.ckpt at once
    mid_epoch = SimpleNamespace(is_last_batch=False, current=SimpleNamespace(ready=1))
    return SimpleNamespace(sanity_checking=False, fast_dev_run=False, state=SimpleNamespace(fn="fit"),
                           is_global_zero=True, global_step=step, checkpoint_callbacks=[],
                           save_checkpoint=save_checkpoint, num_training_batches=10,
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=mid_epoch)))


def _kill_at_rename_onto(target: Path, monkeypatch) -> list:
    """Every way of renaming a file onto ``target`` raises (the process 'dies' there); returns the attempts."""
    attempts = []
    real_replace, real_rename = os.replace, os.rename

    def guard(real):
        def wrapped(src, dst, *a, **kw):
            if Path(dst).resolve() == target.resolve():
                attempts.append(str(src))
                # what a real kill leaves on disk: the exception below lets the writer clean its temporary file up
                shutil.copyfile(src, f"{src}.left")
                raise _Killed(f"killed while renaming {src} onto {dst}")
            return real(src, dst, *a, **kw)
        return wrapped

    monkeypatch.setattr(os, "replace", guard(real_replace))
    monkeypatch.setattr(os, "rename", guard(real_rename))
    return attempts


def test_a_kill_before_the_rename_leaves_the_previous_last_ckpt_readable(tmp_path, monkeypatch):
    cb = LastCheckpoint(tmp_path)
    cb.on_validation_end(_trainer(1), None)  # epoch 1 saved completely
    last = tmp_path / "last.ckpt"
    assert read_checkpoint(last)[0]["global_step"] == 1
    attempts = _kill_at_rename_onto(last, monkeypatch)
    with pytest.raises(_Killed):
        cb.on_validation_end(_trainer(2), None)  # dies as the step-2 state is moved onto last.ckpt
    monkeypatch.undo()
    assert attempts, "the swap never renamed a file onto last.ckpt: this simulated kill no longer applies"
    # what is on disk is the epoch-1 file, and its checksum file still vouches for it
    state, _ = read_checkpoint(last)
    assert state["global_step"] == 1 and torch.equal(state["state_dict"]["w"], torch.full((3,), 1.0))
    # the next save completes the swap, and the new file is accepted too
    cb.on_validation_end(_trainer(3), None)
    assert read_checkpoint(last)[0]["global_step"] == 3


def test_the_temporary_file_of_a_killed_swap_also_matches_the_checksum(tmp_path, monkeypatch):
    # Whichever of the two files a recovery keeps (the old last.ckpt, or the new one moved by hand) matches.
    cb = LastCheckpoint(tmp_path)
    cb.on_validation_end(_trainer(1), None)
    last = tmp_path / "last.ckpt"
    attempts = _kill_at_rename_onto(last, monkeypatch)
    with pytest.raises(_Killed):
        cb.on_validation_end(_trainer(2), None)
    monkeypatch.undo()
    assert len(attempts) == 1
    new = Path(f"{attempts[0]}.left")  # the temporary file a real kill leaves
    assert new.is_file()
    new.replace(last)  # finish the swap by hand
    assert read_checkpoint(last)[0]["global_step"] == 2


def test_a_damaged_last_ckpt_is_still_refused_after_a_swap(tmp_path):
    # the checksum file must not accept anything: a truncated last.ckpt stays a CheckpointError
    cb = LastCheckpoint(tmp_path)
    cb.on_validation_end(_trainer(1), None)
    cb.on_validation_end(_trainer(2), None)
    last = tmp_path / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        read_checkpoint(last)


# ----------------------------------------------------------------------------------------------
# The data module's class path in a checkpoint's data_cfg
# ----------------------------------------------------------------------------------------------
def _class_path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_data_module_class_path_and_the_configs_target_are_accepted():
    config_target = yaml.safe_load((ROOT / "conf/data/base/text_classification.yaml").read_text())["_target_"]
    for target in (_class_path(TextDataModule), config_target, "identifiable_transformers.data.TextDataModule"):
        assert data_module_kwargs({"_target_": target, "name": "x", "max_length": 8}) == {"name": "x", "max_length": 8}
    assert data_module_kwargs({"name": "x"}) == {"name": "x"}  # no _target_ at all


@pytest.mark.parametrize("target", [
    "identifiable_transformers.data.datamodule.TextDataModuleX",
    "identifiable_transformers.data.datamodule_evil.TextDataModule",
    "identifiable_transformers.data.datamodule",
    "os.system",
])
def test_near_misses_of_the_class_path_are_refused(target):
    with pytest.raises(CheckpointError, match="_target_="):
        data_module_kwargs({"_target_": target, "name": "x"})


def test_the_module_constant_names_the_class_where_it_lives():
    # the exact path where the class is defined is one of the accepted targets
    assert _class_path(TextDataModule) in ckpt_mod.DATA_MODULE_TARGETS


# The pretrained data module lives in hf/, a layer above modules/: the caller passes it, or it is found once hf/ has
# defined it; modules/checkpoint.py never imports it (tests/test_imports.py).
def test_the_caller_passes_the_pretrained_data_module():
    class Stand(TextDataModule):
        def __init__(self, name: str = "x", pretrained_tokenizer: str = "", cache_dir: str = ""):
            self.args = (name, pretrained_tokenizer, cache_dir)

    data_cfg = {"_target_": ckpt_mod.PRETRAINED_DATA_TARGETS[1], "name": "rt", "pretrained_tokenizer": "m"}
    passed = dict.fromkeys(ckpt_mod.PRETRAINED_DATA_TARGETS, Stand)
    built = ckpt_mod.data_module_from_checkpoint(data_cfg, "/here", data_modules=passed)
    assert isinstance(built, Stand) and built.args == ("rt", "m", "/here")
    with pytest.raises(CheckpointError, match=r"keys \['evil'\]"):  # checked against the class passed
        data_module_kwargs({**data_cfg, "evil": 1}, data_modules=passed)
    with pytest.raises(CheckpointError, match="_target_="):  # a name outside the allowed ones, even if passed
        data_module_kwargs({"_target_": "attacker.Data"}, data_modules={"attacker.Data": Stand})
    with pytest.raises(RuntimeError, match="has not loaded: pass it as data_modules"):
        data_module_kwargs(data_cfg, data_modules={})  # neither passed nor defined: a program error, said so


def test_the_pretrained_data_module_is_found_once_hf_defines_it():
    from identifiable_transformers.hf.data import PretrainedTextDataModule

    found = ckpt_mod.default_data_modules()
    assert [found[name] for name in ckpt_mod.PRETRAINED_DATA_TARGETS] == [PretrainedTextDataModule] * 2
    assert _class_path(PretrainedTextDataModule) == ckpt_mod.PRETRAINED_DATA_TARGETS[0]
