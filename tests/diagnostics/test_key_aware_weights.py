"""The weight-restricted key-aware count (docs/identifiability.md 2.6) against torch.func and the free count."""

from __future__ import annotations

import math

import torch
from torch.func import jacfwd

from identifiable_transformers.diagnostics.maths.key_aware import generatable_alternative_dim
from identifiable_transformers.diagnostics.maths.key_aware_weights import weight_alternative_dim

F64 = torch.float64


def _head(n, d, dk, dv, g):
    X = torch.randn(n, d, generator=g, dtype=F64)
    Wq, Wk = (torch.randn(d, dk, generator=g, dtype=F64) / math.sqrt(d) for _ in range(2))
    bq, bk = (0.1 * torch.randn(dk, generator=g, dtype=F64) for _ in range(2))
    return X, Wq, bq, Wk, bk, torch.randn(n, dv, generator=g, dtype=F64)


def _reference(X, Wq, bq, Wk, bk, T):
    """rank(J M) - rank(J M T) with J M from torch.func on (W~q, W~k) -> A."""
    n, dk = X.shape[0], Wq.shape[1]

    def attn(wq, wk):
        Xt = torch.cat([X, torch.ones(n, 1, dtype=F64)], 1)
        return torch.softmax((Xt @ wq) @ (Xt @ wk).T / math.sqrt(dk), -1)

    jq, jk = jacfwd(attn, argnums=(0, 1))(torch.cat([Wq, bq[None]]), torch.cat([Wk, bk[None]]))
    J = torch.cat([jq.reshape(n, n, -1), jk.reshape(n, n, -1)], -1)
    JT = torch.einsum("ijp,jc->icp", J, T)
    r = int(torch.linalg.matrix_rank(J.reshape(n * n, -1)))
    return r - int(torch.linalg.matrix_rank(JT.reshape(-1, J.shape[-1]))), r


def test_weight_count_equals_torch_func_and_is_at_most_the_free_count():
    g = torch.Generator().manual_seed(0)
    checked = 0
    for n, d, dk, dv in [(5, 3, 2, 2), (8, 3, 2, 2), (10, 4, 3, 2), (7, 6, 3, 3), (12, 3, 3, 1), (9, 2, 2, 4)]:
        head = _head(n, d, dk, dv, g)
        res = weight_alternative_dim(*head)
        alt, tangent = _reference(*head)
        assert (res["alternative_dim"], res["tangent_dim"]) == (alt, tangent), (n, d, dk, dv)
        X, Wq, bq, Wk, bk, T = head
        free = generatable_alternative_dim(X @ Wq + bq, X @ Wk + bk, T)
        assert res["alternative_dim"] <= free["alternative_dim"]
        if n <= d + 1:  # col([X, 1]) is all of R^n: the weights reach every (dQ, dK)
            assert res["alternative_dim"] == free["alternative_dim"]
        checked += 1
    assert checked == 6


def test_long_inputs_leave_the_weights_fewer_alternatives():
    # n > d + 1: the free count has n (2 d_k - d_v) - d_k (d_k + 1) alternatives (d_k > d_v), the weights far fewer
    g = torch.Generator().manual_seed(1)
    head = _head(16, 3, 3, 2, g)
    X, Wq, bq, Wk, bk, T = head
    free = generatable_alternative_dim(X @ Wq + bq, X @ Wk + bk, T)["alternative_dim"]
    assert free == 16 * (2 * 3 - 2) - 3 * 4
    assert weight_alternative_dim(*head)["alternative_dim"] < free
