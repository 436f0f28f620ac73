"""A checkpoint whose vocabulary this data config no longer builds (one written before the vocabulary was built from
the training rows alone holds more words under the same settings): the refusal names the remedy that works, its run
folder's tokenizer.json as ``data.tokenizer_file``, and following it resumes. A refused resume into the run's own
folder leaves that tokenizer.json as it was.

The crafted checkpoint: a run trained with ``data.min_frequency=1`` (more words) whose saved data settings say the
default ``min_frequency=2``, as an old checkpoint's say the current defaults."""

import re

import pytest
import torch

from identifiable_transformers.modules.checkpoint import CheckpointError
from identifiable_transformers.run.training import run

CALLBACKS = "callbacks=[model_checkpoint,last_checkpoint]"


@pytest.fixture
def old_run(make_cfg, tmp_path, rewrite_checkpoint):
    run(make_cfg(CALLBACKS, "data.min_frequency=1", "test=false", out="old"))
    last = tmp_path / "old" / "checkpoints" / "last.ckpt"
    rewrite_checkpoint(last, last, checksum=True, min_frequency=2)
    return tmp_path / "old", last


def test_another_vocabulary_names_the_runs_tokenizer_file_and_that_resumes(make_cfg, old_run, tmp_path):
    folder, last = old_run
    with pytest.raises(CheckpointError) as err:
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", out="refused"))
    message = str(err.value)
    theirs = torch.load(last, map_location="cpu", weights_only=True)["hyper_parameters"]["vocab_size"]
    assert re.search(rf"holds a model of another size.*'vocab_size': \({theirs}, \d+\)", message), message
    assert f"pass it with data.tokenizer_file={folder / 'tokenizer.json'}." in message, message
    assert "Pass the model settings it was trained with" not in message  # the size is the vocabulary's alone
    assert "\n" not in message
    result = run(make_cfg(CALLBACKS, f"ckpt_path={last}", f"data.tokenizer_file={folder / 'tokenizer.json'}",
                          "trainer.max_epochs=2", "test=false", out="resumed"))
    assert result["epochs_run"] == 2  # trained on from the checkpoint


def test_a_refused_resume_into_its_own_folder_keeps_its_tokenizer_file(make_cfg, old_run):
    folder, last = old_run
    before = (folder / "tokenizer.json").read_bytes()
    with pytest.raises(CheckpointError, match="data.tokenizer_file="):
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", out="old"))
    assert (folder / "tokenizer.json").read_bytes() == before  # the file the message names is still the right one


def test_without_the_runs_tokenizer_file_the_message_says_where_to_find_it(make_cfg, old_run, tmp_path):
    folder, last = old_run
    copy = tmp_path / "alone.ckpt"  # a checkpoint copied out of its run folder
    copy.write_bytes(last.read_bytes())
    with pytest.warns(UserWarning, match="no alone.ckpt.sha256"), pytest.raises(CheckpointError) as err:
        run(make_cfg(CALLBACKS, f"ckpt_path={copy}", out="refused"))
    assert "data.tokenizer_file=<its run folder>/tokenizer.json" in str(err.value)


def test_a_deeper_model_with_another_vocabulary_names_both_fixes(make_cfg, old_run):
    """Evaluated (a training resume refuses the other model setting before any data, naming it)."""
    _, last = old_run
    with pytest.raises(CheckpointError) as err:
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", "model.num_layers=3", "train=false", out="refused"))
    assert "data.tokenizer_file=" in str(err.value) and "Pass the model settings it was trained with too" in str(
        err.value)
