"""The data module of ``model=pretrained``: the same data, tokenized with the checkpoint's own tokenizer.

``PretrainedTextDataModule`` is a :class:`~.datamodule.TextDataModule` (same sources, splits, cache, batching,
rationales and exact resume) that does not train a word-level vocabulary: it encodes with the fast
tokenizer of ``pretrained_tokenizer`` (a hub id or a local folder; conf/model/pretrained.yaml sets it to
``model.name_or_path``). The tokenizer's ``tokenizers`` backend is what is cached, saved in the run folder and
in the checkpoint, with padding off and truncation at ``max_length`` (special tokens kept: ``[CLS] ... [SEP]``).
Its first token is the checkpoint's classification token (``[CLS]``, ``<s>``), which the model pools and the
diagnostics treat as ``<cls>``. ``vocab_size`` and ``min_frequency`` are not used.

Two text fields (``data.text_fields=[premise, hypothesis]``) are encoded as the tokenizer's pair, as the
checkpoint was trained: ``[CLS] a [SEP] b [SEP]`` (RoBERTa: ``<s> a </s></s> b </s>``), truncated longest-first;
the model derives the ``token_type_ids`` from the separator (``PretrainedClassifier.token_types``). One text field
gives every token type 0, as the tokenizer does, even where the text holds a [SEP] itself (``read_pairs``). Three or
more fields are joined with ``text_separator`` as for the project's own tokenizer.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenizers import Tokenizer

from ..data.datamodule import TextDataModule


def backend_tokenizer(hf_tokenizer, max_length: int, what: str) -> Tokenizer:
    """A copy of a transformers fast tokenizer's ``tokenizers`` backend: no padding, truncation at ``max_length``,
    special tokens added; checked to start every encoding with the classification token."""
    tok = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    tok.no_padding()
    tok.enable_truncation(int(max_length))
    cls_id = hf_tokenizer.cls_token_id if hf_tokenizer.cls_token_id is not None else hf_tokenizer.bos_token_id
    first = tok.encode("a", add_special_tokens=True).ids[:1]
    if cls_id is None or first != [cls_id]:
        raise ValueError(f"{what}: its tokenizer does not start an encoding with a classification token (got ids "
                         f"{first}, cls/bos {cls_id}); the model pools the first token, so use a checkpoint whose "
                         "tokenizer adds [CLS] or <s>")
    if hf_tokenizer.pad_token_id is None:
        raise ValueError(f"{what}: its tokenizer has no padding token; batches need one")
    return tok


def special_token_ids(tok: Tokenizer) -> tuple[int, ...]:
    """The ids the tokenizer's template adds around a text or a pair ([CLS], [SEP]; <s>, </s>): what a pretrained
    model's explanations leave out by default (``pinned_ids``; docs/pretrained.md). Padding is never a real token;
    [UNK] and [MASK] are not among them: an unknown word is still a word of the input."""
    with_special = tok.encode("a", "b", add_special_tokens=True).ids
    plain = set(tok.encode("a", "b", add_special_tokens=False).ids)
    return tuple(sorted({i for i in with_special if i not in plain}))


def separator_id(tok: Tokenizer) -> int | None:
    """The token that ends the first segment of a pair (BERT's [SEP]): where the second segment's token types
    start (``PretrainedClassifier.token_types``); None for a tokenizer without segments."""
    enc = tok.encode("a", "b", add_special_tokens=True)
    if 1 not in enc.type_ids:
        return None
    return enc.ids[enc.type_ids.index(1) - 1]


# Joins a pair's two fields in the "text" column until they are encoded (ASCII record separator: not in any text
# the tokenizers' normalisers keep, and stripped by them if it were).
PAIR_SEPARATOR = "\x1e"


class PairEncoder:
    """A ``tokenizers.Tokenizer`` whose ``encode_batch`` encodes ``"a" + PAIR_SEPARATOR + "b"`` as the pair (a, b);
    the offsets of b's tokens are shifted to point into the joined text, so rationales (word indices into the
    first field) map to tokens as for a single text. Everything else is the tokenizer's own."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer

    def __getattr__(self, name: str):
        return getattr(self._tok, name)

    def encode_batch(self, texts, add_special_tokens: bool = True):
        parts = [tuple(t.split(PAIR_SEPARATOR, 1)) if PAIR_SEPARATOR in t else t for t in texts]
        encodings = self._tok.encode_batch(parts, add_special_tokens=add_special_tokens)
        return [e if isinstance(p, str) else self._joined(e, len(p[0]) + len(PAIR_SEPARATOR))
                for p, e in zip(parts, encodings)]

    @staticmethod
    def _joined(enc, shift: int) -> SimpleNamespace:
        offsets = [(a + shift, b + shift) if s == 1 else (a, b) for (a, b), s in zip(enc.offsets, enc.sequence_ids)]
        return SimpleNamespace(ids=enc.ids, offsets=offsets, special_tokens_mask=enc.special_tokens_mask,
                               type_ids=enc.type_ids)


