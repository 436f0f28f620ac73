"""Context-mixing maps of the project's encoders against independent computations (docs/faithfulness.md):
value zeroing against forward hooks that zero one token's value row in every head and rerun the model; ALTI
against a hand-derived case and explicit loops over the layer's own weights; their defining properties."""

import math

import pytest
import torch

from identifiable_transformers.diagnostics import alti, norm_resln, value_zeroing
from identifiable_transformers.diagnostics.faithfulness import explain, unknown_explainers
from identifiable_transformers.diagnostics.faithfulness.context_mixing import (
    alti_from_decomposition,
    token_decomposition,
)
from identifiable_transformers.models.classifier import TransformerClassifier
from identifiable_transformers.report.faithfulness import FAITH_KEY

VOCAB = 40
DESIGNS = [("concat", None, False), ("add", 2, False), ("concat", None, True), ("add", 3, True)]


def _model(head_combine, key_dim, norm_first, layers=2, pooling="cls", seed=0):
    torch.manual_seed(seed)
    m = TransformerClassifier(VOCAB, 3, embed_dim=12, num_heads=3, key_dim=key_dim, head_combine=head_combine,
                              num_layers=layers, ffn_dim=20, norm_first=norm_first, pooling=pooling).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so that their handling is tested
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=g)
    ids[1, 6:] = 0
    ids[2, 3:] = 0
    return ids, ids != 0


def _vz_reference(model, ids, mask, layer_modules, value_modules):
    """(B, L, T, T) by brute force: for each layer and token j, a forward hook zeroes j's value row (all heads,
    bias included) and the whole model reruns; cosine distance of the layer's outputs, rows normalised."""
    B, T = ids.shape
    out = torch.zeros(B, len(layer_modules), T, T, dtype=torch.float64)
    captured = {}

    def grab(_m, _a, o):
        captured["y"] = o[0] if isinstance(o, tuple) else o

    for l, (layer, value) in enumerate(zip(layer_modules, value_modules)):
        h = layer.register_forward_hook(grab)
        with torch.no_grad():
            model(ids, mask)
        base = captured["y"].clone()
        for j in range(T):
            z = value.register_forward_hook(lambda _m, _a, o, j=j: o.index_fill(1, torch.tensor([j]), 0.0))
            with torch.no_grad():
                model(ids, mask)
            z.remove()
            for b in range(B):
                for i in range(T):
                    if mask[b, i] and mask[b, j]:
                        out[b, l, i, j] = 1 - torch.nn.functional.cosine_similarity(
                            captured["y"][b, i], base[b, i], dim=0)
        h.remove()
    return out / out.sum(-1, keepdim=True).clamp_min(1e-30)


@pytest.mark.parametrize("head_combine,key_dim,norm_first", DESIGNS)
def test_value_zeroing_matches_hooked_reruns(head_combine, key_dim, norm_first):
    m = _model(head_combine, key_dim, norm_first).double()  # float64: the reference's 1 - cos needs it
    ids, mask = _batch()
    ref = _vz_reference(m, ids, mask, list(m.layers), [layer.attn.v_proj for layer in m.layers])
    got = value_zeroing(m, ids, mask)
    assert got.shape == (3, 2, 9, 9)
    torch.testing.assert_close(got, ref.float(), atol=1e-6, rtol=1e-5)


def test_alti_hand_derived():
    """One head, d = 1, no LayerNorm (identity), f = x W_v W_o given directly.
    Row 0: A = [.5, .5], f = [2, 4], x_0 = 1: T = [.5*2 + 1, .5*4] = [2, 2], y = 4, d = [2, 2], c = [2, 2].
    Row 1: A = [1, 0], x_1 = 3: T = [2, 3], y = 5, d = [3, 2], c = [2, 3] -> [.4, .6].
    Clipping: A = [.5, .5], f = [2, -1], x_0 = 1: T = [2, -.5], y = 1.5, d = [.5, 2], c = [1, max(0, -.5)] = [1, 0]."""
    A = torch.tensor([[[[0.5, 0.5], [1.0, 0.0]]]])
    x = torch.tensor([[[1.0], [3.0]]])
    c = alti_from_decomposition(token_decomposition(A, torch.tensor([[[[2.0], [4.0]]]]), x, None, None))[0]
    torch.testing.assert_close(c / c.sum(-1, keepdim=True), torch.tensor([[0.5, 0.5], [0.4, 0.6]], dtype=c.dtype))
    c = alti_from_decomposition(token_decomposition(A, torch.tensor([[[[2.0], [-1.0]]]]), x, None, None))[0]
    torch.testing.assert_close(c[0], torch.tensor([1.0, 0.0], dtype=c.dtype))


