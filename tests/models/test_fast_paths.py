"""The fast paths of the attention layer (docs/performance.md) against independent computations."""

import math

import pytest
import torch

from identifiable_transformers.models import (
    MultiHeadSelfAttention,
    TransformerClassifier,
    attention,
    chunked,
    override_attention,
)
from identifiable_transformers.models import dropout as dropout_module
from identifiable_transformers.models.attention import Dropout, keep_mask
from identifiable_transformers.models.reference import loop_attention


def _mask(lengths, t):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # True = real token


def _random_biases(attn: MultiHeadSelfAttention) -> None:
    with torch.no_grad():
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            lin.bias.normal_()


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_projections_run_through_the_linear_modules(head_combine):
    """The diagnostics capture q and k with forward hooks on q_proj / k_proj: they must fire."""
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(12, 3, key_dim=2, head_combine=head_combine)
    _random_biases(attn)
    x = torch.randn(2, 5, 12)
    seen = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(attn, name).register_forward_hook(lambda _m, _i, out, name=name: seen.setdefault(name, out))
    q, k, v = attn._project(x)
    for out, name, size in ((q, "q_proj", attn.key_dim), (k, "k_proj", attn.key_dim), (v, "v_proj", attn.value_dim)):
        expected = x @ getattr(attn, name).weight.T + getattr(attn, name).bias
        torch.testing.assert_close(out, expected.view(2, 5, 3, size).transpose(1, 2))
        torch.testing.assert_close(seen[name], expected)
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"} <= set(attn.state_dict())


@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_full_rows_need_no_mask(head_combine, need_weights):
    """An all-real mask, no mask, and the per-head loop agree (SDPA and explicit paths)."""
    torch.manual_seed(1)
    attn = MultiHeadSelfAttention(16, 4, key_dim=3, head_combine=head_combine).eval()
    _random_biases(attn)
    x, full = torch.randn(3, 7, 16), torch.ones(3, 7, dtype=torch.bool)
    with_mask, w1 = attn(x, full, need_weights)
    without, w2 = attn(x, None, need_weights)
    torch.testing.assert_close(with_mask, without)
    torch.testing.assert_close(without, loop_attention(attn, x, full), atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w1, w2)


