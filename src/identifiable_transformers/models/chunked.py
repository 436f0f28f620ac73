"""Attention computed a few (T, T) matrices at a time, recomputed in the backward: the CPU's training path for
large batches (docs/performance.md)."""

from __future__ import annotations

import torch

from . import dropout as _dropout
from .dropout import _dropout_threshold, _keep, random_bits

# Each chunk of _ChunkedAttention holds about this many bytes of (T, T) weights: a core's share of L2 cache.
ATTENTION_CHUNK_BYTES = 2**21


def _chunks(b: int, h: int, t: int, itemsize: int) -> list[tuple[slice, slice]]:
    """(examples, heads) slices covering (B, H), each about ATTENTION_CHUNK_BYTES of (T, T) weights."""
    m = max(1, ATTENTION_CHUNK_BYTES // (t * t * itemsize))  # (T, T) matrices per chunk
    if m >= h:
        rows = m // h
        return [(slice(i, min(b, i + rows)), slice(0, h)) for i in range(0, b, rows)]
    return [(slice(i, i + 1), slice(j, min(h, j + m))) for i in range(b) for j in range(0, h, m)]


def _heads(x: torch.Tensor, rows: slice, heads: slice) -> torch.Tensor:
    """(B, T, H, d) -> the chunk's (G*Hc, T, d), contiguous."""
    c = x[rows, :, heads].transpose(1, 2)
    return c.reshape(-1, *c.shape[2:])


def _chunks_are_better(q: torch.Tensor, v: torch.Tensor, p: float) -> bool:
    """Whether _ChunkedAttention beats the other paths for these (B, H, T, dk) queries, values and dropout.

    It is written for CPU caches. Under torch.compile inductor fuses the whole-tensor path itself. For
    small tensors (under KEEP_MASK_MIN_NUMEL weights) the whole-tensor path, which fits in cache anyway,
    has less fixed cost. Without dropout and with equal key and value sizes, torch's fused CPU kernel
    (``scaled_dot_product_attention``) is faster; with dropout or unequal sizes torch falls back to its
    math kernel, which the chunks beat by 2.5-4x at 512 tokens (docs/performance.md).
    """
    b, h, t, dk = q.shape
    return q.device.type == "cpu" and b * h * t * t >= _dropout.KEEP_MASK_MIN_NUMEL and (p > 0.0 or dk != v.shape[-1])


class _ChunkedAttention(torch.autograd.Function):
    """Attention (with dropout when training) computed a few (T, T) matrices at a time.

    Same maths and same random draws as the explicit path of ``MultiHeadSelfAttention.forward``:
    softmax(q k^T * scale + bias), dropout with ``keep_mask``, weights @ v, heads concatenated or
    summed. Chunk by chunk, the logits, weights, mask and their gradients stay in cache, and no
    (B, H, T, T) float tensor is allocated: only the random bits of the mask (2 bytes per weight) are
    saved, and the backward recomputes each chunk's weights from q and k (docs/performance.md).

    q, k: (B, T, H, dk) and v: (B, T, H, dv), the projections' views; bias: (B, 1, T), 0 or -inf per
    key, or None. Returns (B, T, H*dv) for concat or (B, T, dv) for add.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, scale: float, p: float, combine: str):
        b, t, h, _ = q.shape
        dv = v.shape[-1]
        threshold, drop_scale = _dropout_threshold(p)
        bits = random_bits(torch.Size([b, h, t, t]), q.device) if p > 0 else None
        out = q.new_empty(b, t, h, dv) if combine == "concat" else q.new_empty(b, t, dv)
        for rows, heads in _chunks(b, h, t, q.element_size()):
            qc, kc = _heads(q, rows, heads), _heads(k, rows, heads)
            weights = _ChunkedAttention._softmax(qc, kc, bias, scale, rows, heads)
            if bits is not None:
                weights = weights.mul_(_keep(bits[rows, heads], threshold, q.dtype).flatten(0, 1))
            chunk = torch.bmm(weights, _heads(v, rows, heads))
            if drop_scale != 1.0:
                chunk = chunk.mul_(drop_scale)
            chunk = chunk.view(-1, heads.stop - heads.start, t, dv)
            if combine == "concat":
                out[rows, :, heads] = chunk.transpose(1, 2)
            elif heads.start == 0:
                torch.sum(chunk, 1, out=out[rows])
            else:
                out[rows] += chunk.sum(1)
        ctx.save_for_backward(q, k, v, bias, bits)
        ctx.scale, ctx.threshold, ctx.drop_scale, ctx.combine = scale, threshold, drop_scale, combine
        return out.flatten(2) if combine == "concat" else out

    @staticmethod
    def _softmax(qc, kc, bias, scale, rows, heads) -> torch.Tensor:
        """The chunk's softmax weights (G*Hc, T, T) from its queries and keys (G*Hc, T, dk)."""
        if bias is None:
            return torch.bmm(qc, kc.transpose(1, 2)).mul_(scale).softmax(-1)
        hc = heads.stop - heads.start
        b = bias[rows, None].expand(-1, hc, 1, -1).reshape(qc.shape[0], 1, -1)
        return torch.baddbmm(b, qc, kc.transpose(1, 2), alpha=scale).softmax(-1)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias, bits = ctx.saved_tensors
        scale, threshold, drop_scale, combine = ctx.scale, ctx.threshold, ctx.drop_scale, ctx.combine
        b, t, h, _ = q.shape
        dv = v.shape[-1]
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if combine == "concat":
            grad = grad.reshape(b, t, h, dv)
        for rows, heads in _chunks(b, h, t, q.element_size()):
            g, hc = len(range(b)[rows]), heads.stop - heads.start
            # d(loss)/d(the chunk's head outputs), times dropout's scale, as (G*Hc, T, dv)
            if combine == "concat":
                g_out = grad[rows, :, heads].transpose(1, 2)
            else:
                g_out = grad[rows, None].expand(g, hc, t, dv)
            g_out = torch.mul(g_out, drop_scale, out=q.new_empty(g, hc, t, dv)).flatten(0, 1)
            qc, kc = _heads(q, rows, heads), _heads(k, rows, heads)
            weights = _ChunkedAttention._softmax(qc, kc, bias, scale, rows, heads)
            g_w = torch.bmm(g_out, _heads(v, rows, heads).transpose(1, 2))  # d(loss)/d(dropped weights)
            if bits is None:
                dropped = weights
            else:
                keep = _keep(bits[rows, heads], threshold, q.dtype).flatten(0, 1)
                dropped = weights * keep
                g_w = g_w.mul_(keep)
            grad_v[rows, :, heads] = torch.bmm(dropped.transpose(1, 2), g_out).view(g, hc, t, dv).transpose(1, 2)
            g_logits = torch._softmax_backward_data(g_w, weights, -1, weights.dtype).mul_(scale)
            grad_q[rows, :, heads] = torch.bmm(g_logits, kc).view(g, hc, t, -1).transpose(1, 2)
            grad_k[rows, :, heads] = torch.bmm(g_logits.transpose(1, 2), qc).view(g, hc, t, -1).transpose(1, 2)
        return grad_q, grad_k, grad_v, None, None, None, None
