"""Context-mixing maps of the pretrained families against independent computations: each block's ``finish``
against the Hugging Face layers' own outputs; value zeroing against forward hooks on the Hugging Face value
projection and a rerun of the model; ALTI of the first layer against explicit loops over the Hugging Face
modules' own weights (tests/diagnostics/test_context_mixing.py) where the scores are Q K^T (not DeBERTa's
relative terms, not ModernBERT's rotations), and the token decomposition against the normed residual sum the
Hugging Face modules compute."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from helpers import forward_hooks, tiny_config
from torch import nn

from identifiable_transformers.diagnostics import alti, norm_resln, value_zeroing
from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS, explain, faithfulness_report
from identifiable_transformers.diagnostics.faithfulness.context_mixing import token_decomposition
from identifiable_transformers.hf.adapters import ATTENTION, family_for, register_attention
from identifiable_transformers.hf.blocks import context_mixing_unsupported
from identifiable_transformers.hf.encoder import PretrainedClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnostics"))
from test_adversarial import _readout_against_override  # noqa: E402
from test_context_mixing import _vz_reference, alti_loops  # noqa: E402

FAMILIES = ["bert", "roberta", "distilbert", "electra", "deberta-v2", "modernbert"]
# Whose attention scores are q k^T / sqrt(d_h) of linear projections of the layer input (alti_loops' model)
QK_FAMILIES = ["bert", "roberta", "distilbert", "electra"]
# ModernBERT's Wo has a bias only with attention_bias (default False): both kinds of block
BLOCK_CASES = [(f, {}) for f in FAMILIES] + [("modernbert", {"attention_bias": True})]
VOCAB = 60


def _model(family: str, **config_kw) -> PretrainedClassifier:
    from transformers import AutoModel

    register_attention()
    torch.manual_seed(0)
    config = tiny_config(family, VOCAB, heads=4, layers=2, positions=40)
    for k, v in config_kw.items():
        setattr(config, k, v)
    encoder = AutoModel.from_config(config, attn_implementation=ATTENTION)
    with torch.no_grad():  # LayerNorm weights and biases away from 1 and 0, larger biases
        for name, p in encoder.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    pad = 1 if family == "roberta" else 0
    return PretrainedClassifier(encoder, family_for(config), num_classes=3, pad_id=pad).eval()


def _batch(pad: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (3, 8), generator=g)
    ids[1, 5:] = pad
    ids[2, 3:] = pad
    return ids, ids != pad


def _layer_outputs(m, ids, mask) -> list[torch.Tensor]:
    """Each Hugging Face layer's own output (B, T, d), by forward hooks during one pass of the model."""
    outs = []

    def record(_i):
        return lambda _m, _a, o: outs.append(o[0] if isinstance(o, tuple) else o)

    with forward_hooks(m.family.layers(m.encoder), record), torch.no_grad():
        m(ids, mask)
    return outs


@pytest.mark.parametrize("family,config_kw", BLOCK_CASES)
def test_finish_gives_each_layers_own_output(family, config_kw):
    """finish(x, attention output) of every block = what the Hugging Face layer outputs (the next layer's input;
    ModernBERT's last one before final_norm), on the real positions of a padded batch."""
    m = _model(family, **config_kw)
    ids, mask = _batch(m.pad_id)
    with torch.no_grad():
        blocks = m.encoder_blocks(ids, mask)
        got = [blk.finish(blk.x, blk.attention_output()) for blk in blocks]
    want = _layer_outputs(m, ids, mask)
    assert len(got) == len(want) == 2
    assert (blocks[0].out_bias is None) == (family == "modernbert" and not config_kw)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g[mask], w[mask], atol=1e-5, rtol=1e-4, msg=f"{family} layer {i}")
        if i + 1 < len(blocks):
            torch.testing.assert_close(blocks[i + 1].x[mask], w[mask], atol=1e-6, rtol=1e-5)


