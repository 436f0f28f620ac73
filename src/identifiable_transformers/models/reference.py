"""The multi-head self-attention written as an explicit loop over examples and heads: the reference that the fast
paths of attention.py are tested against (tests/models/test_fast_paths.py) and checked against on a GPU
(bench/gpu_check.py). Slow on purpose; nothing else uses it."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def loop_attention(attn: torch.nn.Module, x: Tensor, mask: Tensor, drop: Tensor | None = None,
                   scale: float = 1.0) -> Tensor:
    """A ``MultiHeadSelfAttention``'s output, per example and head from its separate nn.Linear projections:
    softmax over the real keys (``mask`` [B, T], True = real), optional dropout (``drop`` [B, H, T, T], True =
    dropped, kept weights times ``scale``), then the heads concatenated or summed, then the output projection.
    Runs in ``x``'s dtype on ``x``'s device (the GPU check passes float64 on the CPU)."""
    b, t, _ = x.shape
    h, dk, dv = attn.num_heads, attn.key_dim, attn.value_dim
    q = attn.q_proj(x).view(b, t, h, dk)
    k = attn.k_proj(x).view(b, t, h, dk)
    v = attn.v_proj(x).view(b, t, h, dv)
    out = []
    for i in range(b):
        heads = []
        for j in range(h):
            logits = q[i, :, j] @ k[i, :, j].T / math.sqrt(dk)
            a = torch.softmax(logits.masked_fill(~mask[i][None, :], -math.inf), dim=-1)
            if drop is not None:
                a = a.masked_fill(drop[i, j], 0.0) * scale
            heads.append(a @ v[i, :, j])
        out.append(torch.cat(heads, -1) if attn.head_combine == "concat" else sum(heads))
    return attn.out_proj(torch.stack(out))
