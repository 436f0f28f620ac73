import itertools

import pytest
import torch
from torch import nn

from identifiable_transformers.models import MultiHeadSelfAttention


def _mask(lengths, t):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # True = real token


def test_concat_matches_torch_multihead_attention():
    torch.manual_seed(0)
    d, h, b, t = 32, 4, 3, 9
    ours = MultiHeadSelfAttention(d, h, head_combine="concat").eval()
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(torch.randn(d))
        ours.out_proj.bias.copy_(ref.out_proj.bias)
    x = torch.randn(b, t, d)
    mask = _mask([9, 5, 2], t)
    out, w = ours(x, mask, need_weights=True)
    ref_out, ref_w = ref(x, x, x, key_padding_mask=~mask, need_weights=True, average_attn_weights=False)
    real = mask[:, :, None]  # compare real query rows; padded queries are ignored downstream
    torch.testing.assert_close(out * real, ref_out * real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w * real[:, None], ref_w * real[:, None], atol=1e-6, rtol=1e-5)
    fast, none = ours(x, mask)
    assert none is None
    torch.testing.assert_close(fast * real, ref_out * real, atol=1e-5, rtol=1e-5)


def test_add_matches_explicit_per_head_loop():
    torch.manual_seed(1)
    d, h, dk, b, t = 16, 3, 2, 2, 7
    attn = MultiHeadSelfAttention(d, h, key_dim=dk, head_combine="add").eval()
    assert attn.value_dim == d
    x = torch.randn(b, t, d)
    mask = _mask([7, 4], t)
    out, _ = attn(x, mask)
    total = torch.zeros(b, t, d)
    for i in range(b):
        n = int(mask[i].sum())
        for head in range(h):
            wq = attn.q_proj.weight[head * dk:(head + 1) * dk]
            wk = attn.k_proj.weight[head * dk:(head + 1) * dk]
            wv = attn.v_proj.weight[head * d:(head + 1) * d]
            q = x[i] @ wq.T + attn.q_proj.bias[head * dk:(head + 1) * dk]
            k = x[i, :n] @ wk.T + attn.k_proj.bias[head * dk:(head + 1) * dk]
            v = x[i, :n] @ wv.T + attn.v_proj.bias[head * d:(head + 1) * d]
            a = torch.softmax(q @ k.T / dk**0.5, dim=-1)  # only real keys
            total[i] += a @ v
    expected = total @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_weights_are_distributions_over_real_keys(head_combine):
    torch.manual_seed(2)
    attn = MultiHeadSelfAttention(24, 4, key_dim=3, head_combine=head_combine).eval()
    t = 8
    mask = _mask([8, 3, 1], t)
    _, w = attn(torch.randn(3, t, 24), mask, need_weights=True)
    assert torch.equal(w.masked_select(~mask[:, None, None, :].expand_as(w)), torch.zeros(int((~mask).sum()) * 4 * t))
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, t))


@pytest.mark.parametrize("head_combine,key_dim", itertools.product(["concat", "add"], [1, 5, 24]))
def test_sdpa_path_matches_explicit_path(head_combine, key_dim):
    torch.manual_seed(3)
    attn = MultiHeadSelfAttention(24, 4, key_dim=key_dim, head_combine=head_combine).eval()
    x, mask = torch.randn(4, 11, 24), _mask([11, 6, 2, 9], 11)
    fast, _ = attn(x, mask)
    slow, _ = attn(x, mask, need_weights=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_internals_reconstruct_the_attention_output(head_combine):
    torch.manual_seed(4)
    attn = MultiHeadSelfAttention(12, 3, key_dim=2, head_combine=head_combine).eval()
    x, mask = torch.randn(2, 6, 12), _mask([6, 4], 6)
    out, w = attn(x, mask, need_weights=True)
    inside = attn.internals(x, mask)
    torch.testing.assert_close(inside.attention, w)
    torch.testing.assert_close(inside.head_output.sum(1) + attn.out_proj.bias, out, atol=1e-5, rtol=1e-5)
    # values include the bias: V = X W_v + b_v, split per head
    v = (x @ attn.v_proj.weight.T + attn.v_proj.bias).view(2, 6, 3, attn.value_dim).transpose(1, 2)
    torch.testing.assert_close(inside.values, v)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(embed_dim=10, num_heads=4), "embed_dim=10"),
        (dict(embed_dim=10, num_heads=4, key_dim=2, head_combine="concat"), "num_heads=4"),
        (dict(embed_dim=8, num_heads=2, key_dim=0), "key_dim"),
        (dict(embed_dim=8, num_heads=2, value_dim=-1), "value_dim"),
        (dict(embed_dim=8, num_heads=2, head_combine="mean"), "head_combine='mean'"),
        (dict(embed_dim=8, num_heads=0), "num_heads"),
    ],
)
def test_bad_configurations_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiHeadSelfAttention(**kwargs)


