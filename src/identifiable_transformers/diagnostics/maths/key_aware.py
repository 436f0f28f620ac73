"""Key-aware alternatives: the attention maps a head can itself produce (docs/identifiability.md 2.5).

A head's map is A = softmax(S), S = s Q K^T (n x n), and its output is A T. Locally, the maps
the head can generate are A + dA with dA = J(dQ, dK); an *alternative* is such a direction with
dA T = 0. The count we want is

    alternative_dim = rank(J) - rank(L J),      L: dA -> dA T.

``method="dense"`` forms J (n^2 x 2 n d_k) with torch.func and takes both ranks: exact but
O(n^5 d_k) time and O(n^3 d_k) memory, so it stops near n = 100. ``method="structured"`` gets the
same two numbers from the structure of J, never forming it (the derivation is in 2.5):

* row i of dA depends on row i of dS only: dA_i = dS_i P_i with P_i = diag(a_i) - a_i a_i^T,
  whose kernel is the ones vector (every a_ij > 0), so rank(J) = dim(W + C) - n, where
  W = {dQ K^T + Q dK^T} (the tangent space of the logits) and C = {c 1^T} (constants per row):
  dim(W + C) = n r_Q + n r_K~ - r_Q r_K~, r_Q = rank Q, r_K~ = rank [K, 1];
* dS_i gives dA_i T = 0 iff dS_i B_i = 0, B_i = P_i T. Writing dS = X [K, 1]^T + Q Y^T, the
  X part is solved row by row, which leaves, per row, g_i = rank([K, 1]^T B_i) output directions
  and one small *key system* for Y: Z_i^T Y q_i = 0 (Z_i an orthonormal basis of
  col(B_i) orthogonal to [K, 1]), so that

    rank(L J) = sum_i g_i + rank(E),     E the stacked key system (sum_i m_i x (n - r_K~) r_Q).

Every rank is numerical, in float64, with the tolerance rule of the other ranks
(``sigma_max * max(rows, cols) * eps``, docs/identifiability.md "Numerics"); nothing assumes
generic inputs. The key system is the only large matrix. Its rank is decided by a direct SVD
when its smaller side is at most ``_DIRECT_SVD_MAX``; otherwise by a certificate (a Cholesky
factorisation of its Gram matrix, shifted by a rounding-error bound, proves every singular value
above the tolerance: full rank); when the certificate fails, by its R factor: full rank when
sigma_min(R) >= 1 / ||R^-1||_F clears the tolerance (``qr+inv``), else an SVD of R (``qr+svd``).
``margin`` reports how far the closest rank decision sat from its tolerance (a ratio >= 1), over every
decision the count depends on (ranks of Q, [K, 1], [T, 1], each row's, the key system). Below
``UNRESOLVED_MARGIN`` the count depends on float64 resolution and is reported as unresolved.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

# identifiability.py re-exports this module at its end, after these are defined, so the import is not circular.
from .nullspace import _rank_from_singular_values, _with_ones_column, stochastic_null_dim

_F64 = torch.float64
_EPS = torch.finfo(_F64).eps
# "auto" takes the dense path where J (n^2 x 2 n d_k entries) has at most this many entries. Measured
# (bench/bench_key_aware.py --crossover, and warm in one process): the structured count is as fast or faster
# at every size down to n = 3, and a fresh process pays about 1 s to start torch.func, so "auto" never takes it.
DENSE_MAX_ELEMENTS = 0
# A count whose margin (the closest of its rank decisions to its tolerance, as a ratio) is below this is
# *unresolved*: float64 cannot tell it from a neighbouring count. Calibrated against exact arithmetic
# (tests/diagnostics/test_key_aware_margins.py: mpmath at 100 digits on random d_k = 1-2 heads, n = 12-32,
# peaked to near-uniform attention): every float64 count that differed from the exact one had a margin of
# at most 4.3 (the geometric decay rate of the key system's smallest singular values through the
# tolerance). It cannot be set much higher: an exact zero of a small matrix leaves rounding noise only
# 10-100 times below the tolerance (sigma_max max(rows, cols) eps), so correct counts of short heads have
# margins of 30-200 (tests/diagnostics/test_diagnostics_callback.py's tiny model).
UNRESOLVED_MARGIN = 10.0
# Key systems whose smaller side is at most this are ranked by a direct SVD.
_DIRECT_SVD_MAX = 1536
# Rows of B (n x n x d each) handled per batched SVD, to bound memory.
_ROW_CHUNK = 64


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


# ----------------------------------------------------------------------------------------------
# The key system E: rows (i, c) = Z'_ic (x) q_i / |q_i|, columns vec(Y'), Y' [(n - r_K~), r_Q]
# ----------------------------------------------------------------------------------------------
def _key_system_rank(Z: Tensor, qn: Tensor, live: Tensor) -> dict[str, Any]:
    """Rank of the stacked key system. Z [n, p, m] (dead columns zero), qn [n, r] unit queries, live [n, m].

    Each live row of E has unit norm (Z's live columns are orthonormal, q is normalised), so
    trace(E^T E) is the number of rows.
    """
    n, p, m = Z.shape
    r = qn.shape[1]
    rows, cols = int(live.sum()), p * r
    if rows == 0 or cols == 0:
        return {"rank": 0, "tol": 0.0, "margin": math.inf, "how": "empty", "shape": [rows, cols]}
    if min(rows, cols) <= _DIRECT_SVD_MAX:
        s = torch.linalg.svdvals(_stack_rows(Z, qn, live))
        rank, tol, margin = _svd_rank(s, rows, cols)
        return {"rank": int(rank), "tol": float(tol), "margin": float(margin), "how": "svd", "shape": [rows, cols]}
    cert = _certify_full_rank(Z, qn, live, rows, cols)
    if cert is not None:
        return {"rank": min(rows, cols), **cert, "how": "certified", "shape": [rows, cols]}
    E = _stack_rows(Z, qn, live)
    R = torch.linalg.qr(E if rows >= cols else E.T, mode="r").R  # same singular values as E
    del E
    bound = _inverse_bound(R, rows, cols)
    if bound is not None:
        return {"rank": min(rows, cols), **bound, "how": "qr+inv", "shape": [rows, cols]}
    s = torch.linalg.svdvals(R)
    rank, tol, margin = _svd_rank(s, rows, cols)
    return {"rank": int(rank), "tol": float(tol), "margin": float(margin), "how": "qr+svd", "shape": [rows, cols]}


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


def _group_constant(Nk: Tensor, Ckc: Tensor, Q: Tensor, K: Tensor, T: Tensor) -> Tensor:
    """Drop the key-system unknowns that no equation reaches when tokens repeat.

    Identical tokens (equal query, key and value rows) give identical rows and columns of A and
    of every B_i, so col(B_i) and col([K, 1]) hold vectors that are constant on each group of
    repeats. Directions of the complement Nk that differ within a group then meet no equation:
    exact zero columns of the key system, which rounding would leave near the tolerance. We keep
    the complement inside the group-constant vectors instead: same rank in exact arithmetic.
    """
    X = torch.cat([Q, K, T], dim=1)
    n = X.shape[0]
    tol = max(n, X.shape[1]) * _EPS * float(X.abs().max())
    # group j with the first earlier row within tol of it (max-norm)
    close = (X[:, None, :] - X[None, :, :]).abs().amax(-1) <= tol  # (n, n)
    first = close.to(torch.int8).argmax(1)  # index of each row's first match (itself if none earlier)
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


# ----------------------------------------------------------------------------------------------
# One head
# ----------------------------------------------------------------------------------------------
def generatable_alternative_dim(
    Q: Tensor, K: Tensor, T: Tensor, scale: float | None = None, method: str = "auto"
) -> dict[str, Any]:
    """Dimension of the alternatives to A = softmax(Q K^T * scale) that the head can itself produce.

    Q, K [n, d_k]; T [n, d_out] (a head's value-output matrix, or V itself); scale defaults to
    1 / sqrt(d_k). Returns ``tangent_dim`` = rank(J), ``output_rank`` = rank(L J),
    ``alternative_dim`` = their difference, ``key_agnostic_dim`` = n (n - rank[T, 1]) (the
    row-stochastic alternatives of any kind, 2.2), plus ``method`` ("dense" or "structured"),
    ``tol`` (the tolerance of the deciding rank), ``margin`` (the smallest over every rank decision the
    count depends on, see the module docstring; structured: ``margins`` per decision) and ``resolved``
    (margin >= ``UNRESOLVED_MARGIN``; an unresolved count is not a property of the head).
    ``method="auto"`` takes the dense path where J has at most ``DENSE_MAX_ELEMENTS`` entries.
    """
    Q, K, T = Q.detach().to("cpu", _F64), K.detach().to("cpu", _F64), T.detach().to("cpu", _F64)
    if Q.dim() != 2 or K.shape != Q.shape or T.dim() != 2 or T.shape[0] != Q.shape[0]:
        raise ValueError(f"need Q, K [n, d_k] and T [n, d]; got {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(T.shape)}")
    if method not in ("auto", "dense", "structured"):
        raise ValueError(f"method must be 'auto', 'dense' or 'structured', not {method!r}")
    n, dk = Q.shape
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    A = torch.softmax(Q @ K.T * scale, dim=-1)
    if bool((A == 0).any()):
        raise ValueError(
            "attention underflows to exactly 0 for some token pairs: the head is not smooth there and "
            "the local count is undefined (scale the logits down or drop those tokens)"
        )

    key_agnostic = n * int(stochastic_null_dim(T))
    if method == "dense" or (method == "auto" and n * n * 2 * n * dk <= DENSE_MAX_ELEMENTS):
        res = _dense(Q, K, T, scale)
    else:
        res = _structured(Q * scale, K, A, T)
    res["key_agnostic_dim"] = key_agnostic
    res["resolved"] = bool(res["margin"] >= UNRESOLVED_MARGIN)
    return res


def _dense(Q: Tensor, K: Tensor, T: Tensor, scale: float) -> dict[str, Any]:
    """rank(J) - rank(L J) with the Jacobian formed by torch.func (float64)."""
    from torch.func import jacfwd

    n = Q.shape[0]

    def attn(q: Tensor, k: Tensor) -> Tensor:
        return torch.softmax(q @ k.T * scale, dim=-1)

    jq, jk = jacfwd(attn, argnums=(0, 1))(Q, K)  # (n, n, n, dk) each
    J = torch.cat([jq.reshape(n, n, -1), jk.reshape(n, n, -1)], dim=-1)  # (n, n, 2 n dk)
    JT = torch.einsum("ijp,jk->ikp", J, T)  # L J = d vec(A T) / d(Q, K)
    rj, tol_j, m_j = _svd_rank(torch.linalg.svdvals(J.reshape(n * n, -1)), n * n, J.shape[-1])
    rjt, tol_jt, m_jt = _svd_rank(torch.linalg.svdvals(JT.reshape(n * T.shape[1], -1)), n * T.shape[1], J.shape[-1])
    return {
        "tangent_dim": int(rj),
        "output_rank": int(rjt),
        "alternative_dim": int(rj) - int(rjt),
        "method": "dense",
        "tol": float(tol_jt),
        "margin": float(min(m_j, m_jt)),
    }


def _structured(Q: Tensor, K: Tensor, A: Tensor, T: Tensor) -> dict[str, Any]:
    """The structured count (module docstring). Q already carries the logit scale."""
    n = Q.shape[0]
    margins: dict[str, float] = {}  # every rank decision the count depends on -> its margin
    # Queries: the row space of Q; coordinates q'_i = Q V_r S_r^-1 (= U_r: an invertible rescaling of the
    # columns of the key system, which leaves its rank unchanged and its conditioning independent of Q's),
    # then unit rows (zero rows drop out).
    Uq, sq, _ = torch.linalg.svd(Q, full_matrices=False)
    r_q, tol_q, m_q = _svd_rank(sq, *Q.shape)
    r_q = int(r_q)
    margins["rank_q"] = float(m_q)
    qc = Uq[:, :r_q] * sq[:r_q]  # Q V_r
    qnorm = qc.norm(dim=1)
    live_q = qnorm > float(tol_q)
    qw = Uq[:, :r_q]
    qn = torch.where(live_q[:, None], qw / qw.norm(dim=1).clamp_min(1e-300)[:, None], torch.zeros_like(qw))
    # Keys with the ones column: col([K, 1]) = span(1) + col(Ckc), complement Nk [n, p].
    Ckc, Nk, r_k, m_k = _split_ones(K)
    margins["rank_k1"] = m_k
    Nk = _group_constant(Nk, Ckc, Q, K, T)
    tangent = n * r_q + n * r_k - r_q * r_k - n

    # Per row i: B_i = P_i T (n x d), an orthonormal basis U_i of col(B_i) (orthogonal to 1, since
    # 1^T P_i = 0), g_i = rank(C_K^T U_i) output directions, and Z_i: the rest of col(B_i),
    # orthogonal to [K, 1], expressed in the complement basis Nk (Z'_i = Nk^T Z_i).
    # Values: P_i 1 = 0, so only col(T) orthogonal to 1 matters; there B_i = diag(a_i)(Tc - 1 abar_i^T)
    # has rank exactly dim(Tc) (1 is not in col(Tc) and a_i > 0). dim(Tc) = rank([T, 1]) - 1 is a rank
    # decision like the others (issue 34): its margin is reported, because Tc is an orthonormal basis, which
    # blows a direction of T just above the tolerance up to unit size.
    Tc, _, _, m_t = _split_ones(T)
    margins["rank_t1"] = m_t
    T = Tc
    AT = A @ T  # (n, d)
    d = T.shape[1]
    g_sum = 0
    m_rows, m_g = math.inf, math.inf
    Zs, lives = [], []
    for lo in range(0, n, _ROW_CHUNK):
        a = A[lo : lo + _ROW_CHUNK]  # (c, n)
        c = a.shape[0]
        B = a[:, :, None] * (T[None] - AT[lo : lo + _ROW_CHUNK, None, :])  # (c, n, d)
        U, s, _ = torch.linalg.svd(B, full_matrices=False)  # U (c, n, d): d <= n - 1 columns, all of rank
        if d:  # how far the smallest (structurally nonzero) singular value sits above the tolerance
            m_rows = min(m_rows, float((s[:, -1] / (s[:, 0] * max(n, d) * _EPS)).min()))
        # g_i = rank(C_Kc^T U_i) (U_i is orthogonal to 1); its null vectors span Z_i
        _, sm, Vh = torch.linalg.svd(Ckc.T[None].expand(c, -1, -1) @ U, full_matrices=True)  # Vh (c, d, d)
        # C_Kc and U_i have orthonormal columns: sm are cosines of principal angles, on the scale 1 (relative to
        # their own largest, a product that is all rounding noise would be called rank 1)
        g, _, mg = _svd_rank(sm, Ckc.shape[1], d, scale=1.0)
        m_g = min(m_g, float(mg.min()))
        g_sum += int(g.sum())
        null = torch.arange(d)[None] >= g[:, None]  # (c, d) right singular vectors spanning the null space
        null &= live_q[lo : lo + _ROW_CHUNK, None]  # a zero query gives no equation
        Z = U @ (Vh.transpose(1, 2) * null[:, None, :].to(_F64))  # (c, n, d), orthonormal live columns
        Zs.append(Nk.T[None] @ Z)  # (c, p, k)
        lives.append(null)
    margins["rows_b"], margins["rows_g"] = m_rows, m_g
    key = _key_system_rank(torch.cat(Zs), qn, torch.cat(lives))
    margins["key_system"] = key["margin"]
    output_rank = g_sum + key["rank"]
    margin = min(margins.values())
    return {
        "tangent_dim": tangent,
        "output_rank": output_rank,
        "alternative_dim": tangent - output_rank,
        "method": "structured",
        "tol": key["tol"],
        "margin": margin,
        "margins": margins,
        "key_system": {k: key[k] for k in ("shape", "how", "rank")},
    }
