"""The synthetic tasks: seeded, labels follow each task's rule, rationales point at the right keywords.

The rule checks recompute the label from the text alone (the keywords are ``k<class>`` words), independently
of the generator's bookkeeping."""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest

from identifiable_transformers.data import train_tokenizer
from identifiable_transformers.data.rationales import encode_with_rationales
from identifiable_transformers.data.synthetic import TASKS, SyntheticSpec, generate

KW = re.compile(r"^k(\d+)[a-z]?$")
ONE_FAMILY = ("presence", "order", "majority")  # a keyword's class is its label's; task=pair has its own tests below


def _keywords(text: str) -> list[tuple[int, int]]:
    """(word position, class) of every keyword of ``text``, in order."""
    return [(i, int(m.group(1))) for i, w in enumerate(text.split()) if (m := KW.match(w))]


def _spec(task: str, **kw) -> SyntheticSpec:
    nk = {"presence": [1, 2], "order": [2, 3], "majority": [3, 5], "pair": [2, 2]}[task]
    return SyntheticSpec.from_config({"task": task, "size": 2000, "num_keywords": nk, **kw})


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_rows_other_seed_other_rows(task):
    a, b, c = generate(_spec(task, seed=3)), generate(_spec(task, seed=3)), generate(_spec(task, seed=4))
    assert a.equals(b)
    assert (a["text"] != c["text"]).mean() > 0.9


def test_tasks_with_the_same_seed_differ():
    assert not generate(_spec("presence")).text.equals(generate(_spec("order")).text)


@pytest.mark.parametrize("task", ONE_FAMILY)
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


@pytest.mark.parametrize("task", ONE_FAMILY)
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
    ({"min_gap": 0}, "min_gap=0 must be >= 1"),
    ({"task": "order", "min_length": 10, "max_length": 20, "min_gap": 5}, r"need 11\): pass data\.synthetic\.min_length>=11"),
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


# ------------------------------------------------------------------ the contrast regime (data=synthetic_contrast)

def _conf(path: str) -> dict:
    from pathlib import Path

    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / path))


