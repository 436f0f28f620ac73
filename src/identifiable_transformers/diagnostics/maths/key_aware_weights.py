"""The alternatives a head can produce from its own weights on the same input (docs/identifiability.md 2.6).

``generatable_alternative_dim`` lets Q and K move freely. Here they move only through the head's weights on a fixed
input: Q = X~ W~_q, K = X~ W~_k with X~ = [X, 1] (the bias as a column), so dQ = X~ dW_q and dK = X~ dW_k. With
M: (dW_q, dW_k) -> (dQ, dK), the count is

    weight_alternative_dim = rank(J M) - rank(L J M),

the directions of the weights that move A without moving A T. J M has n^2 rows and 2 (d + 1) d_k columns and is
formed densely (float64), with the chain rule written out: row (i, j) is
[x~_i (x) (P_i K)_j, (P_i X~)_j (x) q_i] * scale, P_i = diag(a_i) - a_i a_i^T. Dense: O(n^2 (d + 1) d_k) memory and
an SVD of that matrix, so it is meant for n up to about 128 (272 MB at d = 64, d_k = 16).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .key_aware import _F64, UNRESOLVED_MARGIN, _svd_rank


def weight_alternative_dim(X: Tensor, Wq: Tensor, bq: Tensor, Wk: Tensor, bk: Tensor, T: Tensor,
                           scale: float | None = None) -> dict[str, Any]:
    """rank(J M) - rank(L J M) for the head Q = X Wq + bq, K = X Wk + bk on input X [n, d], values T [n, d_v].

    Returns ``tangent_dim`` (rank J M), ``output_rank`` (rank L J M), ``alternative_dim``, ``margin`` (the closer
    of the two rank decisions to its tolerance, as a ratio) and ``resolved`` (margin >= UNRESOLVED_MARGIN).
    """
    X, Wq, bq, Wk, bk, T = (x.detach().to("cpu", _F64) for x in (X, Wq, bq, Wk, bk, T))
    n, d = X.shape
    dk = Wq.shape[1]
    if Wq.shape != (d, dk) or Wk.shape != (d, dk) or bq.shape != (dk,) or bk.shape != (dk,) or T.shape[0] != n:
        raise ValueError("need X [n, d], Wq, Wk [d, d_k], bq, bk [d_k], T [n, d_v]")
    s = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    Xt = torch.cat([X, torch.ones(n, 1, dtype=_F64)], dim=1)  # [n, d + 1]
    Q, K = X @ Wq + bq, X @ Wk + bk
    A = torch.softmax(s * Q @ K.T, dim=-1)
    P = torch.diag_embed(A) - A[:, :, None] * A[:, None, :]  # [n, n, n], P[i] symmetric
    PK = P @ K  # [n, n, d_k]: (P_i K)_j
    PX = P @ Xt  # [n, n, d + 1]: (P_i X~)_j
    Jq = s * Xt[:, None, :, None] * PK[:, :, None, :]  # [i, j, a, b] = x~_ia (P_i K)_jb
    Jk = s * PX[:, :, :, None] * Q[:, None, None, :]  # [i, j, a, b] = (P_i X~)_ja q_ib
    JM = torch.cat([Jq.reshape(n, n, -1), Jk.reshape(n, n, -1)], dim=-1)  # [n, n, 2 (d + 1) d_k]
    del Jq, Jk, P
    LJM = torch.einsum("ijp,jc->icp", JM, T)
    cols = JM.shape[-1]
    rj, _, mj = _svd_rank(torch.linalg.svdvals(JM.reshape(n * n, cols)), n * n, cols)
    rl, _, ml = _svd_rank(torch.linalg.svdvals(LJM.reshape(-1, cols)), LJM.shape[0] * LJM.shape[1], cols)
    margin = float(min(mj, ml))
    return {"tangent_dim": int(rj), "output_rank": int(rl), "alternative_dim": int(rj) - int(rl),
            "margin": margin, "resolved": margin >= UNRESOLVED_MARGIN}