class _ValueTap(nn.Module):
    """ModernBERT's fused Wqkv with its value third passed through ``value`` (an identity to hook): the value
    rows ``_vz_reference`` zeroes; queries and keys untouched."""

    def __init__(self, wqkv: nn.Linear):
        super().__init__()
        self.wqkv, self.value = wqkv, nn.Identity()

    def forward(self, x):
        qk, v = self.wqkv(x).tensor_split([2 * self.wqkv.out_features // 3], dim=-1)  # (q | k | v), head-major
        return torch.cat([qk, self.value(v)], -1)


def _value_modules(m, layers) -> list[nn.Module]:
    if m.family.name != "modernbert":
        return [m.family.value(layer) for layer in layers]
    for layer in layers:
        layer.attn.Wqkv = _ValueTap(layer.attn.Wqkv)
    return [layer.attn.Wqkv.value for layer in layers]


@pytest.mark.parametrize("family", FAMILIES)
def test_value_zeroing_matches_hooked_reruns(family):
    m = _model(family).double()  # float64: the reference's 1 - cos of nearly equal outputs needs it
    ids, mask = _batch(m.pad_id)
    layers = list(m.family.layers(m.encoder))
    ref = _vz_reference(m, ids, mask, layers, _value_modules(m, layers))
    torch.testing.assert_close(value_zeroing(m, ids, mask), ref.float(), atol=1e-6, rtol=1e-5)
    # In float32 too: a pretrained init's outputs move by ~1e-5 (cosine distance), where 1 - cos cancels.
    torch.testing.assert_close(value_zeroing(m.float(), ids, mask), ref.float(), atol=1e-4, rtol=1e-3)


def _attention_parts(family, layer):
    """(query, key, value, output projection, the LayerNorm after the attention residual or None)."""
    if family == "distilbert":
        a = layer.attention
        return a.q_lin, a.k_lin, a.v_lin, a.out_lin, layer.sa_layer_norm
    if family == "deberta-v2":
        s, o = layer.attention.self, layer.attention.output
        return s.query_proj, s.key_proj, s.value_proj, o.dense, o.LayerNorm
    if family == "modernbert":  # fused Wqkv; pre-norm: no LayerNorm on the residual sum
        return None, None, None, layer.attn.Wo, None
    s, o = layer.attention.self, layer.attention.output
    return s.query, s.key, s.value, o.dense, o.LayerNorm


@pytest.mark.parametrize("family", QK_FAMILIES)
def test_alti_first_layer_matches_loops_over_the_weights(family):
    m = _model(family).double()
    ids, mask = _batch(m.pad_id)
    q, k, v, o, ln = _attention_parts(family, m.family.layers(m.encoder)[0])
    with torch.no_grad():
        emb = m.encoder.embeddings
        x = emb(ids) if family == "distilbert" else emb(input_ids=ids)
        if family == "electra":  # electra-small's embeddings are narrower than the hidden size: projected up
            x = m.encoder.embeddings_project(x)
        got = alti(m, ids, mask)[:, 0]
        for b in range(ids.shape[0]):
            ref = alti_loops(x[b], mask[b], q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight, o.bias,
                             m.num_heads, m.key_dim, m.value_dim, "concat", ln.weight, ln.eps, ln.bias)
            torch.testing.assert_close(got[b], torch.tensor(ref, dtype=got.dtype), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_maps_are_distributions_and_alti_follows_the_layer_norm_bias(family):
    m = _model(family)
    ids, mask = _batch(m.pad_id)
    pair = mask[:, None, :, None] & mask[:, None, None, :]
    for fn in (value_zeroing, alti, norm_resln):
        M = fn(m, ids, mask)
        assert M.shape == (3, 2, 8, 8) and (M >= 0).all() and (M[~pair.expand_as(M)] == 0).all()
        torch.testing.assert_close(M.sum(-1), mask[:, None, :].expand(3, 2, 8).float())
    ln = _attention_parts(family, m.family.layers(m.encoder)[0])[4]
    if ln is not None:  # ALTI's y_i is the LayerNorm output, beta included (Ferrando et al.): beta moves it
        before = alti(m, ids, mask)[:, 0]
        with torch.no_grad():
            ln.bias.add_(4.0)
        assert not torch.allclose(alti(m, ids, mask)[:, 0], before, atol=1e-4)
    scores = explain(m, ids, mask, ["value_zeroing", "alti_layer1"])
    assert scores["value_zeroing"].shape == (3, 8) and (scores["alti_layer1"][:, 0] == 0).all()


@pytest.mark.parametrize("family,config_kw", BLOCK_CASES)
def test_token_decomposition_sums_to_the_hugging_face_residual(family, config_kw):
    """sum_j T_i(x_j) = LN(z_i) - beta - gamma (b_o - mean b_o) / s_i with z = x + a the input of the LayerNorm
    after the attention residual and s_i its standard deviation, both read by hooks on that Hugging Face module
    (post-norm); = z_i - b_o with z the input of ModernBERT's mlp_norm (pre-norm, no LayerNorm on the sum)."""
    m = _model(family, **config_kw).double()
    ids, mask = _batch(m.pad_id)
    layers = m.family.layers(m.encoder)
    seen = {}

    def grab(i):
        def hook(_mod, args, out):
            seen[i] = (args[0], out)
        return hook

    after = [_attention_parts(family, layer)[4] or layer.mlp_norm for layer in layers]
    with forward_hooks(after, grab), torch.no_grad():
        blocks = m.encoder_blocks(ids, mask)
    for i, (blk, ln) in enumerate(zip(blocks, after)):
        z, normed = seen[i]
        b_o = _attention_parts(family, layers[i])[3].bias
        b_o = torch.zeros_like(z[0, 0]) if b_o is None else b_o
        if blk.norm is None:
            want = z - b_o
        else:
            s = (z.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
            want = normed - ln.bias - ln.weight * (b_o - b_o.mean()) / s
        Td = token_decomposition(blk.internals.attention, torch.einsum("bhtv,hvd->bhtd", blk.internals.values,
                                 blk.internals.out_proj), blk.x, blk.out_bias, blk.norm)
        got = (Td * mask[:, None, :, None]).sum(2)
        torch.testing.assert_close(got[mask], want[mask], atol=1e-8, rtol=1e-6, msg=f"{family} layer {i}")


@pytest.mark.parametrize("family", FAMILIES)
def test_faithfulness_report_scores_every_family(family):
    """The default explainers (context mixing included) run on every family: finite comprehensiveness."""
    m = _model(family)
    with torch.no_grad():
        m.head.weight.normal_()  # a head that separates the classes, so erasing tokens moves the probability
    ids, mask = _batch(m.pad_id)
    metrics = faithfulness_report(m, ids, mask, explainers=CHEAP_EXPLAINERS)["metrics"]
    for name in ("value_zeroing", "alti", "norm_resln"):
        assert torch.isfinite(torch.tensor(metrics[f"{name}/comprehensiveness"])), name


def test_deberta_with_a_convolution_and_unknown_families_are_refused():
    assert context_mixing_unsupported(_model("deberta-v2")) is None
    m = _model("deberta-v2", conv_kernel_size=3)
    assert m.encoder.encoder.conv is not None and "convolution" in context_mixing_unsupported(m)
    ids, mask = _batch(m.pad_id)
    with pytest.raises(ValueError, match="convolution over neighbouring tokens"):
        value_zeroing(m, ids, mask)
    # The faithfulness callback leaves them out up front (with a warning), not after the first epoch...
    from identifiable_transformers.diagnostics.callbacks.faithfulness import FaithfulnessCallback

    cb = FaithfulnessCallback()
    cb._drop_unsupported(m)
    assert cb.explainers == [e for e in CHEAP_EXPLAINERS if e not in ("value_zeroing", "alti", "norm_resln")]
    with pytest.raises(ValueError, match="pick others"):
        FaithfulnessCallback(explainers=["alti_layer0"])._drop_unsupported(m)
    # ...and the adversarial search runs whole forward passes on it (the last layer's readout needs its blocks)
    from identifiable_transformers.diagnostics.faithfulness.last_layer import LastLayerReadout

    assert not LastLayerReadout.applies(m) and LastLayerReadout.applies(_model("deberta-v2"))
    m = _model("bert")
    m.family = dataclasses.replace(m.family, name="gpt-9")
    with pytest.raises(ValueError, match="'gpt-9'"):
        alti(m, ids, mask)


@pytest.mark.parametrize("family,pooling", [(f, "cls") for f in FAMILIES] + [("modernbert", "mean")])
def test_adversarial_last_layer_readout_runs_a_checkpoints_own_head(family, pooling):
    """A *ForSequenceClassification analysed as it is (CheckpointClassifier): the readout's logits, through the
    checkpoint's own head (BERT's pooler, RoBERTa's and ELECTRA's heads, DistilBERT's pre-classifier, DeBERTa's
    context pooler, ModernBERT's head on its cls or mean pooling), against the whole task model with the rows
    overridden."""
    from transformers import AutoModelForSequenceClassification

    from identifiable_transformers.hf.sequence_classifier import CheckpointClassifier

    register_attention()
    torch.manual_seed(0)
    config = tiny_config(family, VOCAB, heads=4, layers=2, positions=40)
    config.num_labels = 3
    if family == "modernbert":
        config.classifier_pooling = pooling
    task = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    with torch.no_grad():  # biases away from 0, so that a head that dropped one would show
        for name, p in task.named_parameters():
            if name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    m = CheckpointClassifier(task, family_for(config), pad_id=1 if family == "roberta" else 0).eval()
    assert m.pooling == pooling
    ids, mask = _batch(m.pad_id)
    _readout_against_override(m, ids, mask)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_adversarial_last_layer_readout_matches_the_overridden_forward(family, pooling):
    m = _model(family)
    m.pooling = pooling
    ids, mask = _batch(m.pad_id)
    _readout_against_override(m, ids, mask)
