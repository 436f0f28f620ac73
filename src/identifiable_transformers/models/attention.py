"""Multi-head self-attention with a key size decoupled from the value size.

Two ways to combine heads (docs/identifiability.md section 3):

- ``concat``: the standard layer. Each head has ``value_dim = embed_dim // num_heads``; head
  outputs are concatenated and projected. rank(A_h V_h W_o^h) <= d/h, so a head is identifiable
  only for inputs of at most d/h tokens.
- ``add``: the paper's variant. Each head has ``value_dim = embed_dim``; head outputs are
  *summed* (a true sum over heads, unlike the reference code's reshape) and then projected, so a
  head can stay identifiable up to about ``embed_dim`` tokens.

Logits are scaled by 1/sqrt(key_dim), the size the dot product is taken over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

HEAD_COMBINES = ("concat", "add")

# (weights (B, H, T, T), key_padding_mask (B, T) bool or None) -> weights (B, H, T, T)
WeightsHook = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass
class AttentionInternals:
    """What the identifiability diagnostics need from one attention layer (docs/identifiability.md section 2).

    Head h contributes ``attention[:, h] @ values[:, h] @ out_proj[h]`` to the layer's attention
    output (before the output bias), so ``T_h = values[:, h] @ out_proj[h]``.
    """

    attention: torch.Tensor  # (B, H, T, T) softmax weights; padded keys get exactly 0
    values: torch.Tensor  # (B, H, T, dv) value vectors including the bias: X W_v + b_v
    out_proj: torch.Tensor  # (H, dv, d) each head's output projection W_o^h
    head_output: torch.Tensor  # (B, H, T, d) attention @ values @ out_proj, per head


def resolve_head_dims(
    embed_dim: int, num_heads: int, key_dim: int | None, value_dim: int | None, head_combine: str
) -> tuple[int, int]:
    """Apply the defaults (key_dim = d/h; value_dim = d/h for concat, d for add) and validate."""
    if embed_dim < 1:
        raise ValueError(f"embed_dim must be >= 1, got {embed_dim}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if head_combine not in HEAD_COMBINES:
        raise ValueError(f"head_combine={head_combine!r} is unknown; use one of {list(HEAD_COMBINES)}")
    needs_split = key_dim is None or (value_dim is None and head_combine == "concat")
    if needs_split and embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}, which the default "
            "key_dim/value_dim (embed_dim // num_heads) needs: set key_dim and value_dim explicitly "
            "or pick a divisible embed_dim"
        )
    if key_dim is None:
        key_dim = embed_dim // num_heads
    if value_dim is None:
        value_dim = embed_dim // num_heads if head_combine == "concat" else embed_dim
    if key_dim < 1:
        raise ValueError(f"key_dim must be >= 1, got {key_dim}")
    if value_dim < 1:
        raise ValueError(f"value_dim must be >= 1, got {value_dim}")
    return key_dim, value_dim


def _has_padding(key_padding_mask: torch.Tensor | None) -> bool:
    """Whether the mask hides any key (under torch.compile: whether there is a mask, to avoid a graph break)."""
    if key_padding_mask is None:
        return False
    return torch.compiler.is_compiling() or not bool(key_padding_mask.all())


def _dropout_threshold(p: float) -> tuple[int, float]:
    """The 16-bit threshold under which an entry is dropped, and the scale 1 / (1 - rate) of the kept ones."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    threshold = min(round(p * 2**16), 2**16 - 1)
    return threshold, 1.0 / (1.0 - threshold / 2**16)