class PretrainedTextDataModule(TextDataModule):
    """A ``TextDataModule`` tokenizing with ``pretrained_tokenizer``'s tokenizer (see the module docstring).

    Takes every ``TextDataModule`` argument, plus ``pretrained_tokenizer``: a hub id or a local folder.
    """

    def __init__(self, pretrained_tokenizer: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not pretrained_tokenizer:
            raise ValueError("pretrained_tokenizer is not set: name the checkpoint whose tokenizer encodes the data "
                             "(model=pretrained sets data.pretrained_tokenizer=${model.name_or_path})")
        if self.tokenizer_file:
            raise ValueError("tokenizer_file cannot be used with pretrained_tokenizer: the data is encoded with the "
                             "checkpoint's own tokenizer; set data.tokenizer_file=null")
        from .loading import load_tokenizer

        self.pretrained_tokenizer = str(pretrained_tokenizer)
        what = f"data.pretrained_tokenizer={self.pretrained_tokenizer}"
        hf = load_tokenizer(self.pretrained_tokenizer, what="model.name_or_path")
        self._backend = backend_tokenizer(hf, self.max_length, what)
        self.pad_id = int(hf.pad_token_id)
        self.cls_id = int(hf.cls_token_id if hf.cls_token_id is not None else hf.bos_token_id)
        self._backend_json = self._backend.to_str()
        self.pairs = len(self.text_fields) == 2 and not self._uses_classic()
        if self.pairs:  # the two fields reach the tokenizer as a pair (see the module docstring)
            self.text_separator = PAIR_SEPARATOR

    def cache_settings(self) -> dict[str, Any]:
        settings = super().cache_settings()
        settings["pretrained_tokenizer"] = hashlib.sha256(self._backend_json.encode()).hexdigest()
        return settings

    def _make_tokenizer(self, train_text) -> Tokenizer | PairEncoder:
        tok = Tokenizer.from_str(self._backend_json)
        return PairEncoder(tok) if self.pairs else tok

    def _check_fits_tokenized(self, parts: dict[str, Any]) -> None:
        """Synthetic data: every sentence must fit ``max_length`` word pieces. The task's words split into pieces
        (``w191``: ``w ##19 ##1``), and a cut row would keep its label without the keywords that decide it."""
        if self.synthetic is None:
            return
        tok = self._make_tokenizer(None)  # a fresh copy: the one the build encodes with keeps its truncation
        tok.no_truncation()
        lengths = [len(e.ids) for ds in parts.values() for e in tok.encode_batch(ds["text"])]
        over = sum(n > self.max_length for n in lengths)
        if over:
            raise ValueError(
                f"synthetic: {over} of {len(lengths)} sentences are longer than data.max_length={self.max_length} "
                f"word pieces with the tokenizer of {self.pretrained_tokenizer} (the longest: {max(lengths)}; it "
                f"splits the task's words into pieces): the cut would drop the keywords that decide the label on "
                f"some rows. Pass data.max_length>={max(lengths)}, or shorter sentences (data.synthetic.min_length, "
                f"data.synthetic.max_length, in words).")

    def _read_tokenizer(self, path: Path) -> Tokenizer:
        return Tokenizer.from_file(str(path))


# The config checks (config_checks.check_node) read a target's signature: list TextDataModule's arguments too.
_params = [p for p in inspect.signature(TextDataModule).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
PretrainedTextDataModule.__signature__ = inspect.Signature(
    [*_params, inspect.Parameter("pretrained_tokenizer", inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=str | None)])
