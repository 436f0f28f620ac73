"""The adversarial attention search at a tight JSD budget against a brute-force search on small heads."""

import itertools

import pytest
import torch

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
