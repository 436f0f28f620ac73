"""Identifiability of attention weights: the linear algebra of docs/identifiability.md section 2.

Everything here is pure tensor maths (no Lightning, no plotting). The central object, per
example b, layer l and head h, is the head's *value-output matrix* on the example's real tokens

    T = V[:n] @ W_o^h                      # (n, d); n = real length of example b

so that the head contributes ``A @ T`` to the layer's attention output (A = attention, n x n).
Any A' with A' T = A T "explains" the output equally well (Brunner et al., ICLR 2020).

Numerics (docs/identifiability.md section 2, "Numerics"): SVDs run in float64 on the real tokens only -- T is
never padded, because pad rows would inflate the null space -- and ranks use the relative
tolerance ``sigma_max * max(n, d) * eps`` of ``torch.linalg.matrix_rank``; the tolerance used is
returned with every result.

Entry points:
    attention_identifiability(model, input_ids, attention_mask) -> dict of [B, L, H] tensors
    attention_maps(model, input_ids, attention_mask)            -> raw / effective / witness maps
    identifiable_length(head_combine, embed_dim, num_heads, ...) -> theoretical length bounds
    generatable_alternative_dim(Q, K, T)                         -> key-aware check, section 2.5
and the per-matrix building blocks (``null_dim``, ``stochastic_null_dim``,
``effective_attention``, ``alternative_attention``) that take A and T directly.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = [
    "HEAD_METRICS",
    "analyse_heads",
    "alternative_attention",
    "attention_identifiability",
    "attention_maps",
    "effective_attention",
    "generatable_alternative_dim",
    "identifiability_from_internals",
    "identifiable_length",
    "key_aware_alternative_dims",
    "matrix_rank",
    "model_identifiable_length",
    "null_dim",
    "stochastic_null_dim",
    "value_output_matrices",
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
# From a model's attention internals to a report
# ----------------------------------------------------------------------------------------------
def value_output_matrices(internals: Sequence[Any]) -> tuple[Tensor, Tensor]:
    """Stack (attention [B, L, H, T, T], value-output T [B, L, H, T, d]) in float64 on CPU.

    T for layer l, head h is values[:, h] @ out_proj[h] (docs/identifiability.md 2: T = V W_o^h).
    """
    atts, ts = [], []
    for layer in internals:
        values = layer.values.detach().to("cpu", _F64)  # (B, H, T, dv)
        out_proj = layer.out_proj.detach().to("cpu", _F64)  # (H, dv, d)
        atts.append(layer.attention.detach().to("cpu", _F64))  # (B, H, T, T)
        ts.append(torch.einsum("bhtv,hvd->bhtd", values, out_proj))  # (B, H, T, d)
    return torch.stack(atts, dim=1), torch.stack(ts, dim=1)


def _lengths_from_mask(attention_mask: Tensor) -> Tensor:
    mask = attention_mask.to("cpu").bool()
    lengths = mask.sum(-1)
    if (lengths == 0).any():
        bad = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask has examples with no real token (rows {bad}); drop them first")
    prefix = torch.arange(mask.shape[-1]) < lengths.unsqueeze(-1)
    if not torch.equal(prefix, mask):
        raise ValueError(
            "attention_mask must mark real tokens as a prefix of each row (right padding); "
            "got a mask with padding before real tokens"
        )
    return lengths


def identifiability_from_internals(
    internals: Sequence[Any], attention_mask: Tensor, *, return_maps: bool = False
) -> dict[str, Any]:
    """The report of ``attention_identifiability`` from already computed attention internals."""
    lengths = _lengths_from_mask(attention_mask)
    A_all, T_all = value_output_matrices(internals)
    B, L, H = A_all.shape[:3]
    d = T_all.shape[-1]
    out: dict[str, Any] = {
        k: torch.zeros(B, L, H, dtype=torch.long if k.endswith(("null_dim", "rank")) else _F64)
        for k in (*HEAD_METRICS, "rank", "stochastic_rank", "tol", "stochastic_tol", "witness_rel_error")
    }
    out["joint_null_dim"] = torch.zeros(B, L, dtype=torch.long)
    out["joint_stochastic_null_dim"] = torch.zeros(B, L, dtype=torch.long)
    maps: list[dict[str, Tensor] | None] = [None] * B
    # Group examples by exact length: one batched SVD per length, and T is never padded.
    for n in lengths.unique().tolist():
        idx = (lengths == n).nonzero().flatten()
        A = A_all[idx][..., :n, :n]  # (k, L, H, n, n)
        T = T_all[idx][..., :n, :]  # (k, L, H, n, d)
        res = analyse_heads(A, T, return_maps=return_maps)
        for key in out:
            if key in res:
                out[key][idx] = res[key].to(out[key].dtype)
        jn, jsn = _joint_null_dims(T)
        out["joint_null_dim"][idx] = jn.to(torch.long)
        out["joint_stochastic_null_dim"][idx] = jsn.to(torch.long)
        if return_maps:
            for j, b in enumerate(idx.tolist()):
                maps[b] = {
                    "attention": res["attention"][j],
                    "effective": res["effective"][j],
                    "alternative": res["alternative"][j],
                    "alt_tv_rows": res["alt_tv_rows"][j],
                    "witness_rel_error": res["witness_rel_error"][j],
                }
    out["lengths"] = lengths
    # tol = sigma_max(T) * rtol with rtol = max(n, d) * eps (per example); stochastic: max(n, d+1).
    out["rtol"] = lengths.clamp_min(d).to(_F64) * _EPS
    out["eps"] = _EPS
    if return_maps:
        out["maps"] = maps
    return out


def _run_internals(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None):
    if attention_mask is None:
        attention_mask = input_ids != model.pad_id
    attention_mask = attention_mask.bool()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            internals = model.attention_internals(input_ids, attention_mask=attention_mask)
    finally:
        model.train(was_training)
    return internals, attention_mask


def attention_identifiability(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    return_maps: bool = False,
) -> dict[str, Any]:
    """Identifiability report for a batch (docs/identifiability.md section 2), per example, layer and head.

    Runs ``model.attention_internals`` in eval mode without gradients (the previous training
    mode is restored). ``attention_mask`` [B, T] marks real tokens (a prefix of each row); the
    default is ``input_ids != model.pad_id``. Returns a dict of [B, L, H] tensors
    (``HEAD_METRICS`` plus ``rank``, ``stochastic_rank``, ``tol``, ``stochastic_tol``,
    ``witness_rel_error``), [B, L] layer-level ``joint_null_dim`` / ``joint_stochastic_null_dim``,
    ``lengths`` [B], ``rtol`` [B] (tol = sigma_max * rtol) and, with ``return_maps``, ``maps``: per
    example a dict of [L, H, n, n] raw / effective / alternative attention maps.
    """
    internals, attention_mask = _run_internals(model, input_ids, attention_mask)
    return identifiability_from_internals(internals, attention_mask, return_maps=return_maps)


def attention_maps(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
) -> list[dict[str, Tensor]]:
    """Per example: raw, effective (A_eff) and witness-alternative maps [L, H, n, n] on real tokens."""
    return attention_identifiability(model, input_ids, attention_mask, return_maps=True)["maps"]


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


# ----------------------------------------------------------------------------------------------
# docs/identifiability.md 2.5: alternatives the head itself could generate (key-aware, local check)
# ----------------------------------------------------------------------------------------------
def generatable_alternative_dim(Q: Tensor, K: Tensor, T: Tensor, scale: float | None = None) -> dict[str, int]:
    """Dimension of the alternatives to A = softmax(Q K^T * scale) the head can itself produce.

    Locally, the attention maps the head can generate form a manifold whose tangent space at
    (Q, K) is range(J), J = d vec(A) / d(Q, K). Alternatives with the same output are directions
    Delta with Delta T = 0. The key-aware alternative dimension is

        dim(range(J) ∩ {Delta : Delta T = 0}) = rank(J) - rank(L J),   L: Delta -> Delta T,

    computed with float64 Jacobians (torch.func.jacfwd) and matrix_rank's default tolerance.
    Q, K [n, d_k]; T [n, d_out] (a head's value-output matrix, or V itself). Also returns the
    key-agnostic count n * (n - rank([T, 1])): row-stochastic alternatives of any kind (2.2).
    """
    from torch.func import jacfwd

    Q, K, T = Q.to(_F64), K.to(_F64), T.to(_F64)
    n, dk = Q.shape
    if K.shape != (n, dk) or T.shape[0] != n:
        raise ValueError(f"need Q, K [n, d_k] and T [n, d]; got {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(T.shape)}")
    scale = 1.0 / math.sqrt(dk) if scale is None else scale

    def attn(q: Tensor, k: Tensor) -> Tensor:
        return torch.softmax(q @ k.T * scale, dim=-1)

    jq, jk = jacfwd(attn, argnums=(0, 1))(Q, K)  # (n, n, n, dk) each
    J = torch.cat([jq.reshape(n, n, -1), jk.reshape(n, n, -1)], dim=-1)  # (n, n, P)
    JT = torch.einsum("ijp,jk->ikp", J, T)  # L J: d vec(A T) / d(Q, K)
    rank_j = int(torch.linalg.matrix_rank(J.reshape(n * n, -1)))
    rank_jt = int(torch.linalg.matrix_rank(JT.reshape(n * T.shape[1], -1)))
    key_agnostic = n * int(stochastic_null_dim(T))
    return {
        "tangent_dim": rank_j,
        "output_rank": rank_jt,
        "alternative_dim": rank_j - rank_jt,
        "key_agnostic_dim": key_agnostic,
    }


def key_aware_alternative_dims(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
) -> dict[str, Tensor]:
    """``generatable_alternative_dim`` for every example, layer and head of a model (expensive).

    Queries and keys are captured with forward hooks on each layer's ``attn.q_proj`` /
    ``attn.k_proj`` while ``attention_internals`` runs; everything is restricted to real tokens.
    Cost grows like n^3 d_k per head (dense float64 Jacobians): meant for a handful of sentences.
    Returns [B, L, H] long tensors ``alternative_dim``, ``key_agnostic_dim``, ``tangent_dim``.
    """
    layers = getattr(model, "layers", None)
    if layers is None or not all(hasattr(getattr(l, "attn", None), "q_proj") for l in layers):
        raise TypeError("key_aware_alternative_dims needs a TransformerClassifier (layers[i].attn.q_proj/k_proj)")
    captured: dict[tuple[int, str], Tensor] = {}
    hooks = []
    for i, layer in enumerate(layers):
        for name in ("q_proj", "k_proj"):
            def hook(_mod, _inp, out, key=(i, name)):
                captured[key] = out.detach()
            hooks.append(getattr(layer.attn, name).register_forward_hook(hook))
    try:
        internals, attention_mask = _run_internals(model, input_ids, attention_mask)
    finally:
        for h in hooks:
            h.remove()
    lengths = _lengths_from_mask(attention_mask)
    _, T_all = value_output_matrices(internals)
    B, L, H = T_all.shape[:3]
    dk = model.key_dim
    out = {k: torch.zeros(B, L, H, dtype=torch.long) for k in ("alternative_dim", "key_agnostic_dim", "tangent_dim")}
    for l in range(L):
        q = captured[(l, "q_proj")].to("cpu", _F64).view(B, -1, H, dk)  # (B, T, H, dk)
        k = captured[(l, "k_proj")].to("cpu", _F64).view(B, -1, H, dk)
        for b in range(B):
            n = int(lengths[b])
            for h in range(H):
                res = generatable_alternative_dim(q[b, :n, h], k[b, :n, h], T_all[b, l, h, :n])
                for key in out:
                    out[key][b, l, h] = res[key]
    out["lengths"] = lengths
    return out
