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
    than 2 valid positions or where x or y is constant. Rows run in chunks of ``_CHUNK_PAIRS`` pairs.
    """
    T = x.shape[1]
    step = max(1, _CHUNK_PAIRS // max(T * T, 1))
    if x.shape[0] > step:
        return torch.cat([kendall_tau_b(x[i : i + step], y[i : i + step], valid[i : i + step])
                          for i in range(0, x.shape[0], step)])
    x, y = x.double(), y.double()
    dx = torch.sign(x[:, :, None] - x[:, None, :])
    dy = torch.sign(y[:, :, None] - y[:, None, :])
    pair = valid[:, :, None] & valid[:, None, :]
    pair = torch.triu(pair, diagonal=1)
    num = (dx * dy * pair).sum((1, 2))
    den = torch.sqrt((dx.abs() * pair).sum((1, 2)) * (dy.abs() * pair).sum((1, 2)))
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))
