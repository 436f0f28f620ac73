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
from .key_aware_ranks import _EPS, _F64, _split_ones, _svd_rank
from .key_aware_system import (  # noqa: F401 (_gram: re-exported for the tests and benches)
    _certify_full_rank,
    _gram,
    _group_constant,
    _inverse_bound,
    _stack_rows,
)
from .nullspace import stochastic_null_dim

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
# Rows of B (n x n x d each) handled per batched SVD, to bound memory.
_ROW_CHUNK = 64


# Key systems whose smaller side is at most this are ranked by a direct SVD.
_DIRECT_SVD_MAX = 1536


# Here, not in key_aware_system.py, so that the constant and the paths it picks can be patched on this module.
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
    # filled chunk by chunk (not concatenated at the end: at n = 512 it is tens of megabytes)
    Zs = torch.empty(n, Nk.shape[1], d, dtype=_F64)  # (n, p, d)
    lives = torch.empty(n, d, dtype=torch.bool)
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
        torch.matmul(Nk.T[None], Z, out=Zs[lo : lo + _ROW_CHUNK])  # (c, p, d)
        lives[lo : lo + _ROW_CHUNK] = null
    margins["rows_b"], margins["rows_g"] = m_rows, m_g
    key = _key_system_rank(Zs, qn, lives)
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
