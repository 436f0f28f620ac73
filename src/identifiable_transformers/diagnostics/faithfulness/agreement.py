"""Rank agreement between explanations: Kendall tau-b per example."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import real_ends

# Upper bound on the pairs (rows x T x T) compared at once: about 32 MB per float64 temporary, whatever the batch.
_CHUNK_PAIRS = 1 << 22


def kendall_tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Kendall tau-b between x and y (B, T) over the positions where ``valid``, per row -> (B,) float64.

    tau_b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)); NaN for rows with fewer
    than 2 valid positions or where x or y is constant. Rows run sorted by their last valid position, in chunks of
    at most ``_CHUNK_PAIRS`` pairs, each cut to its own width (a short row costs its own length squared).
    """
    return kendall_taus(x[None], y, valid)[0]


def kendall_taus(xs: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """``kendall_tau_b`` of each of K score sets xs (K, B, T) against the same y (B, T) -> (K, B) float64: y's pair
    signs are computed once per chunk of rows, for all K."""
    K, B, _ = xs.shape
    ends = real_ends(valid)
    order = torch.argsort(ends.cpu(), stable=True, descending=True).tolist()
    out = torch.empty(K, B, dtype=torch.float64, device=xs.device)
    lo = 0
    while lo < B:
        w = max(int(ends[order[lo]]), 1)  # the longest row of the chunk comes first
        idx = torch.tensor(order[lo : lo + max(1, _CHUNK_PAIRS // (w * w))], device=xs.device)
        out[:, idx] = _tau_b(xs[:, idx, :w], y[idx, :w], valid[idx, :w])
        lo += len(idx)
    return out


def _signs(x: Tensor) -> Tensor:
    """(..., w) -> (..., w, w) sign(x_i - x_j), float32 (exact: every sum below counts at most w^2 / 2 < 2^24 terms)."""
    x = x.double()
    return torch.sign(x[..., :, None] - x[..., None, :]).float()


def _tau_b(xs: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    pair = torch.triu(valid[:, :, None] & valid[:, None, :], diagonal=1).float()
    dy = _signs(y) * pair
    ny = dy.abs().sum((1, 2)).double()
    taus = []
    for x in xs:
        dx = _signs(x)
        num = (dx * dy).sum((1, 2)).double()
        den = torch.sqrt((dx.abs() * pair).sum((1, 2)).double() * ny)
        taus.append(torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan)))
    return torch.stack(taus)
