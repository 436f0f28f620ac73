"""The adversarial attention search (faithfulness/adversarial.py) against answers known independently.

* The TV it reports is the total variation, over the keys, between the rows it returns and the real
  attention rows (averaged over the searched query rows); their prediction's JSD, recomputed here with
  ``override_attention``, is within the budget.
* For a binary classifier the far points that keep the prediction mix two keys (the search's docstring):
  a brute force along every edge w e_i + (1 - w) e_j of the simplex is a lower bound the search must reach.
* The edge search on its own, with a JSD whose feasible set on each edge is a known interval, returns the
  end of that interval farther from A.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.diagnostics.faithfulness.adversarial import _edge_search
from identifiable_transformers.models import TransformerClassifier, override_attention

CLS = 2


def _model(seed, classes=2, pooling="cls", layers=1):
    torch.manual_seed(seed)
    m = TransformerClassifier(30, classes, embed_dim=8, num_heads=2, key_dim=2, head_combine="add", ffn_dim=16,
                              num_layers=layers, positional="learned", dropout=0.0, pooling=pooling).eval()
    with torch.no_grad():
        m.head.weight.mul_(4.0)  # a sharp classifier: most attention changes move the prediction
    return m


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 30, (4, 5), generator=g)
    ids[:, 0] = CLS
    mask = torch.arange(5) < torch.tensor([5, 4, 5, 3])[:, None]
    return ids.masked_fill(~mask, 0), mask


def _jsd(p, q):
    m = 0.5 * (p + q)
    return 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)


# ----------------------------------------------------------------------------------------------
# What the search reports is what it returns
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pooling,layers", [("cls", 1), ("cls", 2), ("mean", 1)])
def test_the_reported_tv_is_the_tv_over_keys_of_the_returned_rows(pooling, layers):
    model = _model(4, pooling=pooling, layers=layers)
    ids, mask = _batch(4)
    eps = 1e-3
    # mixtures=0: the scan and the ascent alone, which score points with the search's own TV
    res = F.adversarial_attention(model, ids, mask, eps=eps, steps=15, restarts=2, mixtures=0, return_details=True)
    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
    A, p0, L = out.attentions[-1].double(), out.logits.double().softmax(-1), len(out.attentions)
    rows, q = res["rows"].double(), res["query_mask"]
    assert torch.equal(q[:, 0], torch.ones(4, dtype=torch.bool))
    assert torch.equal(q, mask) if pooling == "mean" else not q[:, 1:].any()
    for b, h in itertools.product(range(4), range(2)):
        n, qs = int(mask[b].sum()), q[b].nonzero().flatten()
        # rows outside the searched queries are A's; searched rows are distributions over the real keys
        assert torch.allclose(rows[b, h][~q[b]], A[b, h][~q[b]])
        assert torch.allclose(rows[b, h, qs].sum(-1), torch.ones(len(qs), dtype=torch.float64), atol=1e-5)
        assert (rows[b, h, qs, n:] == 0).all() and (rows[b, h] >= 0).all()
        tv = 0.5 * (rows[b, h, qs, :n] - A[b, h, qs, :n]).abs().sum(-1).mean()  # per query over keys, then mean
        assert float(res["tv"][b, h]) == pytest.approx(float(tv), abs=1e-5), (b, h)

        def hook(layer, w, _m, b=b, h=h):
            if layer != L - 1:
                return w
            w = w.clone()
            w[:, h] = rows[b, h].to(w.dtype)
            return w

        with override_attention(model, hook), torch.no_grad():
            p = model(ids[b : b + 1], mask[b : b + 1]).logits.double().softmax(-1)
        assert float(_jsd(p, p0[b : b + 1])) <= eps * (1 + 1e-3), (b, h)
    assert (res["tv"] > 0.05).any()  # the search moved somewhere: the checks above compared real points


# ----------------------------------------------------------------------------------------------
# Binary classifier: the best point of every edge of the simplex, by brute force
# ----------------------------------------------------------------------------------------------
def _edge_brute_force(model, ids, mask, eps, W=1001):
    """Largest TV of the <cls> row along every edge of the simplex (W points each) with JSD <= eps: (B, H)."""
    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
        p0, A = out.logits.double().softmax(-1), out.attentions[-1].double()
        best = torch.zeros(ids.shape[0], A.shape[1], dtype=torch.float64)
        w = torch.linspace(0, 1, W, dtype=torch.float64)
        for b, h in itertools.product(range(ids.shape[0]), range(A.shape[1])):
            n = int(mask[b].sum())
            cand = torch.zeros(n * (n - 1) // 2, W, n, dtype=torch.float64)
            for e, (i, j) in enumerate(itertools.combinations(range(n), 2)):
                cand[e, :, i], cand[e, :, j] = w, 1 - w
            cand = cand.view(-1, n)

            def hook(layer, wts, _m, cand=cand, h=h, n=n):
                wts = wts.clone()
                wts[:, h, 0, :n] = cand.to(wts.dtype)
                return wts

            with override_attention(model, hook):
                p = model(ids[b : b + 1, :n].expand(len(cand), -1)).logits.double().softmax(-1)
            ok = _jsd(p, p0[b].expand_as(p)) <= eps
            tv = 0.5 * (cand - A[b, h, 0, :n]).abs().sum(-1)
            best[b, h] = tv[ok].max() if ok.any() else 0.0
    return best


@pytest.mark.parametrize("seed,eps", [(7, 1e-5), (3, 1e-4), (0, 1e-4), (5, 1e-5), (2, 1e-4)])
def test_the_two_key_mixture_stage_reaches_the_best_edge_point(seed, eps):
    model = _model(seed)
    ids, mask = _batch(seed)
    brute = _edge_brute_force(model, ids, mask, eps)
    tv = F.adversarial_attention(model, ids, mask, eps=eps, steps=0, restarts=1).double()  # scans and mixtures only
    assert (tv >= brute - 0.005).all(), (tv, brute)


# ----------------------------------------------------------------------------------------------
# The edge search alone (a private function: its contract is not visible apart from the whole search)
# ----------------------------------------------------------------------------------------------
def _edge_cases(a, v, c=1e-2, eps=1e-4):
    """Run the edge search on every edge (i, j) of a 5-key simplex with a "prediction" linear in the row,
    p(x) = x . v, and a JSD c (p(x) - p(A))^2. On each edge the feasible set is then an interval around the w
    where p(x) = p(A) (of width 0.2 / |v_i - v_j| here); TV from A is convex along the edge, so the farthest
    feasible point is one end of that interval, found here by brute force (200001 points per edge).

    Returns, per feasible edge: (edge, farthest TV, TV of the returned point, gap between the interval's two
    ends in TV, whether the farther end lies towards the edge's end farther from A)."""
    T = a.shape[1]
    target = float(a[0] @ v)
    pairs = list(itertools.combinations(range(T), 2))
    pair_i, pair_j = torch.tensor([[i for i, _ in pairs]]), torch.tensor([[j for _, j in pairs]])
    every = torch.ones_like(pair_i, dtype=torch.bool)
    rows = _edge_search(lambda r: c * (r @ v - target) ** 2, a, pair_i, pair_j, every, eps, points=9, iters=30)[0]
    w, a64 = torch.linspace(0, 1, 200001, dtype=torch.float64), a[0].double()
    out = []
    for e, (i, j) in enumerate(pairs):
        x = torch.zeros(len(w), T, dtype=torch.float64)
        x[:, i], x[:, j] = w, 1 - w
        feasible = c * (x @ v.double() - target) ** 2 <= eps
        if not feasible.any():
            assert torch.equal(rows[e], a[0])  # nothing found on the edge: A itself
            continue
        tv = 0.5 * (x[feasible] - a64).abs().sum(-1)  # along increasing w
        got = rows[e].double()
        assert float(c * (got @ v.double() - target) ** 2) <= eps * (1 + 1e-2)  # feasible (judged in float32)
        ends = 0.5 * (torch.eye(T, dtype=torch.float64)[[j, i]] - a64).abs().sum(-1)  # TV at w = 0 and w = 1
        towards_far_end = bool(tv[-1] > tv[0]) == bool(ends[1] >= ends[0])
        out.append(((i, j), float(tv.max()), float(0.5 * (got - a64).abs().sum()), float(tv.max() - tv.min()),
                    towards_far_end))
    return out


def test_the_edge_search_bisects_to_the_interval_end_towards_the_edges_far_end():
    # the rule the docstring states: from the feasible minimum towards the edge's end farther from A
    a = torch.tensor([[0.421, 0.168, 0.085, 0.218, 0.108]])
    v = torch.tensor([5.270, 1.055, 2.343, 1.328, 3.441])
    cases = [cs for cs in _edge_cases(a / a.sum(), v) if cs[4]]
    assert sum(gap > 0.01 for *_, gap, _ in cases) >= 2  # intervals whose two ends differ: the direction matters
    for edge, best, got, _, _ in cases:
        assert got == pytest.approx(best, abs=1e-4), edge


def test_the_edge_search_returns_the_farthest_point_of_every_feasible_interval():
    a = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05]])
    v = torch.tensor([0.0, 1.0, 2.0, 3.0, 5.0])
    cases = _edge_cases(a, v)
    assert len(cases) >= 6
    for edge, best, got, _, _ in cases:
        assert got == pytest.approx(best, abs=1e-4), edge
