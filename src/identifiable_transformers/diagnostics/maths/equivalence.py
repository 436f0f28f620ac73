"""Equivalence-class ranges: how far an attention row can move while the head's output does not
(docs/identifiability.md section 2.8).

For one attention row a (n,) of a head with value-output matrix T (n, d) (T = V W_o^h on the real tokens,
section 2), the rows that give the same output and are still distributions form the polytope

    P(a) = {a' : a' >= 0, sum(a') = 1, a' T = a T}.

For token weights w (n,) the least and greatest ``w . a'`` over P(a) are two linear programs, solved with
SciPy's HiGHS. The equality system a' [T, 1] = a [T, 1] is first reduced to an orthonormal basis Q (n, r) of
the column space of [T, 1], r = rank([T, 1]) with the tolerance ``stochastic_null_dim`` uses, so each LP has
r equality rows (Q^T a' = Q^T a); a itself satisfies them exactly, so P(a) is never empty.

Tolerance: directions whose singular value of [T, c 1] is below ``tol = sigma_max * max(n, d + 1) * eps`` count
as null, so an optimum a* keeps |(a* - a) T| <= tol * ||a* - a|| <= sqrt(2) tol per output coordinate (plus
HiGHS' primal feasibility tolerance, 1e-7, on Q^T a* and a* >= 0). The bounds are then widened to contain
w . a (a is feasible, so low <= w . a <= high holds exactly; the LP may miss it by that tolerance).

Shortcuts that skip the LPs exactly: when r = n the row is identifiable (P(a) = {a}); when w is constant on
P(a) (its part in the null space of [T, 1]^T is below 1e-10 of its norm) the range is the point w . a.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import sparse
from scipy.optimize import linprog
from torch import Tensor

from .nullspace import _EPS, _with_ones_column

__all__ = ["equivalence_range", "equivalence_ranges", "equality_basis"]

# HiGHS' default primal feasibility tolerance: how far an LP optimum may break Q^T a' = Q^T a and a' >= 0.
LP_FEASIBILITY_TOL = 1e-7
# Variables per block-diagonal LP call (_solve_blocks): large enough to amortise the call, small enough for memory.
_BLOCK_VARIABLES = 200_000


def equality_basis(T) -> tuple[list[np.ndarray], np.ndarray]:
    """For T (..., n, d): orthonormal bases Q (n, r) of the column spaces of [T, c 1] (c = sigma_max(T) / sqrt(n),
    as ``stochastic_null_dim``), one per matrix in a flat list, and their tolerances (below which a singular
    value counts as zero). One stacked numpy SVD: for small matrices torch's costs far more per call."""
    T = torch.as_tensor(T, dtype=torch.float64).detach().cpu()
    flat = T.reshape(-1, *T.shape[-2:])
    smax = torch.from_numpy(np.linalg.svd(flat.numpy(), compute_uv=False)[:, :1].sum(-1))  # 0 when d = 0
    M = _with_ones_column(flat, smax).numpy()  # (R, n, d + 1)
    U, sv, _ = np.linalg.svd(M, full_matrices=False)
    tol = sv[:, 0] * max(M.shape[-2:]) * _EPS
    ranks = (sv > tol[:, None]).sum(-1)
    return [U[i, :, :r] for i, r in enumerate(ranks)], tol