def _force_chunks(monkeypatch, chunk_bytes):
    """Send every size to the chunked path, ``chunk_bytes`` of (T, T) weights per chunk; count its calls."""
    monkeypatch.setattr(dropout_module, "KEEP_MASK_MIN_NUMEL", 0)
    monkeypatch.setattr(chunked, "ATTENTION_CHUNK_BYTES", chunk_bytes)
    calls = []
    apply = chunked._ChunkedAttention.apply
    monkeypatch.setattr(chunked._ChunkedAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    return calls


# t = 9: a (T, T) matrix is 324 bytes. 300 -> one matrix per chunk; 700 -> two heads of one example
# (the last chunk of each example has one); 3000 -> two examples with all four heads; 1 MiB -> one chunk.
CHUNK_BYTES = [300, 700, 3000, 2**20]


@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("path", ["chunked", "explicit_keep_mask", "explicit_torch_dropout"])
def test_training_path_with_dropout_equals_the_loop_with_the_same_mask(head_combine, path, monkeypatch):
    """Every training path (values and gradients) against the per-head loop with the same dropout mask.

    Large weights are chunked (forced here for small ones), or, when the weights are shown, go the
    explicit path with keep_mask; small ones with weights shown use torch's dropout.
    """
    calls = _force_chunks(monkeypatch, 700) if path == "chunked" else []
    if path == "explicit_keep_mask":
        monkeypatch.setattr(dropout_module, "KEEP_MASK_MIN_NUMEL", 0)
    torch.manual_seed(2)
    attn = MultiHeadSelfAttention(16, 4, key_dim=3, head_combine=head_combine, dropout=0.3).train()
    _random_biases(attn)
    x, mask = torch.randn(3, 9, 16, requires_grad=True), _mask([9, 4, 1], 9)
    probe = torch.randn(3, 9, 16)
    torch.manual_seed(10)
    out, _ = attn(x, mask, need_weights=path != "chunked")
    assert len(calls) == (path == "chunked")
    torch.manual_seed(10)
    if path == "explicit_torch_dropout":
        keep, scale = torch.nn.functional.dropout(torch.ones(3, 4, 9, 9), 0.3) != 0, 1 / 0.7
    else:
        keep, scale = keep_mask(torch.Size([3, 4, 9, 9]), 0.3)
    drop = ~keep
    assert drop.any() and not drop.all()
    expected = loop_attention(attn, x, mask, drop, scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    params = [x, *attn.parameters()]
    got = torch.autograd.grad((out * probe).sum(), params)
    want = torch.autograd.grad((expected * probe).sum(), params)
    for name, g, w in zip(["x", *(n for n, _ in attn.named_parameters())], got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("b,h,t,chunk_bytes", [(3, 4, 9, c) for c in CHUNK_BYTES] + [(5, 3, 8, 1000), (1, 1, 2, 1)])
def test_chunks_cover_every_example_and_head_once(b, h, t, chunk_bytes, monkeypatch):
    monkeypatch.setattr(chunked, "ATTENTION_CHUNK_BYTES", chunk_bytes)
    seen = torch.zeros(b, h, dtype=torch.long)
    for rows, heads in chunked._chunks(b, h, t, 4):
        seen[rows, heads] += 1
    assert torch.equal(seen, torch.ones(b, h, dtype=torch.long))


@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("chunk_bytes", [300, 600, 2400])  # float64, t = 6: 1 matrix, 2 heads, 2 examples
@pytest.mark.parametrize("p,padded", [(0.0, False), (0.3, True)])
def test_chunked_attention_gradients_match_finite_differences(head_combine, chunk_bytes, p, padded, monkeypatch):
    """The hand-written backward against torch's numerical Jacobian (float64; the mask fixed by the seed)."""
    monkeypatch.setattr(chunked, "ATTENTION_CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(11)
    b, t, h, dk, dv = 3, 6, 4, 2, 3
    q, k, v = (torch.randn(b, t, h, d, dtype=torch.float64, requires_grad=True) for d in (dk, dk, dv))
    bias = attention._key_bias(_mask([6, 4, 1], t) if padded else None, torch.float64)

    def run(q, k, v):
        torch.manual_seed(12)
        return chunked._ChunkedAttention.apply(q, k, v, bias, 0.6, p, head_combine)

    assert torch.autograd.gradcheck(run, (q, k, v))


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_chunked_path_without_dropout_matches_the_explicit_path(head_combine, monkeypatch):
    """In evaluation (and training without dropout) unequal key and value sizes go through the chunks."""
    torch.manual_seed(13)
    attn = MultiHeadSelfAttention(16, 4, key_dim=3, head_combine=head_combine).eval()
    _random_biases(attn)
    x, mask = torch.randn(3, 9, 16), _mask([9, 4, 1], 9)
    expected, _ = attn(x, mask, need_weights=True)
    calls = _force_chunks(monkeypatch, 700)
    out, _ = attn(x, mask)
    assert calls == [1]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, loop_attention(attn, x, mask), atol=1e-5, rtol=1e-5)


def test_chunked_path_runs_under_bf16_autocast(monkeypatch):
    """The trainer's bf16-mixed precision: values close to float32, finite gradients of the right dtype."""
    calls = _force_chunks(monkeypatch, 700)
    torch.manual_seed(14)
    attn = MultiHeadSelfAttention(16, 4, key_dim=3, head_combine="add", dropout=0.2).train()
    x, mask = torch.randn(3, 9, 16), _mask([9, 4, 1], 9)
    torch.manual_seed(15)
    expected, _ = attn(x, mask)
    torch.manual_seed(15)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x, mask)
    assert out.dtype == torch.bfloat16 and calls == [1, 1]
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.05)
    out.float().square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_hook_runs_in_training_without_dropout():
    """With dropout 0 in training the SDPA path would apply; a hook must still see and replace the weights."""
    torch.manual_seed(3)
    attn = MultiHeadSelfAttention(8, 2, head_combine="add", dropout=0.0).train()
    x, mask = torch.randn(2, 5, 8), _mask([5, 3], 5)
    seen = []

    def uniform(w, m):
        seen.append(w.shape)
        return m[:, None, None, :].float().expand_as(w) / m.sum(-1)[:, None, None, None]

    attn.weights_hook = uniform
    out, _ = attn(x, mask)
    assert seen == [torch.Size([2, 2, 5, 5])]
    v = attn.v_proj(x).view(2, 5, 2, 8)
    mean_v = torch.stack([v[i, : int(mask[i].sum())].mean(0) for i in range(2)])  # (B, H, dv)
    expected = attn.out_proj(mean_v.sum(1))[:, None].expand(2, 5, 8)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_keep_mask_rate_scale_and_independence():
    torch.manual_seed(4)
    n = 1_000_000
    keep, scale = keep_mask(torch.Size([n]), 0.1)
    drop = ~keep
    rate = 6554 / 65536  # 0.1 rounded to 1/65536
    assert scale == pytest.approx(1 / (1 - rate))
    assert abs(drop.float().mean().item() - rate) < 5 * math.sqrt(rate * (1 - rate) / n)
    # neighbours share a 64-bit draw; their drops must still be uncorrelated
    d = drop.float()
    corr = torch.corrcoef(torch.stack([d[:-1], d[1:]]))[0, 1].item()
    assert abs(corr) < 5 / math.sqrt(n)
    torch.manual_seed(4)
    assert torch.equal(keep_mask(torch.Size([n]), 0.1)[0], keep)  # governed by torch's seed


def test_dropout_module_keeps_or_zeroes_and_is_identity_in_eval(monkeypatch):
    monkeypatch.setattr(dropout_module, "KEEP_MASK_MIN_NUMEL", 0)
    torch.manual_seed(5)
    x = torch.rand(1000) + 1.0
    layer = Dropout(0.25)
    y = layer(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - 0.25))  # 0.25 is exact in 1/65536 steps
    assert 150 < int((~kept).sum()) < 350
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    with pytest.raises(ValueError, match="dropout"):
        keep_mask(torch.Size([3]), 1.0)


