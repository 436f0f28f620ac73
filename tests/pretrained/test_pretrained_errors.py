"""model=pretrained's user mistakes end with one clear message naming the fix, before any data is prepared."""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from helpers import wordpiece_vocab

from identifiable_transformers.run.config_checks import check_config

ROOT = Path(__file__).resolve().parents[2]
BASE = ["model=pretrained", "data=rt_offline", "trainer=cpu", "logger=none"]


def _copy(src: Path, dst: Path, drop: tuple[str, ...]) -> Path:
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


def test_the_preset_passes_the_config_checks_with_a_checkpoint_folder(make_cfg, tiny_bert):
    check_config(make_cfg(*BASE, f"model.name_or_path={tiny_bert}", fast=False))
    with pytest.raises(ValueError, match="Missing mandatory value: model.name_or_path"):
        check_config(make_cfg(*BASE, fast=False))


def test_a_folder_without_config_or_weights(make_cfg, tiny_bert, tmp_path):
    no_config = _copy(tiny_bert, tmp_path / "no_config", ("config.json",))
    with pytest.raises(ValueError, match="has no config.json: it is not a Hugging Face checkpoint folder"):
        check_config(make_cfg(*BASE, f"model.name_or_path={no_config}", fast=False))
    no_weights = _copy(tiny_bert, tmp_path / "no_weights", ("model.safetensors",))
    with pytest.raises(ValueError, match="has a config.json but no weights"):
        check_config(make_cfg(*BASE, f"model.name_or_path={no_weights}", fast=False))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_config(make_cfg(*BASE, f"model.name_or_path={tmp_path / 'missing'}", fast=False))


def test_an_architecture_without_an_adapter(make_cfg, tmp_path):
    from transformers import AlbertConfig, AutoModel, BertTokenizer

    vocab = wordpiece_vocab()
    folder = tmp_path / "albert"
    AutoModel.from_config(AlbertConfig(vocab_size=len(vocab), embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=4, intermediate_size=37)).save_pretrained(folder)
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"is a 'albert' model .* the supported model types are \['bert'"):
        check_config(make_cfg(*BASE, f"model.name_or_path={folder}", fast=False))


def test_max_length_beyond_the_models_positions(make_cfg, tiny_bert):
    with pytest.raises(ValueError, match=r"^data.max_length \(model.max_len follows it\): max_len=200 is longer than "
                                         r"the 130 "):
        check_config(make_cfg(*BASE, f"model.name_or_path={tiny_bert}", "data.max_length=200", fast=False))


def test_model_max_len_set_alone_is_the_key_named(make_cfg, tiny_bert):
    with pytest.raises(ValueError, match=r"^model.max_len: max_len=600 is longer than the 130 tokens .* set it to 130"):
        check_config(make_cfg(*BASE, f"model.name_or_path={tiny_bert}", "model.max_len=600", fast=False))


def test_an_uncached_hub_id_fails_fast_offline(make_cfg, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="not in the Hugging Face cache, and HF_HUB_OFFLINE=1 is set.*hf downl"):
        check_config(make_cfg(*BASE, "model.name_or_path=identifiable-transformers-tests/no-such-model", fast=False))


def test_an_uncached_hub_id_fails_fast_when_the_hub_is_unreachable(make_cfg, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    with pytest.raises(ConnectionError, match=r"not in the Hugging Face cache, and the hub \(http://127.0.0.1:9\) is "
                                              "unreachable"):
        check_config(make_cfg(*BASE, "model.name_or_path=identifiable-transformers-tests/no-such-model", fast=False))


def test_the_command_line_prints_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli([sys.executable, str(ROOT / "train.py"), *BASE, f"model.name_or_path={tmp_path / 'empty'}",
                    f"paths.log_dir={tmp_path}/logs"], cwd=tmp_path, timeout=300,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "Error: data: model.name_or_path=" in proc.stderr and "has no config.json" in proc.stderr


def test_a_checkpoint_rebuilds_without_the_original_folder(tiny_bert, tmp_path):
    """The checkpoint carries the encoder's config: loading needs neither the hub nor the folder."""
    from identifiable_transformers.hf.module import PretrainedTextClassifier

    module = PretrainedTextClassifier(str(tiny_bert), num_classes=2)
    rebuilt = PretrainedTextClassifier("/nowhere", num_classes=2, hf_config=module.hparams.hf_config)
    rebuilt.load_state_dict(module.state_dict())
    ids = torch.tensor([[2, 10, 11, 3]])
    torch.testing.assert_close(rebuilt.eval()(ids).logits, module.eval()(ids).logits)


@pytest.mark.parametrize("name, cut, match", [
    ("config.json", lambda b: b[: len(b) // 2], r"config\.json is not valid JSON \(.*\): the file is damaged"),
    ("model.safetensors", lambda b: b[: len(b) // 2], r"model\.safetensors cannot be read \(.*\): the file is damaged"),
])
def test_a_damaged_file_of_the_folder_is_named_in_one_error_line(tiny_bert, tmp_path, name, cut, match):
    folder = _copy(tiny_bert, tmp_path / "damaged", ())
    (folder / name).write_bytes(cut((folder / name).read_bytes()))
    proc = run_cli([sys.executable, str(ROOT / "train.py"), *BASE, f"model.name_or_path={folder}",
                    f"paths.log_dir={tmp_path}/logs"], cwd=tmp_path, timeout=300,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and re.search(match, lines[-1]), proc.stderr[-3000:]
    assert f"model.name_or_path={folder}" in lines[-1]


@pytest.mark.parametrize("name, data, match", [("model.safetensors", b"12345", r"model\.safetensors cannot be read"),
                                               ("tokenizer.json", b"{", r"tokenizer\.json is not valid JSON")])
def test_every_damaged_file_is_named_before_the_data(make_cfg, tiny_bert, tmp_path, name, data, match):
    folder = _copy(tiny_bert, tmp_path / "damaged", ())
    (folder / name).write_bytes(data)
    with pytest.raises(ValueError, match=match):
        check_config(make_cfg(*BASE, f"model.name_or_path={folder}", fast=False))


def test_a_home_folder_is_written_quoted_as_the_docs_say(make_cfg):
    from hydra.errors import OverrideParseException

    from identifiable_transformers.hf.loading import is_local

    with pytest.raises(OverrideParseException):
        make_cfg(*BASE, "model.name_or_path=~/models/x", fast=False)  # unquoted: Hydra's parse error, so the docs say quote it
    cfg = make_cfg(*BASE, 'model.name_or_path="~/models/x"', fast=False)  # docs/pretrained.md's form
    assert cfg.model.name_or_path == "~/models/x" and is_local(cfg.model.name_or_path)
