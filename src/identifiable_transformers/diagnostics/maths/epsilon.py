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
  the straight moves towards each vertex e_j of the simplex; the exact witness of 2.3 when given.
* ``eps_tv_bound``: an upper bound, min(1 - min_j a_j, r/2 sqrt(sum_k (||H W_k||_1 / s_k)^2)) (the simplex's
  farthest vertex; Cauchy-Schwarz on ||d||_1 <= sum_k |c_k| ||H W_k||_1 with sum_k s_k^2 c_k^2 <= r^2); 1 - min a
  when T has an exact null direction in 1^perp (then the exact diagnostic already says "not identifiable").

Singular values below the rank tolerance of H^T T (sigma_max max(n, d + 1) eps) count as exact zeros.
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

    Singular values below the rank tolerance of H^T T are set to exact zeros.
    """
    n, d = T.shape[-2:]
    H = _ones_complement(n, T.dtype)
    M = H.T @ T  # [..., n - 1, d]
    # W must be square to span 1^perp; the reduced SVD already is when n - 1 <= d and skips the (d x d) right factor
    W, s, _ = torch.linalg.svd(M, full_matrices=n - 1 > d)  # W [..., n-1, n-1], s [..., min(n-1, d)]
    pad = (n - 1) - s.shape[-1]
    if pad > 0:
        s = torch.cat([s, s.new_zeros(*s.shape[:-1], pad)], dim=-1)
    tol = s[..., :1] * max(n, d + 1) * _EPS  # the rank tolerance of H^T T
    s = torch.where(s > tol, s, torch.zeros_like(s))
    D = H @ W  # [..., n, n - 1]
    return D.flip(-1), s.flip(-1)  # weakest first


def _simplex_step(A: Tensor, Dc: Tensor) -> Tensor:
    """Longest step t with a + t d >= 0 per candidate. A [..., R, n]; Dc [..., R, C, n] -> [..., R, C] (0 for d = 0)."""
    neg = Dc < -_DIR_THR * Dc.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    ratio = A.unsqueeze(-2).clamp_min(0) / (-Dc).clamp_min(1e-300)
    t = torch.where(neg, ratio, torch.full_like(ratio, math.inf)).amin(-1)
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _candidates(A: Tensor, T: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every candidate move per row, independent of eps: (t_simplex, out, half_l1) [..., R, C] -- the step
    that reaches the simplex boundary, ||d T|| and ||d||_1 / 2 per unit step -- and the bound's pieces
    (quad [..., 1], has_null [..., 1])."""
    n = T.shape[-2]
    D, s = _weak_directions(T)  # [..., n, n-1], [..., n-1]
    l1 = D.abs().sum(-2)  # [..., n-1]
    has_null = (s == 0).any(-1, keepdim=True)
    quad = ((l1 / s.clamp_min(1e-300)) ** 2).where(s > 0, torch.zeros_like(s)).sum(-1, keepdim=True).sqrt()
    ts, outs, hl1 = [], [], []

    def add(Dc: Tensor, out: Tensor) -> None:  # Dc [..., R, C, n], out [..., R, C]
        ts.append(_simplex_step(A, Dc))
        outs.append(out)
        hl1.append(0.5 * Dc.abs().sum(-1))

    # 1: +-the weakest directions.
    k = min(_BASIS_DIRECTIONS, n - 1)
    basis = D[..., :k].transpose(-1, -2)  # [..., k, n]
    Db = torch.cat([basis, -basis], dim=-2).unsqueeze(-3).expand(*A.shape[:-1], 2 * k, n)
    add(Db, torch.cat([s[..., :k], s[..., :k]], dim=-1).unsqueeze(-2).expand(*A.shape[:-1], 2 * k))
    # 2: towards a's projection onto the j weakest directions (coordinates c = D^T a), and onto the exact null space.
    c = A @ D  # [..., n, n-1]
    for j in sorted({*(2**p for p in range(int(math.log2(n - 1)) + 1)), n - 1}):
        cj = c[..., :j]
        out = (cj * s[..., :j].unsqueeze(-2)).norm(dim=-1, keepdim=True)
        add(-(cj @ D[..., :j].transpose(-1, -2)).unsqueeze(-2), out)
    null = (s == 0).to(s.dtype).unsqueeze(-2)
    add(-((c * null) @ D.transpose(-1, -2)).unsqueeze(-2), A.new_zeros(*A.shape[:-1], 1))
    # 3: straight towards each vertex e_j (d = e_j - a: step 1, ||d T|| = ||T_j - a T||, ||d||_1 / 2 = 1 - a_j).
    AT = A @ T
    ts.append(torch.ones_like(A))
    sq = (T * T).sum(-1).unsqueeze(-2) - 2.0 * AT @ T.transpose(-1, -2) + (AT * AT).sum(-1, keepdim=True)
    outs.append(sq.clamp_min(0).sqrt())  # ||T_j - a T||, through one matmul
    hl1.append(1.0 - A)
    return torch.cat(ts, -1), torch.cat(outs, -1), torch.cat(hl1, -1), quad, has_null


def epsilon_alternative_tvs(A: Tensor, T: Tensor, eps: list[float],
                            exact_tv: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
    """Per row of A [..., n, n] with T [..., n, d] and per eps: (tv found [..., n], upper bound [..., n]).

    The found value is achieved by a valid a' (a step along one candidate); tv_eps lies between the two.
    ``exact_tv`` (broadcastable to [..., n]): TVs of exact alternatives already found (the witness of 2.3),
    which move the output by 0 and so count as candidates too. The candidates are built once for all eps.
    """
    A, T = A.to(_F64), T.to(_F64)
    if T.shape[-2] < 2:
        z = A.new_zeros(A.shape[:-1])
        return [(z, z) for _ in eps]
    t_simplex, out, half_l1, quad, has_null = _candidates(A, T)
    norm_out = (A @ T).norm(dim=-1)  # [..., n]
    simplex = 1.0 - A.amin(-1)
    results = []
    for e in eps:
        r = e * norm_out
        t_out = torch.where(out > 0, r.unsqueeze(-1) / out.clamp_min(1e-300), torch.full_like(out, math.inf))
        best = (torch.minimum(t_simplex, t_out) * half_l1).amax(-1)
        if exact_tv is not None:
            best = torch.maximum(best, exact_tv.to(best.dtype).expand_as(best))
        bound = torch.where(has_null, simplex, torch.minimum(simplex, 0.5 * r * quad))
        results.append((best, torch.maximum(bound, best)))
    return results


def epsilon_alternative_tv(A: Tensor, T: Tensor, eps: float, exact_tv: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``epsilon_alternative_tvs`` at one eps."""
    return epsilon_alternative_tvs(A, T, [eps], exact_tv)[0]


def epsilon_tv_metrics(A: Tensor, T: Tensor, exact_tv: Tensor | None = None) -> dict[str, Tensor]:
    """Per head (max over rows) ``eps_tv_*`` and ``eps_tv_bound_*`` at the logged levels, A [..., n, n], T [..., n, d].

    ``exact_tv`` [...]: the head's exact witness TV (``alt_attention_tv``), a candidate at every eps."""
    ex = None if exact_tv is None else exact_tv.unsqueeze(-1)
    out = {}
    res = epsilon_alternative_tvs(A, T, list(EPS_LEVELS.values()), ex)
    for name, bname, (tv, ub) in zip(EPS_LEVELS, EPS_BOUNDS, res):
        out[name], out[bname] = tv.amax(-1), ub.amax(-1)
    return out
