"""Data files written by Windows tools start with a UTF-8 byte-order mark and end lines with CRLF: every text format
reads them as the same rows as without (the mark is neither part of the first column's name nor of a value)."""

import codecs

import pytest

from identifiable_transformers.data.sources import read_table


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv"])
def test_a_byte_order_mark_and_crlf_read_as_without(tmp_path, make_rows, write_rows, fmt):
    rows = make_rows(n_per_class=3)
    plain = write_rows(tmp_path / f"plain.{fmt}", rows, fmt)
    marked = tmp_path / f"marked.{fmt}"
    marked.write_bytes(codecs.BOM_UTF8 + plain.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    want, got = read_table(plain).frame, read_table(marked).frame
    assert list(got.columns) == list(want.columns) == list(rows[0])
    assert got.astype(str).values.tolist() == want.astype(str).values.tolist()
    assert got["text"].tolist() == [r["text"] for r in rows]


def test_a_marked_jsonl_file_builds_the_data(local_dm, make_rows, tmp_path):
    """Through the data module, as train.py reads data.train_file."""
    dm = local_dm(fmt="jsonl")
    path = tmp_path / "train.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + path.read_bytes())
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_dataset) + len(dm.val_dataset) + len(dm.test_dataset or []) == len(make_rows())