@pytest.mark.parametrize("name", ["synthetic_contrast", "synthetic_contrast_pair"])
def test_contrast_lengths_lie_strictly_between_the_designs_identifiable_lengths(tmp_path, name):
    """Every example of data=synthetic_contrast, counted in tokens with <cls> after the real tokenizer, is longer
    than d_v + 1 of the default baseline (d/h = 16: its head maps have row-stochastic alternatives) and at most
    d_v + 1 of the default identifiable encoder (d_v = d = 64), and fits data.max_length untruncated."""
    from identifiable_transformers.data import TextDataModule

    base = _conf("model/baseline.yaml")
    d, h = base["embed_dim"], base["num_heads"]
    assert _conf("model/identifiable.yaml")["value_dim"] is None  # d_v = embed_dim in the add design
    baseline_bound, identifiable_bound = d // h + 1, d + 1   # 17 and 65 tokens
    dm = TextDataModule.from_name(name, cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    for ds in (dm.train_dataset, dm.val_dataset, dm.test_dataset):
        for row in ds:
            n = len(row["input_ids"])
            assert baseline_bound < n <= identifiable_bound and n <= dm.max_length, n
    texts = generate(dm.synthetic)["text"]  # and the token count is the word count + <cls>: nothing truncated
    assert max(len(t.split()) for t in texts) + 1 < dm.max_length + 1


def test_contrast_rationales_are_the_first_keyword_and_seeded():
    spec = SyntheticSpec.from_config(_conf("data/synthetic_contrast.yaml")["synthetic"])
    assert spec.task == "order" and 24 <= spec.min_length and spec.max_length <= 62
    df = generate(spec)
    for text, label, rationale in zip(df["text"], df["label"], df["rationale"]):
        kws = _keywords(text)
        assert spec.min_length <= len(text.split()) <= spec.max_length
        assert 2 <= len(kws) <= 3 and len({c for _, c in kws}) == len(kws)
        assert label == kws[0][1] and rationale == str(kws[0][0])
    lengths = df["text"].str.split().str.len()
    assert lengths.min() == spec.min_length and lengths.max() == spec.max_length  # the whole range is drawn
    assert df.equals(generate(spec))
    other = generate(SyntheticSpec.from_config({**spec.as_dict(), "seed": 1}))
    assert (df["text"] != other["text"]).mean() > 0.99


@pytest.mark.parametrize("task", ONE_FAMILY)
def test_min_gap_keeps_consecutive_keywords_apart_and_uses_every_admissible_placement(task):
    # 3 keywords in 11 words at gaps >= 5: the only placement is 0, 5, 10; in 12 words there are 4 placements.
    tight = generate(_spec(task, size=200, min_length=11, max_length=11, min_gap=5, num_keywords=3))
    assert {tuple(p for p, _ in _keywords(t)) for t in tight["text"]} == {(0, 5, 10)}
    loose = generate(_spec(task, size=400, min_length=12, max_length=12, min_gap=5, num_keywords=3))
    placements = [tuple(p for p, _ in _keywords(t)) for t in loose["text"]]
    assert set(placements) == {(0, 5, 10), (0, 5, 11), (0, 6, 11), (1, 6, 11)}
    counts = np.unique(placements, axis=0, return_counts=True)[1]
    assert counts.min() > 400 / 4 * 0.6  # uniform over the admissible placements, not piled on a few
    df = generate(_spec(task, size=500, min_length=40, max_length=60, min_gap=9))
    for text, label, rationale in zip(df["text"], df["label"], df["rationale"]):
        pos = [p for p, _ in _keywords(text)]
        assert min(np.diff(pos)) >= 9 if len(pos) > 1 else True
        assert sorted(map(int, rationale.split())) == sorted(_evidence(text, label, task))
    gaps = [b - a for t in df["text"] for a, b in itertools.pairwise([p for p, _ in _keywords(t)])]
    assert min(gaps) == 9  # the bound is reached
    assert generate(_spec(task, min_gap=1)).equals(generate(_spec(task)))  # min_gap = 1: the plain draw


def test_the_contrast_rows_are_those_the_committed_study_trained_on():
    """docs/results.md's contrast study is re-reportable only with the same rows: a generator change (such as
    min_gap's) must leave the default placements alone. The hash is of the rows generated before min_gap existed."""
    import hashlib

    df = generate(SyntheticSpec.from_config(_conf("data/synthetic_contrast.yaml")["synthetic"]))
    digest = hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
    assert digest == "d256513724230c1c16b26b6cb7a60af47b3c8ea21dc893480d24077f3abebb28"


# ------------------------------------------------------------------ the pair task (data=synthetic_contrast_pair)

@pytest.mark.parametrize("m, nk, per_class", [(2, [2, 2], 1), (2, [1, 2], 2), (3, [2, 3], 2)])
def test_pair_labels_are_the_first_keyword_of_each_family(m, nk, per_class):
    """Recomputed from the text: family A is the keywords k0..k{m-1}, B the keywords k{m}..k{2m-1}; the label is
    m * a + b for the first A keyword's class a and the first B keyword's b - m; the rationale is those two."""
    spec = SyntheticSpec.from_config({"task": "pair", "size": 1500, "num_classes": m * m, "num_keywords": nk,
                                      "keywords_per_class": per_class})
    df = generate(spec)
    for text, label, rationale in zip(df["text"], df["label"], df["rationale"]):
        kws = _keywords(text)
        a = [(p, c) for p, c in kws if c < m]
        b = [(p, c - m) for p, c in kws if m <= c < 2 * m]
        assert len(a) + len(b) == len(kws)  # no other keyword
        assert nk[0] <= len(a) <= nk[1] and nk[0] <= len(b) <= nk[1]
        assert len({c for _, c in a}) == len(a) and len({c for _, c in b}) == len(b)  # distinct within a family
        assert label == m * a[0][1] + b[0][1]
        assert [int(x) for x in rationale.split()] == sorted([a[0][0], b[0][0]])  # two tokens
    assert set(df["label"]) == set(range(m * m))
    assert df.equals(generate(spec))


def test_pair_with_every_class_present_leaves_a_bag_of_words_at_chance():
    """num_keywords = m: every sentence holds each keyword once, so its bag of keywords is the same for every label,
    and each label is about 1/4 of the rows: a bag of words (or uniform attention) cannot beat chance."""
    df = generate(SyntheticSpec.from_config(_conf("data/synthetic_contrast_pair.yaml")["synthetic"]))
    assert {tuple(sorted(c for _, c in _keywords(t))) for t in df["text"]} == {(0, 1, 2, 3)}
    share = np.bincount(df["label"], minlength=4) / len(df)
    assert np.all(np.abs(share - 0.25) < 0.02), share
    # and the first keyword alone does not decide it: given it, the other family's first class is a coin flip
    first = np.array([_keywords(t)[0][1] for t in df["text"]])
    for c in range(4):
        other = df["label"][first == c] % 2 if c < 2 else df["label"][first == c] // 2
        assert 0.45 < other.mean() < 0.55


def test_the_pair_rows_are_pinned():
    """The factorial's second task: its rows must stay what its runs trained on (hash of today's rows)."""
    import hashlib

    df = generate(SyntheticSpec.from_config(_conf("data/synthetic_contrast_pair.yaml")["synthetic"]))
    digest = hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
    assert digest == "cc25675eb472833a838723fbe493ec85c2f45611d8df3a15c25acfb3e65019d4"


def test_pair_counts_both_families_words():
    spec = SyntheticSpec.from_config({"task": "pair", "num_classes": 9, "vocab": 30, "keywords_per_class": 2})
    assert spec.words() == 30 + 2 * 3 * 2  # 6 keyword classes (two families of 3), 2 variants each
    assert SyntheticSpec.from_config({"task": "pair", "vocab": 30, "num_keywords": 2}).words() == 34


@pytest.mark.parametrize("bad, match", [
    ({"num_classes": 5}, r"task=pair needs num_classes = m \* m with m >= 2 .* got num_classes=5"),
    ({"num_classes": 1}, r"num_classes=1 must be >= 2"),
    ({"num_keywords": [1, 3]}, r"task=pair needs num_keywords <= 2 per family"),
    ({"num_keywords": [2, 2], "min_length": 3, "max_length": 8}, r"need 4 words: pass data\.synthetic\.min_length>=4"),
    ({"num_keywords": [2, 2], "min_length": 8, "min_gap": 3}, r"need 10 words: pass data\.synthetic\.min_length>=10"),
])
def test_bad_pair_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SyntheticSpec.from_config({"task": "pair", **bad})


# ------------------------------------------------------------------ settings that are refused, with the fix

@pytest.mark.parametrize("bad, match", [
    ({"seed": -1}, r"seed=-1 is negative: pass a seed >= 0, e\.g\. data\.synthetic\.seed=0"),
    ({"size": "abc"}, r"size='abc' is not an integer: pass e\.g\. data\.synthetic\.size=4000"),
    ({"size": 2.5}, r"size=2\.5 is not an integer"),
    ({"vocab": True}, r"vocab=True is not an integer"),
    ({"task": 3}, r"task=3 is not a string"),
    ({"num_keywords": "abc"}, r"num_keywords='abc' must be one integer or a range"),
    ({"num_keywords": [2, "x"]}, r"must be one integer or a range \[lo, hi\] of integers"),
])
def test_wrong_types_and_negative_seeds_are_refused_with_the_fix(bad, match):
    with pytest.raises(ValueError, match=match):
        SyntheticSpec.from_config({"task": "order", **bad})


def test_the_vocabulary_must_hold_every_word_of_the_task():
    """The smallest accepted data.vocab_size keeps every word of the task (checked against the real tokenizer:
    no <unk> anywhere); one less is refused, naming the fix."""
    from identifiable_transformers.data.tokenizer import UNK_ID

    spec = SyntheticSpec.from_config({"task": "order", "size": 400, "vocab": 30, "keywords_per_class": 2})
    need = 30 + 4 * 2 + 4
    with pytest.raises(ValueError, match=rf"data\.vocab_size={need - 1} cannot hold .* pass data\.vocab_size>={need}"):
        spec.check_vocabulary(need - 1)
    spec.check_vocabulary(need)
    texts = generate(spec)["text"].tolist()
    tok = train_tokenizer(texts, need, 1)
    assert all(UNK_ID not in tok.encode(t).ids for t in texts)
    small = train_tokenizer(texts, need - 1, 1)  # what the refusal prevents: some word becomes <unk>
    assert any(UNK_ID in small.encode(t).ids for t in texts)


def test_a_vocabulary_too_small_for_the_keywords_ends_with_one_error_line(tmp_path):
    """data=synthetic_order data.vocab_size=6 through train.py: exit status 1, one Error: line, no traceback."""
    import sys
    from pathlib import Path

    from cli_runner import run_cli

    root = Path(__file__).resolve().parents[2]
    proc = run_cli([sys.executable, str(root / "train.py"), "data=synthetic_order", "data.vocab_size=6",
                    "logger=none", "trainer=cpu", f"paths.cache_dir={tmp_path}/cache",
                    f"paths.log_dir={tmp_path}/logs"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    ours = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("INFO:", "WARNING:", "["))]
    assert errors == ours
    assert len(errors) == 1 and "data.vocab_size=6 cannot hold the task's 204 words" in errors[0]
    assert "pass data.vocab_size>=208" in errors[0]


@pytest.mark.parametrize("override, expected", [
    ("data.synthetic.seed=-1", "data: synthetic: seed=-1 is negative: pass a seed >= 0"),
    ("data.synthetic.size=abc", "data: synthetic: size='abc' is not an integer: pass e.g. data.synthetic.size=4000"),
    ("data.vocab_size=6", "data: synthetic: data.vocab_size=6 cannot hold the task's 204 words"),
])
def test_config_checks_refuse_the_synthetic_mistakes_before_any_data(override, expected):
    """The same mistakes as train.py meets them: the config check of the data node raises the ConfigError whose
    message the CLI prints after 'Error: '."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from identifiable_transformers.common.errors import ConfigError
    from identifiable_transformers.run.config_checks import check_data

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=["data=synthetic_order", override, "callbacks=none", "logger=none",
                                          "paths.cache_dir=/unused"])
    with pytest.raises(ConfigError) as err:
        check_data(cfg)
    assert str(err.value).startswith(expected), str(err.value)


@pytest.mark.parametrize("data, overrides, cut", [
    ("synthetic_contrast", ["data.synthetic.max_length=101"], "data.synthetic.max_length<=63 or data.max_length>=102"),
    ("synthetic_order", ["data.synthetic.min_length=131", "data.synthetic.max_length=511", "data.synthetic.min_gap=65",
                         "data.max_length=128"], "data.synthetic.max_length<=127 or data.max_length>=512"),
])
def test_sentences_longer_than_data_max_length_are_refused(data, overrides, cut):
    """The issue's two cases. The reference: rows whose evidence lies past the cut (a word at index i is token i + 1,
    after <cls>), counted from the generated text alone; the largest sentence length that fits is accepted."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from identifiable_transformers.common.errors import ConfigError
    from identifiable_transformers.run.config_checks import check_data

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={data}", *overrides, "callbacks=none", "logger=none",
                                          "paths.cache_dir=/unused"])
    synthetic = OmegaConf.to_container(cfg.data.synthetic)
    spec = SyntheticSpec.from_config({**synthetic, "size": 200})
    rows = generate(spec)
    lost = sum(1 for r in rows.itertuples() if max(map(int, r.rationale.split())) + 1 >= cfg.data.max_length)
    assert lost > 0  # what the refusal prevents: rows whose label's keyword is cut off
    with pytest.raises(ConfigError, match=f"longer than data.max_length={cfg.data.max_length}.*Pass {cut}"):
        check_data(cfg)
    fits = cfg.data.max_length - 1
    dataclasses.replace(spec, max_length=fits).check_fits(cfg.data.max_length)  # no error: the longest that fits
