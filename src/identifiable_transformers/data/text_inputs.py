"""The texts analyze.py reads (``text=...``, ``texts_file=...``) and their encoding as the model sees them.

An entry is one text, or a sentence pair: a list of two texts (``'text=[["a gripping film", "it was great"]]'``),
encoded as the tokenizer's pair (``[CLS] a [SEP] b [SEP]``, token types 1 on the second segment), as split mode
encodes a data set with two text fields. A text is read as the tokenizer reads it: ``"a [SEP] b"`` is one text
(its token types stay 0, as ``tokenizer("a [SEP] b")`` gives them), not a pair.

Encoding truncates at ``max_length`` tokens, special tokens included, the way the tokenizer does (a pair longest
first); :class:`EncodedInputs` says per entry how many tokens were cut and which part of the text the model saw.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

Entry = str | tuple[str, str]
PAIR_MARK = " ‖ "  # between a pair's two texts where the report shows them as one line


def read_utf8(path: Path, key: str) -> str:
    """The text of ``path``, UTF-8 with or without a byte-order mark (the mark is not text)."""
    data = path.read_bytes()
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        start = e.start + skip
        line = data[:start].count(b"\n") + 1
        raise ValueError(f"{key}={str(path)!r} is not UTF-8 text (byte {start}, line {line}: {e.reason}): save it "
                         "as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)") from None


def read_texts_file(path: str, key: str = "texts_file") -> list[str]:
    """One text per non-blank line (any line ending; a byte-order mark is dropped), stripped."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{key}={path!r} does not exist")
    texts = [line.strip() for line in read_utf8(p, key).splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{key}={path!r} has no non-blank line")
    return texts


def entries_from_values(values, key: str = "text") -> list[Entry]:
    """``text=`` as entries: a string, or a list whose items are strings or pairs (lists of two strings)."""
    from omegaconf import DictConfig, ListConfig

    items = list(values) if isinstance(values, (list, tuple, ListConfig)) else [values]
    entries: list[Entry] = []
    for i, item in enumerate(items):
        if isinstance(item, (list, tuple, ListConfig)):
            if len(item) != 2 or any(isinstance(t, (list, tuple, ListConfig, DictConfig)) for t in item):
                raise ValueError(f"{key} entry {i} is a list of {len(item)}: a sentence pair is a list of two texts, "
                                 f'e.g. \'{key}=[["a gripping film", "it was great"]]\'; a single text is a string')
            entries.append((str(item[0]), str(item[1])))
        elif isinstance(item, (dict, DictConfig)):
            raise ValueError(f"{key} entry {i} is a mapping: pass a text (a string) or a sentence pair (a list of two)")
        else:
            entries.append(str(item))
    empty = [i for i, e in enumerate(entries) if not all(t.strip() for t in ((e,) if isinstance(e, str) else e))]
    if empty:
        raise ValueError(f"{key} is empty (entries {empty}): pass a non-empty text, e.g. {key}=\"a fine film\"")
    return entries


def shown(entry: Entry) -> str:
    return entry if isinstance(entry, str) else PAIR_MARK.join(entry)


@dataclass
class EncodedInputs:
    input_ids: torch.Tensor  # (B, T) padded with pad_id
    attention_mask: torch.Tensor  # (B, T) bool
    type_ids: torch.Tensor  # (B, T) the tokenizer's token types, 0 on padding
    seen: list[str]  # the part of each entry the model saw (a cut text ends with " …")
    dropped: list[int]  # tokens cut from each entry

    @property
    def batch(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def _seen_text(entry: Entry, enc) -> str:
    """The entry up to its last kept token, per segment (offsets index each segment's own text)."""
    parts = (entry,) if isinstance(entry, str) else entry
    ends = [0] * len(parts)
    for (_, end), seq, special in zip(enc.offsets, enc.sequence_ids, enc.special_tokens_mask):
        if seq is not None and not special:
            ends[seq] = max(ends[seq], end)
    out = [p if not p[end:].strip() else p[:end].rstrip() + " …" for p, end in zip(parts, ends)]
    return PAIR_MARK.join(out)


def _content(enc) -> list[int]:
    """Tokens of each segment that are not added by the template (a [SEP] typed in the text counts)."""
    counts = [0, 0]
    for seq, special in zip(enc.sequence_ids, enc.special_tokens_mask):
        if seq is not None and not special:
            counts[seq] += 1
    return counts


def encode_entries(tokenizer: Tokenizer, entries: Sequence[Entry], max_length: int, pad_id: int,
                   key: str = "max_length") -> EncodedInputs:
    """Encode ``entries`` as the tokenizer does, cut at ``max_length`` tokens (``key`` names that setting).

    Refused, naming the entries: a text with no token left after the tokenizer's normalisation (``<br />``), and a
    ``max_length`` that leaves a text (or one text of a pair) no token beside the special ones."""
    full_tok = Tokenizer.from_str(tokenizer.to_str())
    full_tok.no_truncation()
    full_tok.no_padding()
    cut_tok = Tokenizer.from_str(full_tok.to_str())
    cut_tok.enable_truncation(int(max_length))
    items = [e if isinstance(e, str) else tuple(e) for e in entries]
    full = full_tok.encode_batch(items, add_special_tokens=True)
    cut = cut_tok.encode_batch(items, add_special_tokens=True)
    nothing = [i for i, (e, f) in enumerate(zip(items, full)) if 0 in _content(f)[: 1 if isinstance(e, str) else 2]]
    if nothing:
        listed = ", ".join(repr(shown(entries[i])) for i in nothing[:3]) + (", ..." if len(nothing) > 3 else "")
        raise ValueError(f"text has no token left after the tokenizer's normalisation (entries {nothing}: {listed}): "
                         "pass a text with words in it")
    starved = [i for i, (e, c) in enumerate(zip(items, cut)) if 0 in _content(c)[: 1 if isinstance(e, str) else 2]]
    if starved:
        pair = any(not isinstance(items[i], str) for i in starved)
        need = full_tok.num_special_tokens_to_add(pair) + (2 if pair else 1)
        seen = " ".join(cut[starved[0]].tokens)
        raise ValueError(f"{key}={max_length} leaves no word of {'a pair' if pair else 'the text'} (entries "
                         f"{starved}; the model would see only {seen}): pass {key}>={need}")
    ids = [c.ids for c in cut]
    T = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), T), int(pad_id), dtype=torch.long)
    type_ids = torch.zeros((len(ids), T), dtype=torch.long)
    for b, c in enumerate(cut):
        input_ids[b, : len(c.ids)] = torch.tensor(c.ids)
        type_ids[b, : len(c.ids)] = torch.tensor(c.type_ids)
    mask = torch.arange(T)[None, :] < torch.tensor([len(s) for s in ids])[:, None]
    return EncodedInputs(input_ids, mask, type_ids, [_seen_text(e, c) for e, c in zip(items, cut)],
                         [len(f.ids) - len(c.ids) for f, c in zip(full, cut)])


def truncation_warning(enc: EncodedInputs, max_length: int, positions: int | None, key: str = "max_length"
                       ) -> str | None:
    """One line saying which entries were cut, by how many tokens, and how to keep more; None if none was."""
    cut = [(i, n) for i, n in enumerate(enc.dropped) if n > 0]
    if not cut:
        return None
    listed = ", ".join(f"entry {i}: {n}" for i, n in cut[:10]) + (", ..." if len(cut) > 10 else "")
    longest = max(int(enc.attention_mask[i].sum()) + n for i, n in cut)
    if positions is not None and max_length >= positions:
        fix = (f"the model has positions for {positions} tokens only: split the text to see the rest")
    else:
        most = longest if positions is None else min(longest, positions)
        fix = f"pass {key}={most} to keep {'them' if most == longest else 'more'}"
    return (f"{len(cut)} of {len(enc.dropped)} texts are longer than {key}={max_length} tokens and were cut "
            f"(tokens dropped: {listed}; {sum(n for _, n in cut)} in all): {fix}")
