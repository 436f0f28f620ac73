from collections import Counter

import numpy as np

from identifiable_transformers.data.prepare import stratified_split


def _labels():
    return np.array([0] * 500 + [1] * 300 + [2] * 200)[np.random.default_rng(3).permutation(1000)]


def test_same_seed_same_rows_different_seed_different_rows():
    y = _labels()
    a = stratified_split(y, {"validation": 0.1, "test": 0.2}, seed=42)
    b = stratified_split(y, {"validation": 0.1, "test": 0.2}, seed=42)
    c = stratified_split(y, {"validation": 0.1, "test": 0.2}, seed=7)
    for k in a:
        assert np.array_equal(a[k], b[k])
    assert not np.array_equal(a["test"], c["test"])


def test_partition_sizes_and_stratified_proportions():
    y = _labels()
    s = stratified_split(y, {"validation": 0.1, "test": 0.2}, seed=0)
    allidx = np.concatenate(list(s.values()))
    assert sorted(allidx.tolist()) == list(range(1000))  # a partition: disjoint and complete
    assert (len(s["validation"]), len(s["test"]), len(s["rest"])) == (100, 200, 700)
    assert Counter(y[s["validation"]].tolist()) == {0: 50, 1: 30, 2: 20}
    assert Counter(y[s["test"]].tolist()) == {0: 100, 1: 60, 2: 40}


def test_total_is_rounded_fraction_of_rows_with_odd_classes():
    y = np.array([0] * 4265 + [1] * 4265)
    s = stratified_split(y, {"validation": 0.1, "test": 0.1}, seed=42)
    assert len(s["validation"]) == len(s["test"]) == 853
    for k in ("validation", "test"):
        c = Counter(y[s[k]].tolist())
        assert abs(c[0] - c[1]) <= 1


def test_datamodule_split_deterministic(local_dm, make_rows, tmp_path):
    rows = make_rows(40)
    a = local_dm(rows, cache_dir=str(tmp_path / "a"))
    b = local_dm(rows, cache_dir=str(tmp_path / "b"))  # rebuilt from scratch
    c = local_dm(rows, cache_dir=str(tmp_path / "c"), split_seed=1)
    for dm in (a, b, c):
        dm.prepare_data()
        dm.setup(None)
    assert a.val_dataset["input_ids"] == b.val_dataset["input_ids"]
    assert a.test_dataset["input_ids"] == b.test_dataset["input_ids"]
    assert a.val_dataset["input_ids"] != c.val_dataset["input_ids"]
    assert Counter(a.val_dataset["labels"]) == {0: 4, 1: 4, 2: 4}  # 10% of 40 per class


# ----------------------------------------------------------------------------- evaluation order
def _sorted_by_label(rows):
    return sorted(rows, key=lambda r: r["label"])  # as many files and every carved split used to be


def _first_batch_labels(loader):
    return set(next(iter(loader))["labels"].tolist())


def test_first_evaluation_batch_holds_every_class_of_a_balanced_set(local_dm, make_rows, write_rows, tmp_path):
    # 3 balanced classes, every file sorted by label: stored in label order, the first batch of 8 would
    # hold one class (the carved validation split has 10 of each; the given test file 20 of each)
    test_file = write_rows(tmp_path / "test.csv", _sorted_by_label(make_rows(20, seed=5)))
    dm = local_dm(_sorted_by_label(make_rows(100)), test_file=str(test_file), eval_batch_size=8)
    dm.prepare_data()
    dm.setup(None)
    assert Counter(dm.val_dataset["labels"]) == {0: 10, 1: 10, 2: 10}
    assert Counter(dm.test_dataset["labels"]) == {0: 20, 1: 20, 2: 20}
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        assert _first_batch_labels(loader) == {0, 1, 2}
    assert "seeded shuffled order (split_seed=42)" in dm.meta["split_how"]["validation"]


def test_the_evaluation_order_is_fixed_by_split_seed_alone(local_dm, make_rows, tmp_path):
    rows = _sorted_by_label(make_rows(40))
    a = local_dm(rows, cache_dir=str(tmp_path / "a"), shuffle_seed=0)
    b = local_dm(rows, cache_dir=str(tmp_path / "b"), shuffle_seed=7)  # rebuilt; another training order
    for dm in (a, b):
        dm.prepare_data()
        dm.setup(None)
    for split in ("val", "test"):
        ids = [getattr(dm, f"{split}_dataset")["input_ids"] for dm in (a, b)]
        assert ids[0] == ids[1]  # the same rows in the same order
        loaders = [list(getattr(dm, f"{split}_dataloader")()) for dm in (a, b)]
        assert all(x["input_ids"].equal(y["input_ids"]) for x, y in zip(*loaders))
        loader = getattr(a, f"{split}_dataloader")()
        epochs = [next(iter(loader))["input_ids"] for _ in range(2)]
        assert epochs[0].equal(epochs[1]) and epochs[0].equal(loaders[0][0]["input_ids"])  # every epoch alike


def test_evaluation_order_is_a_seeded_permutation():
    from identifiable_transformers.data.prepare import evaluation_order

    a = evaluation_order(853, 42, "validation")
    assert sorted(a.tolist()) == list(range(853))
    assert np.array_equal(a, evaluation_order(853, 42, "validation"))
    assert not np.array_equal(a, evaluation_order(853, 42, "test"))
    assert not np.array_equal(a, evaluation_order(853, 7, "validation"))


def test_rt_offline_first_evaluation_batches_hold_both_classes(cache_dir):
    # the default data: its carved splits switched class once, at row 426 of 853
    from identifiable_transformers.data import TextDataModule

    dm = TextDataModule.from_name("rt_offline", cache_dir=str(cache_dir), max_length=64, batch_size=16)
    dm.prepare_data()
    dm.setup(None)
    for ds, loader in ((dm.val_dataset, dm.val_dataloader()), (dm.test_dataset, dm.test_dataloader())):
        labels = np.asarray(ds["labels"])
        assert len(labels) == 853 and np.bincount(labels).tolist() in ([427, 426], [426, 427])
        assert np.count_nonzero(np.diff(labels)) > 300  # a shuffled order switches class about every other row
        assert _first_batch_labels(loader) == {0, 1}


def test_the_tokenizer_knows_the_words_of_the_training_rows_only(local_dm, make_rows, tmp_path):
    """Validation and test carved from the training file (a view over its table) lend no word to the vocabulary:
    each row carries a word of its own, and the vocabulary holds exactly the training rows' ones."""
    rows = [{**r, "text": f"{r['text']} own{i}"} for i, r in enumerate(make_rows(40))]
    dm = local_dm(rows, val_fraction=0.1, test_fraction=0.1, limit_train_examples=60)
    dm.prepare_data()
    dm.setup(None)

    def own_words(ds):
        return {dm.tokenizer.id_to_token(t) for ids in ds["input_ids"] for t in ids} & {f"own{i}" for i in range(120)}

    train = own_words(dm.train_dataset)
    assert len(train) == 60 and len(own_words(dm.val_dataset)) == len(own_words(dm.test_dataset)) == 0  # <unk> there
    assert {w for w in dm.tokenizer.get_vocab() if w.startswith("own")} == train
    assert len(dm.val_dataset) == len(dm.test_dataset) == 12
