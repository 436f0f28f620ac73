"""analyze.py and the HTML report: self-contained output, correct per-head numbers, clear errors."""

import json
import math
import re
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from identifiable_transformers.diagnostics.render.report_html import build_report, tokens_for_batch
from identifiable_transformers.models import TransformerClassifier
from identifiable_transformers.modules.classifier import TextClassifier

ROOT = Path(__file__).resolve().parents[2]
WORDS = "the a film movie good bad great dull funny boring plot acting long short very not".split()


def _tokenizer():
    vocab = {"<pad>": 0, "<unk>": 1, "<cls>": 2, "<sep>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return tok


def test_build_report_is_self_contained_and_consistent(tmp_path):
    torch.manual_seed(0)
    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, positional="sinusoidal").eval()
    texts = ["good film", "the film was very long and the plot very dull not funny at all great acting though"]
    enc = [tok.encode(t).ids for t in texts]
    ids = torch.zeros(2, max(map(len, enc)), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    mask = ids != 0
    tokens = tokens_for_batch(tok, ids, mask)
    assert tokens[0] == ["good", "film"]
    path = build_report(model, ids, mask, tmp_path, tokens=tokens, texts=texts, label_names=["neg", "pos"],
                        key_aware=True)
    page = path.read_text()
    # self-contained: no pictures and nothing fetched; each example's maps are data its inline script draws
    assert "<img" not in page and "data:image/png" not in page
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page) and "fetch(" not in page
    assert page.count("<script type='application/json' id='ex") == 2
    assert "identifiable up to <b>n = 4</b>" in page  # concat, d/h = 4
    assert (tmp_path / "example0.png").stat().st_size > 1000 and (tmp_path / "example1.png").is_file()
    heads = json.loads((tmp_path / "report.json").read_text())["heads"]
    assert len(heads) == 2 * 1 * 2
    for r in heads:
        n = r["length"]
        assert r["null_dim"] == max(0, n - 4) and r["stochastic_null_dim"] == max(0, n - 5)
        assert r["witness_rel_error"] <= 1e-6
        assert (r["alt_attention_tv"] > 0) == (r["stochastic_null_dim"] > 0)
        assert r["key_agnostic_dim"] == n * r["stochastic_null_dim"]
    # one verdict per head from the closed form (d/h = 4): example 0 (n = 2) yes, example 1 (n > 5) no
    assert [r["length"] <= 4 for r in heads] == [True, True, False, False] and heads[-1]["length"] > 5
    assert page.count('<span class="ok">identifiable</span>') == 2
    assert page.count('<span class="bad">not identifiable</span>') == 2


def test_key_aware_report_on_a_long_text(tmp_path):
    # 300 tokens, beyond the old dense Jacobian's reach. Concat head, d_k = d_v = 4: a generic head can
    # generate 4 (n - 5) of the n (n - 5) key-agnostic alternatives (docs/identifiability.md 2.5).
    torch.manual_seed(0)
    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, positional="sinusoidal").eval()
    words = [WORDS[i] for i in torch.randint(0, len(WORDS), (300,), generator=torch.Generator().manual_seed(1))]
    ids = torch.tensor([tok.encode(" ".join(words)).ids])
    mask = ids != 0
    build_report(model, ids, mask, tmp_path, tokens=tokens_for_batch(tok, ids, mask), texts=[" ".join(words)],
                 label_names=["neg", "pos"], key_aware=True)
    heads = json.loads((tmp_path / "report.json").read_text())["heads"]
    assert [r["length"] for r in heads] == [300, 300]
    for r in heads:
        assert r["key_agnostic_dim"] == 300 * 295
        assert r["key_aware_alternative_dim"] == 4 * 295


