"""Known answers for the identifiability maths (docs/identifiability.md section 2).

References are independent of the code under test: closed-form generic ranks (n - d_v,
n - d_v - 1), the pseudo-inverse projector I - T T^+, numpy's SVD, torch's Categorical entropy,
and the model's own per-head outputs.
"""

import numpy as np
import pytest
import torch

from identifiable_transformers.diagnostics import (
    alternative_attention,
    analyse_heads,
    attention_identifiability,
    attention_maps,
    effective_attention,
    generatable_alternative_dim,
    identifiable_length,
    key_aware_alternative_dims,
    null_dim,
    stochastic_null_dim,
)
from identifiable_transformers.models import TransformerClassifier

VOCAB = 200


def _model(**kw):
    torch.manual_seed(0)
    kw.setdefault("positional", "none")
    kw.setdefault("dropout", 0.0)
    return TransformerClassifier(VOCAB, 2, **kw).eval()


def _distinct_batch(lengths, seed=0):
    """Right-padded batch; each example uses distinct token ids (no repeated value rows)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randperm(VOCAB - 1, generator=g)[:n] + 1
    return ids, ids != 0


@pytest.mark.parametrize("num_layers", [1, 2])
def test_concat_null_dims_follow_n_minus_d_over_h(num_layers):
    model = _model(embed_dim=16, num_heads=4, head_combine="concat", num_layers=num_layers)  # d_v = 4
    lengths = list(range(1, 11))
    ids, mask = _distinct_batch(lengths)
    rep = attention_identifiability(model, ids, mask)
    L, H = num_layers, 4
    for b, n in enumerate(lengths):
        assert rep["null_dim"][b].tolist() == [[max(0, n - 4)] * H] * L, n
        assert rep["stochastic_null_dim"][b].tolist() == [[max(0, n - 5)] * H] * L, n
    assert rep["lengths"].tolist() == lengths
    assert rep["null_dim"].shape == (len(lengths), L, H)


def test_add_heads_identifiable_up_to_d():
    model = _model(embed_dim=8, num_heads=2, head_combine="add", key_dim=2)  # d_v = d = 8
    lengths = [3, 7, 8, 9, 10, 12]
    ids, mask = _distinct_batch(lengths)
    rep = attention_identifiability(model, ids, mask)
    for b, n in enumerate(lengths):
        assert rep["null_dim"][b].flatten().tolist() == [max(0, n - 8)] * 2
        assert rep["stochastic_null_dim"][b].flatten().tolist() == [max(0, n - 9)] * 2
        # Section 3 caveat: jointly, the two heads' maps are identifiable only while 2 n <= d.
        assert rep["joint_null_dim"][b].tolist() == [max(0, 2 * n - 8)]
        assert rep["joint_stochastic_null_dim"][b].tolist() == [max(0, 2 * n - 8 - 2)]


def test_identifiable_length_closed_form_and_measured():
    assert identifiable_length("concat", 64, 4) == {
        "value_dim": 16, "head": 16, "head_stochastic": 17, "joint": 16, "joint_stochastic": 17}
    assert identifiable_length("add", 64, 4) == {
        "value_dim": 64, "head": 64, "head_stochastic": 65, "joint": 16, "joint_stochastic": 17}
    assert identifiable_length("add", 64, 4, value_dim=8)["head"] == 8
    with pytest.raises(ValueError, match="head_combine"):
        identifiable_length("sum", 64, 4)
    bound = identifiable_length("concat", 16, 4)
    model = _model(embed_dim=16, num_heads=4, head_combine="concat")
    ids, mask = _distinct_batch([bound["head"], bound["head"] + 1, bound["head_stochastic"] + 1])
    rep = attention_identifiability(model, ids, mask)
    assert (rep["null_dim"][0] == 0).all() and (rep["null_dim"][1] > 0).all()
    assert (rep["stochastic_null_dim"][1] == 0).all() and (rep["stochastic_null_dim"][2] > 0).all()


def test_witness_is_a_valid_alternative_with_the_same_head_output():
    model = _model(embed_dim=16, num_heads=4, head_combine="concat", num_layers=2)
    lengths = [3, 5, 6, 9, 14]
    ids, mask = _distinct_batch(lengths, seed=1)
    rep = attention_identifiability(model, ids, mask, return_maps=True)
    with torch.no_grad():
        internals = model.attention_internals(ids, mask)
    for b, n in enumerate(lengths):
        m = rep["maps"][b]
        for l, layer in enumerate(internals):
            for h in range(4):
                A, A_alt = m["attention"][l, h], m["alternative"][l, h]
                assert A.shape == A_alt.shape == (n, n)
                assert (A_alt >= 0).all()
                torch.testing.assert_close(A_alt.sum(-1), torch.ones(n, dtype=A.dtype), atol=1e-5, rtol=0)
                # The model's own head output, from its float32 internals, is the reference.
                ref = layer.head_output[b, h, :n].double()
                alt_out = A_alt @ layer.values[b, h, :n].double() @ layer.out_proj[h].double()
                assert (alt_out - ref).norm() / ref.norm() < 1e-5  # float32 reference
                rel = ((A_alt - A) @ layer.values[b, h, :n].double() @ layer.out_proj[h].double()).norm()
                assert rel / (A @ layer.values[b, h, :n].double() @ layer.out_proj[h].double()).norm() <= 1e-6
                tv = 0.5 * (A_alt - A).abs().sum(-1).max()
                torch.testing.assert_close(rep["alt_attention_tv"][b, l, h], tv)
                identifiable = n <= 5  # d_v + 1 with the row-sum constraint
                if identifiable:
                    assert rep["alt_attention_tv"][b, l, h] == 0 and torch.equal(A_alt, A)
                else:
                    assert rep["alt_attention_tv"][b, l, h] > 1e-3
    assert (rep["witness_rel_error"] <= 1e-6).all()
    assert ((rep["alt_attention_tv"] == 0) == (rep["stochastic_null_dim"] == 0)).all()


def test_report_does_not_depend_on_padding_or_batch_mates():
    model = _model(embed_dim=16, num_heads=4, head_combine="concat", positional="sinusoidal")
    ids, mask = _distinct_batch([7], seed=3)
    alone = attention_identifiability(model, ids, mask)
    batch = torch.randint(1, VOCAB, (3, 20))
    batch[1, :7], batch[1, 7:] = ids[0], 0
    batch[2, 11:] = 0
    inside = attention_identifiability(model, batch, batch != 0)
    for key in ("null_dim", "stochastic_null_dim", "rank", "joint_null_dim"):
        assert torch.equal(alone[key][0], inside[key][1]), key
    for key in ("alt_attention_tv", "effective_gap", "attention_entropy"):
        torch.testing.assert_close(alone[key][0], inside[key][1], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(alone["sigma_ratio"][0], inside["sigma_ratio"][1], rtol=1e-3, atol=1e-12)


def test_duplicate_tokens_raise_null_dim():
    # Without positions a repeated token has the same value row, so rank(T) = #distinct tokens.
    model = _model(embed_dim=8, num_heads=2, head_combine="add")
    distinct = torch.tensor([[5, 6, 7, 8, 9, 10]])
    repeated = torch.tensor([[5, 6, 7, 5, 6, 7]])
    assert (attention_identifiability(model, distinct)["null_dim"] == 0).all()
    rep = attention_identifiability(model, repeated)
    assert (rep["null_dim"] == 3).all()
    # [T, 1] also has only 3 distinct rows: duplicates stay swappable under the row-sum constraint.
    assert (rep["stochastic_null_dim"] == 3).all()
    assert (rep["alt_attention_tv"] > 0).all()


def test_zero_matrix_has_rank_zero():
    # Scale invariance (1e-15 .. 1e15) is tested in test_identifiability_reference.py.
    # An exact zero matrix has rank 0 (no division by a zero sigma_max).
    assert null_dim(torch.zeros(4, 3)).item() == 4
    assert stochastic_null_dim(torch.zeros(4, 3)).item() == 3


def test_effective_attention_reproduces_output_and_matches_pinv_projector():
    g = torch.Generator().manual_seed(1)
    n, dv, d = 10, 3, 6
    T = torch.randn(n, dv, generator=g, dtype=torch.float64) @ torch.randn(dv, d, generator=g, dtype=torch.float64)
    A = torch.softmax(torch.randn(n, n, generator=g, dtype=torch.float64), -1)
    A_eff = effective_attention(A, T)
    torch.testing.assert_close(A_eff @ T, A @ T)
    # Independent reference: the projector onto the left null space is I - T T^+.
    ref = A @ T @ torch.linalg.pinv(T)
    torch.testing.assert_close(A_eff, ref)
    res = analyse_heads(A, T)
    torch.testing.assert_close(res["effective_gap"], (A - ref).norm() / A.norm())
    # Full row rank (n <= d_v): nothing is hidden.
    T_small = T[:3]
    torch.testing.assert_close(effective_attention(A[:3, :3], T_small), A[:3, :3])
    assert analyse_heads(A[:3, :3], T_small)["effective_gap"] < 1e-12


def test_sigma_ratio_and_entropy_against_numpy_and_categorical():
    g = torch.Generator().manual_seed(2)
    T = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    A = torch.softmax(torch.randn(2, 6, 6, generator=g, dtype=torch.float64), -1)
    A[1, :, -1] = 0.0  # a zero weight: 0 log 0 = 0
    A = A / A.sum(-1, keepdim=True)
    res = analyse_heads(A, T)
    s = np.linalg.svd(T.numpy(), compute_uv=False)
    np.testing.assert_allclose(res["sigma_ratio"].numpy(), s[:, -1] / s[:, 0], rtol=1e-10)
    ent = torch.distributions.Categorical(probs=A).entropy().mean(-1)
    torch.testing.assert_close(res["attention_entropy"], ent)


def test_alternative_attention_on_random_tensors():
    g = torch.Generator().manual_seed(3)
    n, dv, d = 9, 2, 5
    T = torch.randn(4, n, dv, generator=g, dtype=torch.float64) @ torch.randn(dv, d, generator=g, dtype=torch.float64)
    A = torch.softmax(3 * torch.randn(4, n, n, generator=g, dtype=torch.float64), -1)
    A_alt, tv = alternative_attention(A, T)
    assert (A_alt >= 0).all() and tv.shape == (4, n)
    torch.testing.assert_close(A_alt.sum(-1), A.sum(-1))
    assert (((A_alt - A) @ T).norm(dim=(-2, -1)) / (A @ T).norm(dim=(-2, -1)) < 1e-10).all()
    torch.testing.assert_close(tv, 0.5 * (A_alt - A).abs().sum(-1))
    assert ((tv > 0) & (tv <= 1 + 1e-12)).all()
    # At least one entry per row is driven to zero: the step is maximal along its direction.
    assert ((A_alt < 1e-12).any(-1)).all()


def test_training_mode_restored_and_bad_masks_rejected():
    model = _model(embed_dim=8, num_heads=2).train()
    ids, mask = _distinct_batch([4, 2])
    attention_identifiability(model, ids, mask)
    assert model.training
    with pytest.raises(ValueError, match="prefix"):
        attention_identifiability(model, ids, mask.flip(-1))
    with pytest.raises(ValueError, match="no real token"):
        attention_identifiability(model, ids, torch.zeros_like(mask))
    maps = attention_maps(model, ids, mask)
    assert [m["attention"].shape for m in maps] == [(1, 2, 4, 4), (1, 2, 2, 2)]


@pytest.mark.parametrize("dk,expected", [(1, 0), (2, 0), (3, 20), (4, 44), (8, 120)])
def test_key_aware_alternative_dims_match_paper_check(dk, expected):
    # docs/identifiability.md 2.5: n = 16, d_v = 4; alternatives the head can generate shrink with the key size.
    g = torch.Generator().manual_seed(dk)
    n, dv = 16, 4
    Q, K, V = (torch.randn(n, k, generator=g, dtype=torch.float64) for k in (dk, dk, dv))
    res = generatable_alternative_dim(Q, K, V)
    assert res["alternative_dim"] == expected
    assert res["key_agnostic_dim"] == n * (n - 1 - dv) == 176


@pytest.mark.parametrize("key_dim,expected", [(2, 0), (3, 20)])
def test_key_aware_dims_on_a_model_head(key_dim, expected):
    # Same closed-form counts through a real concat head (d_v = 4, rank(T) = 4), n = 16 tokens.
    model = _model(embed_dim=16, num_heads=4, head_combine="concat", key_dim=key_dim)
    ids, mask = _distinct_batch([16], seed=5)
    res = key_aware_alternative_dims(model, ids, mask)
    assert res["alternative_dim"].flatten().tolist() == [expected] * 4
    assert res["key_agnostic_dim"].flatten().tolist() == [176] * 4
