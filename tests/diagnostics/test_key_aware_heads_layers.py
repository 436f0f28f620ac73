"""The model-level key-aware counts (maths/key_aware_heads.py) against an independent per-head computation.

A 2-layer, 2-head encoder (float64) whose query and key projections have a prescribed rank per layer
and head, so that every (layer, head) has its own count: a head given another head's, another
layer's, or its keys' projections gets a different count. The reference recomputes each head's
queries, keys and value-output matrix T = V_h W_o^h from the weights and the layer inputs here, and
counts each head with ``generatable_alternative_dim``.
"""

from __future__ import annotations

import torch

from identifiable_transformers.diagnostics.maths import generatable_alternative_dim, key_aware_alternative_dims
from identifiable_transformers.models import TransformerClassifier

F64 = torch.float64
KEYS = ("alternative_dim", "key_agnostic_dim", "tangent_dim", "output_rank")
H, DK, DV, D = 2, 3, 4, 16
# (layer, head) -> (rank of the query projection, rank of the key projection)
RANKS = {(0, 0): (1, 3), (0, 1): (3, 2), (1, 0): (2, 3), (1, 1): (3, 1)}


def _model() -> TransformerClassifier:
    torch.manual_seed(0)
    model = TransformerClassifier(
        vocab_size=40, num_classes=2, embed_dim=D, num_heads=H, key_dim=DK, value_dim=DV, head_combine="concat",
        num_layers=2, ffn_dim=32, dropout=0.0, max_len=16,
    ).to(F64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for (l, h), ranks in RANKS.items():
            attn = model.layers[l].attn
            for proj, rank in zip((attn.q_proj, attn.k_proj), ranks):
                w = torch.randn(DK, rank, generator=g, dtype=F64) @ torch.randn(rank, D, generator=g, dtype=F64)
                proj.weight[h * DK : (h + 1) * DK] = w / D**0.5
    return model.eval()


def _reference(model, ids, mask):
    """{(b, l, h): generatable_alternative_dim of the head's own Q, K, T}, all computed here."""
    t = ids.shape[1]
    x = model.token_embedding(ids) + model.position_embedding.weight[:t]
    out, ranks = {}, {}
    for l, layer in enumerate(model.layers):
        xin, attn = layer.attention_input(x), layer.attn
        for h in range(H):
            rows, vrows = slice(h * DK, (h + 1) * DK), slice(h * DV, (h + 1) * DV)
            q = xin @ attn.q_proj.weight[rows].T + attn.q_proj.bias[rows]
            k = xin @ attn.k_proj.weight[rows].T + attn.k_proj.bias[rows]
            v = xin @ attn.v_proj.weight[vrows].T + attn.v_proj.bias[vrows]
            T = v @ attn.out_proj.weight[:, vrows].T  # concat: head h meets columns h*dv:(h+1)*dv of W_o
            for b, n in enumerate(mask.sum(1).tolist()):
                out[b, l, h] = generatable_alternative_dim(q[b, :n], k[b, :n], T[b, :n])
                ranks[b, l, h] = (int(torch.linalg.matrix_rank(q[b, :n])), int(torch.linalg.matrix_rank(k[b, :n])))
        x, _ = layer(x, mask)
    return out, ranks


def test_model_counts_equal_an_independent_per_head_computation_on_two_distinct_layers():
    model = _model()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 40, (2, 10), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 7:] = False  # the second example has 7 real tokens
    ids[~mask] = model.pad_id
    with torch.no_grad():
        ref, ranks = _reference(model, ids, mask)
    # the construction holds: each head's queries and keys have their prescribed ranks ...
    assert all(ranks[b, l, h] == RANKS[l, h] for (b, l, h) in ranks)
    # ... and the heads' counts differ, so a head given another head's or layer's inputs is noticed
    assert len({tuple(ref[0, l, h][k] for k in KEYS) for (l, h) in RANKS}) == len(RANKS)
    got = key_aware_alternative_dims(model, ids, mask)
    assert got["alternative_dim"].shape == (2, 2, H)
    assert got["lengths"].tolist() == [10, 7]
    for (b, l, h), res in ref.items():
        assert {k: int(got[k][b, l, h]) for k in KEYS} == {k: res[k] for k in KEYS}, (b, l, h)
