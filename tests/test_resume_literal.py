"""A refused resume prints the original values to pass; passed as printed, they resume. The values are complete: a
run trained on a file of its own (``data=local data.train_file=...``) and resumed with the default data config is
told where its data was too (a data file's path alone may change, so it is not a refusal of its own), and every
refusal (model, data, seed, trainer) comes in the one message. Each printed value is a shell word that Hydra reads
back as the checkpoint's value, whatever its type."""

import re
import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.resume import override
from identifiable_transformers.run.training import run

CALLBACKS = "callbacks=[model_checkpoint,last_checkpoint]"
ROWS = [(f"good film number {i}", "pos") if i % 2 else (f"bad film number {i}", "neg") for i in range(80)]


def _original_values(message: str) -> list[str]:
    found = re.search(r"Resume with the original values \((.*)\), or start a new run", message)
    assert found, message
    return shlex.split(found.group(1))  # as the shell splits the line the user pastes


def test_following_the_printed_values_literally_resumes(make_cfg, tmp_path):
    train = tmp_path / "my data.csv"  # a space in the path: the printed value must be one shell word
    train.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in ROWS))
    first = run(make_cfg(CALLBACKS, "data=local", f"data.train_file={train}", "data.text_separator=' | '",
                         "test=false", out="first"))
    last = first["best_model_path"].rsplit("/", 1)[0] + "/last.ckpt"
    with pytest.raises(UserError) as err:  # the default data config, and another seed
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", "seed=7", out="refused"))
    message = str(err.value)
    assert "data.source 'local' -> 'package'" in message and "seed 42 -> 7" in message, message
    values = _original_values(message)
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(values)}
    assert parsed["data.train_file"] == str(train) and parsed["seed"] == 42, values
    assert parsed["data.text_separator"] == " | ", values
    resumed = run(make_cfg(CALLBACKS, f"ckpt_path={last}", "seed=7", *values, "test=false", out="resumed"))
    assert resumed["metrics"]["val/acc_best"] == first["metrics"]["val/acc_best"]  # the same run, nothing left to train


def test_without_the_data_file_the_values_would_not_resume(make_cfg, tmp_path):
    """The premise of the test above: leaving the data file out of the printed values (the old message) fails."""
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in ROWS))
    run(make_cfg(CALLBACKS, "data=local", f"data.train_file={train}", "test=false", out="first"))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError) as err:
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", out="refused"))
    values = [v for v in _original_values(str(err.value)) if not v.startswith("data.train_file=")]
    with pytest.raises((UserError, ValueError)):
        run(make_cfg(CALLBACKS, f"ckpt_path={last}", *values, "test=false", out="resumed"))


@pytest.mark.parametrize("value", [
    None, True, False, 0, 42, 1e-3, 0.999, "relu", "32-true", "val/acc", "42", "true", "null", " . ", "it's",
    "/a path/with spaces.csv", [0.9, 0.999], ("text", "title"), ["a b", "c,d"], [],
    {"train": "train", "validation": None, "test": "test"}, {"synthetic": {"size": 8, "words": ["a", "b"]}},
])
def test_a_printed_value_reads_back_as_the_same_value(value):
    word = override("data.key", value)
    (token,) = shlex.split(word)  # one shell word
    parsed = OverridesParser.create().parse_override(token).value()
    expected = list(value) if isinstance(value, tuple) else value
    assert parsed == expected and type(parsed) is type(expected), (word, parsed)
