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
        dm.prepare_data(); dm.setup(None)
    assert a.val_dataset["input_ids"] == b.val_dataset["input_ids"]
    assert a.test_dataset["input_ids"] == b.test_dataset["input_ids"]
    assert a.val_dataset["input_ids"] != c.val_dataset["input_ids"]
    assert Counter(a.val_dataset["labels"]) == {0: 4, 1: 4, 2: 4}  # 10% of 40 per class
