"""User mistakes end with one short message and exit status 1; bugs keep their traceback.

The subprocess tests run the real entry scripts; most mistakes are found before any data is prepared.
"""

import os
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli
from omegaconf import OmegaConf

from identifiable_transformers.common.errors import ConfigError, user_error_message
from identifiable_transformers.run.config_checks import check_config, describe, matches

ROOT = Path(__file__).resolve().parents[1]


def _script(script, *args, tmp_path, cache_dir, env=None):
    cmd = [sys.executable, str(ROOT / script), *args]
    if script == "train.py":
        cmd += ["logger=none", "trainer=cpu", f"paths.cache_dir={cache_dir}"]
    cmd += [f"paths.log_dir={tmp_path}/logs"]
    return run_cli(cmd, cwd=tmp_path, timeout=300,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), **(env or {})})


def _our_lines(stderr: str) -> list[str]:
    """stderr without Lightning's and the data layer's log lines (not part of the error path)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("INFO:", "WARNING:", "["))]


def _assert_clean(proc, *expected):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = _our_lines(proc.stderr)
    assert 1 <= len(lines) <= 5, lines
    for text in expected:
        assert text in proc.stderr, (text, proc.stderr)


# (overrides, texts the message must contain); more cases of the config checks are tested in-process below
CASES = {
    "bad_type": (["trainer.max_epochs=two"], ["Error: trainer.max_epochs='two' is not an int",
                                              "pass e.g. trainer.max_epochs=10"]),
    "bad_shape": (["model=baseline", "model.embed_dim=30"], ["model.embed_dim", "not divisible by num_heads=4"]),
    "missing_file": (["data=local", "data.train_file=/nope.csv"], ["Error: train_file='/nope.csv' does not exist"]),
    "missing_column": (["data=local", "data.train_file=table.csv"], ["text_fields=['text']", "columns found"]),
    "data_value": (["data.batch_size=0"], ["Error: data: batch_size=0 must be >= 1: set data.batch_size"]),
}


@pytest.mark.parametrize("case", CASES)
def test_user_mistake_ends_with_a_short_message_and_status_1(tmp_path, cache_dir, case):
    (tmp_path / "table.csv").write_text("sentence,label\ngood film,1\nbad film,0\n")
    overrides, expected = CASES[case]
    _assert_clean(_script("train.py", *overrides, tmp_path=tmp_path, cache_dir=cache_dir), *expected)


def test_hub_unavailable_ends_cleanly(tmp_path, cache_dir):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "ds")}
    proc = _script("train.py", "data=agnews", tmp_path=tmp_path, cache_dir=cache_dir, env=env)
    _assert_clean(proc, "Error: hub_id='fancyzhx/ag_news'", "not in the local cache")


@pytest.mark.parametrize("overrides, expected", [
    (["data=agnewz"], ["Could not find 'data/agnewz'", "agnews"]),  # Hydra lists the available options
    (["trainer.max_epoch=3"], ["Could not override 'trainer.max_epoch'"]),
], ids=["unknown_option", "unknown_key"])
def test_hydra_composition_errors_are_short(tmp_path, cache_dir, overrides, expected):
    proc = _script("train.py", *overrides, tmp_path=tmp_path, cache_dir=cache_dir)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) <= 28, proc.stderr  # 16 dataset names, Hydra's search path
    for text in expected:
        assert text in proc.stderr


def test_hydra_full_error_shows_the_traceback(tmp_path, cache_dir):
    proc = _script("train.py", "trainer.max_epochs=two", tmp_path=tmp_path, cache_dir=cache_dir,
                   env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ConfigError: trainer.max_epochs='two'" in proc.stderr, proc.stderr


BUGGY = """
import lightning.pytorch as pl


class Callback(pl.Callback):
    def on_fit_start(self, trainer, module):
        raise ValueError("a bug, not a user mistake")
