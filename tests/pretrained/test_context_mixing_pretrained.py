"""Context-mixing maps of the pretrained families against independent computations: value zeroing against
forward hooks on the Hugging Face value projection and a rerun of the model; ALTI of the first layer against
explicit loops over the Hugging Face modules' own weights (tests/diagnostics/test_context_mixing.py)."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

from identifiable_transformers.diagnostics import alti, norm_resln, value_zeroing
from identifiable_transformers.diagnostics.faithfulness import explain
from identifiable_transformers.hf.adapters import ATTENTION, family_for, register_attention
from identifiable_transformers.hf.encoder import PretrainedClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnostics"))
from test_context_mixing import _vz_reference, alti_loops  # noqa: E402

FAMILIES = ["bert", "roberta", "distilbert"]
VOCAB = 60


def _model(family: str) -> PretrainedClassifier:
    from transformers import AutoModel

    register_attention()
    torch.manual_seed(0)
    config = tiny_config(family, VOCAB, heads=4, layers=2, positions=40)
    encoder = AutoModel.from_config(config, attn_implementation=ATTENTION)
    with torch.no_grad():  # LayerNorm weights and biases away from 1 and 0, larger biases
        for name, p in encoder.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    pad = 1 if family == "roberta" else 0
    return PretrainedClassifier(encoder, family_for(config), num_classes=3, pad_id=pad).eval()


def _batch(pad: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (3, 8), generator=g)
    ids[1, 5:] = pad
    ids[2, 3:] = pad
    return ids, ids != pad


@pytest.mark.parametrize("family", FAMILIES)
def test_value_zeroing_matches_hooked_reruns(family):
    m = _model(family).double()  # float64: the reference's 1 - cos of nearly equal outputs needs it
    ids, mask = _batch(m.pad_id)
    layers = list(m.family.layers(m.encoder))
    ref = _vz_reference(m, ids, mask, layers, [m.family.value(layer) for layer in layers])
    torch.testing.assert_close(value_zeroing(m, ids, mask), ref.float(), atol=1e-6, rtol=1e-5)
    # In float32 too: a pretrained init's outputs move by ~1e-5 (cosine distance), where 1 - cos cancels.
    torch.testing.assert_close(value_zeroing(m.float(), ids, mask), ref.float(), atol=1e-4, rtol=1e-3)


def _attention_parts(family, layer):
    if family == "distilbert":
        a = layer.attention
        return a.q_lin, a.k_lin, a.v_lin, a.out_lin, layer.sa_layer_norm
    s, o = layer.attention.self, layer.attention.output
    return s.query, s.key, s.value, o.dense, o.LayerNorm


@pytest.mark.parametrize("family", FAMILIES)
def test_alti_first_layer_matches_loops_over_the_weights(family):
    m = _model(family).double()
    ids, mask = _batch(m.pad_id)
    q, k, v, o, ln = _attention_parts(family, m.family.layers(m.encoder)[0])
    with torch.no_grad():
        emb = m.encoder.embeddings
        x = emb(ids) if family == "distilbert" else emb(input_ids=ids)
        got = alti(m, ids, mask)[:, 0]
        for b in range(ids.shape[0]):
            ref = alti_loops(x[b], mask[b], q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight, o.bias,
                             m.num_heads, m.key_dim, m.value_dim, "concat", ln.weight, ln.eps)
            torch.testing.assert_close(got[b], torch.tensor(ref, dtype=got.dtype), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_maps_are_distributions_and_alti_ignores_the_layer_norm_bias(family):
    m = _model(family)
    ids, mask = _batch(m.pad_id)
    pair = mask[:, None, :, None] & mask[:, None, None, :]
    for fn in (value_zeroing, alti, norm_resln):
        M = fn(m, ids, mask)
        assert M.shape == (3, 2, 8, 8) and (M >= 0).all() and (M[~pair.expand_as(M)] == 0).all()
        torch.testing.assert_close(M.sum(-1), mask[:, None, :].expand(3, 2, 8).float())
    before = alti(m, ids, mask)[:, 0]
    ln = _attention_parts(family, m.family.layers(m.encoder)[0])[4]
    with torch.no_grad():
        ln.bias.add_(4.0)
    torch.testing.assert_close(alti(m, ids, mask)[:, 0], before)
    scores = explain(m, ids, mask, ["value_zeroing", "alti_layer1"])
    assert scores["value_zeroing"].shape == (3, 8) and (scores["alti_layer1"][:, 0] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_adversarial_last_layer_readout_matches_the_overridden_forward(family, pooling):
    from test_adversarial import _readout_against_override

    m = _model(family)
    m.pooling = pooling
    ids, mask = _batch(m.pad_id)
    _readout_against_override(m, ids, mask)
