r"""Word-level tokenizer (Hugging Face ``tokenizers``) and batch encoding helpers.

The tokenizer lower-cases (after NFKC normalisation and replacing HTML line breaks),
splits on whitespace and punctuation (``\w+`` and ``[^\w\s]+`` runs), and keeps at most ``vocab_size`` words seen at
least ``min_frequency`` times in the *training split*.  Special tokens have fixed ids:
``<pad>`` = 0, ``<unk>`` = 1, ``<cls>`` = 2, ``<sep>`` = 3.  The post-processor prepends
``<cls>`` to every encoding (the model pools the first token).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN = "<pad>", "<unk>", "<cls>", "<sep>"
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN]
PAD_ID, UNK_ID, CLS_ID, SEP_ID = 0, 1, 2, 3


def _base_tokenizer() -> Tokenizer:
    tok = Tokenizer(WordLevel(unk_token=UNK_TOKEN))
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.Replace(Regex(r"<br\s*/?>"), " "),  # IMDb-style HTML line breaks
            normalizers.Lowercase(),
        ]
    )
    # words (\w+) and runs of punctuation ([^\w\s]+) become separate tokens
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS_TOKEN} $A",
        pair=f"{CLS_TOKEN} $A {SEP_TOKEN} $B",
        special_tokens=[(CLS_TOKEN, tok.token_to_id(CLS_TOKEN)), (SEP_TOKEN, tok.token_to_id(SEP_TOKEN))],
    )
    return tok


def train_tokenizer(
    texts: Iterable[str] | Iterator[Sequence[str]],
    vocab_size: int = 20000,
    min_frequency: int = 2,
    length: int | None = None,
) -> Tokenizer:
    """Train a word-level tokenizer on ``texts`` (strings, or an iterator of string batches).

    ``vocab_size`` counts the 4 special tokens.
    """
    if int(vocab_size) <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: it must exceed the {len(SPECIAL_TOKENS)} "
            f"special tokens {SPECIAL_TOKENS}. Set data.vocab_size to e.g. 20000."
        )
    if int(min_frequency) < 1:
        raise ValueError(f"min_frequency={min_frequency} must be >= 1 (set data.min_frequency).")
    tok = _base_tokenizer()
    trainer = WordLevelTrainer(
        vocab_size=int(vocab_size),
        min_frequency=int(min_frequency),
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    check_tokenizer(tok)
    return _add_post_processor(tok)


def check_tokenizer(tok: Tokenizer, source: str = "tokenizer") -> None:
    """Raise ValueError unless the special tokens have the ids this code relies on."""
    expected = dict(zip(SPECIAL_TOKENS, (PAD_ID, UNK_ID, CLS_ID, SEP_ID)))
    got = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    if got != expected:
        raise ValueError(
            f"{source} has special-token ids {got}, expected {expected}. Only tokenizers built "
            "by identifiable_transformers.data (or with the same specials) can be used."
        )


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> Path:
    """Write ``tokenizer.json`` to ``path`` (a file path, or a directory to put it in)."""
    path = Path(path)
    if path.is_dir() or path.suffix != ".json":
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer saved by :func:`save_tokenizer` (file or directory)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer file {str(path)!r} does not exist. Pass the tokenizer.json saved in the "
            "run directory (or the directory holding it)."
        )
    tok = Tokenizer.from_file(str(path))
    check_tokenizer(tok, source=f"tokenizer {str(path)!r}")
    return tok


def tokenizer_from_str(s: str) -> Tokenizer:
    """Rebuild a tokenizer from ``Tokenizer.to_str()`` (e.g. stored in checkpoint hparams)."""
    tok = Tokenizer.from_str(s)
    check_tokenizer(tok)
    return tok


def encode_ids(tok: Tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids per text, ``<cls>`` first, truncated to ``max_length`` (cls included)."""
    if int(max_length) < 2:
        raise ValueError(f"max_length={max_length} must be >= 2 (<cls> plus one token).")
    encs = tok.encode_batch(list(texts), add_special_tokens=True)
    m = int(max_length)
    return [e.ids[:m] for e in encs]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest sequence in the batch. Returns (input_ids Long[B,T], mask Bool[B,T])."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    t = int(lengths.max()) if len(seqs) else 0
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return ids, mask


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    """Encode raw texts exactly as the DataModule does: same dict as ``collate`` minus labels."""
    if isinstance(texts, str):
        texts = [texts]
    ids, mask = pad_batch(encode_ids(tokenizer, texts, max_length))
    return {"input_ids": ids, "attention_mask": mask}
