"""Multi-head self-attention with a key size decoupled from the value size.

Two ways to combine heads (docs/identifiability.md section 3):

- ``concat``: the standard layer. Each head has ``value_dim = embed_dim // num_heads``; head
  outputs are concatenated and projected. rank(A_h V_h W_o^h) <= d/h, so a head is identifiable
  only for inputs of at most d/h tokens.
- ``add``: the paper's variant. Each head has ``value_dim = embed_dim``; head outputs are
  *summed* (a true sum over heads, unlike the reference code's reshape) and then projected, so a
  head can stay identifiable up to about ``embed_dim`` tokens.

Logits are scaled by 1/sqrt(key_dim), the size the dot product is taken over.

``out_rank`` (default None: full) caps the rank of the output projection W_o = A B (A: d x r, B: r x in), so the
attention block's output has rank <= r whatever the head combination. ``add`` with value size v already caps it at
v; a capped ``concat`` separates that bottleneck from the head combination (multirun_sweeps/sweep/factorial_rank.yaml).
The factors are a parametrisation of ``out_proj.weight``: everything that reads the weight sees the product.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from . import dropout as _dropout
from .chunked import _ChunkedAttention, _chunks_are_better
from .dropout import Dropout, keep_mask  # noqa: F401  (re-exported: classifier.py and tests import them here)

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


class LowRank(nn.Module):
    """A weight W (out, in) stored as two factors A (out, r) and B (r, in): ``forward(A, B) = A @ B``.

    Registered on ``out_proj.weight`` (torch.nn.utils.parametrize): ``right_inverse`` starts the factors at the
    best rank-r approximation of the initialised weight (its truncated SVD, split evenly between the factors)."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def right_inverse(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        root = s[: self.rank].sqrt()
        return u[:, : self.rank] * root, root[:, None] * vh[: self.rank]


def check_out_rank(out_rank: int | None, embed_dim: int, in_dim: int) -> None:
    """An output rank must be at least 1 and below full (min(embed_dim, in_dim)); None is full."""
    if out_rank is None:
        return
    full = min(embed_dim, in_dim)
    if not 1 <= out_rank < full:
        raise ValueError(f"out_rank={out_rank} is impossible here: the output projection maps {in_dim} to {embed_dim} "
                         f"features, so its rank is at most {full}; use 1 <= out_rank < {full}, or null for full rank")


def _has_padding(key_padding_mask: torch.Tensor | None) -> bool:
    """Whether there is a mask to apply. A mask that hides no key is applied all the same: asking the tensor
    whether it hides any (``bool(mask.all())``) would make the host wait for the device inside every step,
    which breaks CUDA-graph capture and ``torch.compile(fullgraph=True)`` (docs/performance.md)."""
    return key_padding_mask is not None


def _key_bias(key_padding_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The padding mask as an additive bias (B, 1, T): 0 for real keys, -inf for padded ones; None if none.

    The logits' matmul accumulates onto it (``baddbmm``), so no masked copy of the logits is made.
    """
    if not _has_padding(key_padding_mask):
        return None
    b, t = key_padding_mask.shape
    bias = torch.zeros(b, 1, t, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill_(~key_padding_mask[:, None], -math.inf)


# Devices where a training step's dropout runs inside torch's fused attention. Not the CPU: there torch falls back
# to its math kernel with one ``bernoulli_`` draw per weight, which the chunks and keep_mask beat (docs/performance.md).
SDPA_DROPOUT_DEVICES = ("cuda",)


def _sdpa_drops(q: torch.Tensor) -> bool:
    """Whether dropout may run inside torch's fused attention for these queries.

    Not under ``torch.use_deterministic_algorithms`` (``trainer.deterministic=true``): the fused kernels'
    backward (memory-efficient attention) is not deterministic, and the explicit path keeps reruns bit-identical.
    """
    return q.device.type in SDPA_DROPOUT_DEVICES and not torch.are_deterministic_algorithms_enabled()


def _sdpa(q, k, v, mask, scale: float, p: float, align: int | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` of the (B, H, T, d) projections, dropout ``p`` inside the kernel.

    torch's fused CUDA kernels need head sizes that are multiples of 8 (else it takes its slow math kernel),
    and the paper's keys are 1 or 2 wide: queries and keys are padded with zeros up to a multiple of ``align``
    (8 on CUDA, 1 elsewhere), which leaves every dot product, hence the logits (scaled by the given
    ``scale``), unchanged.
    """
    align = (8 if q.device.type == "cuda" else 1) if align is None else align
    if q.shape[-1] % align:
        pad = (0, align - q.shape[-1] % align)
        q, k = F.pad(q, pad), F.pad(k, pad)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)


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
        out_rank: int | None = None,
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
        check_out_rank(out_rank, embed_dim, self.out_proj.in_features)
        self.out_rank = out_rank
        if out_rank is not None:
            parametrize.register_parametrization(self.out_proj, "weight", LowRank(out_rank))

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
        if not weights_used and (p == 0.0 or _sdpa_drops(q)):
            # No weights to show or change: torch's fused attention (its own kernel choice), on CUDA with the
            # dropout inside the kernel.
            mask = key_padding_mask[:, None, None, :] if _has_padding(key_padding_mask) else None
            heads = _sdpa(q, k, v, mask, 1 / math.sqrt(self.key_dim), p)
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
        if _dropout._torch_dropout_is_better(weights):
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
