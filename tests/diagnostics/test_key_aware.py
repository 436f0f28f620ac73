"""The structured key-aware count against the dense Jacobian ranks (docs/identifiability.md 2.5).

The dense path forms J = d vec(A) / d(Q, K) with torch.func and takes rank(J) - rank(J T): an
independent reference wherever it fits. Comparisons are made where both rank decisions are clear
(margin >= 10: no singular value within a factor 10 of its tolerance), and every test checks
that it compared nearly all of its cases, so it cannot pass by skipping.
"""

from __future__ import annotations

import math

import pytest
import torch

from identifiable_transformers.diagnostics.maths import key_aware
from identifiable_transformers.diagnostics.maths.key_aware import generatable_alternative_dim
from identifiable_transformers.diagnostics.maths.key_aware_heads import key_aware_alternative_dims
from identifiable_transformers.models import TransformerClassifier

F64 = torch.float64
COUNTS = ("tangent_dim", "output_rank", "alternative_dim", "key_agnostic_dim")


def _clear(res: dict, min_margin: float = 10) -> bool:
    return res["margin"] >= min_margin


def _compare(cases, min_margin: float = 10) -> tuple[int, int]:
    compared = total = 0
    for name, Q, K, T in cases:
        total += 1
        dense = generatable_alternative_dim(Q, K, T, method="dense")
        fast = generatable_alternative_dim(Q, K, T, method="structured")
        assert dense["method"] == "dense" and fast["method"] == "structured"
        if _clear(dense, min_margin) and _clear(fast, min_margin):
            compared += 1
            assert {k: fast[k] for k in COUNTS} == {k: dense[k] for k in COUNTS}, (name, tuple(Q.shape), T.shape[1])
    return compared, total


def _random(n, dk, dv, g):
    return (torch.randn(n, k, generator=g, dtype=F64) for k in (dk, dk, dv))


def test_structured_count_equals_dense_ranks_on_random_heads():
    g = torch.Generator().manual_seed(0)
    cases = [
        ("random", *_random(n, dk, dv, g))
        for n in (3, 5, 8, 13, 21)
        for dk in (1, 2, 3, 5, 8)
        for dv in (1, 2, 4, 7, 16)
    ]
    compared, total = _compare(cases)
    assert compared >= 0.95 * total


def _degenerate(n, dk, dv, g):
    Q, K, T = _random(n, dk, dv, g)
    rep = torch.tensor([0, 1, 1, 2, 0, *range(3, n)])[:n]  # tokens 0 and 1 appear twice
    yield "repeated tokens", Q[rep], K[rep], T[rep]
    T1 = T.clone()
    T1[:, 0] = 1.7
    yield "value column constant over tokens", Q, K, T1
    yield "rank-one queries", Q[:, :1] @ torch.randn(1, dk, generator=g, dtype=F64), K, T
    yield "rank-one keys", Q, K[:, :1] @ torch.randn(1, dk, generator=g, dtype=F64), T
    yield "identical keys (uniform attention)", Q, K[:1].repeat(n, 1), T
    Q0 = Q.clone()
    Q0[1] = 0
    yield "a zero query", Q0, K, T
    yield "rank-one values", Q, K, T[:, :1] @ torch.randn(1, dv, generator=g, dtype=F64)


@pytest.mark.parametrize("n,dk,dv", [(5, 2, 3), (6, 3, 2), (7, 8, 4), (8, 2, 8), (9, 4, 4), (4, 6, 3), (10, 1, 6),
                                     (12, 3, 5)])
def test_structured_count_equals_dense_ranks_on_degenerate_heads(n, dk, dv):
    # (7, 8, 4) and (4, 6, 3) have d_k >= n. Exact degeneracies leave rounding noise a few times
    # below the tolerance (margins 5-20 here), so every case is compared, whatever its margin.
    compared, total = _compare(list(_degenerate(n, dk, dv, torch.Generator().manual_seed(n * 100 + dk))), 0)
    assert compared == total


