"""One encoder layer seen as a block: what the context-mixing explainers read (docs/faithfulness.md).

A layer maps its input x (B, T, d) to its output through the attention sub-layer (the per-head maps of
``AttentionInternals``: head h adds ``A_h f_h`` with ``f_h = (X W_v^h + b_v^h) W_o^h``, then the output bias), the
residual, the LayerNorm(s) and the feed-forward. :class:`EncoderBlock` holds, per layer and for one batch, the
layer input, its attention internals, the output bias, the LayerNorm that follows the attention residual (None
for pre-norm layers, whose residual stream is not normalised) and ``finish(x, a)``: the rest of the layer from
its input and an attention output ``a`` (after the output projection and its bias). Value zeroing runs
``finish`` on copies of ``a`` with one token's values zeroed; ALTI and the norm with residual and LayerNorm
decompose ``norm(x + a)`` token by token.

``encoder_blocks(model, input_ids, mask)`` reads them from a ``TransformerClassifier``; the pretrained
classifier has its own (hf/blocks.py). Both are reached through the models' ``encoder_blocks`` method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .attention import AttentionInternals


@dataclass
class EncoderBlock:
    x: torch.Tensor  # (B, T, d) the layer's input: what the attention residual adds
    internals: AttentionInternals  # the attention sub-layer's weights, values and W_o^h (no dropout)
    out_bias: torch.Tensor | None  # (d,) the attention output projection's bias
    norm: nn.LayerNorm | None  # the LayerNorm applied to x + attention output (post-norm); None (pre-norm)
    finish: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, a) -> the layer's output (B, T, d)

    def attention_output(self) -> torch.Tensor:
        """(B, T, d): the attention sub-layer's output, sum_h A_h f_h + b_o."""
        a = self.internals.head_output.sum(1)
        return a if self.out_bias is None else a + self.out_bias


def encoder_blocks(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[EncoderBlock]:
    """Per layer of a ``TransformerClassifier``, its :class:`EncoderBlock`; call in eval mode (no dropout)."""
    x, mask = model._embed(input_ids, attention_mask)
    out = []
    for layer in model.layers:
        internals = layer.attn.internals(layer.attention_input(x), mask)
        norm = None if layer.norm_first else layer.norm1
        out.append(EncoderBlock(x, internals, layer.attn.out_proj.bias, norm, layer.residual_blocks))
        x, _ = layer(x, mask)
    return out