@pytest.mark.parametrize("threshold", [0.0, math.inf])
def test_key_aware_report_labels_unresolved_counts(tmp_path, monkeypatch, threshold):
    """A count whose margin is below UNRESOLVED_MARGIN is labelled in the page and flagged in report.json."""
    from identifiable_transformers.diagnostics.maths import key_aware

    monkeypatch.setattr(key_aware, "UNRESOLVED_MARGIN", threshold)  # 0: every count resolved; inf: none
    torch.manual_seed(0)
    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2).eval()
    ids = torch.tensor([tok.encode(" ".join(WORDS[:12])).ids])
    mask = ids != 0
    page = build_report(model, ids, mask, tmp_path, tokens=tokens_for_batch(tok, ids, mask), key_aware=True,
                        faithfulness=False).read_text()
    heads = json.loads((tmp_path / "report.json").read_text())["heads"]
    assert [r["key_aware_resolved"] for r in heads] == [threshold == 0.0] * 2
    assert all(r["key_aware_margin"] is None or r["key_aware_margin"] > 0 for r in heads)
    assert page.count("unresolved (margin") == (0 if threshold == 0.0 else 2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    tok = _tokenizer()
    module = TextClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, head_combine="add", key_dim=2,
                            label_names=["neg", "pos"], tokenizer_json=tok.to_str())
    ids = torch.randint(4, tok.get_vocab_size(), (8, 6))
    data = [{"input_ids": ids[i], "attention_mask": torch.ones(6, dtype=torch.bool), "labels": torch.tensor(i % 2)}
            for i in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp)
    trainer.fit(module, train_dataloaders=loader)
    path = tmp / "model.ckpt"
    trainer.save_checkpoint(path)
    return path


def _run_analyze(overrides):
    sys.path.insert(0, str(ROOT))
    try:
        import analyze
    finally:
        sys.path.remove(str(ROOT))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="analyze", overrides=overrides)
    return analyze.main.__wrapped__(cfg)


def test_analyze_text_and_texts_file(checkpoint, tmp_path):
    out = tmp_path / "a"
    path = Path(_run_analyze([f"ckpt_path={checkpoint}", "text=a very good film", f"output_dir={out}"]))
    assert path == out / "report.html" and "Example 0" in path.read_text()
    heads = json.loads((out / "report.json").read_text())["heads"]
    assert [h["length"] for h in heads] == [4, 4]  # <unk> for 'a' is still a token; add heads: d = 8
    assert all(h["null_dim"] == 0 for h in heads)

    texts = tmp_path / "texts.txt"
    texts.write_text("good film\n\nthe plot was dull and the acting bad\n")
    out = tmp_path / "b"
    _run_analyze([f"ckpt_path={checkpoint}", f"texts_file={texts}", f"output_dir={out}"])
    assert len(json.loads((out / "report.json").read_text())["heads"]) == 2 * 2