def test_certified_and_qr_paths_agree_with_the_direct_svd(monkeypatch):
    g = torch.Generator().manual_seed(3)
    heads = [tuple(_random(40, 3, 12, g)), tuple(_random(30, 4, 6, g)), tuple(_random(24, 6, 8, g))]
    Q, K, T = _random(30, 3, 12, g)
    rep = torch.arange(30) // 2  # repeated tokens
    heads.append((Q[rep], K[rep], T[rep]))
    direct = [generatable_alternative_dim(*h, method="structured") for h in heads]
    assert all(r["key_system"]["how"] == "svd" for r in direct)
    monkeypatch.setattr(key_aware, "_DIRECT_SVD_MAX", 0)
    certified = [generatable_alternative_dim(*h, method="structured") for h in heads]
    assert [r["key_system"]["how"] for r in certified] == ["certified"] * len(heads)
    monkeypatch.setattr(key_aware, "_certify_full_rank", lambda *a: None)
    inv = [generatable_alternative_dim(*h, method="structured") for h in heads]
    assert [r["key_system"]["how"] for r in inv] == ["qr+inv"] * len(heads)  # full rank: R's inverse decides
    monkeypatch.setattr(key_aware, "_inverse_bound", lambda *a: None)
    qr = [generatable_alternative_dim(*h, method="structured") for h in heads]
    assert [r["key_system"]["how"] for r in qr] == ["qr+svd"] * len(heads)
    for a, b, c, d in zip(direct, certified, qr, inv):
        assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS} == {k: c[k] for k in COUNTS}
        assert {k: a[k] for k in COUNTS} == {k: d[k] for k in COUNTS}
        assert b["key_system"]["rank"] == min(b["key_system"]["shape"])  # a proof of full rank
        # the inverse's bound is below the SVD's margin by at most sqrt(cols) (and the tolerance's ||R||_F)
        assert c["margins"]["key_system"] / math.sqrt(max(c["key_system"]["shape"])) ** 2 <= d["margins"]["key_system"]
        assert d["margins"]["key_system"] <= c["margins"]["key_system"] * (1 + 1e-9)


def _orthonormal(rows, cols, g):
    return torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=F64)).Q


@pytest.mark.parametrize("tall", [True, False])
def test_the_certificate_refuses_a_rank_deficient_key_system(tall):
    g = torch.Generator().manual_seed(7)
    if tall:  # every Z_i inside one 3-dim subspace of p = 8: rank(E) <= 3 r < p r = cols
        n, p, m, r = 40, 8, 3, 2
        basis = _orthonormal(p, 3, g)
        Z = torch.stack([basis @ _orthonormal(3, m, g) for _ in range(n)])
        qn = torch.nn.functional.normalize(torch.randn(n, r, generator=g, dtype=F64), dim=1)
    else:  # wide, with row 2 a copy of row 0: rank(E) <= 4 < 6 = rows
        n, p, m, r = 3, 8, 2, 4
        Z = torch.stack([_orthonormal(p, m, g) for _ in range(n)])
        qn = torch.nn.functional.normalize(torch.randn(n, r, generator=g, dtype=F64), dim=1)
        Z[2], qn[2] = Z[0], qn[0]
    live = torch.ones(n, m, dtype=torch.bool)
    E = key_aware._stack_rows(Z, qn, live)
    rank = int(torch.linalg.matrix_rank(E))
    assert rank < min(E.shape)
    assert key_aware._certify_full_rank(Z, qn, live, *E.shape) is None
    R = torch.linalg.qr(E if E.shape[0] >= E.shape[1] else E.T, mode="r").R
    assert key_aware._inverse_bound(R, *E.shape) is None  # nor does R's inverse claim full rank
    assert key_aware._key_system_rank(Z, qn, live)["rank"] == rank
    # the same shapes without the degeneracy are certified
    Z = torch.stack([_orthonormal(p, m, g) for _ in range(n)])
    qn = torch.nn.functional.normalize(torch.randn(n, r, generator=g, dtype=F64), dim=1)
    assert key_aware._certify_full_rank(Z, qn, live, *E.shape) is not None