def _key_bias(key_padding_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The padding mask as an additive bias (B, 1, T): 0 for real keys, -inf for padded ones; None if none.

    The logits' matmul accumulates onto it (``baddbmm``), so no masked copy of the logits is made.
    """
    if not _has_padding(key_padding_mask):
        return None
    b, t = key_padding_mask.shape
    bias = torch.zeros(b, 1, t, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill_(~key_padding_mask[:, None], -math.inf)


def random_bits(shape: torch.Size, device: torch.device | None = None) -> torch.Tensor:
    """Uniform int16 of the given shape, four per 64-bit draw of torch's generator (``manual_seed`` governs it)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    return bits.view(torch.int16)[:n].view(shape)


def keep_mask(
    shape: torch.Size, p: float, device: torch.device | None = None, dtype: torch.dtype = torch.bool
) -> tuple[torch.Tensor, float]:
    """A dropout keep-mask (True or 1 = kept) of the given shape and the scale 1 / (1 - rate) for the kept entries.

    Each entry is drawn from 16 random bits (``random_bits``): the rate is ``p`` rounded to a multiple
    of 1/65536 (0.1 -> 0.100006) and the scale uses that exact rate, so the expectation is unchanged.
    On CPU this is several times cheaper than ``torch.bernoulli_``, which costs a sixth of a training
    step at 512 tokens (docs/performance.md). The layers ask for a 0/1 float mask (``dtype``): on CPU a
    product with it is several times faster than ``torch.where`` or a product with a bool mask.
    """
    threshold, scale = _dropout_threshold(p)
    return _keep(random_bits(shape, device), threshold, dtype), scale


def _keep(bits: torch.Tensor, threshold: int, dtype: torch.dtype) -> torch.Tensor:
    """keep_mask's mask for these random bits, as ``dtype`` (the comparison writes it directly)."""
    kept = torch.empty(bits.shape, dtype=dtype, device=bits.device)
    return torch.ge(bits, threshold - 2**15, out=kept)  # int16 is uniform on [-2^15, 2^15)


# Below this many entries torch's own dropout is used: on small tensors keep_mask's extra ops cost more than
# they save (bench_model.py --quick ran at 0.46x of torch's layer with keep_mask everywhere, 1.33x without).
KEEP_MASK_MIN_NUMEL = 2**20


def _torch_dropout_is_better(x: torch.Tensor) -> bool:
    # Under torch.compile inductor draws its own random numbers inside the fused kernel.
    return torch.compiler.is_compiling() or x.numel() < KEEP_MASK_MIN_NUMEL


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout``, with the cheaper mask of ``keep_mask`` for large tensors."""
    if not training or p == 0.0:
        return x
    if _torch_dropout_is_better(x):
        return F.dropout(x, p)
    keep, scale = keep_mask(x.shape, p, x.device, x.dtype)
    return x * keep.mul_(scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its mask with ``keep_mask`` (same ``p``, same state: none)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


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
    return q.device.type == "cpu" and b * h * t * t >= KEEP_MASK_MIN_NUMEL and (p > 0.0 or dk != v.shape[-1])


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
            weights = _ChunkedAttention._softmax(_heads(q, rows, heads), _heads(k, rows, heads), bias, scale, rows, heads)
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
            g_out = grad[rows, :, heads].transpose(1, 2) if combine == "concat" else grad[rows, None].expand(g, hc, t, dv)
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


@torch.compiler.disable  # under torch.compile: a graph break, the chunks run eagerly between compiled parts
def _chunked_attention(q, k, v, key_padding_mask, scale: float, p: float, combine: str) -> torch.Tensor:
    """_ChunkedAttention for the layer's (B, H, T, d) projections."""
    bias = _key_bias(key_padding_mask, q.dtype)
    return _ChunkedAttention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, scale, p, combine)