def alti_loops(x, mask, Wq, bq, Wk, bk, Wv, bv, Wo, bo, H, dk, dv, combine, gamma, eps, beta):
    """ALTI of one post-norm layer by explicit loops from its weights (nn.Linear layout: y = x W^T + b), as
    Ferrando et al. (EMNLP 2022) define it: y_i is the LayerNorm's output gamma (z_i - mean z_i) / s_i + beta of
    the residual sum z_i = x_i + sum_j u_ij + b_o, biases included; T_i(x_j) = gamma (u_ij - mean u_ij) / s_i.
    Per head h: q, k, v slices of width dk / dv; W_o^h = the columns h dv .. (h+1) dv of W_o (concat) or all of
    W_o (add, heads summed before it). Returns a (T, T) list of lists for one example."""
    T, d = x.shape
    n = int(mask.sum())
    q, k, v = x @ Wq.T + bq, x @ Wk.T + bk, x @ Wv.T + bv
    u = [[torch.zeros(d, dtype=torch.float64) for _ in range(n)] for _ in range(n)]
    for h in range(H):
        qs, ks, vs = q[:, h * dk:(h + 1) * dk], k[:, h * dk:(h + 1) * dk], v[:, h * dv:(h + 1) * dv]
        Woh = Wo[:, h * dv:(h + 1) * dv] if combine == "concat" else Wo
        for i in range(n):
            logits = [float(qs[i] @ ks[j]) / math.sqrt(dk) for j in range(n)]
            top = max(logits)
            w = [math.exp(t - top) for t in logits]
            for j in range(n):
                u[i][j] = u[i][j] + (w[j] / sum(w)) * (Woh @ vs[j])
    out = [[0.0] * T for _ in range(T)]
    for i in range(n):
        u[i][i] = u[i][i] + x[i]
        z = sum(u[i]) + bo
        s = math.sqrt(float(((z - z.mean()) ** 2).mean()) + eps)
        Ts = [gamma * (u[i][j] - u[i][j].mean()) / s for j in range(n)]
        y = gamma * (z - z.mean()) / s + beta
        c = [max(0.0, float(y.abs().sum()) - float((y - t).abs().sum())) for t in Ts]
        if sum(c) == 0:  # every contribution clipped: the token keeps itself (docs/faithfulness.md)
            c[i] = 1.0
        for j in range(n):
            out[i][j] = c[j] / sum(c)
    return out


