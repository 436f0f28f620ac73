"""The synthetic tasks: seeded, labels follow each task's rule, rationales point at the right keywords.

The rule checks recompute the label from the text alone (the keywords are ``k<class>`` words), independently
of the generator's bookkeeping."""

from __future__ import annotations

import re

import numpy as np
import pytest

from identifiable_transformers.data import train_tokenizer
from identifiable_transformers.data.rationales import encode_with_rationales
from identifiable_transformers.data.synthetic import TASKS, SyntheticSpec, generate

KW = re.compile(r"^k(\d+)[a-z]?$")


def _keywords(text: str) -> list[tuple[int, int]]:
    """(word position, class) of every keyword of ``text``, in order."""
    return [(i, int(m.group(1))) for i, w in enumerate(text.split()) if (m := KW.match(w))]


def _spec(task: str, **kw) -> SyntheticSpec:
    nk = {"presence": [1, 2], "order": [2, 3], "majority": [3, 5]}[task]
    return SyntheticSpec.from_config({"task": task, "size": 2000, "num_keywords": nk, **kw})


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_rows_other_seed_other_rows(task):
    a, b, c = generate(_spec(task, seed=3)), generate(_spec(task, seed=3)), generate(_spec(task, seed=4))
    assert a.equals(b)
    assert (a["text"] != c["text"]).mean() > 0.9


def test_tasks_with_the_same_seed_differ():
    assert not generate(_spec("presence")).text.equals(generate(_spec("order")).text)


@pytest.mark.parametrize("task", TASKS)
def test_labels_follow_the_rule_and_rationales_are_the_evidence(task):
    spec = _spec(task, num_classes=5, keywords_per_class=3)
    df = generate(spec)
    for text, label, rationale in zip(df["text"], df["label"], df["rationale"]):
        kws = _keywords(text)
        classes = [c for _, c in kws]
        assert spec.num_keywords[0] <= len(kws) <= spec.num_keywords[1]
        assert spec.min_length <= len(text.split()) <= spec.max_length
        if task == "presence":
            assert set(classes) == {label}
            expected = [p for p, _ in kws]
        elif task == "order":
            assert len(set(classes)) == len(classes)  # distinct classes: only the first one decides
            assert label == classes[0]
            expected = [kws[0][0]]
        else:
            counts = np.bincount(classes, minlength=spec.num_classes)
            assert (counts == counts.max()).sum() == 1 and label == counts.argmax()
            expected = [p for p, c in kws if c == label]
            assert len(expected) >= 2
        assert [int(x) for x in rationale.split()] == expected


@pytest.mark.parametrize("task", TASKS)
def test_classes_are_roughly_balanced(task):
    df = generate(_spec(task, size=4000, num_classes=4))
    share = np.bincount(df["label"], minlength=4) / len(df)
    assert np.all(np.abs(share - 0.25) < 0.03), share


def test_order_puts_every_class_first_equally_often_given_the_set():
    """What makes a bag of words fail: for a given set of classes, each of them is first about as often."""
    df = generate(_spec("order", size=6000, num_classes=3, num_keywords=[2, 2]))
    firsts = {}
    for text, label in zip(df["text"], df["label"]):
        firsts.setdefault(frozenset(c for _, c in _keywords(text)), []).append(label)
    for pair, labels in firsts.items():
        assert len(pair) == 2
        share = np.mean(np.asarray(labels) == min(pair))
        assert 0.4 < share < 0.6, (pair, share)


@pytest.mark.parametrize("task", TASKS)
def test_rationale_positions_point_at_the_keyword_tokens(task):
    spec = _spec(task, size=300, keywords_per_class=2)
    df = generate(spec)
    tok = train_tokenizer(df["text"].tolist(), 1000, 1)
    words = [[int(x) for x in r.split()] for r in df["rationale"]]
    ids, positions = encode_with_rationales(tok, df["text"].tolist(), words, max_length=64)
    for row_ids, pos, label, text in zip(ids, positions, df["label"], df["text"]):
        assert pos and 0 not in pos  # never <cls>
        tokens = [tok.id_to_token(row_ids[p]) for p in pos]
        assert all(KW.match(t) and int(KW.match(t).group(1)) == label for t in tokens), (text, tokens)
        # one word, one token: token position p is word p - 1
        assert sorted(p - 1 for p in pos) == sorted(w for w in _evidence(text, label, task))


def _evidence(text: str, label: int, task: str) -> list[int]:
    kws = _keywords(text)
    return [kws[0][0]] if task == "order" else [p for p, c in kws if c == label]


@pytest.mark.parametrize("bad, match", [
    ({"task": "sorting"}, "task='sorting'"),
    ({"task": "order", "num_keywords": [1, 2]}, "task=order needs"),
    ({"task": "order", "num_classes": 2, "num_keywords": [2, 3]}, "task=order needs"),
    ({"task": "majority", "num_keywords": 1}, "at least 2 keywords"),
    ({"min_length": 2, "num_keywords": [2, 3]}, "min_length"),
    ({"size": 5}, "too small"),
    ({"colour": 3}, "unknown key"),
])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SyntheticSpec.from_config(bad)


def _bow():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "bow_synthetic.py"
    spec = importlib.util.spec_from_file_location("bow_synthetic", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("task, binary, lo, hi", [
    ("presence", False, 0.97, 1.0),   # the keyword is the label
    ("majority", False, 0.95, 1.0),   # counts decide it linearly
    ("majority", True, 0.3, 0.6),     # presence alone does not
    ("order", False, 0.3, 0.55),      # 2 keywords: each is first half the time
])
def test_a_bag_of_words_solves_what_it_should_and_only_that(tmp_path, task, binary, lo, hi):
    from identifiable_transformers.data import TextDataModule

    nk = {"presence": [1, 2], "order": [2, 2], "majority": [3, 5]}[task]
    dm = TextDataModule.from_name(f"synthetic_{task}", cache_dir=str(tmp_path),
                                  synthetic={"task": task, "size": 1500, "num_keywords": nk})
    acc, chance = _bow().bow_accuracy(dm, binary=binary)
    assert lo <= acc <= hi and 0.2 < chance < 0.35, (acc, chance)
