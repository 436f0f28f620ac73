"""A JSON boolean in a rationale cell is refused, never read as word index 1 (true) or 0 (false).

In Python ``True == 1`` and ``isinstance(True, int)``: a parser that checks for integers first would
mark the second (or first) word as evidence. Through the data module on a JSON-lines file.
"""

from __future__ import annotations

import pytest

from identifiable_transformers.data import TextDataModule


def _rows(cells) -> list[dict]:
    rows = [{"text": f"some words of row {i}", "label": i % 2, "r": [0, 2]} for i in range(30)]
    for i, cell in enumerate(cells):
        rows[i]["r"] = cell
    return rows


def _dm(tmp_path, write_rows, rows) -> TextDataModule:
    f = write_rows(tmp_path / "train.jsonl", rows, "jsonl")
    dm = TextDataModule(name="local_bool", source="local", train_file=str(f), rationale_field="r", max_length=16,
                        vocab_size=100, min_frequency=1, batch_size=8, cache_dir=str(tmp_path / "cache"),
                        val_fraction=0.0, test_fraction=0.0)
    dm.prepare_data()
    dm.setup()
    return dm


def test_integer_lists_are_read_as_word_indices(tmp_path, write_rows):
    # the reference the refusals below differ from: words 0 and 2 -> tokens 1 and 3 (after <cls>)
    dm = _dm(tmp_path, write_rows, _rows([[1], 1]))
    assert dm.rationales("train", [0, 1, 2]) == [[2], [2], [1, 3]]


@pytest.mark.parametrize("cells", [[True], [False], [[0, 2], True], [[True, False]], [[1, True]]],
                         ids=["true", "false", "true-in-row-1", "list-of-booleans", "int-and-boolean"])
def test_a_boolean_cell_is_refused_with_its_row(tmp_path, write_rows, cells):
    with pytest.raises(ValueError, match=r"the cell .*(True|False).* is not a list of integers"):
        _dm(tmp_path, write_rows, _rows(cells))


def test_a_column_of_booleans_is_refused(tmp_path, write_rows):
    rows = [{"text": f"some words of row {i}", "label": i % 2, "r": bool(i % 2)} for i in range(30)]
    with pytest.raises(ValueError, match=r"the cell .*(True|False).* is not a list of integers"):
        _dm(tmp_path, write_rows, rows)
