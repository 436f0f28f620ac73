import torch

from identifiable_transformers.data import (
    CLS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    encode_texts,
    load_tokenizer,
    save_tokenizer,
    tokenizer_from_str,
    train_tokenizer,
)
from identifiable_transformers.data.tokenizer import pad_batch

CORPUS = ["The cat sat on the mat.", "A dog, a CAT and a bird!", "the bird sat"] * 3


def test_specials_and_cls_first():
    tok = train_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    enc = tok.encode("The CAT, sat!")
    assert enc.tokens == ["<cls>", "the", "cat", ",", "sat", "!"]  # lower-case + punctuation split
    assert enc.ids[0] == CLS_ID
    assert tok.encode("zebra").tokens == ["<cls>", "<unk>"]


def test_vocab_cap_and_min_frequency():
    corpus = ["alpha alpha alpha beta beta gamma"] * 2  # counts: alpha 6, beta 4, gamma 2
    tok = train_tokenizer(corpus, vocab_size=6, min_frequency=1)
    assert tok.get_vocab_size() == 6  # 4 specials + 2 most frequent words
    assert tok.token_to_id("alpha") is not None and tok.token_to_id("gamma") is None
    tok = train_tokenizer(corpus, vocab_size=100, min_frequency=3)
    assert set(tok.get_vocab()) == set(SPECIAL_TOKENS) | {"alpha", "beta"}


def test_save_load_round_trip(tmp_path):
    tok = train_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    p = save_tokenizer(tok, tmp_path)  # directory → tokenizer.json
    assert p.name == "tokenizer.json" and p.is_file()
    tok2 = load_tokenizer(tmp_path)
    tok3 = tokenizer_from_str(tok.to_str())
    texts = ["the mat and the dog", "unknownword sat!", "Bird, cat."]
    for t in (tok2, tok3):
        assert [e.ids for e in t.encode_batch(texts)] == [e.ids for e in tok.encode_batch(texts)]


def test_encode_texts_truncates_and_pads_dynamically():
    tok = train_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    out = encode_texts(tok, ["the cat", "the cat sat on the mat and a dog"], max_length=5)
    ids, mask = out["input_ids"], out["attention_mask"]
    assert set(out) == {"input_ids", "attention_mask"}
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == (2, 5)  # longest (truncated to max_length)
    assert ids[:, 0].tolist() == [CLS_ID, CLS_ID]
    assert mask[0].tolist() == [True, True, True, False, False]
    assert ids[0, 3:].tolist() == [PAD_ID, PAD_ID]
    out = encode_texts(tok, ["the cat", "the"], max_length=50)
    assert out["input_ids"].shape == (2, 3)  # T = longest in batch, not max_length


def test_pad_batch_independent_expectation():
    ids, mask = pad_batch([[2, 5, 6], [2], [2, 7]])
    assert ids.tolist() == [[2, 5, 6], [2, 0, 0], [2, 7, 0]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
