"""Null spaces of attention: the linear algebra of docs/identifiability.md section 2 (the bottom layer).

Everything here is pure tensor maths on A and T (no model, no Lightning, no plotting); nothing here
imports another module of the package. The central object, per
example b, layer l and head h, is the head's *value-output matrix* on the example's real tokens

    T = V[:n] @ W_o^h                      # (n, d); n = real length of example b

so that the head contributes ``A @ T`` to the layer's attention output (A = attention, n x n).
Any A' with A' T = A T "explains" the output equally well (Brunner et al., ICLR 2020).

Numerics (docs/identifiability.md section 2, "Numerics"): SVDs run in float64 on the real tokens only -- T is
never padded, because pad rows would inflate the null space -- and ranks use the relative
tolerance ``sigma_max * max(n, d) * eps`` of ``torch.linalg.matrix_rank``; the tolerance used is
returned with every result.

Entry points: the per-matrix building blocks (``null_dim``, ``stochastic_null_dim``,
``effective_attention``, ``alternative_attention``, ``analyse_heads``) that take A and T directly,
and ``identifiable_length`` (theoretical length bounds). The model-level report is in
``internals.py``, the key-aware count (section 2.5) in ``key_aware.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "HEAD_METRICS",
    "analyse_heads",
    "alternative_attention",
    "effective_attention",
    "identifiable_length",
    "matrix_rank",
    "model_identifiable_length",
    "null_dim",
    "stochastic_null_dim",
]

# Per-head quantities returned by ``attention_identifiability`` with shape [B, L, H].
HEAD_METRICS = (
    "null_dim",
    "stochastic_null_dim",
    "alt_attention_tv",
    "effective_gap",
    "sigma_ratio",
    "attention_entropy",
)

_F64 = torch.float64
_EPS = torch.finfo(_F64).eps
# A candidate direction entry counts as negative below -_DIR_THR (directions have unit L2 norm,
# so rounding noise sits near 1e-16 and genuine entries are far larger).
_DIR_THR = 1e-12
# Basis directions tried per row besides the row's own direction -P a (which, in our checks on
# random heads, always gave the largest TV; the basis ones are a fallback).
_WITNESS_BASIS_DIRECTIONS = 4
# Upper bound on elements of the witness search tensor [..., rows, candidates, n] per chunk.
_WITNESS_CHUNK_ELEMS = 8_000_000


# ----------------------------------------------------------------------------------------------
# Rank with a relative tolerance
# ----------------------------------------------------------------------------------------------
def _rank_from_singular_values(s: Tensor, rows: int, cols: int) -> tuple[Tensor, Tensor]:
    """Rank and absolute tolerance from singular values ``s`` [..., k] of (rows x cols) matrices."""
    smax = s[..., 0] if s.shape[-1] > 0 else s.new_zeros(s.shape[:-1])
    tol = smax * max(rows, cols) * _EPS  # the torch.linalg.matrix_rank default
    rank = (s > tol.unsqueeze(-1)).sum(-1)
    return rank, tol


def matrix_rank(M: Tensor) -> tuple[Tensor, Tensor]:
    """Numerical rank of M [..., n, d] in float64 with the relative tolerance; returns (rank, tol)."""
    M = M.to(_F64)
    s = torch.linalg.svdvals(M)
    return _rank_from_singular_values(s, M.shape[-2], M.shape[-1])


def _with_ones_column(T: Tensor, smax: Tensor) -> Tensor:
    """[T, c 1] with c = sigma_max(T) / sqrt(n): rank([T, c1]) = rank([T, 1]) for any c != 0.

    Scaling the ones column to T's own scale keeps the relative tolerance meaningful: rescaling T
    rescales the whole matrix, so the stochastic rank is scale-invariant like rank(T) itself.
    """
    n = T.shape[-2]
    c = torch.where(smax > 0, smax / math.sqrt(n), torch.ones_like(smax))
    ones = c[..., None, None].expand(*T.shape[:-1], 1)
    return torch.cat([T, ones], dim=-1)


def null_dim(T: Tensor) -> Tensor:
    """Brunner's null-space dimension n - rank(T) (docs/identifiability.md 2.1) for T [..., n, d]."""
    rank, _ = matrix_rank(T)
    return T.shape[-2] - rank


