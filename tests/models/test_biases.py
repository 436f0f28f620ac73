"""Attention and classifier with random, non-zero biases against a from-scratch float64 computation.

Freshly initialised layers have all-zero biases, which hides any mistake in how the q/k/v/out
biases enter the weights, the values, the per-head outputs or W_o^h. Here every bias (and every
LayerNorm gain and shift) is random, and the reference below is plain float64 torch written from
the maths of docs/identifiability.md section 1, not from the code under test.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from identifiable_transformers.models import MultiHeadSelfAttention, TransformerClassifier


def _mask(lengths, t):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # True = real token


def randomise_affine(module, seed):
    """Random biases everywhere and random LayerNorm gains: nothing stays at its zero/one init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name:  # LayerNorm weights
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return module


def _wb(linear):
    return linear.weight.detach().double(), linear.bias.detach().double()


@torch.no_grad()
def reference_heads(attn, x, lengths):
    """Per example and head, in float64 on the real keys only:
    q, k, v = X W^T + b; A = softmax(q k^T / sqrt(d_k)); W_o^h = out_proj's slice for head h
    (all of it for added heads); T = V W_o^h; head output = A T; layer output = sum_h A T + b_o."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (_wb(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "out_proj"))
    h, dk, dv = attn.num_heads, attn.key_dim, attn.value_dim
    res = []
    for b, n in enumerate(lengths):
        X = x[b].double()
        heads = []
        for i in range(h):
            q = X @ wq[i * dk:(i + 1) * dk].T + bq[i * dk:(i + 1) * dk]  # (T, dk), every query row
            k = X[:n] @ wk[i * dk:(i + 1) * dk].T + bk[i * dk:(i + 1) * dk]  # (n, dk), real keys
            v = X[:n] @ wv[i * dv:(i + 1) * dv].T + bv[i * dv:(i + 1) * dv]  # (n, dv)
            a = torch.softmax(q @ k.T / math.sqrt(dk), dim=-1)  # (T, n)
            w_o = (wo[:, i * dv:(i + 1) * dv] if attn.head_combine == "concat" else wo).T  # (dv, d)
            T = v @ w_o  # (n, d)
            heads.append({"A": a, "V": v, "W_o": w_o, "T": T, "out": a @ T})
        res.append({"heads": heads, "out": sum(hd["out"] for hd in heads) + bo})
    return res


CASES = [("concat", None, None), ("add", 3, None), ("concat", 2, 5), ("add", 2, 20)]  # (combine, key_dim, value_dim)


@pytest.mark.parametrize("head_combine,key_dim,value_dim", CASES)
def test_biased_attention_matches_from_scratch_reference(head_combine, key_dim, value_dim):
    torch.manual_seed(0)
    attn = randomise_affine(MultiHeadSelfAttention(12, 3, key_dim, value_dim, head_combine), seed=1).eval()
    lengths, t = [7, 4, 1], 7
    x, mask = torch.randn(3, t, 12), _mask(lengths, t)
    ref = reference_heads(attn, x, lengths)
    fast, _ = attn(x, mask)
    slow, w = attn(x, mask, need_weights=True)
    inside = attn.internals(x, mask)
    for b, n in enumerate(lengths):
        for out in (fast, slow):  # both paths, every query row (padded queries attend to real keys too)
            torch.testing.assert_close(out[b].double(), ref[b]["out"], atol=1e-5, rtol=1e-5)
        for i, hd in enumerate(ref[b]["heads"]):
            torch.testing.assert_close(w[b, i, :, :n].double(), hd["A"], atol=1e-6, rtol=1e-5)
            assert torch.all(w[b, i, :, n:] == 0)
            torch.testing.assert_close(inside.attention[b, i, :, :n].double(), hd["A"], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(inside.values[b, i, :n].double(), hd["V"], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(inside.out_proj[i].double(), hd["W_o"], atol=0, rtol=0)
            torch.testing.assert_close(inside.head_output[b, i].double(), hd["out"], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def _reference_classifier(model, ids, lengths, norm_first):
    """Logits and each layer's per-head quantities, from scratch: embeddings (+ learned positions),
    post- or pre-norm encoder layers with ReLU feed-forward, mean or <cls> pooling, linear head."""
    d = model.embed_dim
    ln = lambda x, norm: F.layer_norm(x, (d,), norm.weight.double(), norm.bias.double(), norm.eps)  # noqa: E731
    lin = lambda x, layer: x @ layer.weight.double().T + layer.bias.double()  # noqa: E731
    x = model.token_embedding.weight.double()[ids] + model.position_embedding.weight.double()[: ids.shape[1]]
    layers = []
    for layer in model.layers:
        a_in = ln(x, layer.norm1) if norm_first else x
        ref = reference_heads(layer.attn, a_in, lengths)
        layers.append(ref)
        a = torch.stack([r["out"] for r in ref])
        ffn = lambda z, layer=layer: lin(torch.relu(lin(z, layer.linear1)), layer.linear2)  # noqa: E731
        if norm_first:
            x = x + a
            x = x + ffn(ln(x, layer.norm2))
        else:
            x = ln(x + a, layer.norm1)
            x = ln(x + ffn(x), layer.norm2)
    if norm_first:
        x = ln(x, model.final_norm)
    if model.pooling == "cls":
        pooled = x[:, 0]
    else:
        pooled = torch.stack([x[b, :n].mean(0) for b, n in enumerate(lengths)])
    return lin(pooled, model.head), layers


@pytest.mark.parametrize("head_combine,norm_first,pooling", [("concat", False, "cls"), ("add", True, "mean")])
def test_biased_classifier_and_its_internals_match_from_scratch(head_combine, norm_first, pooling):
    torch.manual_seed(2)
    model = TransformerClassifier(40, 3, embed_dim=8, num_heads=2, key_dim=3, head_combine=head_combine, num_layers=2,
                                  ffn_dim=16, norm_first=norm_first, pooling=pooling, max_len=16)
    model = randomise_affine(model, seed=3).eval()
    lengths = [9, 5]
    ids = torch.randint(1, 40, (2, 9))
    ids[1, 5:] = 0
    logits_ref, layers_ref = _reference_classifier(model, ids, lengths, norm_first)
    with torch.no_grad():
        logits = model(ids).logits
        inside = model.attention_internals(ids)
    torch.testing.assert_close(logits.double(), logits_ref, atol=1e-5, rtol=1e-5)
    for layer_in, ref in zip(inside, layers_ref):  # the second layer sees the first layer's biased output
        for b, n in enumerate(lengths):
            for i, hd in enumerate(ref[b]["heads"]):
                torch.testing.assert_close(layer_in.attention[b, i, :n, :n].double(), hd["A"][:n], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(layer_in.values[b, i, :n].double(), hd["V"], atol=1e-5, rtol=1e-5)
                T = layer_in.values[b, i, :n].double() @ layer_in.out_proj[i].double()
                torch.testing.assert_close(T, hd["T"], atol=1e-5, rtol=1e-5)