def _solve_blocks(problems: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """argmin c . x over {x >= 0, Q^T x = b} for every (c, Q, b), solved as block-diagonal LPs (HiGHS).

    The blocks share no variable and the objective is their sum, so a solution of the whole is optimal in every
    block (else that block alone could be improved): one solver call replaces hundreds of small ones, whose
    fixed cost per call is most of a small LP's time. Chunks of at most ``_BLOCK_VARIABLES`` variables.
    """
    out: list[np.ndarray] = []
    start = 0
    while start < len(problems):
        stop, size = start, 0
        while stop < len(problems) and (stop == start or size + len(problems[stop][0]) <= _BLOCK_VARIABLES):
            size += len(problems[stop][0])
            stop += 1
        chunk = problems[start:stop]
        res = linprog(np.concatenate([c for c, _, _ in chunk]),
                      A_eq=sparse.block_diag([Q.T for _, Q, _ in chunk], format="csr"),
                      b_eq=np.concatenate([b for _, _, b in chunk]), bounds=(0, None), method="highs")
        if res.status != 0:  # never expected: a is feasible and each set is bounded (a face of the simplex)
            raise RuntimeError(f"equivalence LP failed: {res.message}")
        out += np.split(res.x, np.cumsum([len(c) for c, _, _ in chunk])[:-1])
        start = stop
    return out


def _check_row(T: Tensor, a: Tensor) -> None:
    if T.dim() != 2 or a.dim() != 1 or T.shape[0] != a.shape[0]:
        raise ValueError(f"T must be (n, d) and a (n,) with the same n; got {tuple(T.shape)} and {tuple(a.shape)}")
    if bool((a < -1e-9).any()) or abs(float(a.sum()) - 1.0) > 1e-6:
        raise ValueError("a must be a distribution over the real tokens (a >= 0, sum 1 within 1e-6); "
                         f"got min {float(a.min()):.3g}, sum {float(a.sum()):.9g}: pass the unpadded row")


def equivalence_range(T, a, w) -> tuple[float, float]:
    """The least and greatest ``w . a'`` over {a' >= 0, sum a' = 1, a' T = a T}.

    T (n, d): the head's value-output matrix on the real tokens; a (n,): one attention row of that head
    (unpadded: n = the real length); w (n,): token weights (e.g. a one-hot token, a rationale indicator, or
    reference scores). Tensors or arrays; computed in float64. An identifiable row gives (w . a, w . a).
    """
    T, a, w = (torch.as_tensor(x, dtype=torch.float64).detach().cpu() for x in (T, a, w))
    _check_row(T, a)
    if w.shape != a.shape:
        raise ValueError(f"w must be (n,) = {tuple(a.shape)}, got {tuple(w.shape)}")
    res = equivalence_ranges(T[None], a[None], w[None, None])
    low, high = res["low"][0], res["high"][0]
    return float(low[0]), float(high[0])


def equivalence_ranges(T, a, W, *, vertices: bool = False) -> dict[str, object]:
    """``equivalence_range`` for R rows of one length at once: T (R, n, d), a (R, n), W (R, k, n).

    Returns {"low": (R, k), "high": (R, k), "free_dim": (R,) n - rank([T, 1])} float64 tensors and, with
    ``vertices``, "argmin" and "argmax" (R, k, n): an optimal row a' of each LP (a itself where the range is
    a point). Each LP is small (n variables, rank([T, 1]) equality rows): all of them run as one block-diagonal
    LP (``_solve_blocks``); identifiable rows, objectives constant on the class and repeated objectives of a row
    cost no LP.
    """
    T, a, W = (torch.as_tensor(x, dtype=torch.float64).detach().cpu() for x in (T, a, W))
    if T.dim() != 3 or a.dim() != 2 or W.dim() != 3 or W.shape[::2] != a.shape or T.shape[:2] != a.shape:
        raise ValueError(f"need T (R, n, d), a (R, n), W (R, k, n); got {tuple(T.shape)}, {tuple(a.shape)}, "
                         f"{tuple(W.shape)}")
    R, k, n = W.shape
    out: dict[str, object] = {}
    for r in range(R):
        _check_row(T[r], a[r])
    bases, _ = equality_basis(T)
    values = torch.einsum("rkn,rn->rk", W, a)
    out["low"], out["high"] = values.clone(), values.clone()
    out["free_dim"] = torch.tensor([n - Q.shape[1] for Q in bases])
    if vertices:
        out["argmin"], out["argmax"] = (a[:, None, :].expand(R, k, n).clone() for _ in range(2))
    problems, jobs = [], {}  # jobs: (r, i) -> index of its min problem (its max is the next); same w, same LPs
    for r, Q in enumerate(bases):
        if Q.shape[1] == n:  # identifiable: P(a) = {a}, every range is a point
            continue
        Wr = W[r].numpy()
        free = Wr - (Wr @ Q) @ Q.T  # the part of each w that can change along P(a)'s directions
        b = Q.T @ a[r].numpy()
        seen: dict[bytes, int] = {}
        for i in range(k):
            if np.linalg.norm(free[i]) <= 1e-10 * np.linalg.norm(Wr[i]):
                continue  # w . a' is the same for every a' in P(a)
            key = Wr[i].tobytes()
            if key not in seen:
                seen[key] = len(problems)
                problems += [(Wr[i], Q, b), (-Wr[i], Q, b)]
            jobs[r, i] = seen[key]
    xs = _solve_blocks(problems)
    for (r, i), p in jobs.items():
        x_lo, x_hi = torch.from_numpy(xs[p]), torch.from_numpy(xs[p + 1])
        # a is feasible: widen by the LP tolerance so that low <= w . a <= high holds exactly
        out["low"][r, i] = min(float(W[r, i] @ x_lo), float(values[r, i]))
        out["high"][r, i] = max(float(W[r, i] @ x_hi), float(values[r, i]))
        if vertices:
            out["argmin"][r, i], out["argmax"][r, i] = x_lo, x_hi
    return out
