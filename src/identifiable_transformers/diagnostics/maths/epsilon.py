"""epsilon-identifiability: how far attention can move while the output stays within eps (docs/identifiability.md 2.6).

Exact identifiability asks whether any row-stochastic A' != A gives A' T = A T. A trained T is full rank but
ill-conditioned, so an attention row can move a long way while its output moves by less than rounding, or
less than any difference that matters. For a row a of A (a query) and eps > 0 we ask for

    tv_eps(a) = max { TV(a, a') = ||a' - a||_1 / 2 :  a' >= 0, sum(a') = 1, ||(a' - a) T||_2 <= eps ||a T||_2 }

and per head report the largest over its rows. Moves d = a' - a sum to zero, so only T's action on the
hyperplane 1^perp matters: with H an orthonormal basis of 1^perp (a Householder reflection) and
H^T T = W diag(s) V^T (W square, s padded with zeros), d = H W c has ||d T|| = ||s * c||. The feasible moves
are the intersection of the ellipsoid ||s * c|| <= r (r = eps ||a T||, unbounded along null directions) with the
shifted simplex a + d >= 0. We compute two numbers:

* ``eps_tv``: an achieved value (a lower bound on tv_eps): a few candidate directions per row, each followed
  until either the output bound r or the simplex boundary stops it. Candidates: +-the 4 weakest directions
  H W_k; the move of a towards its projection onto the span of the j weakest directions (j = 1, 2, 4, ...)
  and onto the exact null space (moves that empty a's large entries first, the witness search's choice);
  the straight moves towards each vertex e_j of the simplex; and the ellipsoid's support points for those
  moves' sign patterns; the exact witness of 2.3 when given.
* ``eps_tv_bound``: an upper bound, min(1 - min_j a_j, r/2 sqrt(sum_k (||H W_k||_1 / s_k)^2)) (the simplex's
  farthest vertex; Cauchy-Schwarz on ||d||_1 <= sum_k |c_k| ||H W_k||_1 with sum_k s_k^2 c_k^2 <= r^2); 1 - min a
  when T has an exact null direction in 1^perp (then the exact diagnostic already says "not identifiable").

Singular values below the rank tolerance of [T, 1] (the exact diagnostic's) count as exact zeros.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .nullspace import _EPS, _F64

# The eps levels logged per epoch (docs/identifiability.md 2.6) and their logged names.
EPS_LEVELS = {"eps_tv_1e-3": 1e-3, "eps_tv_1e-2": 1e-2}
EPS_BOUNDS = {"eps_tv_bound_1e-3": 1e-3, "eps_tv_bound_1e-2": 1e-2}
_BASIS_DIRECTIONS = 4
_DIR_THR = 1e-12


def _ones_complement(n: int, dtype=_F64) -> Tensor:
    """H [n, n - 1]: orthonormal columns spanning 1^perp (the Householder reflection sending e_1 to 1/sqrt n)."""
    v = torch.full((n,), 1.0 / math.sqrt(n), dtype=dtype)
    v[0] -= 1.0
    if float(v.norm()) == 0.0:  # n = 1
        return torch.zeros(1, 0, dtype=dtype)
    Hfull = torch.eye(n, dtype=dtype) - 2.0 * torch.outer(v, v) / (v @ v)
    return Hfull[:, 1:]


def _weak_directions(T: Tensor) -> tuple[Tensor, Tensor]:
    """(D [..., n, n - 1], s [..., n - 1]): unit moves D_k in 1^perp (columns) with ||D_k^T T|| = s_k, s ascending.

    Singular values below the rank tolerance of [T, 1] are set to exact zeros.
    """
    n, d = T.shape[-2:]
    H = _ones_complement(n, T.dtype)
    M = H.T @ T  # [..., n - 1, d]
    W, s, _ = torch.linalg.svd(M, full_matrices=True)  # W [..., n-1, n-1], s [..., min(n-1, d)]
    pad = (n - 1) - s.shape[-1]
    if pad > 0:
        s = torch.cat([s, s.new_zeros(*s.shape[:-1], pad)], dim=-1)
    smax = torch.linalg.svdvals(T)[..., :1] if n > 1 else s[..., :1]
    tol = torch.maximum(smax, s[..., :1]) * max(n, d + 1) * _EPS
    s = torch.where(s > tol, s, torch.zeros_like(s))
    D = H @ W  # [..., n, n - 1]
    return D.flip(-1), s.flip(-1)  # weakest first


def _step(A: Tensor, Dc: Tensor, out_norm: Tensor, r: Tensor) -> Tensor:
    """TV of the longest feasible step along each candidate. A [..., R, n] rows; Dc [..., R, C, n] directions
    (any norm, summing to 0); out_norm [..., R, C] = ||d T|| of each; r [..., R] the output budget."""
    neg = Dc < -_DIR_THR * Dc.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    ratio = A.unsqueeze(-2).clamp_min(0) / (-Dc).clamp_min(1e-300)
    t_simplex = torch.where(neg, ratio, torch.full_like(ratio, math.inf)).amin(-1)  # [..., R, C]
    t_out = torch.where(out_norm > 0, r.unsqueeze(-1) / out_norm.clamp_min(1e-300), torch.full_like(out_norm, math.inf))
    t = torch.minimum(t_simplex, t_out)
    t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))  # a zero direction moves nothing
    return 0.5 * t * Dc.abs().sum(-1)


def epsilon_alternative_tv(A: Tensor, T: Tensor, eps: float, exact_tv: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per row of A [..., n, n] with T [..., n, d]: (tv found [..., n], upper bound [..., n]) at this eps.

    The found value is achieved by a valid a' (a step along one candidate); tv_eps lies between the two.
    ``exact_tv`` (broadcastable to [..., n]): TVs of exact alternatives already found (the witness of 2.3),
    which move the output by 0 and so count as candidates too.
    """
    A, T = A.to(_F64), T.to(_F64)
    n = T.shape[-2]
    if n < 2:
        z = A.new_zeros(A.shape[:-1])
        return z, z
    D, s = _weak_directions(T)  # [..., n, n-1], [..., n-1]
    r = eps * (A @ T).norm(dim=-1)  # [..., n]
    # Upper bound.
    l1 = D.abs().sum(-2)  # [..., n-1]
    has_null = (s == 0).any(-1, keepdim=True)
    quad = ((l1 / s.clamp_min(1e-300)) ** 2).where(s > 0, torch.zeros_like(s)).sum(-1, keepdim=True).sqrt()
    simplex = 1.0 - A.amin(-1)
    bound = torch.where(has_null, simplex, torch.minimum(simplex, 0.5 * r * quad))
    # Candidates 1: +-the weakest directions.
    k = min(_BASIS_DIRECTIONS, n - 1)
    basis = D[..., :k].transpose(-1, -2)  # [..., k, n]
    Db = torch.cat([basis, -basis], dim=-2).unsqueeze(-3).expand(*A.shape[:-1], 2 * k, n)
    sb = torch.cat([s[..., :k], s[..., :k]], dim=-1).unsqueeze(-2).expand(*A.shape[:-1], 2 * k)
    best = _step(A, Db, sb, r).amax(-1)
    # Candidates 2: towards a's projection onto the j weakest directions (coordinates c = D^T a).
    c = A @ D  # [..., n, n-1]
    for j in sorted({*(2**p for p in range(int(math.log2(n - 1)) + 1)), n - 1}):
        cj = c[..., :j]
        d = -(cj @ D[..., :j].transpose(-1, -2))  # [..., n, n]: -P_j a per row
        out = (cj * s[..., :j].unsqueeze(-2)).norm(dim=-1)  # ||d T||
        best = torch.maximum(best, _step(A, d.unsqueeze(-2), out.unsqueeze(-1), r).squeeze(-1))
    null = (s == 0).to(s.dtype).unsqueeze(-2)  # ... and onto the exact null space (the exact witness's move)
    d = -((c * null) @ D.transpose(-1, -2))
    best = torch.maximum(best, _step(A, d.unsqueeze(-2), torch.zeros_like(r).unsqueeze(-1), r).squeeze(-1))
    # Candidates 3: straight towards each vertex e_j of the simplex (d = e_j - a, ||d T|| = ||T_j - a T||).
    AT = A @ T
    out_v = (T.unsqueeze(-3) - AT.unsqueeze(-2)).norm(dim=-1)  # [..., R, n]
    t_v = torch.where(out_v > 0, r.unsqueeze(-1) / out_v.clamp_min(1e-300), torch.full_like(out_v, math.inf))
    t_v = t_v.clamp(max=1.0)
    best = torch.maximum(best, (t_v * (1.0 - A)).amax(-1))  # TV of a + t (e_j - a) is t (1 - a_j)
    # Candidates 4: the ellipsoid's support points for the sign patterns of those vertex moves (+ at j, - elsewhere):
    # d_j = M (2 e_j - 1), M = D diag(1/s^2) D^T, the move of largest sigma . d per unit of output (no exact null).
    inv = torch.where(s > 0, 1.0 / s.clamp_min(1e-300) ** 2, torch.zeros_like(s))
    M = (D * inv.unsqueeze(-2)) @ D.transpose(-1, -2)  # [..., n, n]
    Dv = (2.0 * M - M.sum(-1, keepdim=True)).transpose(-1, -2)  # [..., n (j), n]: rows d_j (M symmetric)
    Dv = Dv / Dv.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    out_s = (Dv @ T).norm(dim=-1)  # [..., n]
    Dc = Dv.unsqueeze(-3).expand(*A.shape[:-1], n, n)
    best = torch.maximum(best, _step(A, Dc, out_s.unsqueeze(-2).expand(*A.shape[:-1], n), r).amax(-1))
    if exact_tv is not None:
        best = torch.maximum(best, exact_tv.to(best.dtype).expand_as(best))
    return best, torch.maximum(bound, best)


def epsilon_tv_metrics(A: Tensor, T: Tensor, exact_tv: Tensor | None = None) -> dict[str, Tensor]:
    """Per head (max over rows) ``eps_tv_*`` and ``eps_tv_bound_*`` at the logged levels, A [..., n, n], T [..., n, d].

    ``exact_tv`` [...]: the head's exact witness TV (``alt_attention_tv``), a candidate at every eps."""
    out = {}
    ex = None if exact_tv is None else exact_tv.unsqueeze(-1)
    for (name, eps), bname in zip(EPS_LEVELS.items(), EPS_BOUNDS):
        tv, ub = epsilon_alternative_tv(A, T, eps, ex)
        out[name], out[bname] = tv.amax(-1), ub.amax(-1)
    return out
