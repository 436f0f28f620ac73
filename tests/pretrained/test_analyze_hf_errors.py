"""analyze.py hf_model=...: each user mistake is one ``Error:`` line (exit status 1), found before any long work."""

import os
import sys
import time
from pathlib import Path

import pytest
from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_that_is_not_a_model(tmp_path, run_analyze):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^hf_model=.*empty has no config.json: it is not a Hugging Face checkpoint"):
        run_analyze([f"hf_model={tmp_path / 'empty'}", "text=a fine film", f"output_dir={tmp_path / 'out'}"])


def test_an_uncached_hub_id_fails_fast_offline(tmp_path, monkeypatch, run_analyze):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match="^hf_model=identifiable-transformers-tests/no-such-model is not a local "
                                              "folder and not in the Hugging Face cache, and HF_HUB_OFFLINE=1 is set"):
        run_analyze(["hf_model=identifiable-transformers-tests/no-such-model", "text=a fine film",
                     f"output_dir={tmp_path}"])
    assert time.perf_counter() - t0 < 60  # no retries (the 60 s bound only guards against a hang on a busy machine)


def test_faithfulness_of_a_bare_encoder_is_refused(tiny_bert, tmp_path, run_analyze):
    with pytest.raises(ValueError, match=r"is a bare encoder \(saved without a \*ForSequenceClassification head\): it "
                                         "makes no prediction, so there is nothing for the faithfulness explainers"):
        run_analyze([f"hf_model={tiny_bert}", "data=rt_offline", "split=validation", f"output_dir={tmp_path}"])


def test_a_bare_encoder_still_gets_its_maps(tiny_bert, tmp_path, run_analyze):
    import json

    run_analyze([f"hf_model={tiny_bert}", "text=the film was good", f"output_dir={tmp_path}"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["heads"] and "faithfulness" not in report
    assert "No prediction: the model is an encoder without a classification head" in (tmp_path / "report.html"
                                                                                       ).read_text()


@pytest.mark.parametrize("overrides, says", [
    (["data=rt_offline", "split=dev"], r"^split='dev' is unknown; use one of \['train', 'validation', 'test'\]"),
    (["split=validation"], r"^split=validation with hf_model needs a data config to read it from: add data=NAME"),
    (["ckpt_path=x.ckpt", "text=a"], r"^give exactly one of ckpt_path=\.\.\. .* or hf_model=\.\.\."),
])
def test_data_and_source_mistakes(tiny_bert, tmp_path, run_analyze, overrides, says):
    from transformers import BertForSequenceClassification

    folder = tmp_path / "cls"
    BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).save_pretrained(folder)
    for f in tiny_bert.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            (folder / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match=says):
        run_analyze([f"hf_model={folder}", *overrides, f"output_dir={tmp_path / 'out'}"])


def test_the_command_line_prints_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli([sys.executable, str(ROOT / "analyze.py"), f"hf_model={tmp_path / 'empty'}", "text=a film",
                    f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path, timeout=300,
                   env={**os.environ, "HYDRA_FULL_ERROR": "", "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(f"Error: hf_model={tmp_path / 'empty'} "
                                                                         "has no config.json"), proc.stderr
