import itertools

import pytest
import torch

from identifiable_transformers.models import TransformerClassifier

VOCAB = 50


def _model(**kw):
    torch.manual_seed(0)
    return TransformerClassifier(VOCAB, 3, embed_dim=16, num_heads=4, **kw).eval()


@pytest.mark.parametrize(
    "head_combine,pooling,positional,num_layers",
    [("concat", "cls", "learned", 1), ("add", "mean", "sinusoidal", 2), ("add", "cls", "none", 2)],
)
def test_logits_do_not_depend_on_padding_or_batch_mates(head_combine, pooling, positional, num_layers):
    model = _model(head_combine=head_combine, key_dim=2, pooling=pooling, positional=positional, num_layers=num_layers)
    short = torch.randint(1, VOCAB, (1, 5))
    alone = model(short).logits
    batch = torch.randint(1, VOCAB, (3, 12))
    batch[0, 5:] = 0
    batch[0, :5] = short
    mask = batch != 0
    batched = model(batch, mask).logits
    torch.testing.assert_close(batched[:1], alone, atol=1e-5, rtol=1e-5)
    # garbage ids at padded positions change nothing when the mask is given
    noisy = batch.clone()
    noisy[0, 5:] = torch.randint(1, VOCAB, (7,))
    torch.testing.assert_close(model(noisy, mask).logits, batched, atol=1e-5, rtol=1e-5)
    # ... and the explicit-softmax path agrees with the SDPA path
    torch.testing.assert_close(model(batch, mask, output_attentions=True).logits, batched, atol=1e-5, rtol=1e-5)


def test_output_attentions_shapes_and_padding():
    model = _model(head_combine="add", key_dim=1, num_layers=2)
    ids = torch.randint(1, VOCAB, (2, 6))
    ids[1, 3:] = 0
    out = model(ids, output_attentions=True)
    assert out.logits.shape == (2, 3)
    assert len(out.attentions) == 2 and all(a.shape == (2, 4, 6, 6) for a in out.attentions)
    assert torch.all(out.attentions[1][1, :, :, 3:] == 0)
    assert model(ids).attentions is None


@pytest.mark.parametrize(
    "head_combine,key_dim,norm_first,pooling",
    list(itertools.product(["concat", "add"], [1, 4, 16], [False, True], ["cls", "mean"])),
)
def test_parameters_initialised_and_all_receive_gradients(head_combine, key_dim, norm_first, pooling):
    model = TransformerClassifier(VOCAB, 3, embed_dim=16, num_heads=4, key_dim=key_dim, head_combine=head_combine,
                                  norm_first=norm_first, pooling=pooling, num_layers=2)
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all() and p.abs().max() < 10, name
    ids = torch.randint(1, VOCAB, (4, 9))
    ids[0, 6:] = 0
    model(ids).logits.logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_identifiable_variant_has_full_value_size():
    model = TransformerClassifier(VOCAB, 2, embed_dim=32, num_heads=4, key_dim=2, head_combine="add")
    assert (model.key_dim, model.value_dim) == (2, 32)
    assert model.layers[0].attn.v_proj.out_features == 4 * 32
    base = TransformerClassifier(VOCAB, 2, embed_dim=32, num_heads=4)
    assert (base.key_dim, base.value_dim) == (8, 8)


def test_internals_match_forward_for_every_layer():
    model = _model(head_combine="add", key_dim=3, num_layers=2)
    ids = torch.randint(1, VOCAB, (2, 7))
    ids[0, 4:] = 0
    with torch.no_grad():
        out = model(ids, output_attentions=True)
        inside = model.attention_internals(ids)
    assert len(inside) == 2
    for layer_att, layer_in in zip(out.attentions, inside):
        torch.testing.assert_close(layer_in.attention, layer_att)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(positional="rope"), "positional='rope'"),
        (dict(pooling="max"), "pooling='max'"),
        (dict(dropout=1.5), "dropout"),
        (dict(num_layers=0), "num_layers"),
        (dict(activation="tanh"), "activation='tanh'"),
        (dict(embed_dim=15), "embed_dim=15"),
    ],
)
def test_bad_configurations_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TransformerClassifier(VOCAB, 2, **{"embed_dim": 16, "num_heads": 4, **kwargs})


def test_input_longer_than_max_len_is_refused():
    model = TransformerClassifier(VOCAB, 2, embed_dim=8, num_heads=2, max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.ones(1, 5, dtype=torch.long))
    TransformerClassifier(VOCAB, 2, embed_dim=8, num_heads=2, max_len=4, positional="none")(torch.ones(1, 5, dtype=torch.long))
