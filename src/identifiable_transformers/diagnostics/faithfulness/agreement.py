"""Rank agreement between explanations: Kendall tau-b per example."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Upper bound on the pairs (rows x T x T) compared at once: about 32 MB per float64 temporary, whatever the batch.
_CHUNK_PAIRS = 1 << 22


def kendall_tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Kendall tau-b between x and y (B, T) over the positions where ``valid``, per row -> (B,) float64.

    tau_b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)); NaN for rows with fewer
    than 2 valid positions or where x or y is constant. Rows run sorted by their last valid position, in chunks of
    at most ``_CHUNK_PAIRS`` pairs, each cut to its own width (a short row costs its own length squared).
    """
    B, T = x.shape
    last = torch.where(valid.bool(), torch.arange(T, device=valid.device), -1).amax(1)
    order = torch.argsort(last.cpu(), stable=True, descending=True).tolist()
    out = torch.empty(B, dtype=torch.float64, device=x.device)
    lo = 0
    while lo < B:
        w = max(int(last[order[lo]]) + 1, 1)  # the longest row of the chunk comes first
        idx = torch.tensor(order[lo : lo + max(1, _CHUNK_PAIRS // (w * w))], device=x.device)
        out[idx] = _tau_b(x[idx, :w], y[idx, :w], valid[idx, :w])
        lo += len(idx)
    return out


def _tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    x, y = x.double(), y.double()
    dx = torch.sign(x[:, :, None] - x[:, None, :])
    dy = torch.sign(y[:, :, None] - y[:, None, :])
    pair = valid[:, :, None] & valid[:, None, :]
    pair = torch.triu(pair, diagonal=1)
    num = (dx * dy * pair).sum((1, 2))
    den = torch.sqrt((dx.abs() * pair).sum((1, 2)) * (dy.abs() * pair).sum((1, 2)))
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))