class MultiHeadSelfAttention(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        head_combine: str = "concat",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.key_dim, self.value_dim = resolve_head_dims(embed_dim, num_heads, key_dim, value_dim, head_combine)
        self.embed_dim, self.num_heads, self.head_combine, self.dropout = embed_dim, num_heads, head_combine, dropout
        h, dk, dv = num_heads, self.key_dim, self.value_dim
        self.q_proj = nn.Linear(embed_dim, h * dk)
        self.k_proj = nn.Linear(embed_dim, h * dk)
        self.v_proj = nn.Linear(embed_dim, h * dv)
        self.out_proj = nn.Linear(h * dv if head_combine == "concat" else dv, embed_dim)
        # Optional (weights, key_padding_mask) -> weights, applied after the softmax (see override_attention).
        self.weights_hook: WeightsHook | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Every projection is initialised explicitly (the reference code left some uninitialised).
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Through the nn.Linear modules, not one stacked F.linear: the diagnostics hook q_proj and k_proj.
        b, t, _ = x.shape
        h, dk, dv = self.num_heads, self.key_dim, self.value_dim
        q = self.q_proj(x).view(b, t, h, dk).transpose(1, 2)  # (B, H, T, dk)
        k = self.k_proj(x).view(b, t, h, dk).transpose(1, 2)  # (B, H, T, dk)
        v = self.v_proj(x).view(b, t, h, dv).transpose(1, 2)  # (B, H, T, dv)
        return q, k, v

    def _weights(self, q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """Softmax weights (B, H, T, T); padded keys get exactly 0."""
        b, h, t, dk = q.shape
        q, k = q.reshape(b * h, t, dk), k.reshape(b * h, t, dk)
        scale = 1 / math.sqrt(self.key_dim)
        bias = _key_bias(key_padding_mask, q.dtype)
        if bias is None:
            logits = torch.bmm(q * scale, k.transpose(1, 2))
        else:
            logits = torch.baddbmm(bias.repeat_interleave(h, dim=0), q, k.transpose(1, 2), alpha=scale)
        return logits.softmax(dim=-1).view(b, h, t, t)

    def _combine(self, heads: torch.Tensor) -> torch.Tensor:
        b, h, t, dv = heads.shape
        if self.head_combine == "concat":
            return heads.transpose(1, 2).reshape(b, t, h * dv)  # (B, T, H*dv)
        return heads.sum(dim=1)  # (B, T, dv): a true sum over heads

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, d); key_padding_mask: (B, T) bool, True for real tokens.

        Returns the attention output (B, T, d) and, if ``need_weights``, the weights (B, H, T, T).
        """
        q, k, v = self._project(x)
        p = self.dropout if self.training else 0.0
        weights_used = need_weights or self.weights_hook is not None  # to show or to change
        if not weights_used and _chunks_are_better(q, v, p):
            combined = _chunked_attention(q, k, v, key_padding_mask, 1 / math.sqrt(self.key_dim), p, self.head_combine)
            return self.out_proj(combined), None
        if not weights_used and p == 0.0:
            # No weights to show, change or drop: torch's fused attention (its own kernel choice).
            mask = key_padding_mask[:, None, None, :] if _has_padding(key_padding_mask) else None
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(self.key_dim))
            return self.out_proj(self._combine(heads)), None
        weights = self._weights(q, k, key_padding_mask)
        if self.weights_hook is not None:
            weights = self.weights_hook(weights, key_padding_mask)
        dropped, scale = self._drop(weights, p)
        b, h, t, _ = weights.shape
        heads = torch.bmm(dropped.reshape(b * h, t, t), v.reshape(b * h, t, self.value_dim))
        combined = self._combine(heads.view(b, h, t, self.value_dim))
        if scale != 1.0:
            combined = combined * scale  # dropout's 1/(1 - p), cheaper here than on the (B, H, T, T) weights
        return self.out_proj(combined), weights if need_weights else None

    @staticmethod
    def _drop(weights: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
        """Dropout on the weights without its 1/(1 - p) scale, and that scale."""
        if p == 0.0:
            return weights, 1.0
        if _torch_dropout_is_better(weights):
            return F.dropout(weights, p), 1.0
        keep, scale = keep_mask(weights.shape, p, weights.device, weights.dtype)
        return weights * keep, scale

    def head_out_proj(self) -> torch.Tensor:
        """(H, dv, d): W_o^h, the map from head h's value space to the output."""
        w = self.out_proj.weight.t()  # (H*dv or dv, d)
        if self.head_combine == "concat":
            return w.reshape(self.num_heads, self.value_dim, self.embed_dim)
        return w.unsqueeze(0).expand(self.num_heads, -1, -1)

    def internals(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionInternals:
        """Attention weights, value vectors and per-head output maps for input x (no dropout)."""
        q, k, v = self._project(x)
        weights = self._weights(q, k, key_padding_mask)
        w_o = self.head_out_proj()
        head_output = torch.einsum("bhst,bhtv,hvd->bhsd", weights, v, w_o)  # (B, H, T, d)
        return AttentionInternals(attention=weights, values=v, out_proj=w_o, head_output=head_output)


@contextmanager
def override_attention(model: nn.Module, hook: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor]
                       ) -> Iterator[None]:
    """Replace the attention weights of every layer inside the block: ``hook(layer_index, weights, mask)``.

    The hook sees each layer's softmax weights (B, H, T, T) and the key padding mask (B, T) and returns
    the weights the layer then uses with its own values and output projection (gradients flow through
    it). Used by the faithfulness diagnostics (uniform attention, adversarial attention). A model with an
    ``override_attention`` method of its own (a pretrained encoder, models/pretrained.py) is handed the hook.
    """
    own = getattr(model, "override_attention", None)
    if callable(own):
        with own(hook):
            yield
        return
    layers = [m for m in model.modules() if isinstance(m, MultiHeadSelfAttention)]
    try:
        for i, layer in enumerate(layers):
            layer.weights_hook = (lambda w, m, i=i: hook(i, w, m))
        yield
    finally:
        for layer in layers:
            layer.weights_hook = None
