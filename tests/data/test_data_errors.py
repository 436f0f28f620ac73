"""Bad input: clear errors naming the parameter, the value and the fix."""

import pytest

from identifiable_transformers.data import TextDataModule, get_spec


def _prep(dm):
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_unknown_dataset_name_lists_known():
    with pytest.raises(ValueError) as ei:
        TextDataModule.from_name("agnewz")
    msg = str(ei.value)
    assert "agnewz" in msg and "agnews" in msg and "rt_offline" in msg and "yahoo" in msg
    with pytest.raises(ValueError, match="agnews"):
        get_spec("nope")
    with pytest.raises(ValueError, match="Known datasets"):
        TextDataModule(name="nope", source="hub")  # hub without hub_id and unknown name


def test_unknown_source():
    with pytest.raises(ValueError, match="source='ftp'"):
        TextDataModule(source="ftp")


def test_missing_file(tmp_path):
    dm = TextDataModule(source="local", train_file=str(tmp_path / "nope.csv"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="train_file=.*nope.csv"):
        dm.prepare_data()
    with pytest.raises(ValueError, match="train_file"):
        TextDataModule(source="local", cache_dir=str(tmp_path / "c"))


def test_missing_data_dir_and_train_csv(tmp_path):
    dm = TextDataModule(name="agnews", source="hub", data_dir=str(tmp_path / "missing"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="data_dir"):
        dm.prepare_data()
    (tmp_path / "empty").mkdir()
    dm = TextDataModule(name="agnews", source="hub", data_dir=str(tmp_path / "empty"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError, match="train.csv"):
        dm.prepare_data()


def test_unsupported_suffix(local_dm, tmp_path):
    f = tmp_path / "data.xlsx"
    f.write_text("x")
    with pytest.raises(ValueError, match="unsupported file type '.xlsx'"):
        local_dm(train_file=str(f)).prepare_data()


def test_missing_text_column_names_found_columns(local_dm):
    with pytest.raises(ValueError) as ei:
        local_dm(text_fields=["body"]).prepare_data()
    msg = str(ei.value)
    assert "text_fields" in msg and "'body'" in msg and "['text', 'label']" in msg


def test_missing_label_column(local_dm):
    with pytest.raises(ValueError, match=r"label_field='y'.*columns found: \['text', 'label'\]"):
        local_dm(label_field="y").prepare_data()


def test_empty_and_nan_text_dropped_with_count(local_dm, make_rows, caplog, tmp_path, write_rows):
    rows = make_rows(10)
    rows[3]["text"] = ""
    rows[7]["text"] = "   "
    with caplog.at_level("WARNING", logger="identifiable_transformers.data"):
        dm = _prep(local_dm(rows))
    assert "dropped 2 row(s) with empty/NaN text" in caplog.text
    assert len(dm.train_dataset) + len(dm.val_dataset) + len(dm.test_dataset) == 28
    # NaN text in parquet (None) is dropped too
    rows = make_rows(10)
    rows[0]["text"] = None
    dm = _prep(local_dm(rows, fmt="parquet", cache_dir=str(tmp_path / "c2")))
    assert len(dm.train_dataset) + len(dm.val_dataset) + len(dm.test_dataset) == 29


def test_all_text_empty_is_an_error(local_dm, make_rows):
    rows = [dict(r, text="") for r in make_rows(5)]
    with pytest.raises(ValueError, match="every row"):
        local_dm(rows).prepare_data()


def test_nan_label_names_the_row(local_dm, make_rows, tmp_path):
    rows = make_rows(10)
    rows[4]["label"] = ""
    with pytest.raises(ValueError) as ei:
        local_dm(rows).prepare_data()
    msg = str(ei.value)
    assert "label is missing" in msg and "data row 4" in msg and "line 6" in msg and "train.csv" in msg
    rows = make_rows(10)
    rows[5]["label"] = None
    with pytest.raises(ValueError, match="data row 5 .*line 6"):
        local_dm(rows, fmt="jsonl", cache_dir=str(tmp_path / "c2")).prepare_data()


@pytest.mark.parametrize("cell", ["NaN", "nan", "NA", "null"])
def test_a_label_cell_spelling_a_missing_value_is_an_error_naming_the_line(local_dm, make_rows, cell):
    rows = make_rows(10)
    rows[4]["label"] = cell  # written as the plain CSV cell NaN, read as the string "NaN"
    with pytest.raises(ValueError) as ei:
        local_dm(rows).prepare_data()
    msg = str(ei.value)
    assert f"label {cell!r}" in msg and "missing value" in msg and "line 6" in msg and "train.csv" in msg
    assert "data.label_names" in msg  # the fix when it really is a class name


def test_a_missing_value_spelling_listed_in_label_names_is_a_class(local_dm, make_rows):
    rows = [dict(r, label={"sports": "none", "tech": "tech", "world": "world"}[r["label"]]) for r in make_rows(10)]
    dm = _prep(local_dm(rows, label_names=["none", "tech", "world"]))
    assert dm.label_names == ["none", "tech", "world"]
    ids = list(dm.train_dataset["labels"]) + list(dm.val_dataset["labels"]) + list(dm.test_dataset["labels"])
    assert ids.count(0) == 10


def test_a_header_row_repeated_mid_file_is_an_error_naming_the_line(local_dm, make_rows, tmp_path):
    rows = make_rows(10)
    rows.insert(12, {"text": "text", "label": "label"})  # two files concatenated with their headers
    with pytest.raises(ValueError) as ei:
        local_dm(rows).prepare_data()
    msg = str(ei.value)
    assert "repeats the header row" in msg and "data row 12" in msg and "line 14" in msg and "Remove that line" in msg
    rows = [dict(text=r["text"], y=r["label"]) for r in make_rows(10)]
    rows.insert(3, {"text": "text", "y": "y"})
    with pytest.raises(ValueError, match=r"line 5\).*repeats the header row"):
        local_dm(rows, label_field="y", cache_dir=str(tmp_path / "c2")).prepare_data()


@pytest.mark.parametrize("source", ["package", "hub"])
def test_an_unknown_name_with_a_named_source_is_an_error_listing_the_known_names(source):
    # data=rt_offline data.name=foo used to train rt_offline under the name foo
    with pytest.raises(ValueError) as ei:
        TextDataModule(name="foo", source=source, package_subset="rotten_tomatoes", hub_id="fancyzhx/ag_news")
    msg = str(ei.value)
    assert "name='foo'" in msg and "rt_offline" in msg and "agnews" in msg and "conf/data/<name>.yaml" in msg


def test_local_files_take_any_name(local_dm):
    assert local_dm(name="my_reviews").name == "my_reviews"


def test_unknown_string_label_with_label_names(local_dm, make_rows):
    rows = make_rows(10)
    rows[2]["label"] = "cooking"
    with pytest.raises(ValueError) as ei:
        local_dm(rows, label_names=["sports", "tech", "world"]).prepare_data()
    msg = str(ei.value)
    assert "'cooking'" in msg and "data row 2" in msg and "sports" in msg


def test_string_labels_follow_given_label_names_order(local_dm, make_rows):
    rows = make_rows(10)
    dm = _prep(local_dm(rows, label_names=["world", "tech", "sports"]))
    assert dm.label_names == ["world", "tech", "sports"]
    ids = list(dm.train_dataset["labels"]) + list(dm.val_dataset["labels"]) + list(dm.test_dataset["labels"])
    assert sorted(ids).count(0) == sum(r["label"] == "world" for r in rows)


def test_integer_label_out_of_range(local_dm, make_rows):
    rows = [dict(r, label={"sports": 0, "tech": 1, "world": 2}[r["label"]]) for r in make_rows(10)]
    rows[9]["label"] = 7
    with pytest.raises(ValueError, match=r"label 7 .*data row 9"):
        local_dm(rows, label_names=["a", "b", "c"]).prepare_data()


def test_non_contiguous_integer_labels_remapped_sorted(local_dm, make_rows):
    rows = [dict(r, label={"sports": 10, "tech": 3, "world": 7}[r["label"]]) for r in make_rows(10)]
    dm = _prep(local_dm(rows))
    assert dm.label_names == ["3", "7", "10"]  # numeric order, not string order
    assert dm.num_classes == 3


def test_non_integer_float_label(local_dm, make_rows, tmp_path):
    rows = [dict(r, label=1.0) for r in make_rows(5)]
    rows[1]["label"] = 0.5
    with pytest.raises(ValueError, match="0.5 .*not an integer"):
        local_dm(rows, fmt="jsonl").prepare_data()


def test_num_classes_mismatch(local_dm):
    with pytest.raises(ValueError) as ei:
        local_dm(num_classes=5).prepare_data()
    msg = str(ei.value)
    assert "num_classes=5" in msg and "3 classes" in msg and "data.num_classes=3" in msg


def test_non_utf8_file_names_file_and_line(tmp_path, local_dm):
    f = tmp_path / "latin.csv"
    f.write_bytes("text,label\nok row,a\ncaf\xe9 row,b\n".encode("latin-1"))
    with pytest.raises(ValueError) as ei:
        local_dm(train_file=str(f)).prepare_data()
    msg = str(ei.value)
    assert "latin.csv" in msg and "line 3" in msg and "UTF-8" in msg


def test_unparseable_csv_names_file(tmp_path, local_dm):
    f = tmp_path / "bad.csv"
    f.write_text("text,label\n\"unterminated,a\nx,b,c,d\n")
    with pytest.raises(ValueError, match="bad.csv"):
        local_dm(train_file=str(f)).prepare_data()


def test_bad_json_names_file(tmp_path, local_dm):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "a", "label": 1}\n{not json}\n')
    with pytest.raises(ValueError, match="bad.jsonl"):
        local_dm(train_file=str(f)).prepare_data()


def test_empty_file(tmp_path, local_dm):
    f = tmp_path / "empty.csv"
    f.write_text("text,label\n")
    with pytest.raises(ValueError, match="no data rows"):
        local_dm(train_file=str(f)).prepare_data()


def test_bad_fractions_and_sizes(local_dm):
    with pytest.raises(ValueError, match="val_fraction=1.5"):
        local_dm(val_fraction=1.5).prepare_data()
    with pytest.raises(ValueError, match="max_length"):
        local_dm(max_length=1)
    with pytest.raises(ValueError, match="vocab_size"):
        local_dm(vocab_size=3).prepare_data()


def test_failed_prepare_leaves_no_partial_cache(local_dm, make_rows, tmp_path):
    rows = make_rows(5)
    rows[0]["label"] = ""
    dm = local_dm(rows)
    with pytest.raises(ValueError):
        dm.prepare_data()
    leftovers = list((tmp_path / "cache").rglob("meta.json")) + list((tmp_path / "cache").rglob(".*tmp*"))
    assert leftovers == []


def test_properties_before_setup_raise(local_dm):
    with pytest.raises(RuntimeError, match="after prepare_data"):
        _ = local_dm().vocab_size
