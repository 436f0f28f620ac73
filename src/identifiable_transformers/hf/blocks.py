"""The pretrained encoders' layers as ``EncoderBlock``s (models/blocks.py): what the context-mixing explainers read.

Per family, the rest of a layer after its attention output projection (``finish``), the LayerNorm that follows
the attention residual and the output projection's bias, read from the Hugging Face modules by their names:

- BERT, RoBERTa (and MiniLM, a BERT): ``attention.output.LayerNorm(dropout(a) + x)``, then ``intermediate`` and
  ``output`` (dense, dropout, ``LayerNorm(. + h)``);
- DistilBERT: ``sa_layer_norm(a + x)``, then ``output_layer_norm(ffn(h) + h)``.

Each layer's input is recorded by a forward pre-hook on the layer during one pass that also captures the
attention weights and values (``AttentionState.capture``, as ``attention_internals`` does).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.attention import AttentionInternals
from ..models.blocks import EncoderBlock


def _bert_parts(layer: nn.Module):
    out = layer.attention.output

    def finish(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = out.LayerNorm(out.dropout(a) + x)
        return layer.output(layer.intermediate(h), h)

    return out.LayerNorm, out.dense.bias, finish


def _distilbert_parts(layer: nn.Module):
    def finish(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = layer.sa_layer_norm(a + x)
        return layer.output_layer_norm(layer.ffn(h) + h)

    return layer.sa_layer_norm, layer.attention.out_lin.bias, finish


_PARTS = {"bert": _bert_parts, "roberta": _bert_parts, "distilbert": _distilbert_parts}


def encoder_blocks(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[EncoderBlock]:
    """Per layer of a ``PretrainedClassifier``, its :class:`EncoderBlock`; call in eval mode (no dropout)."""
    parts = _PARTS[model.family.name]
    mask = model._mask(input_ids, attention_mask)
    layers = model.family.layers(model.encoder)
    inputs: dict[int, torch.Tensor] = {}

    def record_input(i: int):
        def hook(_module, args, kwargs):
            inputs[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = [layer.register_forward_pre_hook(record_input(i), with_kwargs=True) for i, layer in enumerate(layers)]
    state = model._state
    state.capture, state.record = True, {}
    try:
        model._encode(input_ids, mask)
        record = state.record
    finally:
        state.capture, state.record = False, {}
        for h in handles:
            h.remove()
    out = []
    for i, layer in enumerate(layers):
        weights, values = record[i]
        w_o = model.head_out_proj(i)
        head_output = torch.einsum("bhst,bhtv,hvd->bhsd", weights, values, w_o)
        internals = AttentionInternals(attention=weights, values=values, out_proj=w_o, head_output=head_output)
        norm, bias, finish = parts(layer)
        out.append(EncoderBlock(inputs[i], internals, bias, norm, finish))
    return out
