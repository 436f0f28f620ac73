"""The pretrained encoders' layers as ``EncoderBlock``s (models/blocks.py): what the context-mixing explainers read.

Per family, the rest of a layer after its attention output projection (``finish``), the LayerNorm that follows
the attention residual and the output projection's bias, read from the Hugging Face modules by their names:

- BERT, RoBERTa (and MiniLM, a BERT), ELECTRA (a BERT encoder) and DeBERTa-v2/v3 (``DebertaV2Layer``: the same
  post-norm layout and module names): ``attention.output.LayerNorm(dropout(a) + x)``, then ``intermediate`` and
  ``output`` (dense, dropout, ``LayerNorm(. + h)``);
- DistilBERT: ``sa_layer_norm(a + x)``, then ``output_layer_norm(ffn(h) + h)``;
- ModernBERT, pre-norm: the attention reads ``attn_norm(x)`` (the identity in layer 0), so the recorded values
  are computed from it, while the residual adds the raw ``x``: no LayerNorm on the residual sum (``norm`` None),
  ``h = x + a``, then ``h + mlp(mlp_norm(h))``. Its ``final_norm`` after the last layer belongs to no layer.
  ``Wo`` has no bias unless ``config.attention_bias``.

DeBERTa-v2 checkpoints with ``conv_kernel_size > 0`` (deberta-v2-xlarge, for one; v3 has none) add a
convolution over neighbouring tokens of the embeddings to layer 0's output (``DebertaV2Encoder.conv``). That
mixes context outside attention, which no per-layer attention map accounts for, so those models are refused
with a ValueError rather than given maps that silently miss it.

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


def _modernbert_parts(layer: nn.Module):
    def finish(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = x + a  # the attention output already went through Wo and out_drop (identity in eval mode)
        return h + layer.mlp(layer.mlp_norm(h))

    return None, layer.attn.Wo.bias, finish


_PARTS = {"bert": _bert_parts, "roberta": _bert_parts, "electra": _bert_parts, "deberta-v2": _bert_parts,
          "distilbert": _distilbert_parts, "modernbert": _modernbert_parts}


def context_mixing_unsupported(model) -> str | None:
    """Why ``encoder_blocks`` cannot describe this ``PretrainedClassifier``'s layers, or None when it can: lets a
    caller (a callback, a config check) leave the context-mixing explainers out before a run rather than fail."""
    name = model.family.name
    if name not in _PARTS:
        return (f"the context-mixing explainers (value_zeroing, alti, norm_resln) do not know the layers of "
                f"{name!r} models (they read {sorted(_PARTS)})")
    if name == "deberta-v2" and getattr(model.encoder.encoder, "conv", None) is not None:
        return (f"this DeBERTa-v2 model (conv_kernel_size={model.encoder.config.conv_kernel_size}) adds a "
                "convolution over neighbouring tokens to its first layer's output, context mixing that no per-layer "
                "attention map accounts for, so the context-mixing explainers (value_zeroing, alti, norm_resln) do "
                "not support it (DeBERTa-v3 checkpoints have no convolution)")
    return None


def encoder_blocks(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[EncoderBlock]:
    """Per layer of a ``PretrainedClassifier``, its :class:`EncoderBlock`; call in eval mode (no dropout)."""
    reason = context_mixing_unsupported(model)
    if reason is not None:
        raise ValueError(f"{reason}: leave them out of the explainers")
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
