"""The resume check compares values, not their Python types: a checkpoint of a module built in Python keeps
``betas=(0.9, 0.999)`` (the default, a tuple) where the config holds the list ``[0.9, 0.999]``; the same numbers
are no change. Other numbers are, named old -> new."""

import pytest
from omegaconf import OmegaConf

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.resume import check_resume_settings, resume_changes


def _cfg(betas, text_fields):
    return OmegaConf.create({"train": True, "model": {"_target_": "m.Model", "lr": 1e-3, "betas": betas},
                             "data": {"_target_": "d.Data", "max_length": 64, "text_fields": text_fields}})


def _ckpt(betas, text_fields):
    return {"hyper_parameters": {"lr": 1e-3, "betas": betas,
                                 "data_cfg": {"_target_": "d.Data", "max_length": 64, "text_fields": text_fields}}}


def test_a_tuple_in_the_checkpoint_equals_the_same_list_in_the_config():
    cfg, ckpt = _cfg([0.9, 0.999], ["text"]), _ckpt((0.9, 0.999), ("text",))
    assert resume_changes(cfg, ckpt) == {}
    check_resume_settings(cfg, ckpt, "last.ckpt")  # no error


def test_other_numbers_are_a_change():
    cfg, ckpt = _cfg([0.9, 0.999], ["text"]), _ckpt((0.8, 0.999), ("text", "title"))
    assert resume_changes(cfg, ckpt) == {"model.betas": ((0.8, 0.999), [0.9, 0.999]),
                                         "data.text_fields": (("text", "title"), ["text"])}
    with pytest.raises(UserError, match=r"model.betas \(0.8, 0.999\) -> \[0.9, 0.999\]"):
        check_resume_settings(cfg, ckpt, "last.ckpt")
