"""Tiny random Hugging Face encoders, saved with a tokenizer built offline (no download)."""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

WORDS = ("the a an and of to is it in that this film movie good bad great best worst not no but with for as "
         "was one story characters funny boring love hate fun dull plot acting performance beautiful").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_vocab(seed: int | None = None) -> dict[str, int]:
    """Specials, words, letters, digits, punctuation and their ``##`` continuations: every text tokenizes.
    With ``seed`` the non-special tokens are shuffled: the same vocabulary under other ids."""
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = list(dict.fromkeys([*WORDS, *pieces, *(f"##{p}" for p in pieces)]))
    if seed is not None:
        tokens = [tokens[i] for i in torch.randperm(len(tokens), generator=torch.Generator().manual_seed(seed))]
    return {t: i for i, t in enumerate([*SPECIALS, *tokens])}


def tiny_config(family: str, vocab_size: int, heads: int = 4, layers: int = 2, positions: int = 130):
    from transformers import (
        BertConfig,
        DebertaV2Config,
        DistilBertConfig,
        ElectraConfig,
        ModernBertConfig,
        RobertaConfig,
        XLMRobertaConfig,
    )

    common = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=37, max_position_embeddings=positions)
    if family == "bert":
        return BertConfig(**common)
    if family == "roberta":  # positions start at pad_token_id + 1 = 2: two more rows than tokens
        return RobertaConfig(**{**common, "max_position_embeddings": positions + 2}, pad_token_id=1, bos_token_id=0,
                             eos_token_id=2)
    if family == "xlm-roberta":
        return XLMRobertaConfig(**{**common, "max_position_embeddings": positions + 2}, pad_token_id=1)
    if family == "distilbert":
        return DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=layers, n_heads=heads, hidden_dim=37,
                                max_position_embeddings=positions)
    if family == "electra":  # embeddings narrower than the hidden size, projected up (as electra-small's)
        return ElectraConfig(**common, embedding_size=16)
    if family == "deberta-v2":  # v3's layout: relative attention, both position terms, log buckets, shared keys
        return DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                               max_relative_positions=-1, share_att_key=True, position_biased_input=False,
                               norm_rel_ebd="layer_norm", pad_token_id=0)
    if family == "modernbert":  # one global layer, one local layer (window 8 < the 20-token example)
        return ModernBertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=37, max_position_embeddings=positions,
                                global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, bos_token_id=2,
                                eos_token_id=3, cls_token_id=2, sep_token_id=3)
    raise ValueError(family)


def save_tiny_bert(folder: Path, family: str = "bert", seed: int = 0, vocab_seed: int | None = None, **kw) -> Path:
    """A random BERT-style encoder of ``family`` with a WordPiece tokenizer, saved with save_pretrained."""
    from transformers import AutoModel, BertTokenizer

    vocab = wordpiece_vocab(vocab_seed)
    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_config(family, len(vocab), **kw))
    model.save_pretrained(folder)
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    return folder


@contextmanager
def forward_hooks(modules: Sequence[torch.nn.Module], hook_for: Callable[[int], Callable]) -> Iterator[None]:
    """``hook_for(i)`` as a forward hook on ``modules[i]`` while inside, all removed on leaving."""
    handles = [mod.register_forward_hook(hook_for(i)) for i, mod in enumerate(modules)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