def test_override_attention_in_training_mode():
    torch.manual_seed(6)
    model = TransformerClassifier(50, 3, embed_dim=16, num_heads=2, head_combine="add", key_dim=2).train()
    ids = torch.randint(1, 50, (2, 6))
    calls = []
    with override_attention(model, lambda i, w, m: calls.append(i) or w):
        model(ids)
    assert calls == [0]


def test_compile_without_a_compiler_fails_clearly(monkeypatch):
    import torch._inductor.cpp_builder as builder

    from identifiable_transformers.modules.classifier import TextClassifier

    def missing():
        raise RuntimeError("no g++")

    monkeypatch.setattr(builder, "get_cpp_compiler", missing)
    with pytest.raises(RuntimeError, match="model.compile=false"):
        TextClassifier(50, 3, embed_dim=8, num_heads=2, compile=True)


@pytest.mark.slow
@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("chunked", [False, True])
def test_compiled_model_matches_eager(head_combine, chunked, monkeypatch):
    """Compiled against eager; ``chunked``: the attention takes the chunked path (a graph break under compile)."""
    from identifiable_transformers.modules.classifier import TextClassifier

    calls = _force_chunks(monkeypatch, 2**20) if chunked else []

    kwargs = dict(embed_dim=16, num_heads=2, key_dim=2, head_combine=head_combine, dropout=0.0)
    torch.manual_seed(7)
    eager = TextClassifier(50, 3, **kwargs).eval()
    compiled = TextClassifier(50, 3, compile=True, **kwargs).eval()
    compiled.load_state_dict(eager.state_dict())
    assert set(compiled.state_dict()) == set(eager.state_dict())
    ids = torch.randint(1, 50, (3, 7))
    mask = _mask([7, 5, 2], 7)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, mask).logits, eager(ids, mask).logits, atol=1e-5, rtol=1e-5)
    for model in (eager, compiled):
        model.train()
        model(ids, mask).logits.square().sum().backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert (len(calls) == 4) == chunked  # eval and train, eager and compiled


def test_configured_adamw_steps_like_the_reference_loop():
    """configure_optimizers' AdamW (fused on CPU) against torch's single-tensor AdamW on the same groups."""
    from identifiable_transformers.modules.classifier import TextClassifier

    torch.manual_seed(8)
    lit = TextClassifier(30, 3, embed_dim=8, num_heads=2, lr=1e-2, weight_decay=0.1)
    opt = lit.configure_optimizers()
    assert opt.defaults["fused"]
    ref_params = [p.detach().clone().requires_grad_() for p in lit.model.parameters()]
    index = {id(p): i for i, p in enumerate(lit.model.parameters())}
    groups = [{"params": [ref_params[index[id(p)]] for p in g["params"]], "weight_decay": g["weight_decay"]}
              for g in opt.param_groups]
    ref = torch.optim.AdamW(groups, lr=1e-2, foreach=False)
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.1}
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref_params]
        for p, r, g in zip(lit.model.parameters(), ref_params, grads):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, r in zip(lit.model.parameters(), ref_params):
        torch.testing.assert_close(p.detach(), r.detach(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("b,t,dk,dv,p,expected", [
    (64, 512, 16, 32, 0.1, True),    # the benchmark's shapes, training
    (64, 512, 16, 32, 0.0, True),    # evaluation with a small key: torch's fused kernel does not apply
    (64, 512, 32, 32, 0.0, False),   # evaluation with equal sizes: torch's fused kernel is faster
    (64, 512, 32, 32, 0.1, True),    # training with equal sizes: torch would fall back to its math kernel
    (64, 60, 16, 32, 0.1, False),    # a Rotten Tomatoes batch: under 2^20 weights
])
def test_which_shapes_take_the_chunked_path(b, t, dk, dv, p, expected):
    q, v = torch.empty(b, 4, t, dk), torch.empty(b, 4, t, dv)
    assert chunked._chunks_are_better(q, v, p) is expected
    assert not chunked._chunks_are_better(q.to("meta"), v.to("meta"), p)  # CPU only


def test_sdpa_pads_small_keys_without_changing_the_result():
    """On CUDA queries and keys are zero-padded to a multiple of 8 (the fused kernels' size): same values, same
    gradients as unpadded, and both as the per-head loop."""
    torch.manual_seed(20)
    attn = MultiHeadSelfAttention(16, 4, key_dim=2, head_combine="add").eval()
    _random_biases(attn)
    x, mask = torch.randn(3, 9, 16, requires_grad=True), _mask([9, 4, 1], 9)
    q, k, v = attn._project(x)
    scale = 1 / math.sqrt(2)
    outs = [attention._sdpa(q, k, v, mask[:, None, None, :], scale, 0.0, align=a) for a in (1, 8)]
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)
    grads = [torch.autograd.grad(o.square().sum(), x, retain_graph=True)[0] for o in outs]
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn.out_proj(attn._combine(outs[1])), loop_attention(attn, x, mask), atol=1e-5,
                               rtol=1e-5)


