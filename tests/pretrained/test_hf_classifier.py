"""load_hf_classifier: a Hugging Face classifier read as it is, against the Hugging Face model itself (its logits,
its tokenizer's pair encoding); special tokens kept out of explanations, checked against explicit loops; pooling."""

import pytest
import torch
from helpers import tiny_config, wordpiece_vocab

from identifiable_transformers.diagnostics.faithfulness import explain, faithfulness_report
from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.loading import load_hf_classifier

FAMILIES = ["bert", "roberta", "distilbert"]
PAIRS = (["the film was good", "bad", "a boring plot"], ["great fun and love", "no", "the acting"])


def _save_classifier(folder, family: str = "bert", num_labels: int = 3, seed: int = 0):
    from transformers import AutoModelForSequenceClassification, BertTokenizer

    vocab = wordpiece_vocab()
    config = tiny_config(family, len(vocab), positions=40)
    config.num_labels = num_labels
    config.id2label = {i: f"class_{i}" for i in range(num_labels)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    torch.manual_seed(seed)
    ref = AutoModelForSequenceClassification.from_config(config)
    ref.save_pretrained(folder)
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    return ref.eval()


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_cls")
    return folder, _save_classifier(folder)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_are_the_checkpoints_own_on_pairs(tmp_path, family):
    ref = _save_classifier(tmp_path, family)
    model, tokenizer = load_hf_classifier(str(tmp_path))
    assert type(model).__name__ == "CheckpointClassifier" and not model.training
    assert model.label_names == ["class_0", "class_1", "class_2"]
    enc = tokenizer(*PAIRS, padding=True, return_tensors="pt")  # with token_type_ids: the model derives them
    if family == "distilbert":  # no segments
        enc.pop("token_type_ids")
    with torch.no_grad():
        theirs = ref(**enc).logits
        ours = model(enc["input_ids"], enc["attention_mask"]).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_token_types_are_the_tokenizers(bert_classifier):
    folder, _ = bert_classifier
    model, tokenizer = load_hf_classifier(str(folder))
    enc = tokenizer(*PAIRS, padding=True, return_tensors="pt")
    assert bool((enc["token_type_ids"][:, -3:] == 1).any())  # a second segment is there to find
    torch.testing.assert_close(model.token_types(enc["input_ids"], enc["attention_mask"].bool()),
                               enc["token_type_ids"] * enc["attention_mask"])


def test_a_bare_encoder_gives_maps_and_refuses_faithfulness(tiny_bert):
    model, tokenizer = load_hf_classifier(str(tiny_bert))
    assert type(model).__name__ == "EncoderOnly" and not model.has_head
    enc = tokenizer(["the film was good"], return_tensors="pt")
    rep = attention_identifiability(model, enc["input_ids"], enc["attention_mask"].bool())
    assert rep["null_dim"].shape == (1, model.num_layers, model.num_heads)
    with pytest.raises(ValueError, match="is a bare encoder .* nothing for the faithfulness explainers"):
        faithfulness_report(model, enc["input_ids"], enc["attention_mask"].bool())


def _probs(model, ids, mask):
    with torch.no_grad():
        return model(ids, mask).logits.softmax(-1)


def test_special_tokens_are_neither_scored_nor_erased(bert_classifier):
    """loo against an explicit loop over the words only; comprehensiveness and sufficiency of loo's order against
    explicit erasure that keeps [CLS] and both [SEP]s."""
    folder, _ = bert_classifier
    model, tokenizer = load_hf_classifier(str(folder))
    enc = tokenizer(["the film was good and fun"], ["a boring plot"], return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    special = torch.tensor(tokenizer.get_special_tokens_mask(ids[0].tolist(), already_has_special_tokens=True)).bool()
    assert int(special.sum()) == 3
    rep = faithfulness_report(model, ids, mask, explainers=["loo"], random_draws=1)
    loo = rep["scores"]["loo"][0]
    p = _probs(model, ids, mask)[0]
    pred = int(p.argmax())
    words = (~special).nonzero().flatten().tolist()
    for j in range(ids.shape[1]):
        if j in words:
            keep = mask.clone()
            keep[0, j] = False
            assert float(loo[j]) == pytest.approx(float(p[pred] - _probs(model, ids, keep)[0, pred]), abs=1e-5)
        else:
            assert float(loo[j]) == 0.0
    order = sorted(words, key=lambda j: (-float(loo[j]), j))
    comp, suff = [], []
    for k in (1, 5, 10, 20, 50):
        c = max(1, -(-k * len(words) // 100))
        removed, kept = mask.clone(), special[None].clone()
        removed[0, order[:c]] = False
        kept[0, order[:c]] = True
        comp.append(float(p[pred] - _probs(model, ids, removed)[0, pred]))
        suff.append(float(p[pred] - _probs(model, ids, kept)[0, pred]))
    assert rep["metrics"]["loo/comprehensiveness"] == pytest.approx(sum(comp) / 5, abs=1e-5)
    assert rep["metrics"]["loo/sufficiency"] == pytest.approx(sum(suff) / 5, abs=1e-5)


def test_special_tokens_are_scored_when_asked(bert_classifier):
    folder, _ = bert_classifier
    model, tokenizer = load_hf_classifier(str(folder), score_special_tokens=True)
    enc = tokenizer(["the film was good"], ["a plot"], return_tensors="pt")
    loo = explain(model, enc["input_ids"], enc["attention_mask"].bool(), ["loo"])["loo"][0]
    sep = (enc["input_ids"][0] == tokenizer.sep_token_id).nonzero().flatten()
    assert bool((loo[sep] != 0).all()) and float(loo[0]) == 0.0  # position 0 stays the pooled token


def test_mean_pooling_ignores_padding(tiny_bert):
    from identifiable_transformers.hf.encoder import build_pretrained_classifier

    model = build_pretrained_classifier(str(tiny_bert), num_classes=2, pooling="mean").eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    padded = torch.tensor([[2, 10, 11, 12, 3, 0, 0, 0], [2, 13, 3, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        alone = model(ids, torch.ones_like(ids, dtype=torch.bool)).logits
        batch = model(padded, padded != 0).logits
        hidden = model.encoder(input_ids=ids).last_hidden_state
    torch.testing.assert_close(batch[:1], alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alone, model.head(hidden.mean(1)), rtol=1e-5, atol=1e-6)  # the mean, by hand


def test_pooling_follows_a_sentence_transformers_declaration(tiny_bert, tmp_path):
    import json
    import shutil

    from identifiable_transformers.hf.encoder import build_pretrained_classifier

    folder = shutil.copytree(tiny_bert, tmp_path / "st")
    assert build_pretrained_classifier(str(folder), 2, pooling=None).pooling == "cls"  # nothing declared
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False,
                                                                  "pooling_mode_mean_tokens": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert build_pretrained_classifier(str(folder), 2, pooling=None).pooling == "mean"
    assert build_pretrained_classifier(str(folder), 2, pooling="cls").pooling == "cls"  # model.pooling overrides


def test_load_hf_classifier_pools_as_a_sentence_transformers_folder_declares(tiny_bert, tmp_path):
    """Through load_hf_classifier itself (analyze.py hf_model=...): a bare encoder whose modules.json declares mean
    pooling explains the mean of the real queries' rows (the attention explainer against the Hugging Face model's
    own last-layer maps), not [CLS]'s; pooling= overrides the declaration."""
    import json
    import shutil

    from transformers import AutoModel, AutoTokenizer

    from identifiable_transformers.diagnostics.faithfulness.explainers import _attention_explainers

    folder = shutil.copytree(tiny_bert, tmp_path / "st")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False,
                                                                  "pooling_mode_mean_tokens": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    model, _ = load_hf_classifier(str(folder))
    assert type(model).__name__ == "EncoderOnly" and model.pooling == "mean"
    assert load_hf_classifier(str(folder), pooling="cls")[0].pooling == "cls"
    assert load_hf_classifier(str(tiny_bert))[0].pooling == "cls"  # nothing declared
    enc = AutoTokenizer.from_pretrained(folder)(["the film was good and fun", "bad"], padding=True,
                                                return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    with torch.no_grad():
        maps = AutoModel.from_pretrained(folder, attn_implementation="eager")(
            **enc, output_attentions=True).attentions[-1].mean(1)  # (B, T, T), heads averaged
    m = mask.double()[:, :, None]
    want = (maps.double() * m).sum(1) / m.sum(1)  # the mean over the real queries' rows
    got = _attention_explainers(model, ids, mask, ["attention"])["attention"]  # explain()'s, without a prediction
    torch.testing.assert_close(got.double() * mask, want * mask, rtol=0, atol=1e-6)


def test_keep_head_fine_tunes_the_checkpoints_own_head(bert_classifier):
    from identifiable_transformers.hf.module import PretrainedTextClassifier

    folder, ref = bert_classifier
    module = PretrainedTextClassifier(str(folder), num_classes=3, keep_head=True).eval()
    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    with torch.no_grad():
        torch.testing.assert_close(module.model(ids, ids != 0).logits,
                                   ref(input_ids=ids, attention_mask=(ids != 0).long()).logits, rtol=0, atol=1e-6)
    rebuilt = PretrainedTextClassifier("/nowhere", num_classes=3, keep_head=True, hf_config=module.hparams.hf_config)
    rebuilt.load_state_dict(module.state_dict())  # a Lightning checkpoint rebuilds without the folder
    with pytest.raises(ValueError, match="keep_head=true but .* 3 labels and the data 2 classes"):
        PretrainedTextClassifier(str(folder), num_classes=2, keep_head=True)


def test_keep_head_needs_a_classification_head(tiny_bert):
    from identifiable_transformers.hf.module import PretrainedTextClassifier

    with pytest.raises(ValueError, match="keep_head=true but .* has no classification head"):
        PretrainedTextClassifier(str(tiny_bert), num_classes=2, keep_head=True)


def test_two_text_fields_are_encoded_as_the_tokenizers_pair(tiny_bert, tmp_path):
    from transformers import AutoTokenizer

    from identifiable_transformers.hf.data import PretrainedTextDataModule

    words = "the a film movie good bad great plot acting fun dull story".split()
    rows = [(" ".join(words[i % 12:] + words[:i % 5]), " ".join(words[i % 7:i % 7 + 2 + i % 4]), i % 2)
            for i in range(30)]
    csv = tmp_path / "pairs.csv"
    csv.write_text("premise,hypothesis,label\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows))
    dm = PretrainedTextDataModule(pretrained_tokenizer=str(tiny_bert), name="pairs", source="local",
                                  train_file=str(csv), text_fields=["premise", "hypothesis"], max_length=12,
                                  splits={"train": "train", "validation": None, "test": None},
                                  test_fraction=0.0, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("fit")
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    expected = {tuple(tokenizer(a, b, truncation=True, max_length=12)["input_ids"]) for a, b, _ in rows}
    got = [tuple(x) for d in (dm.train_dataset, dm.val_dataset) for x in d["input_ids"]]
    assert len(got) == 30 and set(got) <= expected
    assert any(len(g) == 12 for g in got) and all(g.count(tokenizer.sep_token_id) == 2 for g in got)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra"])
def test_kept_logits_are_the_masked_forwards(tmp_path, family):
    """kept_logits (the kept tokens run as a shorter sequence at their own positions and segments: how erasure's
    copies run) against the model's forward with the dropped tokens masked out, on pairs, separators dropped too."""
    _save_classifier(tmp_path, family)
    model, tokenizer = load_hf_classifier(str(tmp_path))
    enc = tokenizer(*PAIRS, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"].repeat(4, 1), enc["attention_mask"].bool().repeat(4, 1)
    keep = mask & (torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.6)
    keep[:, 0] = True
    keep[-1] = mask[-1]  # one copy keeps everything
    assert bool((mask & ~keep & (ids == tokenizer.sep_token_id)).any())  # a separator is dropped somewhere
    assert model.keeps_positions
    with torch.no_grad():
        torch.testing.assert_close(model.kept_logits(ids, keep), model(ids, keep).logits, rtol=1e-4, atol=1e-5)


def test_relative_and_windowed_positions_do_not_keep_positions():
    from identifiable_transformers.hf.adapters import FAMILIES as ADAPTERS

    assert {f.name for f in ADAPTERS if f.positions is None} == {"deberta-v2", "modernbert"}


@pytest.mark.parametrize("fields, pairs", [(["text"], False), (["premise", "hypothesis"], True)])
def test_model_pretrained_reads_segments_only_from_pair_data(bert_classifier, fields, pairs):
    """model=pretrained: a single text holding [SEP] keeps the tokenizer's token types (all 0); two text fields are
    the tokenizer's pair (1 after the first [SEP])."""
    from transformers import AutoTokenizer

    from identifiable_transformers.hf.module import PretrainedTextClassifier

    folder, _ = bert_classifier
    tokenizer = AutoTokenizer.from_pretrained(folder)
    module = PretrainedTextClassifier(str(folder), num_classes=2, tokenizer_json=tokenizer.backend_tokenizer.to_str(),
                                      data_cfg={"text_fields": fields})
    enc = tokenizer("the film [SEP] was good", return_tensors="pt") if not pairs else tokenizer(
        "the film", "was good", return_tensors="pt")
    types = module.model.token_types(enc["input_ids"], enc["attention_mask"].bool())
    assert enc["input_ids"][0].tolist().count(tokenizer.sep_token_id) == 2
    assert (types is None and not enc["token_type_ids"].any()) if not pairs else types.tolist() == enc[
        "token_type_ids"].tolist()
