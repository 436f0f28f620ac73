"""Adapters: where each Hugging Face encoder family keeps its heads' projections (docs/pretrained.md).

Every family supported here runs its self-attention through transformers' ``AttentionInterface``: the layer
projects queries, keys and values itself (biases included), reshapes them to (B, H, T, d_h) and calls the
attention function with the additive padding mask and its scaling. This module registers one attention
function, :func:`attention_forward`, that computes exactly what transformers' eager one does
(``softmax(q k^T * scaling + mask)``, dropout, ``@ v``), and on request also records each layer's weights and
values or replaces its weights (the diagnostics' ``override_attention``). Nothing else of the model changes,
so the maps it records are the model's own. Without a request it calls torch's fused kernel, as ``sdpa`` does.

DeBERTa-v2/v3 computes its disentangled attention in its own module, outside ``AttentionInterface``; its family
installs :class:`WeightsTap` in that module instead (:func:`tap_disentangled`), at the one place every
softmax map passes (its attention dropout), so the same requests reach it (docs/pretrained.md, "DeBERTa").

A :class:`Family` names, per architecture, the encoder layers, each layer's attention module (the one the
attention function receives), its query / key / value projections, its output projection (whose input is
the heads' outputs concatenated, head-major) and the word embeddings, and how many positions an input may
use. ``family_for(config)`` picks the family from ``config.model_type``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION = "identifiable_transformers"  # the name registered with transformers' AttentionInterface

# (layer index, weights (B, H, T, T), key_padding_mask (B, T) bool or None) -> weights (B, H, T, T)
LayerHook = Callable[[int, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass
class AttentionState:
    """What the attention function is asked to do on the current forward pass (shared by a model's layers)."""

    key_mask: torch.Tensor | None = None  # (B, T) bool, True on real tokens: what a hook is told
    hook: LayerHook | None = None  # replaces the softmax weights (override_attention)
    weights: list | None = None  # one slot per layer: the weights used (output_attentions)
    record: dict = field(default_factory=dict)  # layer -> (weights, values) while capturing internals
    capture: bool = False

    @property
    def active(self) -> bool:
        return self.hook is not None or self.weights is not None or self.capture


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **_kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' eager attention (same maths, same argument order), with the requests of ``AttentionState``.

    query, key, value: (B, H, T, d_h), projections with their biases; attention_mask: additive (B, 1, T, T)
    with 0 on real keys and the dtype's minimum on padded ones, or None. Returns ((B, T, H, d_h), weights).
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    state: AttentionState | None = getattr(module, "_idt_state", None)
    if state is None or not state.active:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    layer = module._idt_layer
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        logits = logits + attention_mask
    weights = logits.softmax(dim=-1)
    if state.hook is not None:
        weights = state.hook(layer, weights, state.key_mask)
    if state.capture:
        state.record[layer] = (weights, value)
    if state.weights is not None:
        state.weights[layer] = weights
    out = torch.matmul(F.dropout(weights, p=dropout, training=module.training), value)
    return out.transpose(1, 2).contiguous(), weights


def register_attention() -> None:
    """Register :func:`attention_forward` (and transformers' eager additive mask for it) under ``ATTENTION``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, attention_forward)
    AttentionMaskInterface.register(ATTENTION, eager_mask)


@dataclass(frozen=True)
class Family:
    """Where one architecture family keeps what the diagnostics read (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]
    layers: Callable[[nn.Module], nn.ModuleList]  # the encoder's layers, first to last
    attention: Callable[[nn.Module], nn.Module]  # layer -> the module the attention function receives
    query: Callable[[nn.Module], nn.Linear]  # layer -> projections, (d -> H d_h), head-major outputs
    key: Callable[[nn.Module], nn.Linear]
    value: Callable[[nn.Module], nn.Linear]
    output: Callable[[nn.Module], nn.Linear]  # layer -> the output projection, (H d_h -> d)
    word_embeddings: Callable[[nn.Module], nn.Embedding]
    max_tokens: Callable[[object], int]  # config -> the longest input its positions allow
    # attention module -> None: routes its maps through AttentionState where AttentionInterface does not
    install: Callable[[nn.Module], None] | None = None
    # Why the key-aware count (which recomputes A = softmax(s Q K^T) from the projections) does not apply; None: it does
    key_aware_unsupported: str | None = None
    # (config, T, device) -> the (T,) position ids the encoder gives a T-token input, for families whose positions
    # are absolute embeddings it takes as position_ids (a shorter sequence can then keep its tokens' own); None:
    # relative or windowed positions (DeBERTa, ModernBERT), which depend on where the other tokens sit
    positions: Callable[[object, int, torch.device], torch.Tensor] | None = None
    # encoder -> the norm applied to the last layer's output before last_hidden_state (ModernBERT's), or None
    final_norm: Callable[[nn.Module], nn.Module | None] = lambda _encoder: None


def _from_zero(_config, T: int, device) -> torch.Tensor:
    return torch.arange(T, device=device)


def _bert_self(layer: nn.Module) -> nn.Module:
    return layer.attention.self


BERT = Family(
    name="bert", model_types=("bert",),
    layers=lambda m: m.encoder.layer, attention=_bert_self,
    query=lambda l: _bert_self(l).query, key=lambda l: _bert_self(l).key, value=lambda l: _bert_self(l).value,
    output=lambda l: l.attention.output.dense, word_embeddings=lambda m: m.embeddings.word_embeddings,
    max_tokens=lambda c: int(c.max_position_embeddings), positions=_from_zero,
)
# RoBERTa numbers positions from pad_token_id + 1 (create_position_ids_from_input_ids): 514 positions, 512 tokens.
ROBERTA = Family(
    name="roberta", model_types=("roberta", "xlm-roberta"),
    layers=BERT.layers, attention=BERT.attention, query=BERT.query, key=BERT.key, value=BERT.value,
    output=BERT.output, word_embeddings=BERT.word_embeddings,
    max_tokens=lambda c: int(c.max_position_embeddings) - int(c.pad_token_id) - 1,
    positions=lambda c, T, device: torch.arange(T, device=device) + int(c.pad_token_id) + 1,
)
DISTILBERT = Family(
    name="distilbert", model_types=("distilbert",),
    layers=lambda m: m.transformer.layer, attention=lambda l: l.attention,
    query=lambda l: l.attention.q_lin, key=lambda l: l.attention.k_lin, value=lambda l: l.attention.v_lin,
    output=lambda l: l.attention.out_lin, word_embeddings=lambda m: m.embeddings.word_embeddings,
    max_tokens=lambda c: int(c.max_position_embeddings), positions=_from_zero,
)
# ELECTRA's discriminator is a BERT encoder (its embeddings may be narrower, projected up to the hidden size).
ELECTRA = Family(
    name="electra", model_types=("electra",),
    layers=BERT.layers, attention=BERT.attention, query=BERT.query, key=BERT.key, value=BERT.value,
    output=BERT.output, word_embeddings=BERT.word_embeddings, max_tokens=BERT.max_tokens, positions=_from_zero,
)


class WeightsTap(nn.Module):
    """Stands in for DeBERTa's attention dropout, which receives every softmax map (B, H, T, T): applies
    ``AttentionState``'s requests to it (hook, records), then the dropout. No parameters: the state dict is the
    model's. The values (with bias) are recorded by a forward hook on the value projection."""

    def __init__(self, attention: nn.Module, dropout: nn.Module):
        super().__init__()
        self.dropout = dropout
        self._attention = [attention]  # a list: not a submodule (no cycle in the module tree)

    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        attn = self._attention[0]
        state: AttentionState | None = getattr(attn, "_idt_state", None)
        if state is not None and state.active:
            layer = attn._idt_layer
            if state.hook is not None:  # DeBERTa views the result as (B H, T, T): it must be contiguous
                weights = state.hook(layer, weights, state.key_mask).contiguous()
            if state.capture:
                state.record[layer] = (weights, attn._idt_values)
            if state.weights is not None:
                state.weights[layer] = weights
        return self.dropout(weights)


def tap_disentangled(attn: nn.Module) -> None:
    """Install :class:`WeightsTap` in a DeBERTa-v2 ``DisentangledSelfAttention`` (once)."""
    if isinstance(attn.dropout, WeightsTap):
        return

    def keep_values(_mod, _inp, out):  # (B, T, H d_h) -> (B, H, T, d_h), as the attention function receives them
        state = getattr(attn, "_idt_state", None)
        if state is not None and state.capture:
            attn._idt_values = out.view(*out.shape[:2], attn.num_attention_heads, -1).transpose(1, 2)

    attn.value_proj.register_forward_hook(keep_values)
    attn.dropout = WeightsTap(attn, attn.dropout)


def _deberta_self(layer: nn.Module) -> nn.Module:
    return layer.attention.self


# DeBERTa-v2/v3: A = softmax(Q K^T / sqrt(3 d_h) + c2p + p2c) (relative-position terms), masked, and the head
# outputs A V with V = X W_v + b_v: the map is still a softmax over scores and the output still A V, so
# T = V W_o^h holds and every null-space quantity applies; only the key-aware count, which recomputes A from
# Q K^T alone, does not.
DEBERTA_V2 = Family(
    name="deberta-v2", model_types=("deberta-v2",),
    layers=lambda m: m.encoder.layer, attention=_deberta_self,
    query=lambda l: _deberta_self(l).query_proj, key=lambda l: _deberta_self(l).key_proj,
    value=lambda l: _deberta_self(l).value_proj,
    output=lambda l: l.attention.output.dense, word_embeddings=lambda m: m.embeddings.word_embeddings,
    max_tokens=lambda c: int(c.max_position_embeddings), install=tap_disentangled,
    key_aware_unsupported="DeBERTa's scores add relative-position terms (c2p, p2c) to Q K^T",
)
# ModernBERT: fused Wqkv, rotary positions on queries and keys, and every few layers a sliding-window mask. The
# attention function receives the rotated queries and keys and the (windowed) additive mask, so the maps and
# values are the model's own; the key-aware count's hooks on separate query / key projections have nothing to read.
MODERNBERT = Family(
    name="modernbert", model_types=("modernbert",),
    layers=lambda m: m.layers, attention=lambda l: l.attn,
    query=lambda l: None, key=lambda l: None, value=lambda l: None,
    output=lambda l: l.attn.Wo, word_embeddings=lambda m: m.embeddings.tok_embeddings,
    max_tokens=lambda c: int(c.max_position_embeddings), final_norm=lambda m: m.final_norm,
    key_aware_unsupported=("ModernBERT fuses its projections (Wqkv), rotates queries and keys and windows the "
                           "attention of its local layers"),
)
FAMILIES = (BERT, ROBERTA, DISTILBERT, ELECTRA, DEBERTA_V2, MODERNBERT)
SUPPORTED_MODEL_TYPES = tuple(t for f in FAMILIES for t in f.model_types)


def family_for(config, where: str = "the model") -> Family:
    """The adapter for ``config.model_type``; a ValueError naming the supported types otherwise."""
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise ValueError(
        f"{where} is a {model_type!r} model ({type(config).__name__}), and no adapter reads its heads: the "
        f"supported model types are {list(SUPPORTED_MODEL_TYPES)} (MiniLM checkpoints are 'bert'). Pick a "
        "checkpoint of one of these families (docs/pretrained.md).")
