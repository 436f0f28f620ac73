"""The adversarial attention search: the simplex projection against bisection, the search against brute force on
small heads (tight JSD budgets) and against models whose output ignores attention or depends on it sharply."""

import itertools

import numpy as np
import pytest
import torch
from diag_helpers import random_batch, random_model
from scipy.special import rel_entr

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.models import TransformerClassifier, override_attention

CLS = 2


def _simplex_grid(n: int, N: int) -> torch.Tensor:
    """Every point of the n-simplex with coordinates in multiples of 1/N: (num points, n) float64."""
    pts = [c for c in itertools.product(range(N + 1), repeat=n - 1) if sum(c) <= N]
    g = torch.tensor(pts, dtype=torch.float64)
    return torch.cat([g, N - g.sum(1, keepdim=True)], 1) / N


def _brute_force(model, ids, mask, eps, N):
    """Largest TV over a grid of the simplex (all mixtures of one-hot rows) with JSD <= eps, per example and head."""
    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
        p0 = out.logits.double().softmax(-1)
        A = out.attentions[-1].double()
        L, H = len(out.attentions), A.shape[1]
        best = torch.zeros(ids.shape[0], H, dtype=torch.float64)
        for b, h in itertools.product(range(ids.shape[0]), range(H)):
            n = int(mask[b].sum())
            cand = _simplex_grid(n, N).float()

            def hook(layer, w, m, cand=cand, h=h, n=n):
                if layer != L - 1:
                    return w
                w = w.clone()
                w[:, h, 0, :n] = cand
                return w

            with override_attention(model, hook):
                p = model(ids[b : b + 1, :n].expand(len(cand), -1)).logits.double().softmax(-1)
            q = p0[b].expand_as(p)
            m = 0.5 * (p + q)
            jsd = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
            tv = 0.5 * (cand.double() - A[b, h, 0, :n]).abs().sum(-1)
            best[b, h] = tv[jsd <= eps].max() if (jsd <= eps).any() else 0.0
    return best


def _model(seed, layers=1, classes=2, head_combine="add"):
    torch.manual_seed(seed)
    m = TransformerClassifier(30, classes, embed_dim=8, num_heads=2, key_dim=2, head_combine=head_combine, ffn_dim=16,
                              num_layers=layers, positional="learned", dropout=0.0).eval()
    with torch.no_grad():
        m.head.weight.mul_(4.0)  # a sharp classifier: most attention changes move the prediction
    return m


def _batch(seed, B=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 30, (B, 5), generator=g)
    ids[:, 0] = CLS
    mask = torch.arange(5) < torch.tensor([5, 4, 5, 3][:B])[:, None]
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("seed,layers,classes,head_combine", [(0, 1, 2, "add"), (1, 1, 2, "concat"), (2, 2, 2, "add"),
                                                             (3, 1, 3, "add")])
def test_search_reaches_the_brute_force_optimum_at_tight_eps(seed, layers, classes, head_combine):
    model = _model(seed, layers, classes, head_combine)
    ids, mask = _batch(seed)
    eps = 1e-4
    brute = _brute_force(model, ids, mask, eps, N=24)
    res = F.adversarial_attention(model, ids, mask, eps=eps, steps=100, restarts=2, return_details=True)
    assert (res["jsd"] <= eps + 1e-7).all()
    assert (res["tv"] >= brute.float() - 0.02).all(), (res["tv"], brute)


