"""The uniform-attention control (Wiegreffe & Pinter 2019): every layer's attention set to 1/n over the real keys."""

from __future__ import annotations

import torch
from torch import Tensor

from ...models import override_attention
from ._common import _eval_with_grad, _inputs, _logits


def uniform_attention_logits(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Logits with every layer's attention replaced by 1/n over the real keys (values and output kept)."""

    def uniform(_layer: int, w: Tensor, key_mask: Tensor | None) -> Tensor:
        m = torch.ones_like(w[:, :1, :1, :]) if key_mask is None else key_mask[:, None, None, :].to(w.dtype)
        return (m / m.sum(-1, keepdim=True)).expand_as(w)

    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad(), override_attention(model, uniform):
            return _logits(model, ids, mask)
