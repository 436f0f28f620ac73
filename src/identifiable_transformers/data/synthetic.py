"""Seeded synthetic classification tasks whose rationale (the evidence for the label) is known.

Every example is a sentence of filler words ``w0 .. w{vocab-1}`` with a few class keywords planted in it.
The keywords of class ``c`` are ``k{c}`` (or ``k{c}a``, ``k{c}b``, ... with ``keywords_per_class`` > 1);
filler words and keywords are single ``\\w+`` runs, so each word is exactly one token of the project's
tokenizer. The rationale is the list of 0-based word positions of the keywords that carry the label:

* ``presence``: one keyword (``num_keywords`` of them, all of one class, ``[1, 1]`` by default) appears;
  the label is its class. Every keyword is rationale. A bag of words solves it.
* ``order``: keywords of ``n`` *distinct* classes appear; the label is the class of the first one. The
  rationale is that first keyword. Every class set is seen with each of its classes first equally often,
  so a bag of words reaches about ``1/n``.
* ``majority``: ``n`` keywords (classes drawn uniformly, redrawn until one class has strictly the most);
  the label is that class. The rationale is every keyword of that class (at least two tokens), which the
  model must count against the others. A bag of word *counts* can solve it; word presence alone cannot.
* ``pair``: two keyword families, A (``k0 .. k{m-1}``) and B (``k{m} .. k{2m-1}``), ``num_classes`` = m * m;
  ``n_A`` and ``n_B`` keywords (each drawn in ``num_keywords``, distinct classes within a family), interleaved at
  random. The label is ``m * a + b`` for the class ``a`` of the first A keyword and ``b`` of the first B keyword,
  so it needs both; the rationale is those two keywords (two tokens). With ``num_keywords`` = m every class of
  both families is present and only their order decides: a bag of words is at chance.

``min_gap`` places consecutive keywords at least that many words apart (``long_range``: further apart than the
designs' identifiable lengths). The rows come out as a frame with ``text``, ``label`` (class id) and
``rationale`` (space-separated word indices, the ``data.rationale_field`` format), so they go through the same
normalisation, splitting, tokenizing and caching as a local file with a rationale column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

TASKS = ("presence", "order", "majority", "pair")  # appended: a task's index seeds its rows


@dataclass(frozen=True)
class SyntheticSpec:
    """The generator's settings (``data.synthetic.<key>``); every one is part of the cache key."""

    task: str = "order"
    size: int = 4000                 # rows in all; validation and test are carved from them
    min_length: int = 8              # words per sentence, keywords included
    max_length: int = 16
    vocab: int = 200                 # filler words
    num_classes: int = 4
    num_keywords: tuple[int, int] = (2, 3)   # keywords per sentence, drawn uniformly in [lo, hi]
    keywords_per_class: int = 1
    min_gap: int = 1                 # consecutive keywords' positions differ by at least this (1: may be adjacent)
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> SyntheticSpec:
        cfg = dict(cfg or {})
        unknown = set(cfg) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"data.synthetic has unknown key(s) {sorted(unknown)}; known keys: "
                             f"{sorted(cls.__dataclass_fields__)}.")
        for key, value in cfg.items():  # types first: a string where a number belongs would fail deep inside
            if key == "task" and not isinstance(value, str):
                raise ValueError(f"synthetic: task={value!r} is not a string: pass e.g. data.synthetic.task=order.")
            if key not in ("task", "num_keywords") and not _is_int(value):
                raise ValueError(f"synthetic: {key}={value!r} is not an integer: pass e.g. "
                                 f"data.synthetic.{key}={getattr(cls, key)}.")
        if "num_keywords" in cfg:
            nk = cfg["num_keywords"]
            nk = [nk, nk] if _is_int(nk) else list(nk) if isinstance(nk, (list, tuple)) else None
            if nk is None or len(nk) != 2 or not all(map(_is_int, nk)):
                raise ValueError(f"synthetic: num_keywords={cfg['num_keywords']!r} must be one integer or a range "
                                 "[lo, hi] of integers: pass e.g. data.synthetic.num_keywords=[2,3].")
            cfg["num_keywords"] = (int(nk[0]), int(nk[1]))
        spec = cls(**cfg)
        spec.check()
        return spec

    def check(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"synthetic: {msg}")  # the CLI prefixes the node: "data: synthetic: ..."

        if self.task not in TASKS:
            raise bad(f"task={self.task!r} is not one of {TASKS}.")
        if self.seed < 0:
            raise bad(f"seed={self.seed} is negative: pass a seed >= 0, e.g. data.synthetic.seed=0.")
        lo, hi = self.num_keywords
        if self.num_classes < 2:
            raise bad(f"num_classes={self.num_classes} must be >= 2.")
        if self.size < 10 * self.num_classes:
            raise bad(f"size={self.size} is too small for {self.num_classes} classes "
                      f"(at least {10 * self.num_classes}).")
        if self.vocab < 1 or self.keywords_per_class < 1:
            raise bad(f"vocab={self.vocab} and keywords_per_class={self.keywords_per_class} must be >= 1.")
        if not 1 <= lo <= hi:
            raise bad(f"num_keywords={list(self.num_keywords)} must be a range 1 <= lo <= hi.")
        if self.task == "order" and not 2 <= lo <= hi <= self.num_classes:
            raise bad(f"task=order needs 2 <= num_keywords <= num_classes={self.num_classes} (keywords of distinct "
                      f"classes, the first decides); got {list(self.num_keywords)}.")
        if self.task == "majority" and lo < 2:
            raise bad("task=majority needs at least 2 keywords per sentence; "
                      f"got num_keywords={list(self.num_keywords)}.")
        if not hi <= self.min_length <= self.max_length:
            raise bad(f"need num_keywords <= min_length <= max_length; got num_keywords={list(self.num_keywords)}, "
                      f"min_length={self.min_length}, max_length={self.max_length}.")
        if self.min_gap < 1:
            raise bad(f"min_gap={self.min_gap} must be >= 1 (1: keywords may be adjacent).")
        need = hi + (hi - 1) * (self.min_gap - 1)  # hi keywords, each pair of neighbours min_gap apart
        if need > self.min_length:
            raise bad(f"min_gap={self.min_gap} cannot fit {hi} keywords into min_length={self.min_length} words (they "
                      f"need {need}): pass data.synthetic.min_length>={need} or a smaller data.synthetic.min_gap.")
        if self.task == "pair":
            self._check_pair()

    def _check_pair(self) -> None:
        """task=pair: num_classes = m * m (m >= 2 classes per family), 1 <= num_keywords <= m per family, and the
        2 * hi keywords of both families fit min_length with their gaps."""
        m, hi = _pair_m(self.num_classes), self.num_keywords[1]
        if m * m != self.num_classes or m < 2:
            raise ValueError(f"synthetic: task=pair needs num_classes = m * m with m >= 2 (4, 9, ...; the label is "
                             f"the pair of the two families' first classes); got num_classes={self.num_classes}.")
        if hi > m:
            raise ValueError(f"synthetic: task=pair needs num_keywords <= {m} per family (distinct classes within a "
                             f"family); got {list(self.num_keywords)}.")
        need = 2 * hi + (2 * hi - 1) * (self.min_gap - 1)
        if need > self.min_length:
            raise ValueError(f"synthetic: task=pair places up to {2 * hi} keywords (num_keywords per family, two "
                             f"families), which need {need} words: pass data.synthetic.min_length>={need}.")

    def words(self) -> int:
        """The generator's distinct words: its filler words and every class keyword."""
        kinds = 2 * _pair_m(self.num_classes) if self.task == "pair" else self.num_classes  # pair: two families of m
        return self.vocab + kinds * self.keywords_per_class

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse a tokenizer cap (``data.vocab_size``, special tokens included) below the task's words: the
        tokenizer keeps the most frequent words, so some keywords or fillers would become ``<unk>`` (a
        keyword lost that way makes its class unlearnable)."""
        from .tokenizer import SPECIAL_TOKENS

        specials = len(SPECIAL_TOKENS)
        need = self.words() + specials
        if vocab_size < need:
            raise ValueError(
                f"synthetic: data.vocab_size={vocab_size} cannot hold the task's {self.words()} words "
                f"({self.num_classes * self.keywords_per_class} class keywords and {self.vocab} filler words) and the "
                f"{specials} special tokens, so words would be read as <unk>: pass data.vocab_size>={need} "
                "(or fewer words: data.synthetic.vocab, num_classes, keywords_per_class).")

    def check_fits(self, max_length: int) -> None:
        """Refuse sentences longer than ``data.max_length`` tokens: the tokens past it are cut, and with them, on
        some rows, the keywords that decide the label (a row then keeps its label without its evidence). Each word
        is one token of the project's tokenizer, after ``<cls>``; a pretrained tokenizer splits words into one or
        more pieces, so the words must fit there too."""
        need = self.max_length + 1  # <cls> and the longest sentence's words
        if need > max_length:
            raise ValueError(
                f"synthetic: sentences of up to max_length={self.max_length} words are {need} tokens with <cls>, "
                f"longer than data.max_length={max_length}: the cut would drop the keywords that decide the label "
                f"on some rows. Pass data.synthetic.max_length<={max_length - 1} or data.max_length>={need}.")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_keywords"] = list(self.num_keywords)
        return d


def _pair_m(num_classes: int) -> int:
    """task=pair: the classes per family, m = sqrt(num_classes) rounded down."""
    return math.isqrt(num_classes) if num_classes > 0 else 0


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def keyword(cls: int, j: int, per_class: int) -> str:
    """The ``j``-th keyword of class ``cls``."""
    return f"k{cls}" if per_class == 1 else f"k{cls}{chr(ord('a') + j)}"


def _keyword_classes(spec: SyntheticSpec, rng: np.random.Generator) -> tuple[list[int], int]:
    """The classes of one sentence's keywords (in sentence order) and its label."""
    n = int(rng.integers(spec.num_keywords[0], spec.num_keywords[1] + 1))
    c = spec.num_classes
    if spec.task == "presence":
        y = int(rng.integers(c))
        return [y] * n, y
    if spec.task == "order":
        classes = rng.choice(c, size=n, replace=False).tolist()  # uniform over ordered distinct tuples
        return classes, classes[0]
    if spec.task == "pair":  # n A keywords (classes 0..m-1) and n_b B keywords (m..2m-1), interleaved at random
        m = _pair_m(c)
        n_b = int(rng.integers(spec.num_keywords[0], spec.num_keywords[1] + 1))
        family = np.concatenate([rng.choice(m, size=n, replace=False), m + rng.choice(m, size=n_b, replace=False)])
        classes = rng.permutation(family).tolist()
        a, b = next(x for x in classes if x < m), next(x for x in classes if x >= m)
        return classes, m * a + (b - m)
    while True:  # majority: redraw until one class has strictly the most keywords
        classes = rng.integers(c, size=n).tolist()
        counts = np.bincount(classes, minlength=c)
        top = np.flatnonzero(counts == counts.max())
        if len(top) == 1:
            return classes, int(top[0])