"""


def test_a_bug_keeps_its_traceback(tmp_path, cache_dir):
    # a ValueError raised outside the project (here in a callback's own code) is not a user mistake
    (tmp_path / "buggy.py").write_text(BUGGY)
    proc = _script("train.py", "+callbacks.bug._target_=buggy.Callback", "data.max_length=32", tmp_path=tmp_path,
                   cache_dir=cache_dir)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ValueError: a bug, not a user mistake" in proc.stderr, proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("Error: ")], proc.stderr  # not our message


def test_multirun_stops_at_the_first_mistake_naming_the_job(tmp_path, cache_dir):
    proc = _script("train.py", "-m", "model.embed_dim=abc,16", tmp_path=tmp_path, cache_dir=cache_dir)
    _assert_clean(proc, "Error in job 0: model.embed_dim='abc' is not an int")
    assert not list((tmp_path / "logs").rglob("metrics.json"))


def test_analyze_missing_checkpoint_ends_cleanly(tmp_path, cache_dir):
    proc = _script("analyze.py", "ckpt_path=/nope/last.ckpt", "text=a fine film", tmp_path=tmp_path,
                   cache_dir=cache_dir)
    _assert_clean(proc, "Error: ckpt_path='/nope/last.ckpt' is not a file")


# ---------------------------------------------------------------- the checks themselves, in-process


@pytest.mark.parametrize("override, message", [
    ("trainer.precision=17", "trainer.precision=17 is not one of 64, 32, 16, 'transformer-engine'"),
    ("trainer.deterministic=maybe", "='maybe' is not one of 'warn' or true or false or null"),
    ("model.betas=[0.9]", "model.betas=[0.9] is not a list of 2 (a number, a number): "
                          "pass e.g. model.betas=[0.9,0.999]"),
    ("model.norm_first=1", "model.norm_first=1 is not true or false: pass e.g. model.norm_first=false"),
    ("data.text_fields=3", "data.text_fields=3 is not a list of a string"),
    ("data.val_fraction=a", "data.val_fraction='a' is not a number"),
    ("callbacks.model_checkpoint.save_top_k=x", "callbacks.model_checkpoint.save_top_k='x' is not an int"),
    ("+trainer.max_epochz=3", "trainer.max_epochz is not an option of lightning.pytorch.Trainer: did you mean"),
    ("data._target_=nowhere.Data", "data._target_='nowhere.Data' cannot be imported"),
    ("model.max_len=16", "model.max_len=16 is below data.max_length=64"),
    ("model.key_dim=0", "model.key_dim: key_dim must be >= 1, got 0"),
    ("model.dropout=2", "model.dropout: dropout must be in [0, 1), got 2"),
    ("model.embed_dim=abc", "model.embed_dim='abc' is not an int: pass e.g. model.embed_dim=64"),
    ("+model.embed_dims=30", "model.embed_dims is not an option of "
                             "identifiable_transformers.modules.classifier.TextClassifier: did you mean model.embed_dim?"),
    ("+model.zzz=30", "its options: vocab_size, num_classes, embed_dim"),
    # element types of list values, and no boolean for a string (data.name=true ended in a TypeError)
    ("data.label_names=[[neg],[pos]]", "data.label_names=[['neg'], ['pos']] is not a list of a string or null: "
                                       "pass e.g. data.label_names=[text]"),
    ("data.text_fields=[text,[title]]", "is not a list of a string"),
    ("data.name=true", "data.name=True is not a string: pass e.g. data.name=rt_offline"),
    ("data.hub_config=false", "data.hub_config=False is not a string or null"),
    # ranges the model, the optimiser and the data module check at construction, before any data
    ("model.embed_dim=0", "model.embed_dim: embed_dim must be >= 1, got 0"),
    ("model.num_heads=0", "model.num_heads: num_heads must be >= 1, got 0"),
    ("model.lr=-0.001", "model.lr: lr must be >= 0, got -0.001"),
    ("model.warmup_steps=-1", "model.warmup_steps: warmup_steps must be >= 0, got -1"),
    ("model.label_smoothing=1", "model.label_smoothing: label_smoothing must be in [0, 1), got 1"),
    ("seed=abc", "seed='abc' is not an int or null: pass e.g. seed=42"),
    ("train=yes", "train='yes' is not true or false: pass e.g. train=true"),
    ("data.batch_size=0", "data: batch_size=0 must be >= 1: set data.batch_size to a positive number"),
    ("data.eval_batch_size=-5", "data: eval_batch_size=-5 must be >= 1: set data.eval_batch_size"),
    ("data.num_workers=-1", "data: num_workers=-1 must be >= 0: set data.num_workers=0"),
    ("data.max_length=1", "data: max_length=1 is too small: set data.max_length >= 2"),
    ("data.name=foo", "data: Unknown dataset name='foo'. Known datasets: agnews,"),
])
def test_check_config_names_key_value_and_expected_type(make_cfg, override, message):
    with pytest.raises(ConfigError) as info:
        check_config(make_cfg(override))
    assert message in str(info.value)
    assert "\n" not in str(info.value) and user_error_message(info.value) == str(info.value)  # one Error: line


@pytest.mark.parametrize("key", ["paths.cache_dir", "data.cache_dir"])
def test_a_cache_dir_that_is_a_file_is_found_before_the_data(make_cfg, tmp_path, key):
    (tmp_path / "a_file").write_text("x")
    for value in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        cfg = make_cfg()
        OmegaConf.update(cfg, key, str(value))
        with pytest.raises(ConfigError, match=f"{key}=.*a_file.* is not a folder .*a_file is a file"):
            check_config(cfg)


def test_missing_checkpoint_is_found_before_the_data(make_cfg):
    with pytest.raises(FileNotFoundError, match="ckpt_path=/nope/x.ckpt does not exist"):
        check_config(make_cfg("ckpt_path=/nope/x.ckpt"))


PRESETS = [f"{group}={p.stem}" for group in ("data", "model", "trainer", "callbacks", "logger", "debug", "experiment",
                                             "hparams_search") for p in sorted((ROOT / "conf" / group).glob("*.yaml"))
           if f"{group}={p.stem}" != "model=pretrained"]  # needs a checkpoint folder: tests/pretrained/
VALID = [["model.key_dim=1", "model.value_dim=3", "model.embed_dim=30"], ["data.text_fields=text"],
         ["data.hub_config=2020"], ["trainer.precision=bf16-mixed"], ["trainer.devices=[0]"],
         ["trainer.max_epochs=null"],
         ["callbacks=[default,early_stopping]"]]


@pytest.mark.parametrize("extra", [[p] for p in PRESETS] + VALID, ids=lambda x: " ".join(x))
def test_check_config_accepts_the_shipped_presets(make_cfg, tmp_path, extra):
    if extra == ["data=local"]:
        (tmp_path / "train.csv").write_text("text,label\ngood,1\n")
        extra = [*extra, f"data.train_file={tmp_path / 'train.csv'}"]
    check_config(make_cfg(*extra, fast=False))


def test_matches_and_describe_follow_annotations():
    from collections.abc import Mapping, Sequence
    from typing import Literal, Optional, Union

    assert matches(3, float) and not matches(True, int) and not matches("3", int) and matches(None, Optional[int])  # noqa: UP045 (typing forms on purpose)
    assert matches("a", Sequence[str]) and not matches("a", list[str]) and matches(["a"], list[str])
    assert matches({"train": None}, Mapping[str, str | None]) and not matches({"t": [1]}, Mapping[str, str])
    assert not matches(1, Literal["1"]) and matches("1", Literal["1"]) and not matches(1, Literal[True])
    assert matches({"_target_": "x.Y"}, int)  # instantiated into an object first
    assert matches("anything", Path) and matches(1, object)  # classes: left to the target
    assert describe(Optional[int]) == "an int or null"  # noqa: UP045
    assert describe(Union[Literal[1, 2], Literal["a"], None]) == "one of 1, 2, 'a' or null"  # noqa: UP007


def test_only_the_projects_own_raises_are_user_mistakes(tmp_path):
    import fractions

    from identifiable_transformers.data.prepare import check_fraction

    with pytest.raises(ValueError) as ours:
        check_fraction("val_fraction", 2.0)
    assert user_error_message(ours.value) == str(ours.value)
    with pytest.raises(ValueError) as theirs:
        fractions.Fraction("two")  # raised in the standard library
    assert user_error_message(theirs.value) is None  # a library's ValueError: a bug, keep the traceback
    with pytest.raises(ZeroDivisionError) as bug:
        check_fraction("val_fraction", 1 / 0)
    assert user_error_message(bug.value) is None
    missing = OmegaConf.create({"ckpt_path": "???"})
    with pytest.raises(Exception) as info:
        _ = missing.ckpt_path
    assert user_error_message(info.value).startswith("ckpt_path is required")