def stochastic_null_dim(T: Tensor) -> Tensor:
    """n - rank([T, 1]) (docs/identifiability.md 2.2): null directions that also keep rows summing to one."""
    T = T.to(_F64)
    smax = torch.linalg.svdvals(T)[..., 0]
    rank, _ = matrix_rank(_with_ones_column(T, smax))
    return T.shape[-2] - rank


# ----------------------------------------------------------------------------------------------
# Effective attention and the witness alternative (docs/identifiability.md 2.3, 2.4)
# ----------------------------------------------------------------------------------------------
def _left_null_projector(M: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Orthonormal left-null basis of M [..., n, c] (zero columns outside the null space).

    Returns (N, rank, tol, s, null_mask): N [..., n, n] holds the left singular vectors with
    index >= rank (the others zeroed), so ``N @ N^T`` is the projector onto the left null space.
    """
    n, c = M.shape[-2:]
    # U must be square (n x n) to span the left null space; the reduced SVD already is when n <= c
    # and skips the (c x c) right factor, the costly part for short inputs.
    U, s, _ = torch.linalg.svd(M, full_matrices=n > c)  # U [..., n, n]
    rank, tol = _rank_from_singular_values(s, n, c)
    null_mask = torch.arange(n, device=M.device) >= rank.unsqueeze(-1)  # [..., n] (columns)
    N = U * null_mask.unsqueeze(-2).to(U.dtype)
    return N, rank, tol, s, null_mask


def effective_attention(A: Tensor, T: Tensor) -> Tensor:
    """Brunner's effective attention A_eff = A - A N N^T (docs/identifiability.md 2.4) on real tokens.

    A [..., n, n], T [..., n, d]; N is an orthonormal basis of the left null space of T. A_eff T
    equals A T but A_eff is generally not a distribution.
    """
    A, T = A.to(_F64), T.to(_F64)
    N, *_ = _left_null_projector(T)
    return A - A @ N @ N.transpose(-1, -2)


def _witness_search(A: Tensor, Z: Tensor, P: Tensor, null_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of A, the largest-TV alternative row found along candidate null directions.

    A [..., n, n] attention (rows = queries); Z [..., n, K] candidate basis directions of the left
    null space of [T, 1] (unit columns, zero where not in the null space); P [..., n, n] the null
    projector. Candidates per row: +-each basis column, and +-the projection of -a itself (the
    null direction that points most directly away from a, so it tends to empty a's large
    entries first). Along unit direction z (z sums to 0 because it is
    orthogonal to the ones column), a + t z stays a distribution up to t* = min_{z_j<0} a_j/(-z_j);
    the TV distance is then 0.5 t* ||z||_1. Returns (A_alt, tv_rows [..., n]).
    """
    del null_mask  # Z and P are already masked; kept in the signature for clarity of callers
    n = A.shape[-1]
    rows = A.shape[-2]
    basis = Z.transpose(-1, -2)  # [..., K, n]
    basis = basis.unsqueeze(-3).expand(*A.shape[:-2], rows, basis.shape[-2], n)  # [..., R, K, n]
    own = -(A @ P)  # [..., R, n]: P symmetric, so row i is -P a_i
    own_norm = own.norm(dim=-1, keepdim=True)
    own = torch.where(own_norm > _DIR_THR, own / own_norm.clamp_min(1e-300), torch.zeros_like(own))
    D = torch.cat([basis, -basis, own.unsqueeze(-2), -own.unsqueeze(-2)], dim=-2)  # [..., R, C, n]

    neg = D < -_DIR_THR
    ratio = A.unsqueeze(-2).clamp_min(0) / (-D).clamp_min(_DIR_THR)
    ratio = torch.where(neg, ratio, torch.full_like(ratio, math.inf))
    t = ratio.amin(dim=-1)  # [..., R, C]
    valid = neg.any(dim=-1)  # a zero (masked) direction has no negative entry
    t = torch.where(valid, t, torch.zeros_like(t))
    tv = 0.5 * t * D.abs().sum(-1)  # [..., R, C]
    best_tv, best = tv.max(dim=-1)  # [..., R]
    t_best = t.gather(-1, best.unsqueeze(-1))  # [..., R, 1]
    d_best = D.gather(-2, best[..., None, None].expand(*best.shape, 1, n)).squeeze(-2)  # [..., R, n]
    A_alt = A + t_best * d_best
    # The entry that defines t* lands on 0 up to rounding; clip the ~1e-17 negatives.
    A_alt = A_alt.clamp_min(0)
    return A_alt, best_tv


def alternative_attention(A: Tensor, T: Tensor) -> tuple[Tensor, Tensor]:
    """A witness alternative (docs/identifiability.md 2.3): A' >= 0, rows summing like A's, A' T = A T.

    A [..., n, n] (real tokens), T [..., n, d]. Returns (A_alt, tv_rows [..., n]) where tv_rows is
    the total-variation distance between each row of A and of A'. For heads whose
    stochastic_null_dim is 0 the witness is A itself and every TV is exactly 0. The search tries a
    few directions per row, so the TV is a lower bound on the largest achievable one.
    """
    A, T = A.to(_F64), T.to(_F64)
    smax = torch.linalg.svdvals(T)[..., 0]
    Z, _, _, _, null_mask = _left_null_projector(_with_ones_column(T, smax))
    k = min(_WITNESS_BASIS_DIRECTIONS, T.shape[-2])
    return _witness_search(A, Z[..., -k:], Z @ Z.transpose(-1, -2), null_mask)


# ----------------------------------------------------------------------------------------------
# All per-head quantities for a batch of heads sharing one length n
# ----------------------------------------------------------------------------------------------
def _row_entropy(A: Tensor) -> Tensor:
    """Mean over query rows of the row entropy (nats), 0 log 0 = 0. A [..., n, n] -> [...]."""
    plogp = torch.where(A > 0, A * torch.log(A.clamp_min(1e-300)), torch.zeros_like(A))
    return (-plogp.sum(-1)).mean(-1)


def analyse_heads(A: Tensor, T: Tensor, *, return_maps: bool = False) -> dict[str, Tensor]:
    """Every per-head quantity of docs/identifiability.md section 2 for A [..., n, n] and T [..., n, d].

    All leading dimensions are batch dimensions (one SVD call each for T and [T, 1]). Inputs are
    the real-token blocks: no padding. Returns tensors of shape [...] (plus the maps if asked).
    """
    A, T = A.to(_F64), T.to(_F64)
    n, d = T.shape[-2:]
    if A.shape[-2:] != (n, n):
        raise ValueError(f"attention block must be ({n}, {n}) to match T {tuple(T.shape)}, got {tuple(A.shape)}")

    # 2.1 Brunner's null space of T, and the conditioning of T.
    N, rank, tol, s, _ = _left_null_projector(T)
    smax = s[..., 0]
    sigma_ratio = torch.where(smax > 0, s[..., -1] / smax.clamp_min(1e-300), torch.zeros_like(smax))

    # 2.4 effective attention and the share of attention the output cannot see.
    A_hidden = A @ N @ N.transpose(-1, -2)
    a_norm = A.norm(dim=(-2, -1))
    effective_gap = A_hidden.norm(dim=(-2, -1)) / a_norm.clamp_min(1e-300)

    # 2.2 / 2.3 row-stochastic alternatives and the witness.
    Z, rank_s, tol_s, _, null_mask_s = _left_null_projector(_with_ones_column(T, smax))
    A_alt = A.clone()
    tv_rows = torch.zeros(A.shape[:-1], dtype=_F64, device=A.device)
    first = int(rank_s.min()) if rank_s.numel() else n  # columns below every head's rank are never null
    if first < n:
        P = Z[..., first:] @ Z[..., first:].transpose(-1, -2)  # projector onto the null space
        # The last columns of U are null for every head that has null directions at all.
        k = min(_WITNESS_BASIS_DIRECTIONS, n - first)
        Zc = Z[..., n - k :]  # [..., n, k]
        flat = A.shape[:-2]
        A2, Z2, P2 = A.reshape(-1, n, n), Zc.reshape(-1, n, k), P.reshape(-1, n, n)
        per_item = n * (2 * k + 2) * n
        step = max(1, _WITNESS_CHUNK_ELEMS // max(per_item, 1))
        alts, tvs = [], []
        for i in range(0, A2.shape[0], step):
            a_alt, tv = _witness_search(A2[i : i + step], Z2[i : i + step], P2[i : i + step], null_mask_s)
            alts.append(a_alt)
            tvs.append(tv)
        A_alt = torch.cat(alts).reshape(*flat, n, n)
        tv_rows = torch.cat(tvs).reshape(*flat, n)
    stoch_null = n - rank_s
    # docs/identifiability.md 2.3: exactly zero for identifiable heads (no search noise can leak in).
    tv_rows = torch.where((stoch_null > 0).unsqueeze(-1), tv_rows, torch.zeros_like(tv_rows))
    AT = A @ T
    witness_rel_error = ((A_alt - A) @ T).norm(dim=(-2, -1)) / AT.norm(dim=(-2, -1)).clamp_min(1e-300)

    out = {
        "null_dim": (n - rank).to(torch.long),
        "stochastic_null_dim": stoch_null.to(torch.long),
        "alt_attention_tv": tv_rows.amax(-1),
        "effective_gap": effective_gap,
        "sigma_ratio": sigma_ratio,
        "attention_entropy": _row_entropy(A),
        "rank": rank.to(torch.long),
        "stochastic_rank": rank_s.to(torch.long),
        "tol": tol,
        "stochastic_tol": tol_s,
        "witness_rel_error": witness_rel_error,
    }
    if return_maps:
        out["attention"] = A
        out["effective"] = A - A_hidden
        out["alternative"] = A_alt
        out["alt_tv_rows"] = tv_rows
    return out


def _joint_null_dims(T: Tensor) -> tuple[Tensor, Tensor]:
    """Layer-level (all heads at once) null dims for T [..., H, n, d] (docs/identifiability.md section 3 caveat).

    From the layer's summed output sum_h A_h T_h the heads' maps are jointly identifiable only if
    the stacked (H n x d) matrix has full row rank: joint_null_dim = H n - rank(stack_h T_h).
    The stochastic variant appends one ones-indicator column per head (each A_h is row-stochastic).
    """
    H, n, d = T.shape[-3:]
    stacked = T.reshape(*T.shape[:-3], H * n, d)
    s = torch.linalg.svdvals(stacked)
    rank, _ = _rank_from_singular_values(s, H * n, d)
    smax = s[..., 0]
    c = torch.where(smax > 0, smax / math.sqrt(n), torch.ones_like(smax))
    eye = torch.eye(H, dtype=T.dtype, device=T.device).repeat_interleave(n, dim=0)  # [H n, H]
    ind = c[..., None, None] * eye
    s2 = torch.linalg.svdvals(torch.cat([stacked, ind], dim=-1))
    rank2, _ = _rank_from_singular_values(s2, H * n, d + H)
    return H * n - rank, H * n - rank2


# ----------------------------------------------------------------------------------------------
# Theory: identifiable lengths for a configuration
# ----------------------------------------------------------------------------------------------
def identifiable_length(
    head_combine: str, embed_dim: int, num_heads: int, value_dim: int | None = None
) -> dict[str, int]:
    """Longest input length n for which a generic head / layer is identifiable.

    rank(T) <= r = min(d_v, d), so a head has null_dim = 0 up to n = r (docs/identifiability.md 2.1) and
    stochastic_null_dim = 0 up to n = r + 1 (2.2). Defaults: d_v = d / h for "concat", d for "add".
    From the layer's output the H heads are only jointly identifiable while H n <= rank of the
    stacked T's, at most min(H d_v, d) (docs/identifiability.md section 3 caveat): ``joint`` and, with the
    row-sum constraints, ``joint_stochastic``.
    """
    if head_combine not in ("concat", "add"):
        raise ValueError(f"head_combine must be 'concat' or 'add', got {head_combine!r}")
    if value_dim is None:
        if head_combine == "concat" and embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; pass value_dim")
        value_dim = embed_dim // num_heads if head_combine == "concat" else embed_dim
    r = min(value_dim, embed_dim)
    joint_rank = min(num_heads * value_dim, embed_dim)
    return {
        "value_dim": value_dim,
        "head": r,
        "head_stochastic": r + 1,
        "joint": joint_rank // num_heads,
        "joint_stochastic": (joint_rank + num_heads) // num_heads,
    }


def model_identifiable_length(model: torch.nn.Module) -> dict[str, int]:
    """``identifiable_length`` for a TransformerClassifier's resolved configuration."""
    return identifiable_length(model.head_combine, model.embed_dim, model.num_heads, model.value_dim)

