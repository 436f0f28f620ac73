"""The data module of ``model=pretrained``: the same data, tokenized with the checkpoint's own tokenizer.

``PretrainedTextDataModule`` is a :class:`~.datamodule.TextDataModule` (same sources, splits, cache, batching,
rationales and exact resume) that does not train a word-level vocabulary: it encodes with the fast
tokenizer of ``pretrained_tokenizer`` (a hub id or a local folder; conf/model/pretrained.yaml sets it to
``model.name_or_path``). The tokenizer's ``tokenizers`` backend is what is cached, saved in the run folder and
in the checkpoint, with padding off and truncation at ``max_length`` (special tokens kept: ``[CLS] ... [SEP]``).
Its first token is the checkpoint's classification token (``[CLS]``, ``<s>``), which the model pools and the
diagnostics treat as ``<cls>``. ``vocab_size`` and ``min_frequency`` are not used.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
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

    def cache_settings(self) -> dict[str, Any]:
        settings = super().cache_settings()
        settings["pretrained_tokenizer"] = hashlib.sha256(self._backend_json.encode()).hexdigest()
        return settings

    def _make_tokenizer(self, train_text) -> Tokenizer:
        return Tokenizer.from_str(self._backend_json)

    def _read_tokenizer(self, path: Path) -> Tokenizer:
        return Tokenizer.from_file(str(path))


# The config checks (config_checks.check_node) read a target's signature: list TextDataModule's arguments too.
_params = [p for p in inspect.signature(TextDataModule).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
PretrainedTextDataModule.__signature__ = inspect.Signature(
    [*_params, inspect.Parameter("pretrained_tokenizer", inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=str | None)])
