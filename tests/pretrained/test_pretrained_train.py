"""model=pretrained end to end: a tiny random BERT saved to a local folder trains with the project's data, logs
every diagnostic, and its checkpoint works with analyze.py, the report and a resume (offline, CPU, few batches)."""

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import save_tiny_bert
from tokenizers import Tokenizer

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.resume import check_same_tokenizer as _check_same_tokenizer
from identifiable_transformers.run.training import run

# conftest's FAST, less its model.* sizes (a pretrained encoder has its own), with small diagnostics
FAST = ["trainer=cpu", "logger=none", "trainer.max_epochs=1", "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "data.batch_size=16", "data.max_length=64", "data=rt_offline",
        "model=pretrained", "callbacks.identifiability.probe_size=4", "callbacks.identifiability.key_aware_examples=2",
        "callbacks.identifiability.plots=false", "callbacks.faithfulness.final=false"]


def test_tiny_bert_trains_logs_diagnostics_and_its_checkpoint_is_analysed(make_cfg, tmp_path, tiny_bert, run_analyze,
                                                                          cache_dir):
    result = run(make_cfg(*FAST, f"model.name_or_path={tiny_bert}", fast=False))
    m = result["metrics"]
    assert {"test/acc", "val/ident/identifiable_frac", "val/ident/null_dim", "val/ident/l1/identifiable_frac",
            "val/ident/l1_h3/null_dim", "val/ident/key_aware_alternative_dim", "val/faith/attention/comprehensiveness",
            "val/faith/effective/comprehensiveness", "val/faith/rollout/comprehensiveness"} <= set(m)
    assert result["config"]["model"]["model_type"] == "bert" and result["config"]["model"]["num_heads"] == 4
    # The data was tokenized with the checkpoint's own WordPiece tokenizer, truncated at data.max_length.
    tok = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "WordPiece" and tok["truncation"]["max_length"] == 64
    ckpt = result["best_model_path"]

    report = run_analyze([f"ckpt_path={ckpt}", 'text="a gripping, beautiful film"', f"output_dir={tmp_path / 'an'}"])
    assert (tmp_path / "an" / "report.json").is_file() and str(report).endswith("report.html")
    # split=...: the data module is rebuilt from the checkpoint's data settings (the pretrained one, by name)
    run_analyze([f"ckpt_path={ckpt}", "split=validation", "num_examples=2", f"paths.cache_dir={cache_dir}",
                 f"output_dir={tmp_path / 'an2'}"])
    assert (tmp_path / "an2" / "report.json").is_file()

    from identifiable_transformers.report.cli import main as report_main

    assert report_main([str(tmp_path / "run"), "--no-key-aware"]) == 0
    assert "| 32 | 4 | 8 | 8 |" in (tmp_path / "run" / "results.md").read_text()  # embed, heads, key, value sizes

    # Resuming with another checkpoint (same sizes, other token ids) is refused before training: the resume check
    # names the encoder and its tokenizer, old -> new.
    other = save_tiny_bert(tmp_path / "other", vocab_seed=1)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    again = make_cfg(*FAST, f"model.name_or_path={other}", f"ckpt_path={last}", fast=False, out="run2")
    with pytest.raises(UserError, match=r"other settings .*model.name_or_path .* -> .*data.pretrained_tokenizer"):
        run(again)
    # The same tokenizer truncating elsewhere (a resume with another data.max_length) means the same ids: accepted.
    saved = torch.load(last, weights_only=True)
    shorter = Tokenizer.from_str(saved["hyper_parameters"]["tokenizer_json"])
    shorter.enable_truncation(32)
    _check_same_tokenizer(saved, SimpleNamespace(tokenizer=shorter, vocab_size=shorter.get_vocab_size()), last)
