"""The synthetic tasks under a pretrained tokenizer (model=pretrained): a sentence must fit data.max_length word
pieces, [CLS] and [SEP] included, or the build is refused (hf/data.py). Tested at the exact limit on both sides,
against the Hugging Face tokenizer's own encoding of the generated sentences."""

import pytest
from transformers import AutoTokenizer

from identifiable_transformers.data.synthetic import SyntheticSpec, generate
from identifiable_transformers.hf.data import PretrainedTextDataModule

SPEC = dict(task="order", size=60, min_length=4, max_length=8, vocab=30, num_classes=3, num_keywords=[2, 2], seed=0)


def _module(tiny_bert, tmp_path, max_length):
    return PretrainedTextDataModule(pretrained_tokenizer=str(tiny_bert), name="synthetic_order", source="synthetic",
                                    synthetic=SPEC, rationale_field="rationale", max_length=max_length,
                                    splits={"train": "train", "validation": None, "test": None},
                                    cache_dir=str(tmp_path / f"cache{max_length}"))


@pytest.fixture(scope="module")
def encoded(tiny_bert):
    """The generated sentences as the checkpoint's own tokenizer encodes them, special tokens included."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    texts = generate(SyntheticSpec.from_config(SPEC))["text"].tolist()
    return [tokenizer(t)["input_ids"] for t in texts]


def test_the_longest_sentence_fits_exactly_and_is_kept_whole(tiny_bert, tmp_path, encoded):
    longest = max(len(e) for e in encoded)
    assert sum(len(e) == longest for e in encoded) >= 1 and longest > SPEC["max_length"] + 2  # words split in pieces
    dm = _module(tiny_bert, tmp_path, longest)
    dm.prepare_data()
    dm.setup("fit")
    got = sorted(tuple(x) for d in (dm.train_dataset, dm.val_dataset, dm.test_dataset) if d is not None
                 for x in d["input_ids"])
    assert got == sorted(tuple(e) for e in encoded)  # every sentence whole, its last word and [SEP] kept


def test_one_piece_less_is_refused(tiny_bert, tmp_path, encoded):
    longest = max(len(e) for e in encoded)
    over = sum(len(e) > longest - 1 for e in encoded)
    dm = _module(tiny_bert, tmp_path, longest - 1)
    with pytest.raises(ValueError, match=rf"^synthetic: {over} of {len(encoded)} sentences are longer than "
                                         rf"data.max_length={longest - 1} word pieces .* \(the longest: {longest};"):
        dm.prepare_data()