def test_analyze_errors_are_clear(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="ckpt_path"):
        _run_analyze([f"ckpt_path={tmp_path / 'missing.ckpt'}", "text=good", f"output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="empty"):
        _run_analyze([f"ckpt_path={checkpoint}", "text=' '", f"output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="exactly one"):
        _run_analyze([f"ckpt_path={checkpoint}", f"output_dir={tmp_path}"])


def _tiny_batch(tok):
    texts = ["good film very long", "the plot was dull and not funny"]
    enc = [tok.encode(t).ids for t in texts]
    ids = torch.zeros(2, max(map(len, enc)), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    return texts, ids, ids != 0


def _strips(page: str, explainer: str) -> list[list[float]]:
    rows = re.findall(rf"<tr data-explainer='{explainer}'>(.*?)</tr>", page)
    return [[float(x) for x in re.findall(r"data-score='([^']+)'", r)] for r in rows]


def test_report_has_a_heat_strip_per_explainer_with_the_attention_row(tmp_path):
    from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS

    torch.manual_seed(0)
    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, positional="sinusoidal").eval()
    texts, ids, mask = _tiny_batch(tok)
    page = build_report(model, ids, mask, tmp_path, tokens=tokens_for_batch(tok, ids, mask), texts=texts).read_text()
    for e in CHEAP_EXPLAINERS:
        assert len(_strips(page, e)) == 2, e
    # independent reference: the forward pass's last-layer attention, position 0's row, mean over heads
    with torch.no_grad():
        att = model(ids, mask, output_attentions=True).attentions[-1][:, :, 0, :].mean(1)
    for b, strip in enumerate(_strips(page, "attention")):
        n = int(mask[b].sum())
        assert strip == pytest.approx(att[b, 1:n].tolist(), rel=1e-4, abs=1e-6)
    faith = json.loads((tmp_path / "report.json").read_text())["faithfulness"]
    assert [f["example"] for f in faith] == [0, 1] and set(faith[0]["metrics"]) == set(CHEAP_EXPLAINERS)


def test_report_strip_shading_and_metrics_beside_it(tmp_path, monkeypatch):
    from identifiable_transformers.diagnostics.render import report_html

    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, positional="sinusoidal").eval()
    texts, ids, mask = _tiny_batch(tok)
    B, T = ids.shape
    scores = torch.zeros(B, T)
    scores[0, 1:4] = torch.tensor([2.0, -4.0, 1.0])
    fake = {"scores": {"grad_input": scores},
            "per_example": {"grad_input/comprehensiveness": torch.tensor([0.123, 0.5]),
                            "grad_input/sufficiency": torch.tensor([-0.25, 0.0]),
                            "grad_input/tau_loo": torch.tensor([float("nan"), 0.75]),
                            "grad_input/flip_frac": torch.tensor([1.0, 0.2])}}
    monkeypatch.setattr(report_html, "_faithfulness", lambda *a: fake)
    page = build_report(model, ids, mask, tmp_path, tokens=tokens_for_batch(tok, ids, mask), texts=texts).read_text()
    row = re.findall(r"<tr data-explainer='grad_input'>(.*?)</tr>", page)[0]
    assert _strips(page, "grad_input")[0] == [2.0, -4.0, 1.0]  # tokens 1..n-1 of example 0 (n = 4)
    assert "rgba(214,39,40,0.500)'>film<" in row and "rgba(31,119,180,1.000)'>very<" in row
    assert "rgba(214,39,40,0.250)'>long<" in row
    assert "<td>0.123</td><td>-0.250</td><td>n/a</td><td>1.000</td>" in row
    assert json.loads((tmp_path / "report.json").read_text())["faithfulness"][0]["metrics"]["grad_input"]["tau_loo"] is None


def test_rationale_tokens_are_marked_on_every_strip(tmp_path):
    from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS

    torch.manual_seed(0)
    tok = _tokenizer()
    model = TransformerClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, positional="sinusoidal").eval()
    texts, ids, mask = _tiny_batch(tok)  # "good film very long", "the plot was dull and not funny"
    tokens = tokens_for_batch(tok, ids, mask)
    rationales = [[1, 2], [3, 5, 6]]  # positions into input_ids: "film very", "dull not funny" (position 0 plays <cls>)
    page = build_report(model, ids, mask, tmp_path, tokens=tokens, texts=texts, rationales=rationales).read_text()
    for e in CHEAP_EXPLAINERS:
        rows = re.findall(rf"<tr data-explainer='{e}'>(.*?)</tr>", page)
        marked = [re.findall(r"data-rationale='1'[^>]*>([^<]+)<", r) for r in rows]
        assert marked == [["film", "very"], ["dull", "not", "funny"]], e
        assert "AUPRC rat." in page
    faith = json.loads((tmp_path / "report.json").read_text())["faithfulness"]
    assert faith[1]["rationale"] == [3, 5, 6] and "rationale_auprc" in faith[1]["metrics"]["loo"]
    # without rationales: no marks, no plausibility columns
    page = build_report(model, ids, mask, tmp_path / "plain", tokens=tokens, texts=texts).read_text()
    assert "data-rationale" not in page and "AUPRC rat." not in page


def test_analyze_split_with_rationales_passes_them_on(monkeypatch):
    from types import SimpleNamespace

    import datasets
    from omegaconf import OmegaConf

    sys.path.insert(0, str(ROOT))
    try:
        import analyze
    finally:
        sys.path.remove(str(ROOT))
    tok = _tokenizer()

    class FakeData:
        has_rationales = True
        tokenizer = tok
        val_dataset = datasets.Dataset.from_list(
            [{"input_ids": [2] + [5 + (i + k) % 10 for k in range(3 + i % 4)], "labels": i % 2,
              "rationale": [1, 2] if i % 3 == 0 else []} for i in range(30)])

        def prepare_data(self):
            pass

        def setup(self, stage):
            pass

        def collate(self, rows):
            T = max(len(r["input_ids"]) for r in rows)
            ids = torch.zeros(len(rows), T, dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            return {"input_ids": ids, "attention_mask": ids != 0}

    from identifiable_transformers.modules import checkpoint

    monkeypatch.setattr(checkpoint, "data_module_from_checkpoint", lambda data_cfg, cache_dir, **kw: FakeData())
    module = SimpleNamespace(hparams={"data_cfg": {"name": "x"}}, tokenizer=tok, model=SimpleNamespace(max_len=64))
    cfg = OmegaConf.create({"split": "validation", "num_examples": 4, "seed": 0, "ckpt_path": "unused.ckpt",
                            "paths": {"cache_dir": "unused"}})
    batch, idx, rationales = analyze._split_batch(cfg, module)
    assert len(idx) == 4 and all(i % 3 == 0 for i in idx)  # the examples with a rationale are preferred
    assert rationales == [[1, 2]] * 4 and batch["input_ids"].shape[0] == 4
