"""The identifiability report of a biased model against a from-scratch float64 computation.

The reference here never calls the code under test: per head it rebuilds A = softmax(q k^T / sqrt(d_k))
and T = (X W_v^h + b_v^h) W_o^h from the model's weights, takes ranks from singular values with the
documented tolerance sigma_max * max(n, d) * eps (docs/identifiability.md section 2, "Numerics"),
and checks the witness A' by recomputing A'T and AT. The model runs in float64 so the checks can be
tight; every bias is random (zero biases hide how they enter V and T).
"""

import math

import pytest
import torch

from identifiable_transformers.diagnostics import (
    analyse_heads,
    attention_identifiability,
    identifiable_length,
    model_identifiable_length,
    null_dim,
    stochastic_null_dim,
)
from identifiable_transformers.models import TransformerClassifier

EPS = torch.finfo(torch.float64).eps
VOCAB = 100


def _biased_model(seed=0, **kw):
    torch.manual_seed(seed)
    model = TransformerClassifier(VOCAB, 2, positional="none", dropout=0.0, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model.double().eval()


def _batch(lengths, seed=0):
    """Right-padded batch of distinct token ids per example (no repeated rows in X)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randperm(VOCAB - 1, generator=g)[:n] + 1
    return ids, ids != 0


def _rank(M):
    """Numerical rank with the documented tolerance, from the singular values (plain torch)."""
    s = torch.linalg.svdvals(M)
    tol = s[0] * max(M.shape) * EPS
    return int((s > tol).sum()), tol, s


@torch.no_grad()
def _reference_heads(model, ids, n):
    """[(A, V, T)] per head of the single layer for one example's n real tokens, float64."""
    attn = model.layers[0].attn
    X = model.token_embedding.weight[ids[:n]].double()  # positional="none": the layer input is the embedding
    h, dk, dv = attn.num_heads, attn.key_dim, attn.value_dim
    W = {k: (getattr(attn, k).weight.double(), getattr(attn, k).bias.double()) for k in ("q_proj", "k_proj", "v_proj")}
    wo = attn.out_proj.weight.double()  # (d, h*dv) for concat, (d, dv) for add
    heads = []
    for i in range(h):
        q, k = ((X @ W[p][0][i * dk:(i + 1) * dk].T + W[p][1][i * dk:(i + 1) * dk]) for p in ("q_proj", "k_proj"))
        V = X @ W["v_proj"][0][i * dv:(i + 1) * dv].T + W["v_proj"][1][i * dv:(i + 1) * dv]
        A = torch.softmax(q @ k.T / math.sqrt(dk), dim=-1)
        W_o = wo[:, i * dv:(i + 1) * dv].T if attn.head_combine == "concat" else wo.T  # (dv, d)
        heads.append((A, V, V @ W_o))
    return heads


# (model kwargs, min(d_v, d)): the standard layer, the paper's layer, and d_v > d (W_o^h caps the rank at d)
CASES = {
    "concat": (dict(embed_dim=8, num_heads=2, head_combine="concat"), 4),
    "add": (dict(embed_dim=8, num_heads=2, head_combine="add", key_dim=2), 8),
    "concat_dv_gt_d": (dict(embed_dim=8, num_heads=2, head_combine="concat", key_dim=3, value_dim=12), 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_report_of_a_biased_model_matches_from_scratch(case):
    kw, r = CASES[case]
    model = _biased_model(**kw)
    d = kw["embed_dim"]
    lengths = [2, r, r + 1, r + 2, r + 1, r + 4]  # two examples of one length share a batched SVD
    ids, mask = _batch(lengths)
    rep = attention_identifiability(model, ids, mask, return_maps=True)
    for b, n in enumerate(lengths):
        assert rep["rtol"][b].item() == max(n, d) * EPS
        maps = rep["maps"][b]
        Ts = []
        for h, (A, V, T) in enumerate(_reference_heads(model, ids[b], n)):
            Ts.append(T)
            rank, tol, s = _rank(T)
            # closed form: rank(T) = min(n, d_v, d) generically; [T, 1] gains one more
            assert rep["null_dim"][b, 0, h] == n - rank == max(0, n - r), (n, h)
            assert rep["stochastic_null_dim"][b, 0, h] == max(0, n - r - 1), (n, h)
            assert rep["rank"][b, 0, h] == rank
            torch.testing.assert_close(rep["tol"][b, 0, h], tol, rtol=1e-10, atol=0)
            torch.testing.assert_close(rep["sigma_ratio"][b, 0, h], s[-1] / s[0], rtol=1e-6, atol=1e-12)
            A_eff = A @ T @ torch.linalg.pinv(T)  # I - N N^T is the projector onto T's column space
            torch.testing.assert_close(rep["effective_gap"][b, 0, h], (A - A_eff).norm() / A.norm(), rtol=1e-6,
                                       atol=1e-10)
            entropy = -(A * A.log()).sum(-1).mean()  # softmax rows are strictly positive
            torch.testing.assert_close(rep["attention_entropy"][b, 0, h], entropy, rtol=1e-10, atol=0)
            torch.testing.assert_close(maps["attention"][0, h], A, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(maps["effective"][0, h], A_eff, rtol=1e-6, atol=1e-9)

            # The witness, checked against A and T recomputed from scratch.
            A_alt = maps["alternative"][0, h]
            assert A_alt.shape == (n, n) and (A_alt >= 0).all()
            torch.testing.assert_close(A_alt.sum(-1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
            assert ((A_alt @ T - A @ T).norm() / (A @ T).norm()).item() < 1e-10
            assert rep["witness_rel_error"][b, 0, h] < 1e-10
            tv = 0.5 * (A_alt - A).abs().sum(-1)
            torch.testing.assert_close(rep["alt_attention_tv"][b, 0, h], tv.max(), rtol=1e-8, atol=1e-12)
            if n - r - 1 > 0:
                assert tv.max() > 1e-3  # a genuinely different, equally valid map
            else:
                assert tv.max() < 1e-12 and rep["alt_attention_tv"][b, 0, h] == 0
            if case == "concat_dv_gt_d" and n > d:
                # V alone (n x 12, bias included) has rank min(n, d + 1): it would report one fewer null dim.
                assert n - _rank(V)[0] == rep["null_dim"][b, 0, h] - 1
        # the layer-level count: H n - rank of the stacked T's
        assert rep["joint_null_dim"][b, 0] == len(Ts) * n - _rank(torch.cat(Ts))[0]


def test_identifiable_length_caps_the_value_size_at_d():
    assert identifiable_length("concat", 8, 2, value_dim=12) == {
        "value_dim": 12, "head": 8, "head_stochastic": 9, "joint": 4, "joint_stochastic": 5}
    model = TransformerClassifier(VOCAB, 2, embed_dim=8, num_heads=2, value_dim=12)
    assert model_identifiable_length(model)["head"] == 8


def _with_spectrum(s, n, d, seed=0):
    """An n x d matrix with singular values s, from random orthonormal factors (float64)."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, len(s), generator=g, dtype=torch.float64))
    W, _ = torch.linalg.qr(torch.randn(d, len(s), generator=g, dtype=torch.float64))
    return U @ torch.diag(torch.tensor(s, dtype=torch.float64)) @ W.T


def test_rank_tolerance_is_sigma_max_times_max_n_d_times_eps():
    # n = 64, d = 4, sigma_max = 1: tol = 64 eps = 1.4e-14. 5e-14 is 3.5x above it (a tolerance 10x too
    # large drops it); 4e-15 is 3.5x below it and 4.5x above 4 eps (a tolerance using min(n, d) keeps it).
    n, d = 64, 4
    T = _with_spectrum([1.0, 1e-3, 5e-14, 4e-15], n, d)
    assert int(torch.linalg.matrix_rank(T)) == 3  # torch's own default (rtol = max(n, d) eps) agrees
    assert null_dim(T).item() == n - 3
    res = analyse_heads(torch.full((n, n), 1.0 / n, dtype=torch.float64), T)
    assert res["rank"].item() == 3 and res["null_dim"].item() == n - 3
    smax = torch.linalg.svdvals(T)[0]
    torch.testing.assert_close(res["tol"], smax * max(n, d) * EPS, rtol=1e-12, atol=0)
    # [T, c 1] is (n x d+1): its tolerance is sigma_max([T, c 1]) * max(n, d + 1) * eps, and c 1 has the
    # norm of sigma_max(T), so sigma_max([T, c 1]) lies in [sigma_max(T), sqrt(2) sigma_max(T)].
    assert smax * n * EPS <= res["stochastic_tol"] <= math.sqrt(2) * smax * n * EPS * (1 + 1e-12)


def test_ranks_are_invariant_to_scaling_down_to_1e_minus_15_and_up_to_1e15():
    g = torch.Generator().manual_seed(0)
    T = torch.randn(3, 12, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 9, generator=g, dtype=torch.float64)
    A = torch.softmax(torch.randn(3, 12, 12, generator=g, dtype=torch.float64), -1)
    for scale in (1e-15, 1e-9, 1.0, 1e9, 1e15):
        # rank(T) = 5 by construction; [T, 1] adds one: n - 5 = 7, n - 6 = 6
        assert null_dim(scale * T).tolist() == [7, 7, 7], scale
        assert stochastic_null_dim(scale * T).tolist() == [6, 6, 6], scale
        res = analyse_heads(A, scale * T)
        assert res["null_dim"].tolist() == [7, 7, 7] and res["stochastic_null_dim"].tolist() == [6, 6, 6], scale
        assert (res["alt_attention_tv"] > 1e-3).all(), scale
        # the tolerance scales with T
        s = torch.linalg.svdvals(scale * T)[..., 0]
        torch.testing.assert_close(res["tol"], s * 12 * EPS, rtol=1e-12, atol=0)