def test_add_with_explicit_key_dim_needs_no_divisibility():
    attn = MultiHeadSelfAttention(10, 4, key_dim=3, head_combine="add")
    assert (attn.key_dim, attn.value_dim) == (3, 10)


def test_override_attention_replaces_weights_and_restores():
    """A hook returning the weights unchanged changes nothing; uniform weights give the mean of the
    real values, computed independently; the hook is gone after the block."""
    from identifiable_transformers.models import TransformerClassifier, override_attention

    torch.manual_seed(3)
    model = TransformerClassifier(50, 3, embed_dim=16, num_heads=2, head_combine="add", key_dim=2).eval()
    ids = torch.randint(4, 50, (2, 6))
    mask = _mask([6, 4], 6)
    ref = model(ids, mask).logits
    seen = []
    with override_attention(model, lambda i, w, m: seen.append(i) or w):
        same = model(ids, mask).logits
    torch.testing.assert_close(same, ref)
    assert seen == [0]
    attn = model.layers[0].attn
    x = torch.randn(2, 6, 16)
    with override_attention(model, lambda i, w, m: m[:, None, None, :].float().expand_as(w) / m.sum(-1)[:, None, None, None]):
        out, _ = attn(x, mask)
    v = attn.v_proj(x).view(2, 6, 2, 16)  # (B, T, H, dv)
    for b, n in enumerate([6, 4]):
        expected = attn.out_proj(v[b, :n].mean(0).sum(0))  # add: heads summed, then projected
        torch.testing.assert_close(out[b], expected.expand(6, 16), atol=1e-5, rtol=1e-5)
    assert attn.weights_hook is None
    torch.testing.assert_close(model(ids, mask).logits, ref)


def test_out_rank_caps_the_output_projection_and_the_internals_still_reproduce_the_forward():
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(embed_dim=32, num_heads=4, key_dim=2, value_dim=8, head_combine="concat",
                                  out_rank=3).eval()
    assert torch.linalg.matrix_rank(attn.out_proj.weight.detach()).item() == 3
    assert "out_proj.weight" not in dict(attn.named_parameters())  # the factors are the parameters, not W_o
    x = torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    out, _ = attn(x, mask)
    internals = attn.internals(x, mask)
    rebuilt = internals.head_output.sum(1) + attn.out_proj.bias
    torch.testing.assert_close(rebuilt, out, atol=1e-5, rtol=1e-5)
    # the block's output (without the bias) spans at most out_rank dimensions, whatever the input
    centred = (out - attn.out_proj.bias).reshape(-1, 32)
    assert torch.linalg.matrix_rank(centred.detach(), atol=1e-5).item() <= 3
    # a head's W_o^h (value_dim x d) has rank min(value_dim, out_rank): with out_rank >= value_dim, as in
    # factorial_rank.yaml, every head keeps its full rank and its identifiability
    assert torch.linalg.matrix_rank(attn.head_out_proj()[0].detach()).item() == 3
    wide = MultiHeadSelfAttention(embed_dim=32, num_heads=4, key_dim=2, value_dim=8, out_rank=8)
    assert all(torch.linalg.matrix_rank(w.detach()).item() == 8 for w in wide.head_out_proj())
    full = MultiHeadSelfAttention(embed_dim=32, num_heads=4, key_dim=2, value_dim=8, head_combine="concat")
    assert full.out_rank is None and "out_proj.weight" in dict(full.named_parameters())


@pytest.mark.parametrize("rank", [0, 32, 40])
def test_an_impossible_out_rank_is_refused_with_the_fix(rank):
    with pytest.raises(ValueError, match=rf"out_rank={rank} is impossible.*1 <= out_rank < 32, or null"):
        MultiHeadSelfAttention(embed_dim=32, num_heads=4, out_rank=rank)
