"""Inputs refused before any work, each with one ``Error:`` line naming the problem and the fix (issue 32, section 2):
config values train.py would only trip over after training, and analyze.py's texts and example counts."""

import os
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from identifiable_transformers.common.errors import ConfigError, user_error_message
from identifiable_transformers.run.config_checks import check_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides, message", [
    (["callbacks.faithfulness.ig_steps=0"], "callbacks.faithfulness.ig_steps=0 must be >= 1 (integrated-gradients "
                                            "steps of the end-of-fit stage, which runs after training): pass e.g. "
                                            "callbacks.faithfulness.ig_steps=32, or turn the stage off with "
                                            "callbacks.faithfulness.final=false"),
    (["callbacks.faithfulness.ig_steps=-3"], "callbacks.faithfulness.ig_steps=-3 must be >= 1"),
    (["callbacks.faithfulness.explainers=attention"], "callbacks.faithfulness.explainers='attention' is a string, but "
                                                      "a list is expected: pass e.g. "
                                                      "callbacks.faithfulness.explainers=[attention]"),
    (["data.label_names=neg"], "data.label_names='neg' is a string, but a list is expected"),
    (["model.betas=abc"], "model.betas='abc' is not a list of 2 (a number, a number): pass e.g. "
                          "model.betas=[0.9,0.999]"),  # a string its elements could not be: the plain type message
    (["test=no"], "test='no' is not true or false: pass e.g. test=true"),
    (["test=1"], "test=1 is not true or false"),
])
def test_a_value_that_would_fail_late_is_refused_before_training(make_cfg, overrides, message):
    with pytest.raises(ConfigError) as info:
        check_config(make_cfg(*overrides, fast=False))
    assert message in str(info.value)
    assert "\n" not in str(info.value) and user_error_message(info.value) == str(info.value)


@pytest.mark.parametrize("overrides", [
    ["callbacks.faithfulness.ig_steps=0", "callbacks.faithfulness.final=false"],  # the stage that uses it is off
    ["callbacks.faithfulness.explainers=[attention]"],
    ["data.text_fields=text"],  # the data module takes one column name as a list of it
    ["test=false"],
])
def test_the_same_keys_with_usable_values_pass(make_cfg, overrides):
    check_config(make_cfg(*overrides, fast=False))


