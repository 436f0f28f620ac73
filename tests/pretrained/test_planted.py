"""What the pretrained classifier reads from a Hugging Face encoder, each against the encoder itself:

* the per-head output maps: the heads' outputs sum to the output projection's output without its bias (a head
  split in the wrong order leaves null dims and effective attention unchanged, but not this sum);
* how many tokens a family's positions allow: exactly the longest input the encoder runs (RoBERTa numbers
  positions from pad_token_id + 1: 130 tokens for 132 position rows);
* pooling: a text alone and the same text in a padded batch get the same logits (mean pooling over real tokens);
* the tokenized-data cache: two checkpoints' tokenizers never share a cache entry (each run's ids are its own
  tokenizer's, read with transformers' tokenizer).
"""

import json

import hydra
import pytest
import torch
from helpers import WORDS, forward_hooks, save_tiny_bert, tiny_config

from identifiable_transformers.hf.adapters import ATTENTION, family_for, register_attention
from identifiable_transformers.hf.encoder import PretrainedClassifier

FAMILIES = [("bert", 4), ("roberta", 2), ("xlm-roberta", 4), ("distilbert", 4)]
VOCAB = 60


def _classifier(family: str, heads: int = 4, positions: int = 40, **kwargs) -> PretrainedClassifier:
    from transformers import AutoModel

    register_attention()
    torch.manual_seed(0)
    encoder = AutoModel.from_config(tiny_config(family, VOCAB, heads=heads, positions=positions),
                                    attn_implementation=ATTENTION)
    return PretrainedClassifier(encoder, family_for(encoder.config), num_classes=3, **kwargs).eval()


def _batch(model, lengths):
    ids = torch.randint(5, VOCAB, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids[~mask] = model.pad_id
    return ids, mask


@pytest.mark.parametrize("family,heads", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_the_heads_outputs_sum_to_the_output_projection_without_its_bias(family, heads):
    model = _classifier(family, heads)
    ids, mask = _batch(model, [11, 6])
    seen = {}
    outputs = [model.family.output(layer) for layer in model.family.layers(model.encoder)]
    with forward_hooks(outputs, lambda i: lambda mod, inputs, output: seen.__setitem__(i, output - mod.bias)), \
            torch.no_grad():
        internals = model.attention_internals(ids, mask)
    assert len(internals) == len(seen) == 2
    for i, inner in enumerate(internals):
        assert inner.head_output.shape[1] == heads
        torch.testing.assert_close(inner.head_output.sum(1), seen[i], rtol=1e-5, atol=1e-5)


def _runs(encoder, length: int) -> bool:
    try:
        with torch.no_grad():
            encoder(input_ids=torch.full((1, length), 7), attention_mask=torch.ones(1, length, dtype=torch.long))
    except (IndexError, RuntimeError):
        return False
    return True


@pytest.mark.parametrize("family", [f for f, _ in FAMILIES])
def test_max_len_is_the_longest_input_the_encoder_runs(family):
    model = _classifier(family, positions=130)
    longest = max(n for n in range(126, 135) if _runs(model.encoder, n))  # brute force, on the encoder itself
    assert longest == 130 and model.max_len == longest
    with pytest.raises(ValueError, match=f"max_len={longest + 1} is longer than the {longest} tokens .* set it to {longest} or less"):
        _classifier(family, positions=130, max_len=longest + 1)
    with pytest.raises(ValueError, match=f"input length {longest + 1} exceeds max_len={longest}"):
        model(torch.full((1, longest + 1), 7))
    assert model(torch.full((1, longest), 7)).logits.shape == (1, 3)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_a_text_alone_and_in_a_padded_batch_gets_the_same_logits(family, pooling):
    model = _classifier(family, pooling=pooling)
    ids, mask = _batch(model, [5, 17])
    with torch.no_grad():
        alone = model(ids[:1, :5], mask[:1, :5]).logits
        batched = model(ids, mask).logits
    torch.testing.assert_close(batched[:1], alone, rtol=1e-5, atol=1e-6)
    if pooling == "mean":  # the mean over the 5 real tokens' last hidden states, by hand
        with torch.no_grad():
            x = model(ids[:1, :5], mask[:1, :5]).hidden_states[0]
        torch.testing.assert_close(alone[0], model.head(x.mean(0)), rtol=1e-5, atol=1e-6)


def test_two_checkpoints_tokenizers_never_share_a_cache_entry(make_cfg, tmp_path):
    from transformers import AutoTokenizer

    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 5)) for i in range(40)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    ids_of = {}
    for name, vocab_seed in (("first", None), ("second", 1)):  # the same words under other ids
        folder = save_tiny_bert(tmp_path / name, vocab_seed=vocab_seed)
        cfg = make_cfg("model=pretrained", f"model.name_or_path={folder}", "data=local", f"data.train_file={train}",
                       "data.max_length=16", fast=False)
        dm = hydra.utils.instantiate(cfg.data, _convert_="all")
        dm.prepare_data()
        dm.setup("fit")
        theirs = AutoTokenizer.from_pretrained(folder)
        expected = {tuple(theirs(t, truncation=True, max_length=16)["input_ids"]) for t in texts}
        got = {tuple(r) for split in (dm.train_dataset, dm.val_dataset, dm.test_dataset)
               for r in split["input_ids"]}
        assert got <= expected, name
        ids_of[name] = got
    assert ids_of["first"] != ids_of["second"]