def test_counts_of_trained_heads_equal_dense_ranks():
    # A small encoder trained for a few dozen Adam steps on a task where the first token decides.
    torch.manual_seed(0)
    model = TransformerClassifier(
        vocab_size=30, num_classes=2, embed_dim=16, num_heads=2, key_dim=3, value_dim=5, head_combine="concat",
        num_layers=1, max_len=16, dropout=0.0,
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(80):
        ids = torch.randint(3, 30, (32, 12))
        y = (ids[:, 0] > 16).long()
        loss = torch.nn.functional.cross_entropy(model(ids).logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.5  # it learnt something: these are trained, not random, heads
    ids = torch.randint(3, 30, (3, 12))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 9:] = False
    dense = key_aware_alternative_dims(model, ids, mask, method="dense")
    fast = key_aware_alternative_dims(model, ids, mask, method="structured")
    clear = torch.tensor([[[(m or math.inf) >= 10 for m in l] for l in b] for b in dense["margin"]])
    clear &= torch.tensor([[[(m or math.inf) >= 10 for m in l] for l in b] for b in fast["margin"]])
    assert clear.float().mean() >= 0.8
    for k in ("alternative_dim", "tangent_dim", "output_rank", "key_agnostic_dim"):
        assert torch.equal(dense[k][clear], fast[k][clear]), k
    assert fast["method"][0][0][0] == "structured"


def _generic_alternatives(n, dk, dv):
    """The count for generic heads with d_k < n, d_v < n (docs/identifiability.md 2.5)."""
    return max(0, 2 * n * dk - dk * (dk + 1) - n * min(dk, dv) - min(n * max(dv - dk, 0), (n - dk - 1) * dk))


@pytest.mark.parametrize("n,dk,dv", [(96, 2, 16), (96, 12, 16), (128, 16, 16), (160, 10, 16), (120, 4, 6)])
def test_long_random_heads_follow_the_generic_count(n, dk, dv):
    # Beyond the dense path's reach: random heads are generic with probability one.
    Q, K, T = _random(n, dk, dv, torch.Generator().manual_seed(n + dk))
    res = generatable_alternative_dim(Q, K, T)
    assert res["method"] == "structured" and res["margin"] >= 10
    assert res["alternative_dim"] == _generic_alternatives(n, dk, dv)
    assert res["key_agnostic_dim"] == n * (n - dv - 1)


def test_auto_picks_dense_only_below_its_threshold_and_bad_input_is_refused(monkeypatch):
    g = torch.Generator().manual_seed(1)
    assert generatable_alternative_dim(*_random(4, 2, 3, g))["method"] == "structured"  # measured faster everywhere
    monkeypatch.setattr(key_aware, "DENSE_MAX_ELEMENTS", 4 * 4 * 2 * 4 * 2)
    assert generatable_alternative_dim(*_random(4, 2, 3, g))["method"] == "dense"
    assert generatable_alternative_dim(*_random(5, 2, 3, g))["method"] == "structured"
    Q, K, T = _random(6, 2, 3, g)
    explicit = generatable_alternative_dim(Q, K, T, scale=1 / math.sqrt(2), method="dense")
    assert generatable_alternative_dim(Q, K, T, method="dense")["alternative_dim"] == explicit["alternative_dim"]
    with pytest.raises(ValueError, match="need Q, K"):
        generatable_alternative_dim(Q, K[:3], T)
    with pytest.raises(ValueError, match="method"):
        generatable_alternative_dim(Q, K, T, method="fast")
    with pytest.raises(ValueError, match="underflows"):
        generatable_alternative_dim(Q * 1e3, K * 1e3, T)
