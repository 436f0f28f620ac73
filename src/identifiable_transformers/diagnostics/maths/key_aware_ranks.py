"""Numerical ranks with their margins, for the key-aware count (key_aware.py; docs/identifiability.md 2.5).

Every rank is decided in float64 with the tolerance rule of the other ranks (``sigma_max * max(rows, cols) *
eps``, docs/identifiability.md "Numerics"), and reports how far its closest singular value sat from it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .nullspace import _rank_from_singular_values, _with_ones_column

_F64 = torch.float64
_EPS = torch.finfo(_F64).eps


def _svd_rank(s: Tensor, rows: int, cols: int, scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Rank, tolerance and margin from singular values s [..., k] (descending) of rows x cols matrices.

    margin = min(s_r / tol, tol / s_{r+1}): the distance, as a ratio, of the closest singular value
    to the threshold (inf when there is none on one side). ``scale``: the matrices' known scale, for products
    of orthonormal bases (scale 1), whose own largest singular value can itself be rounding noise; the tolerance
    is then scale * max(rows, cols) * eps instead of relative to s_1.
    """
    if scale is None:
        rank, tol = _rank_from_singular_values(s, rows, cols)  # the rule every rank of the package uses
    else:
        tol = torch.full(s.shape[:-1], scale * max(rows, cols) * _EPS, dtype=s.dtype, device=s.device)
        rank = (s > tol.unsqueeze(-1)).sum(-1)
    keep = s > tol.unsqueeze(-1)
    inf = torch.full_like(tol, math.inf)
    if s.shape[-1]:
        above = torch.where(keep, s, math.inf).min(-1).values
        below = torch.where(keep, -math.inf, s).max(-1).values
    else:
        above, below = inf, -inf
    m_above = torch.where(tol > 0, above / tol, inf)
    m_below = torch.where((below > 0) & (tol > 0), tol / below, inf)
    return rank, tol, torch.minimum(m_above, m_below)


def _split_ones(M: Tensor) -> tuple[Tensor, Tensor, int, float]:
    """Bases of col([M, 1]) without the ones direction, and of its complement.

    Returns (C, N, r, margin): r = rank([M, c 1]) with c = sigma_max(M) / sqrt(n) (the scaling of
    ``stochastic_null_dim``), C [n, r - 1] an orthonormal basis of col([M, 1]) orthogonal to 1,
    N [n, n - r] one of the orthogonal complement of col([M, 1]). Splitting the ones direction off
    exactly matters: softmax's tangent map kills it (P_i 1 = 0), and leaving it to a numerical
    rank decision turns exact zeros into rounding noise near the tolerance.
    """
    n = M.shape[0]
    smax = torch.linalg.svdvals(M)[0] if M.numel() else M.new_zeros(())
    U, s, _ = torch.linalg.svd(_with_ones_column(M, smax), full_matrices=True)
    r, _, margin = _svd_rank(s, n, M.shape[1] + 1)
    r = int(r)
    ones = M.new_full((n, 1), 1.0 / math.sqrt(n))
    C = U[:, :r] - ones @ (ones.T @ U[:, :r])  # rank r - 1: 1 lies in col([M, 1])
    C = torch.linalg.svd(C, full_matrices=False)[0][:, : r - 1]
    return C, U[:, r:], r, float(margin)
