"""Rationales through the data layer: ``data.rationale_field`` on local files, the synthetic tasks, the cache,
batches (``rationale_mask``) and ``dm.rationales``. Expected token positions are written by hand from the
tokenizer's documented splitting (words and punctuation runs are separate tokens, ``<cls>`` first)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from identifiable_transformers.data import TextDataModule

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int = 40) -> list[dict]:
    """n rows; the first four have hand-checked rationales, the rest none."""
    fixed = [
        # words: 0 "Great" 1 "movie," 2 "truly" 3 "wonderful!" -> tokens: <cls> great movie , truly wonderful !
        {"text": "Great movie, truly wonderful!", "label": "pos", "r": "1 3"},
        {"text": "a dull , boring film", "label": "neg", "r": "4 1"},     # unsorted cell: sorted positions
        {"text": "not good at all", "label": "neg", "r": ""},              # no rationale: allowed
        {"text": "fine", "label": "pos", "r": "0"},
    ]
    rest = [{"text": f"filler text number {i} here", "label": "pos" if i % 2 else "neg", "r": ""} for i in range(n - 4)]
    return fixed + rest


def _dm(tmp_path, write_rows, rows, fmt="csv", **kw):
    f = write_rows(tmp_path / f"train.{fmt}", rows, fmt)
    args = dict(name="local_rat", source="local", train_file=str(f), rationale_field="r", max_length=32,
                vocab_size=200, min_frequency=1, batch_size=8, cache_dir=str(tmp_path / "cache"),
                val_fraction=0.0, test_fraction=0.0)
    args.update(kw)
    dm = TextDataModule(**args)
    dm.prepare_data()
    dm.setup()
    return dm


def test_word_indices_become_the_overlapping_token_positions(tmp_path, write_rows):
    dm = _dm(tmp_path, write_rows, _rows())
    assert dm.has_rationales
    assert dm.rationales("train", [0, 1, 2, 3]) == [[2, 3, 5, 6], [2, 5], [], [1]]
    toks = [dm.tokenizer.id_to_token(t) for t in dm.train_dataset[0]["input_ids"]]
    assert toks == ["<cls>", "great", "movie", ",", "truly", "wonderful", "!"]
    assert dm.meta["rows_with_rationale"] == {"train": 3}


def test_batches_carry_a_rationale_mask_padded_like_the_ids(tmp_path, write_rows):
    dm = _dm(tmp_path, write_rows, _rows())
    batch = dm.collate([dm.train_dataset[i] for i in range(4)])
    m = batch["rationale_mask"]
    assert m.dtype == torch.bool and m.shape == batch["input_ids"].shape == (4, 7)
    assert m.nonzero().tolist() == [[0, 2], [0, 3], [0, 5], [0, 6], [1, 2], [1, 5], [3, 1]]
    assert not (m & ~batch["attention_mask"]).any() and not m[:, 0].any()


def test_the_first_text_field_is_the_one_indexed(tmp_path, write_rows):
    rows = [{"title": "Top pick", "body": "really great", "label": i % 2, "r": "1"} for i in range(20)]
    dm = _dm(tmp_path, write_rows, rows, text_fields=["title", "body"])
    # joined "Top pick . really great": <cls> top pick . really great -> word 1 "pick" is token 2
    assert dm.rationales("train", [0]) == [[2]]
    rows[0]["r"] = "2"  # "really" is a word of the joined text, but not of the first field
    with pytest.raises(ValueError, match=r"index 2, outside the 2 whitespace-separated words"):
        _dm(tmp_path, write_rows, rows, text_fields=["title", "body"])


def test_jsonl_lists_of_integers_are_accepted(tmp_path, write_rows):
    rows = [dict(r, r=[int(x) for x in r["r"].split()]) for r in _rows()]
    dm = _dm(tmp_path, write_rows, rows, fmt="jsonl")
    assert dm.rationales("train", [0, 1, 2]) == [[2, 3, 5, 6], [2, 5], []]


def test_jsonl_single_integers_with_nulls_are_indices(tmp_path, write_rows):
    # pandas reads a column of integers with nulls as floats (3.0, NaN): an integral float is an index
    cells = {0: 3, 1: 1, 3: 0}
    rows = [dict(r, r=cells.get(i)) for i, r in enumerate(_rows())]
    dm = _dm(tmp_path, write_rows, rows, fmt="jsonl")
    assert dm.rationales("train", [0, 1, 2, 3, 4]) == [[5, 6], [2], [], [1], []]
    rows[1]["r"] = 1.5  # a fraction is no index
    with pytest.raises(ValueError, match=r"the cell 1\.5 in the train split .* is not a list of integers"):
        _dm(tmp_path, write_rows, rows, fmt="jsonl")


def test_truncated_rationale_tokens_are_left_out(tmp_path, write_rows):
    dm = _dm(tmp_path, write_rows, _rows(), max_length=4)  # <cls> great movie ,
    assert dm.rationales("train", [0]) == [[2, 3]]


def test_the_validation_and_test_splits_keep_their_rationales(tmp_path, write_rows):
    rows = [dict(r, r="0") for r in _rows(60)]  # every row: its first word
    dm = _dm(tmp_path, write_rows, rows, val_fraction=0.2, test_fraction=0.2)
    for split, ds in (("validation", dm.val_dataset), ("test", dm.test_dataset)):
        assert len(ds) == 12 and dm.rationales(split, range(len(ds))) == [[1]] * 12
    batch = next(iter(dm.val_dataloader()))
    assert batch["rationale_mask"][:, 1].all() and batch["rationale_mask"].sum() == len(batch["labels"])


def test_without_rationale_field_nothing_changes(tmp_path, write_rows):
    dm = _dm(tmp_path, write_rows, _rows(), rationale_field=None)
    assert not dm.has_rationales and "rationale" not in dm.train_dataset.column_names
    assert "rationale_mask" not in dm.collate([dm.train_dataset[0]])
    with pytest.raises(ValueError, match="no rationales"):
        dm.rationales("train", [0])


def test_the_rationale_column_is_part_of_the_cache_key(tmp_path, write_rows):
    rows = _rows()
    a = _dm(tmp_path, write_rows, rows)
    rows[0]["r"] = "0"
    b = _dm(tmp_path, write_rows, rows)
    assert a.cache_path() != b.cache_path() and b.rationales("train", [0]) == [[1]]
    c = _dm(tmp_path, write_rows, [dict(r, other=r["r"]) for r in rows], rationale_field="other")
    assert c.cache_path() != b.cache_path()


@pytest.mark.parametrize("cell, match", [
    ("1 x", r"the cell '1 x' in the train split at data row 0 \(0-based; line 2\) of train_file=.*train\.csv.* is not a list of integers"),
    ("1.5", r"the cell '1\.5' .* is not a list of integers"),
    ("4", r"the cell '4' .*line 2.* has the index 4, outside the 4 whitespace-separated words"),
    ("-1", r"has the index -1, outside"),
])
def test_bad_cells_name_the_file_line_and_cell(tmp_path, write_rows, cell, match):
    rows = _rows()
    rows[0]["r"] = cell
    with pytest.raises(ValueError, match=match):
        _dm(tmp_path, write_rows, rows)


def test_a_missing_rationale_column_lists_the_columns(tmp_path, write_rows):
    with pytest.raises(ValueError, match=r"rationale_field='nope' not found .* columns found: \['text', 'label', 'r'\]"):
        _dm(tmp_path, write_rows, _rows(), rationale_field="nope")


def test_train_py_ends_a_bad_cell_with_one_error_line(tmp_path, write_rows):
    rows = _rows()
    rows[5]["r"] = "two"
    f = write_rows(tmp_path / "bad.csv", rows, "csv")
    proc = run_cli(
        [sys.executable, str(ROOT / "train.py"), "data=local", f"data.train_file={f}", "data.rationale_field=r",
         "logger=none", "trainer=cpu", f"paths.cache_dir={tmp_path}/cache", f"paths.log_dir={tmp_path}/logs"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "the cell 'two'" in errors[0] and "line 7" in errors[0] and "bad.csv" in errors[0]


KW = re.compile(r"^k(\d+)[a-z]?$")


@pytest.mark.parametrize("task", ["presence", "order", "majority"])
def test_synthetic_rationales_point_at_the_label_keywords_in_every_split(tmp_path, task):
    dm = TextDataModule.from_name(f"synthetic_{task}", cache_dir=str(tmp_path),
                                  synthetic={"task": task, "size": 400, "keywords_per_class": 2,
                                             "num_keywords": {"presence": [1, 2], "order": [2, 3], "majority": [3, 5]}[task]})
    dm.prepare_data()
    dm.setup()
    assert dm.has_rationales and dm.meta["rows"] == {"train": 320, "validation": 40, "test": 40}
    for split, ds in (("train", dm.train_dataset), ("validation", dm.val_dataset), ("test", dm.test_dataset)):
        rats = dm.rationales(split, range(len(ds)))
        for row, rat in zip(ds, rats):
            tokens = [dm.tokenizer.id_to_token(t) for t in row["input_ids"]]
            keyword_positions = [p for p, t in enumerate(tokens) if KW.match(t)]
            label_positions = [p for p in keyword_positions if int(KW.match(tokens[p]).group(1)) == row["labels"]]
            expected = label_positions[:1] if task == "order" else label_positions
            assert rat == expected and rat, (tokens, rat)
            if task == "order":
                assert rat[0] == keyword_positions[0]


def test_synthetic_settings_are_checked_at_construction_and_keyed(tmp_path):
    with pytest.raises(ValueError, match="task='sorting'"):
        TextDataModule.from_name("synthetic_order", cache_dir=str(tmp_path), synthetic={"task": "sorting"})
    a = TextDataModule.from_name("synthetic_order", cache_dir=str(tmp_path))
    b = TextDataModule.from_name("synthetic_order", cache_dir=str(tmp_path),
                                 synthetic={**a.synthetic.as_dict(), "seed": 1})
    assert a.cache_path() != b.cache_path()


def test_rationale_mask_marks_the_positions_and_refuses_any_outside_the_width():
    from identifiable_transformers.data.rationales import rationale_mask
    from identifiable_transformers.diagnostics.faithfulness import rationale_mask as faith_mask

    assert faith_mask is rationale_mask  # one definition for the batches and the diagnostics
    expected = torch.tensor([[False, True, False, True], [False, False, False, False]])
    assert torch.equal(rationale_mask([[1, 3], []], 4), expected)
    for bad in ([4], [-1]):  # -1 would otherwise mark the last token
        with pytest.raises(ValueError, match=rf"rationale positions \[{bad[0]}\] of example 1 are outside its 4 tokens"):
            rationale_mask([[1], bad], 4)