def _project_bisection(v: np.ndarray) -> np.ndarray:
    """The simplex projection's KKT form w = max(v - theta, 0), sum w = 1, theta found by bisection."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.maximum(v - mid, 0).sum() > 1 else (lo, mid)
    return np.maximum(v - 0.5 * (lo + hi), 0)


def test_project_simplex_against_bisection():
    rng = np.random.default_rng(0)
    v = rng.normal(scale=2.0, size=(50, 7))
    mask = rng.random((50, 7)) < 0.7
    mask[:, 0] = True
    w = F.project_simplex(torch.tensor(v), torch.tensor(mask)).numpy()
    for i in range(50):
        ref = np.zeros(7)
        ref[mask[i]] = _project_bisection(v[i][mask[i]])
        np.testing.assert_allclose(w[i], ref, atol=1e-9)
    p = torch.tensor(rng.dirichlet(np.ones(5), size=4))
    assert torch.allclose(F.project_simplex(p), p)  # points on the simplex stay
    # No point of the simplex is closer (random candidates).
    x = v[0]
    cand = rng.dirichlet(np.ones(7), size=2000)
    w0 = F.project_simplex(torch.tensor(x)).numpy()
    assert ((cand - x) ** 2).sum(1).min() >= ((w0 - x) ** 2).sum() - 1e-12


def test_adversarial_attention_when_the_output_ignores_attention():
    model = random_model(head_combine="concat")
    with torch.no_grad():  # the attention output is a constant: any row gives the same prediction
        model.layers[0].attn.v_proj.weight.zero_()
        model.layers[0].attn.v_proj.bias.zero_()
    ids, mask = random_batch(B=3)
    res = F.adversarial_attention(model, ids, mask, steps=100, restarts=3, return_details=True)
    with torch.no_grad():
        A = model(ids, mask, output_attentions=True).attentions[0]
    for b in range(3):
        n = int(mask[b].sum())
        a = A[b, :, 0, :n]  # (H, n)
        best = 1 - a.min(-1).values  # all mass on the least attended key
        assert (res["tv"][b] >= 1 - a.max(-1).values - 1e-4).all()  # at least as far as some vertex
        assert (res["tv"][b] <= best + 1e-5).all()
        assert (res["tv"][b] > 0.5).all()
    assert (res["jsd"] <= 1e-6).all()


@pytest.mark.parametrize("layers", [1, 2])
def test_adversarial_attention_keeps_the_prediction(layers):
    model = random_model(head_combine="add", layers=layers)
    with torch.no_grad():
        model.head.weight.mul_(5.0)  # a sharp classifier: attention changes move the prediction
    ids, mask = random_batch(B=3)
    eps = 0.01
    res = F.adversarial_attention(model, ids, mask, eps=eps, steps=60, restarts=2, return_details=True)
    tv = res["tv"]
    assert tv.shape == (3, 2) and (tv >= 0).all() and (tv <= 1).all()
    with torch.no_grad():
        p0 = model(ids, mask).logits.softmax(-1)
        A = model(ids, mask, output_attentions=True).attentions[-1]
        for b, h in itertools.product(range(3), range(2)):
            rows = res["rows"][b, h]

            def hook(layer, w, m, rows=rows, h=h):
                if layer != layers - 1:
                    return w
                w = w.clone()
                w[0, h, 0] = rows[0]
                return w

            with override_attention(model, hook):
                p = model(ids[b : b + 1], mask[b : b + 1]).logits.softmax(-1)
            p1, q1 = p[0].double().numpy(), p0[b].double().numpy()
            m = 0.5 * (p1 + q1)
            assert 0.5 * rel_entr(p1, m).sum() + 0.5 * rel_entr(q1, m).sum() <= eps + 1e-6
            n = int(mask[b].sum())
            assert float(rows[0, :n].sum()) == pytest.approx(1.0, abs=1e-5) and (rows[0] >= 0).all()
            assert float(0.5 * (rows[0] - A[b, h, 0]).abs().sum()) == pytest.approx(float(tv[b, h]), abs=1e-5)
            # At least as far as a brute-force search along the segments from A to every vertex.
            a = A[b, h, 0, :n]
            t = torch.linspace(0.02, 1.0, 50)
            cand = ((1 - t[:, None, None]) * a + t[:, None, None] * torch.eye(n)).reshape(-1, n)  # (50 n, n)

            def brute(layer, w, m, cand=cand, h=h, n=n):
                if layer != layers - 1:
                    return w
                w = w.clone()
                w[:, h, 0, :n] = cand
                return w

            with override_attention(model, brute):
                p = model(ids[b : b + 1, :n].expand(len(cand), -1)).logits.softmax(-1).double()
            q = p0[b].double().expand_as(p)
            m = 0.5 * (p + q)
            jsd = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
            line_tv = 0.5 * (cand - a).abs().sum(-1)
            assert float(tv[b, h]) >= float(line_tv[jsd <= eps].max()) - 1e-6
    assert (tv > 0.05).all()


def _readout_against_override(model, ids, mask, seed=0):
    """LastLayerReadout's logits against whole forward passes with the last layer's head h rows overridden
    (override_attention: the model's own attention code), on random rows over the real keys."""
    from identifiable_transformers.diagnostics.faithfulness.last_layer import LastLayerReadout

    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
    B, H, T, _ = out.attentions[-1].shape
    L = len(out.attentions)
    g = torch.Generator().manual_seed(seed)
    b = torch.arange(B).repeat_interleave(H)
    h = torch.arange(H).repeat(B)
    rows = torch.rand(len(b), T, T, generator=g) * mask[b][:, None, :]
    rows = rows / rows.sum(-1, keepdim=True)
    q = mask[b] if model.pooling == "mean" else torch.arange(T)[None].expand(len(b), -1) == 0  # the read rows
    rows = torch.where(q[:, :, None], rows, out.attentions[-1][b, h])
    assert LastLayerReadout.applies(model)
    with torch.no_grad():
        got = LastLayerReadout(model, ids, mask).logits(b, h, rows)
    for s in range(len(b)):
        def hook(layer, w, _m, s=s):
            if layer != L - 1:
                return w
            w = w.clone()
            w[:, h[s]] = rows[s]
            return w

        with torch.no_grad(), override_attention(model, hook):
            want = model(ids[b[s] : b[s] + 1], mask[b[s] : b[s] + 1]).logits[0]
        torch.testing.assert_close(got[s], want, atol=2e-5, rtol=1e-4)
    # and differentiable in the rows (the projected ascent takes its gradient)
    rows = rows.requires_grad_(True)
    (grad,) = torch.autograd.grad(LastLayerReadout(model, ids, mask).logits(b, h, rows).sum(), rows)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("layers,pooling,norm_first,head_combine", [(1, "cls", False, "add"), (3, "cls", False, "add"),
                                                                    (2, "mean", True, "concat"), (2, "cls", True, "add")])
def test_last_layer_readout_matches_the_overridden_forward(layers, pooling, norm_first, head_combine):
    torch.manual_seed(layers)
    model = TransformerClassifier(30, 3, embed_dim=8, num_heads=2, key_dim=2, head_combine=head_combine, ffn_dim=16,
                                  num_layers=layers, pooling=pooling, norm_first=norm_first, dropout=0.0).eval()
    ids, mask = _batch(layers)
    _readout_against_override(model, ids, mask)
