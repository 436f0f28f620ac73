"""Rationales: which tokens of an example are the evidence for its label (``data.rationale_field``).

In a file a rationale cell holds space-separated, 0-based indices of the whitespace-separated words of the
text (of the first text field when there are several; it comes first in the joined text). An empty cell is
an example without a rationale. After tokenization a rationale is a list of token positions into that
example's ``input_ids``: every token whose character span overlaps a rationale word, found through the
tokenizer's offsets; ``<cls>`` (position 0) never is, and tokens cut by ``max_length`` are left out.
Batches carry it as ``rationale_mask`` (bool, B x T); the faithfulness diagnostics score explanations against it
(docs/faithfulness.md, plausibility).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .sources import RawSplit

_WORD = re.compile(r"\S+")  # the words str.split() gives, with their character spans


def _cell_indices(v: Any) -> list[int] | None:
    """The indices a cell holds, or None when it is not a (space-separated) list of integers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return []
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return [int(v)]
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return [int(v)]  # pandas reads a column of integers with empty cells as floats: 3.0 is the index 3
    if isinstance(v, str):
        parts = v.split()
        return [int(p) for p in parts] if all(re.fullmatch(r"[+-]?\d+", p) for p in parts) else None
    if isinstance(v, (list, tuple, np.ndarray)):
        items = list(v)
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in items):
            return [int(x) for x in items]
    return None


def parse_rationales(raw: RawSplit, field: str, first_texts: Sequence[str], split: str) -> list[list[int]]:
    """The word indices of every row of ``raw[field]``, checked against the words of ``first_texts``
    (the first text field, normalised as it is joined). Sorted, duplicates removed.

    A cell that is not a list of integers, or an index outside the text's words, is a ValueError
    naming the split, the file line (or data row) and the cell."""
    values = raw.frame[field].tolist() if raw.frame is not None else raw.dataset[field]
    out: list[list[int]] = []
    for i, (cell, text) in enumerate(zip(values, first_texts)):
        idx = _cell_indices(cell)
        if idx is None:
            raise ValueError(
                f"rationale_field={field!r}: the cell {cell!r} in the {split} split at {raw.where(i)} is not a list "
                "of integers. A rationale cell holds space-separated, 0-based word indices (e.g. '0 3 4'), or is "
                "empty for a row without a rationale.")
        n_words = len(text.split())
        bad = [j for j in idx if not 0 <= j < n_words]
        if bad:
            raise ValueError(
                f"rationale_field={field!r}: the cell {cell!r} in the {split} split at {raw.where(i)} has the "
                f"index {bad[0]}, outside the {n_words} whitespace-separated words of its text (0-based: "
                f"0..{n_words - 1}). Indices count the words of the first text field.")
        out.append(sorted(set(idx)))
    return out


def token_positions(text: str, offsets: Sequence[tuple[int, int]], special: Sequence[int],
                    words: Sequence[int]) -> list[int]:
    """Positions of the tokens whose character span overlaps one of the ``words`` (word indices of
    ``text``); special tokens (``<cls>``) never count. ``offsets`` and ``special`` come from the
    tokenizer's encoding of ``text`` (already truncated)."""
    if not words:
        return []
    wanted = set(words)
    spans = [m.span() for i, m in enumerate(_WORD.finditer(text)) if i in wanted]
    out = []
    for pos, ((a, b), sp) in enumerate(zip(offsets, special)):
        if sp or a == b:
            continue
        if any(a < we and ws < b for ws, we in spans):
            out.append(pos)
    return out


def encode_with_rationales(tok, texts: Sequence[str], words: Sequence[Sequence[int]],
                           max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids (``<cls>`` first, truncated to ``max_length``) and rationale token positions per text."""
    encs = tok.encode_batch(list(texts), add_special_tokens=True)
    m = int(max_length)
    ids, positions = [], []
    for text, enc, w in zip(texts, encs, words):
        ids.append(enc.ids[:m])
        positions.append(token_positions(text, enc.offsets[:m], enc.special_tokens_mask[:m], w))
    return ids, positions


def rationale_mask(rationales: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """(B, width) bool, True at each row's rationale positions (the batch's padded width); a position outside
    ``[0, width)`` is an error (a negative one would silently mark a token from the end)."""
    mask = torch.zeros(len(rationales), width, dtype=torch.bool)
    for i, r in enumerate(rationales):
        positions = [int(j) for j in r]
        bad = [j for j in positions if not 0 <= j < width]
        if bad:
            raise ValueError(f"rationale positions {bad} of example {i} are outside its {width} tokens")
        mask[i, positions] = True
    return mask


class RationaleAccess:
    """The rationale side of :class:`~.datamodule.TextDataModule` (a mixin: it reads the module's settings)."""

    @property
    def has_rationales(self) -> bool:
        """True when the examples carry rationales (``data.rationale_field``, set by every synthetic task)."""
        if self.train_dataset is not None:
            return "rationale" in self.train_dataset.column_names
        return self.rationale_field is not None

    def rationales(self, split: str, indices: Sequence[int]) -> list[list[int]]:
        """The rationale token positions of the examples ``indices`` of ``split`` ("train", "validation",
        "test"), in the order given; an empty list for an example without one. Positions index the
        example's ``input_ids`` (0 is ``<cls>``, never in a rationale)."""
        self._require_setup("rationales")
        datasets = {"train": self.train_dataset, "validation": self.val_dataset, "test": self.test_dataset}
        if split not in datasets:
            raise ValueError(f"split={split!r} is not one of {list(datasets)}.")
        if not self.has_rationales:
            raise ValueError(f"[{self.name}] has no rationales: "
                             "set data.rationale_field to the column that holds them.")
        ds = datasets[split]
        if ds is None:
            raise ValueError(f"[{self.name}] has no {split} split.")
        column = ds.select_columns(["rationale"])
        return [list(column[int(i)]["rationale"]) for i in indices]