def _weights_as_output(t: int) -> MultiHeadSelfAttention:
    """One head whose projections are the identity: for inputs x_j = s_j e_j, output row i divided by s is the
    row i of the (dropped and rescaled) attention weights, which makes the dropout mask visible."""
    attn = MultiHeadSelfAttention(t, 1, key_dim=t, value_dim=t, dropout=0.25).train()
    with torch.no_grad():
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            lin.weight.copy_(torch.eye(t))
            lin.bias.zero_()
    return attn


def test_dropout_inside_torch_attention_has_the_right_rate_and_scale(monkeypatch):
    """Where the fused kernel drops (CUDA; forced here on the CPU), it is the path taken, padded keys stay at 0,
    and a kept weight is the softmax weight / (1 - p), a dropped one 0, at the rate p."""
    monkeypatch.setattr(attention, "SDPA_DROPOUT_DEVICES", ("cpu",))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw["dropout_p"]) or sdpa(*a, **kw))
    t, p = 32, 0.25
    attn = _weights_as_output(t)
    torch.manual_seed(21)
    scales = torch.rand(64, t) + 0.5
    x, mask = torch.diag_embed(scales), _mask([32, 20] * 32, t)
    out, _ = attn(x, mask)
    out = out / scales[:, None, :]  # the weights
    assert calls == [p]
    expected = torch.softmax((x @ x.transpose(1, 2) / math.sqrt(t)).masked_fill(~mask[:, None], -math.inf), -1)
    real = mask[:, None, :].expand(-1, t, -1)
    assert torch.equal(out[~real], torch.zeros_like(out[~real]))
    kept = out[real] != 0
    torch.testing.assert_close(out[real][kept], expected[real][kept] / (1 - p), atol=1e-6, rtol=1e-5)
    n = int(real.sum())
    rate = 1 - kept.float().mean().item()
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n)
    attn.eval()
    torch.testing.assert_close(attn(x, mask)[0] / scales[:, None, :], expected, atol=1e-6, rtol=1e-5)


def test_dropout_stays_out_of_torch_attention_on_the_cpu_and_when_deterministic(monkeypatch):
    q = torch.empty(2, 1, 3, 4)
    assert not attention._sdpa_drops(q)  # the CPU keeps keep_mask and the chunks
    monkeypatch.setattr(attention, "SDPA_DROPOUT_DEVICES", ("cpu",))
    assert attention._sdpa_drops(q)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not attention._sdpa_drops(q)  # trainer.deterministic=true: the explicit path, bit-identical reruns


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_training_forward_traces_as_one_graph(head_combine):
    """No graph break in a training forward with padding and dropout (what a CUDA-graph capture needs): the
    attention asks no tensor for a Python value. Compiled with the eager backend, so no compiler is needed."""
    torch.manual_seed(22)
    model = TransformerClassifier(50, 3, embed_dim=16, num_heads=2, key_dim=2, head_combine=head_combine).train()
    ids, mask = torch.randint(1, 50, (3, 7)), _mask([7, 5, 2], 7)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    logits = compiled(ids, mask).logits
    logits.square().sum().backward()
    assert logits.shape == (3, 3) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, mask).logits, model(ids, mask).logits)
