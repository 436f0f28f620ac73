"""Each family's adapter against the Hugging Face model itself: its own eager attention maps and hidden states,
and a head's null space and effective attention computed independently from them and from the value and
output projection weights read straight from the Hugging Face modules."""

import pytest
import torch
from helpers import tiny_config

from identifiable_transformers.diagnostics.faithfulness import uniform_attention_logits
from identifiable_transformers.diagnostics.maths import attention_identifiability, key_aware_alternative_dims
from identifiable_transformers.diagnostics.maths.key_aware_heads import head_inputs
from identifiable_transformers.hf.encoder import build_pretrained_classifier
from identifiable_transformers.models import override_attention

FAMILIES = [("bert", 4), ("roberta", 2), ("xlm-roberta", 4), ("distilbert", 4), ("electra", 4), ("deberta-v2", 4),
            ("modernbert", 4)]
NO_KEY_AWARE = ("deberta-v2", "modernbert")  # their scores are not s Q K^T of the projections alone
VOCAB = 60


def _value_and_output(ref, family: str, layer: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The value projection and the attention output projection, read from the HF modules by their names."""
    if family == "distilbert":
        att = ref.transformer.layer[layer].attention
        return att.v_lin, att.out_lin
    if family == "deberta-v2":
        block = ref.encoder.layer[layer].attention
        return block.self.value_proj, block.output.dense
    if family == "modernbert":  # the value rows of the fused Wqkv (q, k, v blocks, head-major within each)
        att = ref.layers[layer].attn
        d = att.Wo.in_features
        v = torch.nn.Linear(att.Wqkv.in_features, d, bias=att.Wqkv.bias is not None)
        v.weight.data = att.Wqkv.weight.data[2 * d:]
        if att.Wqkv.bias is not None:
            v.bias.data = att.Wqkv.bias.data[2 * d:]
        return v, att.Wo
    block = ref.encoder.layer[layer].attention
    return block.self.value, block.output.dense


@pytest.fixture(scope="module", params=FAMILIES, ids=[f for f, _ in FAMILIES])
def pair(request, tmp_path_factory):
    """(family, our classifier, the same weights as a plain HF model with eager attention, input ids, mask)."""
    from transformers import AutoModel

    family, heads = request.param
    torch.manual_seed(0)
    ref = AutoModel.from_config(tiny_config(family, VOCAB, heads=heads, positions=40), attn_implementation="eager")
    folder = tmp_path_factory.mktemp(family)
    ref.save_pretrained(folder)
    ref.eval()
    model = build_pretrained_classifier(str(folder), num_classes=3).eval()
    lengths = [20, 9, 5]  # above and below the head size d/h (8 or 16): null spaces of several sizes
    ids = torch.randint(4, VOCAB, (3, max(lengths)))
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids[~mask] = model.pad_id
    return family, model, ref, ids, mask


def test_attention_maps_and_hidden_states_are_the_models_own(pair):
    _, model, ref, ids, mask = pair
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
        ours = model(ids, mask, output_attentions=True)
        internals = model.attention_internals(ids, mask)
    assert len(internals) == len(out.attentions) == 2
    for theirs, a, inner in zip(out.attentions, ours.attentions, internals):
        torch.testing.assert_close(a, theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(inner.attention, theirs, rtol=1e-5, atol=1e-6)
        # padded keys: exactly 0 (on real queries: DeBERTa masks padded query rows whole, a uniform row)
        assert torch.all(inner.attention.masked_select(mask[:, None, :, None] & ~mask[:, None, None, :]) == 0)
    torch.testing.assert_close(ours.hidden_states, out.last_hidden_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.logits, model.head(out.last_hidden_state[:, 0]), rtol=1e-5, atol=1e-5)


def test_null_dims_and_effective_attention_match_an_independent_computation(pair):
    family, model, ref, ids, mask = pair
    report = attention_identifiability(model, ids, mask, return_maps=True)
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=mask.long(), output_attentions=True, output_hidden_states=True)
    H, dh = model.num_heads, model.embed_dim // model.num_heads
    seen = set()
    for b, n in enumerate(mask.sum(1).tolist()):
        for l in range(2):
            v_lin, o_lin = _value_and_output(ref, family, l)
            X = out.hidden_states[l][b, :n]  # the layer's input
            if family == "modernbert":
                X = ref.layers[l].attn_norm(X)  # pre-norm: the attention reads the normalised input
            V = X.double() @ v_lin.weight.double().T  # (n, H dh), head-major
            if v_lin.bias is not None:
                V = V + v_lin.bias.double()
            for h in range(H):
                T = V[:, h * dh:(h + 1) * dh] @ o_lin.weight.double()[:, h * dh:(h + 1) * dh].T  # (n, d)
                rank = int(torch.linalg.matrix_rank(T))  # tolerance sigma_max * max(n, d) * eps, as documented
                assert int(report["null_dim"][b, l, h]) == n - rank
                seen.add(n - rank)
                U = torch.linalg.svd(T, full_matrices=True).U
                A = out.attentions[l][b, h, :n, :n].double()
                effective = A @ U[:, :rank] @ U[:, :rank].T  # A without its rows' part in T's left null space
                torch.testing.assert_close(report["maps"][b]["effective"][l, h], effective, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(report["maps"][b]["attention"][l, h].double(), A, rtol=1e-5, atol=1e-6)
    assert 0 in seen and max(seen) > 0  # identifiable and non-identifiable heads were both checked


def test_key_aware_count_reads_the_models_queries_and_keys(pair):
    family, model, ref, ids, mask = pair
    if family in NO_KEY_AWARE:
        with pytest.raises(ValueError, match="key-aware count does not apply"):
            head_inputs(model, ids, mask)
        return
    heads = head_inputs(model, ids, mask)
    with torch.no_grad():
        hidden = ref(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
    layer = ref.transformer.layer[1].attention if family == "distilbert" else ref.encoder.layer[1].attention.self
    wq = layer.q_lin if family == "distilbert" else layer.query
    q = (hidden[1].double() @ wq.weight.double().T + wq.bias.double()).view(*ids.shape, model.num_heads, -1)
    torch.testing.assert_close(heads["q"][1], q, rtol=1e-5, atol=1e-5)
    res = key_aware_alternative_dims(model, ids[2:], mask[2:])  # the 5-token example: cheap
    assert res["alternative_dim"].shape == (1, 2, model.num_heads)
    assert bool((res["alternative_dim"] <= res["key_agnostic_dim"]).all())


def test_override_attention_replaces_the_weights_the_model_uses(pair):
    _, model, ref, ids, mask = pair
    with torch.no_grad():
        plain = model(ids, mask).logits
        with override_attention(model, lambda _l, w, _m: w):
            same = model(ids, mask).logits
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(uniform_attention_logits(model, ids, mask), plain)  # the hook reaches every layer
    x = torch.zeros(ids.shape[0], model.num_heads, ids.shape[1], ids.shape[1], requires_grad=True)
    with override_attention(model, lambda _l, w, _m: w + x):
        model(ids, mask).logits.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # gradients reach the hook's weights (adversarial search)
