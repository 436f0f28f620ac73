"""Dropout with cheaper random bits on CPU: ``keep_mask``, ``dropout`` and ``Dropout`` (docs/performance.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _dropout_threshold(p: float) -> tuple[int, float]:
    """The 16-bit threshold under which an entry is dropped, and the scale 1 / (1 - rate) of the kept ones."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    threshold = min(round(p * 2**16), 2**16 - 1)
    return threshold, 1.0 / (1.0 - threshold / 2**16)


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
