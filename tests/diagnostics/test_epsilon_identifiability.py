"""epsilon-identifiability (docs/identifiability.md 2.6) against a brute-force search on small heads.

The brute force samples the boundary of the feasible moves densely (unit directions in 1^perp, isotropic and
whitened by T), follows each until the output budget eps ||a T|| or the simplex stops it, and keeps the
largest TV: a value every sample achieves, converging to tv_eps from below. The diagnostic's ``found`` is
achieved too (so it cannot exceed tv_eps, i.e. the brute force up to its sampling resolution) and its bound
must hold above every sample.
"""

from __future__ import annotations

import math

import pytest
import torch

from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.diagnostics.maths.epsilon import epsilon_alternative_tv
from identifiable_transformers.models import TransformerClassifier

F64 = torch.float64


def _brute(a, T, eps, g, samples=50_000):
    n = a.shape[0]
    # an orthonormal basis of 1^perp from torch's QR (independent of the code's Householder basis)
    X = torch.cat([torch.ones(n, 1, dtype=F64), torch.randn(n, n - 1, generator=g, dtype=F64)], 1)
    H = torch.linalg.qr(X).Q[:, 1:]
    W, s, _ = torch.linalg.svd(H.T @ T)
    w = torch.randn(samples, n - 1, generator=g, dtype=F64)
    u = torch.randn(samples, len(s), generator=g, dtype=F64)
    w = torch.cat([w / w.norm(dim=1, keepdim=True), ((u / u.norm(dim=1, keepdim=True)) / s) @ W[:, : len(s)].T])
    d = w @ H.T
    r = eps * float((a @ T).norm())
    out = (d @ T).norm(dim=1)
    t_simplex = torch.where(d < 0, a[None] / (-d).clamp_min(1e-300), torch.full_like(d, math.inf)).amin(1)
    t = torch.minimum(t_simplex, r / out)
    a2 = a[None] + t[:, None] * d
    assert float(a2.min()) > -1e-12 and float(((a2 - a) @ T).norm(dim=1).max()) <= r * (1 + 1e-9)
    return float((0.5 * (a2 - a[None]).abs().sum(1)).max())


def _head(n, dv, cond, g):
    U, _, Vh = torch.linalg.svd(torch.randn(n, dv, generator=g, dtype=F64), full_matrices=False)
    s = torch.logspace(0, math.log10(cond), min(n, dv), dtype=F64)
    A = torch.softmax(2 * torch.randn(n, n, generator=g, dtype=F64), -1)
    return A, U @ torch.diag(s) @ Vh


@pytest.mark.parametrize("n,dv,cond", [(4, 3, 1e-2), (4, 4, 1e-3), (5, 4, 1e-3), (5, 6, 1e-2), (6, 5, 1e-2),
                                       (5, 5, 1e-4)])
def test_found_and_bound_bracket_a_brute_force_search(n, dv, cond):
    # n <= d_v + 1: every head here is exactly identifiable, but ill-conditioned like trained value maps
    g = torch.Generator().manual_seed(n * 10 + dv)
    A, T = _head(n, dv, cond, g)
    ratios = []
    for eps in (1e-3, 1e-2, 1e-1):
        found, bound = epsilon_alternative_tv(A, T, eps)
        for i in range(n):
            brute = _brute(A[i], T, eps, g)
            assert float(found[i]) <= brute + 0.02  # achieved: no more than the true maximum (sampling resolution)
            assert float(bound[i]) >= brute - 1e-12  # a bound: above every achieved move
            ratios.append(float(found[i]) / brute)
    assert min(ratios) >= 0.25 and sum(ratios) / len(ratios) >= 0.6  # the search finds most of the maximum


def test_exact_null_directions_give_the_simplex_limit_and_no_eps_change_is_free():
    g = torch.Generator().manual_seed(3)
    A, T = _head(7, 3, 1.0, g)  # n > d_v + 1: exact alternatives exist
    found, bound = epsilon_alternative_tv(A, T, 1e-3)
    assert torch.allclose(bound, 1 - A.amin(-1))
    # exact moves (null directions of [T, 1], from torch's SVD) are inside every eps budget
    Z = torch.linalg.svd(torch.cat([T, torch.ones(7, 1, dtype=F64)], 1)).U[:, 4:]  # rank [T, 1] = 4
    d = -(A @ Z @ Z.T)  # each row's move towards its projection onto the null space
    t = torch.where(d < 0, A / (-d).clamp_min(1e-300), torch.full_like(d, math.inf)).amin(1)
    assert bool((found >= 0.5 * t * d.abs().sum(1) - 1e-9).all())
    # a well-conditioned identifiable head: tiny eps, tiny change (linear in eps)
    A, T = _head(5, 6, 1.0, g)
    f3, b3 = epsilon_alternative_tv(A, T, 1e-3)
    f2, b2 = epsilon_alternative_tv(A, T, 1e-2)
    assert float(b3.max()) < 0.05 and torch.allclose(b2, 10 * b3, rtol=1e-6)


def test_the_identifiability_report_carries_the_eps_metrics():
    torch.manual_seed(0)
    model = TransformerClassifier(vocab_size=20, num_classes=2, embed_dim=8, num_heads=2, key_dim=2, max_len=16)
    ids = torch.randint(3, 20, (3, 12))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 5:] = False
    rep = attention_identifiability(model, ids, mask)
    for k in ("eps_tv_1e-3", "eps_tv_1e-2", "eps_tv_bound_1e-3", "eps_tv_bound_1e-2"):
        assert rep[k].shape == rep["null_dim"].shape
    assert bool((rep["eps_tv_1e-3"] <= rep["eps_tv_bound_1e-3"] + 1e-12).all())
    assert bool((rep["eps_tv_1e-3"] <= rep["eps_tv_1e-2"] + 1e-12).all())
    # heads with exact alternatives reach at least the exact witness's TV (a candidate at every eps)
    exact = rep["stochastic_null_dim"] > 0
    assert bool(exact.any())
    assert bool((rep["eps_tv_1e-3"][exact] >= rep["alt_attention_tv"][exact] - 1e-9).all())
