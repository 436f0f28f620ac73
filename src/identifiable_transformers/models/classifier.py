"""Transformer encoder text classifier: embeddings -> encoder layers -> pooling -> linear head.

Defaults follow the reference code (docs/identifiability.md section 3): one post-norm layer, ReLU feed-forward of
width 256, dropout 0.1, ``<cls>`` pooling. ``head_combine="add"`` with a small ``key_dim`` is the
paper's identifiable encoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionInternals, Dropout, MultiHeadSelfAttention
from .blocks import EncoderBlock, encoder_blocks

POSITIONALS = ("learned", "sinusoidal", "none")
POOLINGS = ("cls", "mean")
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass
class ClassifierOutput:
    logits: torch.Tensor  # (B, num_classes)
    attentions: tuple[torch.Tensor, ...] | None = None  # one (B, H, T, T) per layer, if requested
    hidden_states: torch.Tensor | None = None  # (B, T, d) output of the last encoder layer


def pool(x: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, d) hidden states -> (B, d): the first token's ("cls") or the mean over real tokens ("mean")."""
    if pooling == "cls":
        return x[:, 0]
    m = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    return (x * m).sum(1) / m.sum(1).clamp_min(1.0)


def _check_choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is unknown; use one of {list(choices)}")


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward, each in a residual block; post-norm unless ``norm_first``."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        head_combine: str = "concat",
        ffn_dim: int = 256,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        out_rank: int | None = None,
    ):
        super().__init__()
        _check_choice("activation", activation, ACTIVATIONS)
        self.attn = MultiHeadSelfAttention(embed_dim, num_heads, key_dim, value_dim, head_combine, dropout, out_rank)
        self.linear1 = nn.Linear(embed_dim, ffn_dim)
        self.linear2 = nn.Linear(ffn_dim, embed_dim)
        self.norm1 = nn.LayerNorm(embed_dim)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.dropout = Dropout(dropout)
        self.activation = ACTIVATIONS[activation]
        self.norm_first = norm_first
        for lin in (self.linear1, self.linear2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention sub-layer sees: the layer input, or its norm for pre-norm layers."""
        return self.norm1(x) if self.norm_first else x

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.attention_input(x), mask, need_weights)
        return self.residual_blocks(x, a), weights

    def residual_blocks(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input x and its attention output a: both residual blocks and norms."""
        if self.norm_first:
            x = x + self.dropout(a)
            return x + self._ffn(self.norm2(x))
        x = self.norm1(x + self.dropout(a))
        return self.norm2(x + self._ffn(x))


def sinusoidal_positions(max_len: int, dim: int) -> torch.Tensor:
    """(max_len, dim) fixed positions of Vaswani et al. (2017); works for odd ``dim`` too."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


class TransformerClassifier(nn.Module):
    """Sequence classifier. Arguments (defaults in parentheses):

    vocab_size, num_classes: sizes of the vocabulary and the label set.
    embed_dim (64): model width d. num_heads (4): attention heads per layer.
    key_dim (None = d // h): per-head query/key size; small values are the paper's point.
    value_dim (None = d // h for concat, d for add): per-head value size.
    head_combine ("concat"): "concat" (standard) or "add" (heads summed, identifiable).
    num_layers (1), ffn_dim (256), dropout (0.1), activation ("relu"), norm_first (False: post-norm).
    max_len (512): longest input. positional ("learned"): "learned", "sinusoidal" or "none".
    pooling ("cls"): first token (the data prepends ``<cls>``) or "mean" over real tokens.
    pad_id (0): padding token id; the default attention mask is ``input_ids != pad_id``.
    out_rank (None = full): the rank cap of each attention layer's output projection (models/attention.py).
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        embed_dim: int = 64,
        num_heads: int = 4,
        key_dim: int | None = None,
        value_dim: int | None = None,
        head_combine: str = "concat",
        num_layers: int = 1,
        ffn_dim: int = 256,
        dropout: float = 0.1,
        max_len: int = 512,
        positional: str = "learned",
        pooling: str = "cls",
        pad_id: int = 0,
        activation: str = "relu",
        norm_first: bool = False,
        out_rank: int | None = None,
    ):
        super().__init__()
        _check_choice("positional", positional, POSITIONALS)
        _check_choice("pooling", pooling, POOLINGS)
        # embed_dim and num_heads first: the embedding's init divides by embed_dim before the attention checks them
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads),
                            ("vocab_size", vocab_size), ("num_classes", num_classes), ("num_layers", num_layers),
                            ("ffn_dim", ffn_dim), ("max_len", max_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {vocab_size})")

        self.embed_dim, self.num_heads, self.head_combine = embed_dim, num_heads, head_combine
        self.num_layers, self.max_len, self.positional, self.pooling, self.pad_id = (
            num_layers, max_len, positional, pooling, pad_id)
        self.token_embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        nn.init.normal_(self.token_embedding.weight, std=embed_dim**-0.5)
        with torch.no_grad():
            self.token_embedding.weight[pad_id].zero_()
        if positional == "learned":
            self.position_embedding = nn.Embedding(max_len, embed_dim)
            nn.init.normal_(self.position_embedding.weight, std=embed_dim**-0.5)
        elif positional == "sinusoidal":
            self.register_buffer("position_table", sinusoidal_positions(max_len, embed_dim), persistent=False)
        self.embed_dropout = Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(embed_dim, num_heads, key_dim, value_dim, head_combine, ffn_dim, dropout, activation,
                         norm_first, out_rank)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(embed_dim) if norm_first else nn.Identity()
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.key_dim, self.value_dim = self.layers[0].attn.key_dim, self.layers[0].attn.value_dim

    def _embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        t = input_ids.shape[1]
        if self.positional != "none" and t > self.max_len:
            raise ValueError(
                f"input length {t} exceeds max_len={self.max_len} of the {self.positional} positions: "
                "truncate the input (data.max_length) or build the model with a larger max_len"
            )
        mask = input_ids != self.pad_id if attention_mask is None else attention_mask.bool()
        x = self.token_embedding(input_ids)  # (B, T, d)
        if self.positional == "learned":
            x = x + self.position_embedding.weight[:t]
        elif self.positional == "sinusoidal":
            x = x + self.position_table[:t]
        return self.embed_dropout(x), mask

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False
    ) -> ClassifierOutput:
        x, mask = self._embed(input_ids, attention_mask)
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights=output_attentions)
            attentions.append(weights)
        x = self.final_norm(x)  # (B, T, d)
        return ClassifierOutput(
            logits=self.head(pool(x, mask, self.pooling)), attentions=tuple(attentions) if output_attentions else None,
            hidden_states=x,
        )

    def logits_from_last_layer(self, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits from the last layer's output y (B, T', d) and its mask (B, T'): what ``forward`` does after the
        layers. With cls pooling T' may be 1 (only the first token is read)."""
        return self.head(pool(self.final_norm(y), mask, self.pooling))

    def attention_internals(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> list[AttentionInternals]:
        """Per layer: attention weights, value vectors and per-head output maps (see AttentionInternals).

        Call under ``torch.no_grad()`` in eval mode to get the deterministic quantities the
        identifiability diagnostics analyse.
        """
        x, mask = self._embed(input_ids, attention_mask)
        out = []
        for layer in self.layers:
            out.append(layer.attn.internals(layer.attention_input(x), mask))
            x, _ = layer(x, mask)
        return out

    def encoder_blocks(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                       ) -> list[EncoderBlock]:
        """Per layer, its input, attention internals, norms and the rest of the layer (models/blocks.py): what the
        context-mixing explainers read. Call under ``torch.no_grad()`` in eval mode."""
        return encoder_blocks(self, input_ids, attention_mask)
