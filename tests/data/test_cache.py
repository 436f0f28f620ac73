"""The tokenized cache: keyed by content and code, verified on load, rebuilt when damaged."""

import logging
import os

import pytest

import identifiable_transformers.data.datamodule as D
from identifiable_transformers.data import TextDataModule


def _dm(path, cache, **kw):
    return TextDataModule(**{**dict(name="t", source="local", train_file=str(path), cache_dir=str(cache),
                                    max_length=32, vocab_size=500, min_frequency=1, val_fraction=None,
                                    test_fraction=None), **kw})


def _ready(dm):
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_a_file_edited_in_place_with_its_size_and_mtime_kept_is_a_new_cache_entry(tmp_path, make_rows, write_rows):
    f = write_rows(tmp_path / "t.csv", make_rows(10))
    old = _ready(_dm(f, tmp_path / "c"))
    assert old.tokenizer.token_to_id("gaol") is None
    st = f.stat()
    data = f.read_bytes()
    assert b"goal " in data
    f.write_bytes(data.replace(b"goal ", b"gaol ", 1))  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    new = _ready(_dm(f, tmp_path / "c"))
    assert new.cache_path() != old.cache_path()
    assert new.tokenizer.token_to_id("gaol") is not None  # trained on the edited file, not the stale cache


@pytest.mark.parametrize("edited", ["validation_file", "test_file"])
def test_an_edited_validation_or_test_file_serves_its_new_labels(tmp_path, make_rows, write_rows, edited):
    files = {k: write_rows(tmp_path / f"{k}.csv", make_rows(10, seed=i))
             for i, k in enumerate(("train_file", "validation_file", "test_file"))}
    args = {k: str(v) for k, v in files.items()}

    def labels(dm):
        ds = dm.val_dataset if edited == "validation_file" else dm.test_dataset
        return sorted(ds["labels"])

    old = _ready(_dm(files["train_file"], tmp_path / "c", **args))
    assert labels(old) == [0] * 10 + [1] * 10 + [2] * 10
    rows = make_rows(10, seed=1 if edited == "validation_file" else 2)
    write_rows(files[edited], [dict(r, label="sports") for r in rows])  # every row relabelled class 0
    new = _ready(_dm(files["train_file"], tmp_path / "c", **args))
    assert new.cache_path() != old.cache_path()
    assert labels(new) == [0] * 30


def _snapshot(folder):
    return {(str(p), p.stat().st_mtime_ns) for p in [folder, *folder.rglob("*")]}


def test_a_read_only_cache_is_read_when_built_and_named_when_it_must_be_built(tmp_path, make_rows, write_rows,
                                                                               read_only):
    f = write_rows(tmp_path / "t.csv", make_rows(10))
    built = _ready(_dm(f, tmp_path / "c"))
    labels = list(built.train_dataset["labels"])
    read_only(tmp_path / "c")
    before = _snapshot(tmp_path / "c")
    again = _ready(_dm(f, tmp_path / "c"))  # built: only read
    assert list(again.train_dataset["labels"]) == labels and _snapshot(tmp_path / "c") == before
    with pytest.raises(ValueError) as info:  # another max_length: a new entry that cannot be written
        _dm(f, tmp_path / "c", max_length=16).prepare_data()
    msg = str(info.value)
    assert "must be built (it is not built yet)" in msg and str(tmp_path / "c" / "t") in msg
    assert "not writable" in msg and "paths.cache_dir" in msg
    assert _snapshot(tmp_path / "c") == before


def test_changed_preparation_code_is_a_new_cache_entry(tmp_path, make_rows, write_rows, monkeypatch):
    f = write_rows(tmp_path / "t.csv", make_rows(10))
    before = _dm(f, tmp_path / "c").cache_path()
    monkeypatch.setattr(D, "preparation_version", lambda: "another version of the code")
    assert _dm(f, tmp_path / "c").cache_path() != before


def _arrow(root):
    files = sorted((root / "dataset").rglob("*.arrow"))
    assert files
    return files[0]


def _zero_inside(root):
    f = _arrow(root)
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(64)  # same size: train ids silently change without a check
    f.write_bytes(bytes(data))


DAMAGE = {
    "dataset folder deleted": lambda root: __import__("shutil").rmtree(root / "dataset"),
    "arrow file truncated": lambda root: _arrow(root).write_bytes(_arrow(root).read_bytes()[:100]),
    "bytes zeroed inside the arrow file": _zero_inside,
    "meta.json corrupt": lambda root: (root / "meta.json").write_text('{"name": "t", "lab'),
    "tokenizer.json corrupt": lambda root: (root / "tokenizer.json").write_text("not json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_rebuilt_with_a_warning(tmp_path, make_rows, write_rows, caplog, damage):
    f = write_rows(tmp_path / "t.csv", make_rows(20))
    first = _ready(_dm(f, tmp_path / "c"))
    root = first.cache_path()
    ids = [list(x) for x in first.train_dataset["input_ids"]]
    labels = list(first.train_dataset["labels"])
    vocab = first.tokenizer.get_vocab()
    DAMAGE[damage](root)
    with caplog.at_level(logging.WARNING, logger="identifiable_transformers.data"):
        again = _ready(_dm(f, tmp_path / "c"))
    assert "damaged" in caplog.text and "rebuilding" in caplog.text
    assert again.cache_path() == root
    assert [list(x) for x in again.train_dataset["input_ids"]] == ids and list(again.train_dataset["labels"]) == labels
    assert again.tokenizer.get_vocab() == vocab
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="identifiable_transformers.data"):
        _ready(_dm(f, tmp_path / "c"))
    assert "damaged" not in caplog.text  # the rebuilt cache is whole again


def test_meta_json_holds_a_checksum_of_every_cache_file(tmp_path, make_rows, write_rows):
    import json

    import xxhash

    f = write_rows(tmp_path / "t.csv", make_rows(10))
    root = _ready(_dm(f, tmp_path / "c")).cache_path()
    checksums = json.loads((root / "meta.json").read_text())["checksums"]
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {"meta.json"}
    assert set(checksums) == files and any(k.endswith(".arrow") for k in files) and "tokenizer.json" in files
    for rel, digest in checksums.items():
        assert xxhash.xxh3_128((root / rel).read_bytes()).hexdigest() == digest
