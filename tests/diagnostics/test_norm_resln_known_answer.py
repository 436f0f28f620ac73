"""norm_resln (Kobayashi et al., EMNLP 2021) against an independent float64 computation from the layer's own weights:
explicit loops over heads, queries and keys, ||T_i(x_j)||_2 with the residual and the LayerNorm's linear part, rows
normalised over the real tokens (docs/faithfulness.md, Context mixing)."""

import math

import pytest
import torch

from identifiable_transformers.diagnostics import norm_resln
from identifiable_transformers.models.classifier import TransformerClassifier

VOCAB = 40


def _model(head_combine, key_dim):
    torch.manual_seed(0)
    m = TransformerClassifier(VOCAB, 3, embed_dim=12, num_heads=3, key_dim=key_dim, head_combine=head_combine,
                              num_layers=1, ffn_dim=20, norm_first=False).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.double()


def norm_resln_loops(x, n, attn, norm):
    """(T, T) float64 map of one example of a post-norm layer: x (T, d) the layer input, n real tokens."""
    T, d = x.shape
    H, dk, dv = attn.num_heads, attn.key_dim, attn.value_dim
    q = x @ attn.q_proj.weight.T + attn.q_proj.bias
    k = x @ attn.k_proj.weight.T + attn.k_proj.bias
    v = x @ attn.v_proj.weight.T + attn.v_proj.bias
    Wo, bo = attn.out_proj.weight, attn.out_proj.bias
    u = [[torch.zeros(d, dtype=torch.float64) for _ in range(n)] for _ in range(n)]
    for h in range(H):
        Woh = Wo[:, h * dv:(h + 1) * dv] if attn.head_combine == "concat" else Wo
        for i in range(n):
            logits = [float(q[i, h * dk:(h + 1) * dk] @ k[j, h * dk:(h + 1) * dk]) / math.sqrt(dk) for j in range(n)]
            e = [math.exp(t - max(logits)) for t in logits]
            for j in range(n):
                u[i][j] = u[i][j] + e[j] / sum(e) * (Woh @ v[j, h * dv:(h + 1) * dv])
    out = torch.zeros(T, T, dtype=torch.float64)
    for i in range(n):
        u[i][i] = u[i][i] + x[i]  # the residual belongs to token i alone
        z = sum(u[i]) + bo  # the whole pre-norm vector sets the LayerNorm's scale
        s = math.sqrt(float(((z - z.mean()) ** 2).mean()) + norm.eps)
        norms = [math.sqrt(float((((norm.weight * (u[i][j] - u[i][j].mean()) / s)) ** 2).sum())) for j in range(n)]
        for j in range(n):
            out[i, j] = norms[j] / sum(norms)
    return out


@pytest.mark.parametrize("head_combine,key_dim", [("concat", None), ("add", 2)])
def test_norm_resln_is_the_l2_norm_of_each_tokens_part(head_combine, key_dim):
    m = _model(head_combine, key_dim)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 9), generator=g)
    ids[1, 6:] = 0
    ids[2, 3:] = 0
    mask = ids != 0
    with torch.no_grad():
        x = m.token_embedding(ids) + m.position_embedding.weight[: ids.shape[1]]
        got = norm_resln(m, ids, mask)[:, 0]
    layer = m.layers[0]
    for b in range(ids.shape[0]):
        want = norm_resln_loops(x[b], int(mask[b].sum()), layer.attn, layer.norm1)
        torch.testing.assert_close(got[b].double(), want, atol=2e-6, rtol=0)

