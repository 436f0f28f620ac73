"""The synthetic generator's distributions against their documented laws (data/synthetic.py).

Sentence lengths are uniform on [min_length, max_length], both ends included; each class keyword is
drawn uniformly among its ``keywords_per_class`` variants. The counts are read off the generated text
and compared with the law's expected frequencies.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from identifiable_transformers.data.synthetic import TASKS, SyntheticSpec, generate

KW = re.compile(r"^k(\d+)([a-z]?)$")


@pytest.mark.parametrize("task", TASKS)
def test_sentence_lengths_are_uniform_on_min_to_max_inclusive(task):
    nk = {"presence": [1, 2], "order": [2, 3], "majority": [3, 4], "pair": [1, 2]}[task]
    cfg = {"task": task, "size": 3000, "min_length": 5, "max_length": 10, "num_keywords": nk}
    spec = SyntheticSpec.from_config(cfg)
    lengths = Counter(len(t.split()) for t in generate(spec)["text"])
    assert sorted(lengths) == list(range(5, 11))  # both ends occur, nothing outside
    for length, count in lengths.items():  # 6 values, 500 each expected; binomial sd ~20
        assert abs(count / 3000 - 1 / 6) < 0.03, (length, count)


def test_a_sentence_of_exactly_one_length_has_that_length():
    spec = SyntheticSpec.from_config({"task": "presence", "size": 200, "min_length": 7, "max_length": 7})
    assert {len(t.split()) for t in generate(spec)["text"]} == {7}


@pytest.mark.parametrize("per_class", [2, 3])
def test_every_keyword_variant_is_planted_about_equally_often(per_class):
    spec = SyntheticSpec.from_config(
        {"task": "presence", "size": 3000, "num_classes": 3, "num_keywords": [1, 2], "keywords_per_class": per_class}
    )
    variants = Counter()
    for text in generate(spec)["text"]:
        for w in text.split():
            if m := KW.match(w):
                variants[int(m.group(1)), m.group(2)] += 1
    letters = [chr(ord("a") + j) for j in range(per_class)]
    assert set(variants) == {(c, v) for c in range(3) for v in letters}  # k0a, k0b, ...: and no bare k0
    for c in range(3):
        total = sum(variants[c, v] for v in letters)  # ~1500 keywords per class
        for v in letters:
            assert abs(variants[c, v] / total - 1 / per_class) < 0.06, (c, v, variants[c, v], total)
