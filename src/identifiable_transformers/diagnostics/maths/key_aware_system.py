"""The key system of the structured key-aware count (key_aware.py; docs/identifiability.md 2.5).

E stacks, per row i, the equations Z_i^T Y q_i = 0 on the key unknowns Y: its rows, its Gram matrix, the
certificate of full rank and the bound from R's inverse (key_aware.py's ``_key_system_rank`` chooses among
them). ``_group_constant`` drops the unknowns that no equation reaches when tokens repeat.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .key_aware_ranks import _EPS, _F64

# Rows of the key system handled per block when its Gram matrix is formed, to bound memory.
_ROW_CHUNK = 64


# ----------------------------------------------------------------------------------------------
# The key system E: rows (i, c) = Z'_ic (x) q_i / |q_i|, columns vec(Y'), Y' [(n - r_K~), r_Q]
# ----------------------------------------------------------------------------------------------
def _inverse_bound(R: Tensor, rows: int, cols: int) -> dict[str, float] | None:
    """Full rank from the R factor without its SVD, or None: sigma_min(R) >= 1 / ||R^-1||_F.

    R [k, k] is triangular, so its inverse costs k^3 / 3 (an SVD about 10 k^3). The tolerance uses
    ||R||_F >= sigma_max, so it is never below the SVD path's; the bound loses at most sqrt(k) against the
    true sigma_min, and the computed inverse is accurate to about k eps kappa(R) (relative), far below
    that factor wherever this path decides. Margin: the bound over the tolerance (a lower bound on it).
    """
    k = R.shape[0]
    if k == 0 or not bool(torch.isfinite(R).all()) or float(R.diagonal().abs().min()) == 0.0:
        return None
    tol = float(torch.linalg.matrix_norm(R)) * max(rows, cols) * _EPS
    Rinv = torch.linalg.solve_triangular(R, torch.eye(k, dtype=R.dtype), upper=True)
    inv_norm = float(torch.linalg.matrix_norm(Rinv))
    del Rinv
    if not math.isfinite(inv_norm) or inv_norm == 0.0:
        return None
    lower = 1.0 / inv_norm
    if lower > 2.0 * tol:
        return {"tol": tol, "margin": lower / tol}
    return None


def _stack_rows(Z: Tensor, qn: Tensor, live: Tensor) -> Tensor:
    """E [rows, p r] with row (i, c) = vec(z_ic q_i^T), (i, c) over the live columns."""
    n, p, m = Z.shape
    z = Z.transpose(1, 2)[live]  # (rows, p)
    q = qn[:, None, :].expand(n, m, -1)[live]  # (rows, r)
    return (z[:, :, None] * q[:, None, :]).reshape(z.shape[0], -1)


def _gram(Z: Tensor, qn: Tensor, live: Tensor, rows: int, cols: int) -> Tensor:
    """The smaller Gram matrix of E, from its Kronecker structure (E itself is never formed)."""
    n, p, m = Z.shape
    r = qn.shape[1]
    if rows >= cols:  # E^T E [p r, p r] = sum_i (q_i q_i^T) (x) (Z_i Z_i^T); dead columns are zero
        G = Z.new_zeros(r * r, p * p)
        for lo in range(0, n, _ROW_CHUNK):
            z, q = Z[lo : lo + _ROW_CHUNK], qn[lo : lo + _ROW_CHUNK]
            proj = (z @ z.transpose(1, 2)).reshape(z.shape[0], p * p)  # (c, p*p)
            G += (q[:, :, None] * q[:, None, :]).reshape(z.shape[0], r * r).T @ proj
        # index (b, b', a, a') -> (a b), (a' b'): the column order of vec(Y') in _stack_rows
        return G.view(r, r, p, p).permute(2, 0, 3, 1).reshape(p * r, p * r)
    # E E^T [rows, rows]: entries (q_i . q_j)(z_ic . z_jc')
    z = Z.transpose(1, 2)[live]
    q = qn[:, None, :].expand(n, m, -1)[live]
    return (z @ z.T) * (q @ q.T)


def _certify_full_rank(Z: Tensor, qn: Tensor, live: Tensor, rows: int, cols: int) -> dict[str, float] | None:
    """Prove sigma_min(E) > tol with a shifted Cholesky of the Gram matrix G, or return None.

    The computed G differs from the exact one by at most err = (terms + dim + 2) eps trace(G) in the
    2-norm (accumulating the PSD products, then Cholesky's backward error, both bounded through the
    trace). If G - (err + lower^2) I factorises, then lambda_min(exact G) > lower^2, i.e.
    sigma_min(E) > lower. First lower = 2 tol (the decision); then, for the margin, a few steps of
    inverse iteration with that factor estimate sigma_min, and half of it is certified the same way
    (the margin reported is that certified lower bound over tol, or 2).
    """
    G = _gram(Z, qn, live, rows, cols)
    dim = G.shape[0]
    n, p, m = Z.shape
    trace = float(rows)  # unit rows
    # Each entry of G sums at most `terms` rounded products (tall: m per Z_i Z_i^T, then over the n rows in
    # chunks; wide: p and r per factor), so |fl(G) - G| <= gamma_terms |E|^T |E|, of 2-norm <= trace.
    terms = n + m + 2 if rows >= cols else p + qn.shape[1] + 2
    err = 2.0 * (terms + dim + 2) * _EPS * trace
    # sigma_max(E)^2 = lambda_max(G); power steps approach it from below, so pad generously.
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(dim, dtype=G.dtype, generator=gen)
    for _ in range(30):
        v = G @ v
        v = v / v.norm()
    smax = math.sqrt(min(float(v @ G @ v) * 1.5, trace) + err)
    tol = smax * max(rows, cols) * _EPS
    shift = err + (2.0 * tol) ** 2
    G.diagonal().sub_(shift)
    L, info = torch.linalg.cholesky_ex(G)
    if int(info):
        return None
    x = torch.randn(dim, 1, dtype=G.dtype, generator=gen)
    for _ in range(8):  # inverse iteration on G - shift I: converges to its smallest eigenvalue
        x = torch.cholesky_solve(x, L)
        x = x / x.norm()
    lam = float(x.T @ G @ x) + shift  # Rayleigh quotient: an estimate of lambda_min(G)
    lower = 0.5 * math.sqrt(max(lam - err, 0.0))
    if lower > 2.0 * tol:
        G.diagonal().add_(shift - err - lower**2)
        if int(torch.linalg.cholesky_ex(G)[1]) == 0:
            return {"tol": tol, "margin": lower / tol}
    return {"tol": tol, "margin": 2.0}


# Entries of the (rows x n x D) difference block compared at a time: 1 M float64 = 8 MB (issue 39: the whole
# n x n x D block of a MiniLM head at n = 512 took 0.9 GB, twice with its absolute value).
_CLOSE_BLOCK = 1 << 20


def _first_close_rows(X: Tensor, tol: float) -> Tensor:
    """For each row i of X [n, D], the first row j (j <= i) with max_k |X_ik - X_jk| <= tol.

    Compared one block of rows at a time: the same elementwise comparisons as the full n x n x D difference,
    never holding it.
    """
    n, D = X.shape
    rows = max(1, _CLOSE_BLOCK // max(1, n * D))
    first = torch.empty(n, dtype=torch.long)
    for lo in range(0, n, rows):
        close = (X[lo : lo + rows, None, :] - X[None, :, :]).abs().amax(-1) <= tol  # (rows, n)
        first[lo : lo + rows] = close.to(torch.int8).argmax(1)  # row i is close to itself: a match exists
    return first


def _group_constant(Nk: Tensor, Ckc: Tensor, Q: Tensor, K: Tensor, T: Tensor) -> Tensor:
    """Drop the key-system unknowns that no equation reaches when tokens repeat.

    Identical tokens (equal query, key and value rows) give identical rows and columns of A and
    of every B_i, so col(B_i) and col([K, 1]) hold vectors that are constant on each group of
    repeats. Directions of the complement Nk that differ within a group then meet no equation:
    exact zero columns of the key system, which rounding would leave near the tolerance. We keep
    the complement inside the group-constant vectors instead: same rank in exact arithmetic.
    """
    X = torch.cat([Q, K, T], dim=1)  # (n, D), D = 2 d_k + d
    n = X.shape[0]
    tol = max(n, X.shape[1]) * _EPS * float(X.abs().max())
    first = _first_close_rows(X, tol)  # index of each row's first match (itself if none earlier)
    groups, inverse = torch.unique(first, return_inverse=True)
    if len(groups) == n:
        return Nk
    G = torch.zeros(n, len(groups), dtype=_F64)
    G[torch.arange(n), inverse] = 1.0
    G = G / G.sum(0).sqrt()  # orthonormal group indicators
    ones = torch.full((n, 1), 1.0 / math.sqrt(n), dtype=_F64)
    Ck = torch.cat([ones, Ckc], dim=1)
    R = G - Ck @ (Ck.T @ G)  # the group-constant vectors orthogonal to col([K, 1])
    U, s, _ = torch.linalg.svd(R, full_matrices=False)
    return U[:, : len(groups) - Ck.shape[1]]