@pytest.mark.parametrize("head_combine,key_dim", [("concat", None), ("add", 2)])
def test_alti_matches_loops_over_the_weights(head_combine, key_dim):
    m = _model(head_combine, key_dim, False, layers=1).double()
    ids, mask = _batch()
    a = m.layers[0].attn
    with torch.no_grad():
        x = m.token_embedding(ids) + m.position_embedding.weight[: ids.shape[1]]
        got = alti(m, ids, mask)[:, 0]
        for b in range(ids.shape[0]):
            ref = alti_loops(x[b], mask[b], a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                             a.v_proj.weight, a.v_proj.bias, a.out_proj.weight, a.out_proj.bias, a.num_heads,
                             a.key_dim, a.value_dim, head_combine, m.layers[0].norm1.weight, m.layers[0].norm1.eps,
                             m.layers[0].norm1.bias)
            torch.testing.assert_close(got[b], torch.tensor(ref, dtype=got.dtype), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head_combine,key_dim,norm_first", DESIGNS)
def test_token_decomposition_sums_to_the_layer_norm_output(head_combine, key_dim, norm_first):
    """sum_j T_i(x_j) = LN(x_i + a_i) - beta - L_i(b_o) (post-norm; torch's LayerNorm), x_i + a_i - b_o (pre-norm)."""
    m = _model(head_combine, key_dim, norm_first, layers=1).double()
    ids, mask = _batch()
    with torch.no_grad():
        blk = m.encoder_blocks(ids, mask)[0]
        f = torch.einsum("bhtv,hvd->bhtd", blk.internals.values, blk.internals.out_proj)
        Td = token_decomposition(blk.internals.attention, f, blk.x, blk.out_bias, blk.norm)
        layer = m.layers[0]
        a = layer.attn(layer.attention_input(blk.x), mask)[0]  # the model's own attention output
        z = blk.x + a
        if norm_first:
            expected = z - layer.attn.out_proj.bias
        else:
            s = (z.var(-1, unbiased=False) + layer.norm1.eps).sqrt()[..., None]
            bo = layer.attn.out_proj.bias
            expected = layer.norm1(z) - layer.norm1.bias - layer.norm1.weight * (bo - bo.mean()) / s
    real = mask[:, :, None]
    torch.testing.assert_close(Td.sum(2) * real, expected * real, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_combine,key_dim,norm_first", DESIGNS)
@pytest.mark.parametrize("fn", [value_zeroing, alti, norm_resln], ids=lambda f: f.__name__)
def test_rows_are_distributions_over_real_tokens(fn, head_combine, key_dim, norm_first):
    m = _model(head_combine, key_dim, norm_first)
    ids, mask = _batch()
    M = fn(m, ids, mask)
    assert (M >= 0).all()
    pair = mask[:, None, :, None] & mask[:, None, None, :]
    assert (M[~pair.expand_as(M)] == 0).all()
    rows = M.sum(-1)
    torch.testing.assert_close(rows, mask[:, None, :].expand_as(rows).float())


@pytest.mark.parametrize("head_combine,key_dim,norm_first", DESIGNS)
def test_alti_compares_with_the_block_output_biases_included(head_combine, key_dim, norm_first):
    """ALTI's y_i is the block's own LayerNorm output (read by a hook on the model's module), biases included: its
    contributions are those of the float64 definition with that y_i, and they move with the LayerNorm's beta and the
    output bias; the bias-free variant (y_i = sum_j T_i(x_j)) does not, and differs from ALTI on these models."""
    m = _model(head_combine, key_dim, norm_first, layers=1).double()
    ids, mask = _batch()
    layer, seen = m.layers[0], {}
    with torch.no_grad():
        blk = m.encoder_blocks(ids, mask)[0]
        f = torch.einsum("bhtv,hvd->bhtd", blk.internals.values, blk.internals.out_proj)
        Td = token_decomposition(blk.internals.attention, f, blk.x, blk.out_bias, blk.norm) * mask[:, None, :, None]
        if norm_first:  # no LayerNorm on the residual sum: y_i = x_i + a_i, the model's own attention output
            y = blk.x + layer.attn(layer.attention_input(blk.x), mask)[0]
        else:
            hook = layer.norm1.register_forward_hook(lambda mod, inp, out: seen.setdefault("y", out))
            m(ids, mask)
            hook.remove()
            y = seen["y"]
        c = (y.abs().sum(-1)[..., None] - (y[:, :, None] - Td).abs().sum(-1)).clamp_min(0)  # the paper's formula
        empty = (c.sum(-1) == 0) & mask
        c = c + torch.diag_embed(empty.double())
        ref = c / c.sum(-1, keepdim=True)
        got = alti(m, ids, mask)[:, 0].double()
        pair = mask[:, :, None] & mask[:, None, :]
        torch.testing.assert_close(got[pair], ref[pair], atol=1e-6, rtol=1e-5)
        bias_free = alti_from_decomposition(Td)
        bias_free = bias_free / bias_free.sum(-1, keepdim=True).clamp_min(1e-300)
        assert (got[pair] - bias_free[pair]).abs().max() > 1e-3  # the check can fail: the two differ here
        layer.attn.out_proj.bias.add_(1.0)  # the output bias moves y_i, hence ALTI (pre- and post-norm)
        if not norm_first:
            layer.norm1.bias.add_(-2.0)
        assert not torch.allclose(alti(m, ids, mask)[:, 0].double()[pair], got[pair], atol=1e-4)


def test_a_token_no_one_attends_to_keeps_only_its_residual_share():
    """Column j of A zero off the diagonal: nobody else takes anything from j, so c_ij = 0 for i != j."""
    torch.manual_seed(0)
    A = torch.rand(2, 3, 5, 5)
    A[..., :, 2] = 0
    A[..., 2, 2] = 0.3
    A = A / A.sum(-1, keepdim=True)
    ln = torch.nn.LayerNorm(6)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    c = alti_from_decomposition(token_decomposition(A, torch.randn(2, 3, 5, 6), torch.randn(2, 5, 6),
                                                    torch.randn(6), ln))
    off = torch.ones(5, dtype=torch.bool)
    off[2] = False
    assert (c[:, off, 2] == 0).all() and (c[:, 2, 2] > 0).all()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_explainer_is_the_pooled_row_of_the_rollout(pooling):
    m = _model("add", 2, False, layers=3, pooling=pooling)
    ids, mask = _batch()
    names = ["value_zeroing", "alti", "norm_resln", "alti_layer1", "value_zeroing_layer0"]
    scores = explain(m, ids, mask, names)
    maps = {"value_zeroing": value_zeroing(m, ids, mask), "alti": alti(m, ids, mask), "norm_resln": norm_resln(m, ids, mask)}
    for name in names:
        base, _, layer = name.partition("_layer")
        M = maps[base]
        R = M[:, int(layer)] if layer else M[:, 2] @ M[:, 1] @ M[:, 0]
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            row = R[b, 0] if pooling == "cls" else R[b, :n].mean(0)
            expected = torch.zeros(ids.shape[1])
            expected[1:n] = row[1:n]  # <cls> and padding score 0
            torch.testing.assert_close(scores[name][b], expected, atol=1e-5, rtol=1e-4)


def test_names_layers_and_report_keys():
    assert unknown_explainers(["alti", "alti_layer3", "value_zeroing_layer0", "norm_resln_layer12"]) == []
    assert unknown_explainers(["alti_layer", "alti_layerx", "gradient_layer0"]) == ["alti_layer", "alti_layerx",
                                                                                  "gradient_layer0"]
    m = _model("concat", None, False)
    ids, mask = _batch()
    with pytest.raises(ValueError, match="has 2 layers"):
        explain(m, ids, mask, ["alti_layer2"])
    assert FAITH_KEY.match("val/faith/alti_layer0/comprehensiveness").group(1) == "alti_layer0"
    from identifiable_transformers.diagnostics.callbacks.faithfulness import FaithfulnessCallback

    assert FaithfulnessCallback(explainers=["alti_layer0", "value_zeroing"]).explainers == ["alti_layer0",
                                                                                           "value_zeroing"]
    with pytest.raises(ValueError, match="alti_layerx"):
        FaithfulnessCallback(explainers=["alti_layerx"])


@pytest.mark.parametrize("fn", [value_zeroing, alti, norm_resln], ids=lambda f: f.__name__)
def test_extra_padding_changes_nothing(fn):
    """Every example padded further (the chunks cut their padded tail): the same maps, 0 on the new columns."""
    m = _model("add", 2, False)
    ids, mask = _batch()
    padded = torch.nn.functional.pad(ids, (0, 4))
    M, P = fn(m, ids, mask), fn(m, padded, padded != 0)
    torch.testing.assert_close(P[..., :9, :9], M, atol=1e-6, rtol=1e-5)
    assert (P[..., 9:, :] == 0).all() and (P[..., :, 9:] == 0).all()


def test_value_zeroing_of_one_layer_alone_is_its_full_maps_row():
    """Only one layer scored (no rollout): its copies run on <cls> alone; the row is the full map's."""
    m = _model("concat", None, False, layers=3)
    ids, mask = _batch()
    full = value_zeroing(m, ids, mask)
    scores = explain(m, ids, mask, ["value_zeroing_layer1", "alti"])
    expected = full[:, 1, 0] * mask
    expected[:, 0] = 0
    torch.testing.assert_close(scores["value_zeroing_layer1"], expected, atol=1e-6, rtol=1e-5)
