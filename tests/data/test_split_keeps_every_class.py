"""Carving validation and test from the training rows never takes a class whole: a class with no training row
would be scored in validation and test though no model could learn it (a rare class, large fractions). Known
answers: the per-class counts of each part, by hand from the largest-remainder quotas."""

import logging

import numpy as np

from identifiable_transformers.data.prepare import stratified_split


def _counts(labels, parts):
    return {k: np.bincount(labels[v], minlength=labels.max() + 1).tolist() for k, v in parts.items()}


def test_a_class_of_one_row_stays_in_training(caplog):
    labels = np.array([0, 0, 0, 0, 1])
    # quotas at 0.3: class 0 gets 1.2 -> 1, class 1 0.3 -> 0; round(1.5) = 2 rows: the extra goes to the larger
    # remainder, class 1's (0.3 > 0.2), in both splits: its only row. Kept for training instead.
    with caplog.at_level(logging.WARNING, logger="identifiable_transformers.data"):
        parts = stratified_split(labels, {"validation": 0.3, "test": 0.3}, seed=0)
    assert _counts(labels, parts) == {"validation": [1, 0], "test": [1, 0], "rest": [2, 1]}
    assert "class 1 (1 rows) would have no training row" in caplog.text


def test_large_fractions_leave_one_training_row_per_class():
    labels = np.array([0] * 9 + [1] * 9 + [2] * 2)
    # at 0.45: classes 0 and 1 get 4 each (4.05), class 2 gets 1 (0.9) in each split: class 2's two rows
    parts = stratified_split(labels, {"validation": 0.45, "test": 0.45}, seed=0)
    assert _counts(labels, parts) == {"validation": [4, 4, 1], "test": [4, 4, 0], "rest": [1, 1, 1]}
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(20))  # a partition


def test_common_classes_are_split_as_before():
    labels = np.array([0] * 45 + [1] * 45 + [2] * 3)
    parts = stratified_split(labels, {"validation": 0.1, "test": 0.1}, seed=0)
    assert _counts(labels, parts) == {"validation": [5, 4, 0], "test": [5, 4, 0], "rest": [35, 37, 3]}
