"""The key-aware count's repeated-token grouping, computed in blocks of rows (issue 39: no n x n x (2 d_k + d)
temporary), against an explicit loop over row pairs, and the whole count against the same count with the
blocks forced to one row."""

import pytest
import torch

from identifiable_transformers.diagnostics.maths import key_aware_system
from identifiable_transformers.diagnostics.maths.key_aware import generatable_alternative_dim


def _first_close_by_loop(X: torch.Tensor, tol: float) -> list[int]:
    n = X.shape[0]
    return [next(j for j in range(n) if float((X[i] - X[j]).abs().max()) <= tol) for i in range(n)]


def _head_with_repeats(n: int, dk: int, dv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(n, k, generator=g, dtype=torch.float64) for k in (dk, dk, dv))
    for src, dst in ((0, 3), (1, 5), (1, 7), (2, n - 1)):  # repeated tokens: equal query, key and value rows
        Q[dst], K[dst], V[dst] = Q[src], K[src], V[src]
    return Q, K, V @ torch.randn(dv, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("block", [1, 37, 1 << 22])
def test_first_close_rows_matches_an_explicit_loop(monkeypatch, block):
    Q, K, T = _head_with_repeats(12, 2, 3, 5, seed=0)
    X = torch.cat([Q, K, T], dim=1)
    X[9] = X[4] + 1e-17  # within the tolerance of row 4: grouped with it
    tol = max(X.shape) * torch.finfo(torch.float64).eps * float(X.abs().max())
    monkeypatch.setattr(key_aware_system, "_CLOSE_BLOCK", block)
    first = key_aware_system._first_close_rows(X, tol).tolist()
    assert first == _first_close_by_loop(X, tol)
    assert first[3] == 0 and first[7] == 1 and first[9] == 4  # the test sees the repeats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_count_is_the_same_with_one_row_per_block(monkeypatch, seed):
    Q, K, T = _head_with_repeats(24, 2, 4, 10, seed)
    whole = generatable_alternative_dim(Q, K, T, method="structured")
    monkeypatch.setattr(key_aware_system, "_CLOSE_BLOCK", 1)
    blocks = generatable_alternative_dim(Q, K, T, method="structured")
    for key in ("alternative_dim", "tangent_dim", "output_rank", "margin"):
        assert blocks[key] == whole[key]
    dense = generatable_alternative_dim(Q, K, T, method="dense")  # independent: the Jacobian itself
    assert dense["alternative_dim"] == whole["alternative_dim"]