def generate(spec: SyntheticSpec) -> pd.DataFrame:
    """``spec.size`` rows: ``text``, ``label`` (int), ``rationale`` (space-separated word indices)."""
    rng = np.random.default_rng([int(spec.seed), TASKS.index(spec.task)])
    texts, labels, rationales = [], [], []
    for _ in range(spec.size):
        classes, y = _keyword_classes(spec, rng)
        length = int(rng.integers(spec.min_length, spec.max_length + 1))
        words = [f"w{i}" for i in rng.integers(spec.vocab, size=length)]
        # Keyword positions, in order, at least min_gap apart: k sorted distinct draws from the positions left once
        # the k - 1 gaps' extra (min_gap - 1) words are set aside, then shifted by them (uniform over the
        # admissible placements; min_gap = 1 is the plain draw of k distinct positions).
        k, extra = len(classes), spec.min_gap - 1
        slots = np.sort(rng.choice(length - (k - 1) * extra, size=k, replace=False)) + extra * np.arange(k)
        for pos, c in zip(slots, classes):
            words[pos] = keyword(c, int(rng.integers(spec.keywords_per_class)), spec.keywords_per_class)
        if spec.task == "order":
            evidence = [int(slots[0])]
        elif spec.task == "pair":  # the first keyword of each family
            m = _pair_m(spec.num_classes)
            evidence = [int(next(p for p, c in zip(slots, classes) if c < m)),
                        int(next(p for p, c in zip(slots, classes) if c >= m))]
            evidence.sort()
        else:  # presence, majority: every keyword of the label's class
            evidence = [int(p) for p, c in zip(slots, classes) if c == y]
        texts.append(" ".join(words))
        labels.append(y)
        rationales.append(" ".join(map(str, evidence)))
    return pd.DataFrame({"text": texts, "label": labels, "rationale": rationales})
