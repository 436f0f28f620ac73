"""Rank agreement between explanations: Kendall tau-b per example."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def kendall_tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Kendall tau-b between x and y (B, T) over the positions where ``valid``, per row -> (B,) float64.

    tau_b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)); NaN for rows with fewer
    than 2 valid positions or where x or y is constant.
    """
    x, y = x.double(), y.double()
    dx = torch.sign(x[:, :, None] - x[:, None, :])
    dy = torch.sign(y[:, :, None] - y[:, None, :])
    pair = valid[:, :, None] & valid[:, None, :]
    pair = torch.triu(pair, diagonal=1)
    num = (dx * dy * pair).sum((1, 2))
    den = torch.sqrt((dx.abs() * pair).sum((1, 2)) * (dy.abs() * pair).sum((1, 2)))
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))