def test_ig_steps_zero_ends_train_py_before_any_data(tmp_path, cache_dir):
    proc = run_cli(
        [sys.executable, str(ROOT / "train.py"), "logger=none", "trainer=cpu", "callbacks.faithfulness.ig_steps=0",
         f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("Error: callbacks.faithfulness.ig_steps=0 must be >= 1"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache").exists()  # refused before the data was prepared


# ------------------------------------------------------------------------------------------------ analyze.py
@pytest.fixture(scope="module")
def tiny_ckpt(one_step_checkpoint) -> Path:
    """A one-step checkpoint with the project's tokenizer (it drops HTML line breaks, as for IMDb)."""

    from identifiable_transformers.data.tokenizer import train_tokenizer
    from identifiable_transformers.modules.classifier import TextClassifier

    tok = train_tokenizer(["a fine film", "a dull film", "fine and dull"] * 2, vocab_size=20)
    module = TextClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, ffn_dim=16, max_len=16,
                            label_names=["neg", "pos"], tokenizer_json=tok.to_str())
    return one_step_checkpoint(module, tok.get_vocab_size())


@pytest.mark.parametrize("text, entries", [('"<br />"', "[0]: '<br />'"),
                                           ('["a fine film", "<br/>  <br>"]', "[1]: '<br/>  <br>'")])
def test_a_text_with_nothing_left_after_normalisation_is_refused(tiny_ckpt, tmp_path, run_analyze, text, entries):
    with pytest.raises(ValueError) as info:
        run_analyze([f"ckpt_path={tiny_ckpt}", f"text={text}", f"output_dir={tmp_path / 'out'}"])
    assert str(info.value) == (f"text has no token left after the tokenizer's normalisation (entries {entries}): "
                               "pass a text with words in it")
    assert not (tmp_path / "out" / "report.html").exists()


@pytest.mark.parametrize("value, says", [("0", "num_examples=0 must be >= 1"), ("-2", "num_examples=-2 must be >= 1"),
                                         ("abc", "num_examples='abc' is not an int")])
def test_split_mode_needs_a_positive_number_of_examples(tmp_path, run_analyze, value, says):
    ckpt = tmp_path / "never_read.ckpt"
    ckpt.write_bytes(b"the count is checked before the checkpoint is read")
    with pytest.raises(ValueError, match=f"^{says}: pass e.g. num_examples=8"):
        run_analyze([f"ckpt_path={ckpt}", "split=validation", f"num_examples={value}"])


def test_analyze_text_with_nothing_left_through_the_command_line(tiny_ckpt, tmp_path):
    proc = run_cli(
        [sys.executable, str(ROOT / "analyze.py"), f"ckpt_path={tiny_ckpt}", "text=\"<br />\"",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == ("Error: text has no token left after the tokenizer's normalisation "
                                            "(entries [0]: '<br />'): pass a text with words in it"), proc.stderr
    assert "Traceback" not in proc.stderr  # (the line before it: the checkpoint has no .sha256, a warning)


def test_a_texts_file_with_a_byte_order_mark_and_crlf_reads_as_its_lines(tiny_ckpt, tmp_path, run_analyze, monkeypatch):
    """The mark is not a token (it used to become <unk> in example 0), and \\r\\n ends a line."""
    from identifiable_transformers.data.tokenizer import tokenizer_from_str
    from identifiable_transformers.diagnostics.render import report_html
    from identifiable_transformers.loading import load_module

    seen = {}
    monkeypatch.setattr(report_html, "build_report", lambda model, ids, mask, out, **kw: seen.update(kw) or out)
    texts = tmp_path / "texts.txt"
    texts.write_bytes(b"\xef\xbb\xbfa fine film\r\n\r\nfine and dull\r\n")
    run_analyze([f"ckpt_path={tiny_ckpt}", f"texts_file={texts}", f"output_dir={tmp_path / 'out'}"])
    tok = tokenizer_from_str(load_module(tiny_ckpt).hparams.tokenizer_json)
    assert seen["tokens"] == [tok.encode(t).tokens for t in ("a fine film", "fine and dull")]
    assert seen["texts"] == ["a fine film", "fine and dull"]


def test_a_pair_for_the_projects_encoder_is_joined_as_its_data_joins_fields(tiny_ckpt, tmp_path, run_analyze,
                                                                             monkeypatch):
    from identifiable_transformers.data.tokenizer import tokenizer_from_str
    from identifiable_transformers.diagnostics.render import report_html
    from identifiable_transformers.loading import load_module

    seen = {}
    monkeypatch.setattr(report_html, "build_report", lambda model, ids, mask, out, **kw: seen.update(kw) or out)
    run_analyze([f"ckpt_path={tiny_ckpt}", 'text=[["a fine film", "dull"]]', f"output_dir={tmp_path / 'out'}"])
    tok = tokenizer_from_str(load_module(tiny_ckpt).hparams.tokenizer_json)
    assert seen["tokens"] == [tok.encode("a fine film . dull").tokens]  # data.text_separator's default, " . "


def test_a_max_length_past_the_positions_names_analyze_pys_key(tiny_ckpt, tmp_path, run_analyze):
    with pytest.raises(ValueError, match=rf"^max_length=17 is longer than the 16 tokens ckpt_path={tiny_ckpt} has "
                                         "positions for: pass max_length=16 or less$"):
        run_analyze([f"ckpt_path={tiny_ckpt}", "text=a fine film", "max_length=17", f"output_dir={tmp_path / 'o'}"])
    assert not (tmp_path / "o").exists()


def test_a_failed_run_through_the_command_line_leaves_no_folder(tiny_ckpt, tmp_path):
    out = tmp_path / "reports" / "first"
    proc = run_cli(
        [sys.executable, str(ROOT / "analyze.py"), f"ckpt_path={tiny_ckpt}", "text=a fine film", "max_length=1",
         f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("Error: max_length=1 leaves no word of the text (entries [0]; the model "
                                            "would see only <cls>): pass max_length>=2"), proc.stderr
    assert not (tmp_path / "reports").exists()
