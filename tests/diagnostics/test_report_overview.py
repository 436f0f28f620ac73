"""The report's layer x head overview, its embedded maps, its size, its PNG grids and report.json's predictions
(issue 56), checked without a browser (test_report_browser.py opens the page in Chromium)."""

import base64
import io
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from identifiable_transformers.diagnostics.render.plots import MAX_PNG_SIDE, figure_to_png, plot_attention_grid
from identifiable_transformers.diagnostics.render.report_html import build_report
from identifiable_transformers.models import TransformerClassifier


def _batch(lengths, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    ids[~mask] = 0
    tokens = [[f"w{int(t)}" for t in row[:n]] for row, n in zip(ids, lengths)]
    return ids, mask, tokens


def _data(page: str, b: int) -> dict:
    return json.loads(re.search(rf"<script type='application/json' id='ex{b}-data'>(.*?)</script>", page,
                                re.S).group(1))


def _block_means(A: np.ndarray, f: int) -> np.ndarray:
    """Reference block average by explicit loops: each cell the mean of the tokens its block holds."""
    n = A.shape[0]
    m = -(-n // f)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            out[i, j] = A[i * f : (i + 1) * f, j * f : (j + 1) * f].mean()
    return out


def test_overview_has_a_linked_cell_per_head_and_the_closed_form_totals(tmp_path):
    # concat, d = 8, h = 2: d/h = 4, so a generic head is identifiable up to n = 4 tokens and among row-stochastic
    # maps up to 5 (docs/identifiability.md 2.1); three layers x two heads
    torch.manual_seed(0)
    model = TransformerClassifier(40, 2, embed_dim=8, num_heads=2, num_layers=3).eval()
    ids, mask, tokens = _batch([4, 9])
    page = build_report(model, ids, mask, tmp_path, tokens=tokens, faithfulness=False).read_text()
    for b, n in enumerate((4, 9)):
        overview = re.search(rf"<div class='overview' data-example='{b}'.*?</table></div>", page, re.S).group(0)
        cells = re.findall(r"<a class='cell' data-layer='(\d+)' data-head='(\d+)' href='#ex(\d+)-l(\d+)-h(\d+)'",
                           overview)
        assert [(int(c[0]), int(c[1])) for c in cells] == [(l, h) for l in range(3) for h in range(2)]
        assert all(c[2] == str(b) and c[3:] == c[:2] for c in cells)  # each cell links to its own head
        expected = 0 if n <= 5 else 2  # non-identifiable heads per layer: stoch. null dim max(0, n - 5) > 0
        assert re.findall(r"<td class='tot' data-layer='\d'>(\d+)/2</td>", overview) == [str(expected)] * 3
        data = _data(page, b)
        null = next(m for m in data["measures"] if m["key"] == "null_dim")["values"]
        assert null == [[max(0, n - 4)] * 2] * 3
        assert {m["key"] for m in data["measures"]} >= {"null_dim", "stochastic_null_dim", "alt_attention_tv",
                                                         "effective_gap", "eps_tv_1e-2"}
        assert "<details><summary>Per-head table (6 heads)</summary>" in page


def test_embedded_maps_are_the_heads_block_averaged_attention_and_witnesses_only_where_not_identifiable(tmp_path):
    torch.manual_seed(1)
    model = TransformerClassifier(200, 2, embed_dim=8, num_heads=2, num_layers=2).eval()
    ids, mask, tokens = _batch([5, 130], vocab=200)
    page = build_report(model, ids, mask, tmp_path, tokens=tokens, faithfulness=False).read_text()
    with torch.no_grad():  # independent reference: the forward pass's own attention weights
        attentions = model(ids, mask, output_attentions=True).attentions  # L x [B, H, T, T]
    short, long = _data(page, 0), _data(page, 1)
    assert (short["block"], short["side"], short["labelled"]) == (1, 5, True)
    assert (long["block"], long["side"], long["labelled"]) == (3, 44, False)  # ceil(130 / 64) = 3; the last block 1
    for data, b, n in ((short, 0, 5), (long, 1, 130)):
        f = data["block"]
        for l in range(2):
            for h in range(2):
                head = data["maps"][l * 2 + h]
                ref = _block_means(attentions[l][b, h, :n, :n].double().numpy(), f)
                q = np.frombuffer(base64.b64decode(head["a"]), dtype=np.uint8).reshape(ref.shape)
                witness = np.frombuffer(base64.b64decode(head["w"]), dtype=np.uint8) if head["w"] else q
                assert max(q.max(), witness.max()) == 255  # the head's own scale, shared by its raw map and witness
                np.testing.assert_allclose(q / 255 * head["top"], ref, atol=head["top"] / 510 + 1e-6)
                row = np.frombuffer(base64.b64decode(head["r0"]), dtype=np.uint8) / 255 * head["rtop"]
                np.testing.assert_allclose(row, attentions[l][b, h, 0, :n].numpy(), atol=head["rtop"] / 510 + 1e-6)
                # n = 5 <= d/h + 1: every head is identifiable among row-stochastic maps, so there is no witness
                assert (head["w"] is None) == (n <= 5) and (head["w0"] is None) == (n <= 5)


def test_two_short_texts_on_a_4_layer_8_head_model_stay_under_2_mb(tmp_path):
    torch.manual_seed(0)
    model = TransformerClassifier(40, 2, embed_dim=32, num_heads=8, num_layers=4).eval()
    ids, mask, tokens = _batch([12, 20])
    path = build_report(model, ids, mask, tmp_path, tokens=tokens, texts=["a", "b"], label_names=["neg", "pos"])
    page = path.read_text()
    assert path.stat().st_size <= 2_000_000
    assert [len(re.findall(rf"href='#ex{b}-l\d-h\d'", page)) for b in (0, 1)] == [32, 32]


def test_the_page_grows_with_tokens_not_with_pictures(tmp_path):
    """Past 64 tokens a map is block-averaged to 64 x 64 cells: 4 times the tokens, far from 16 times the bytes."""
    torch.manual_seed(0)
    model = TransformerClassifier(40, 2, embed_dim=8, num_heads=2, num_layers=2, max_len=600).eval()
    sizes = []
    for n in (128, 512):
        ids, mask, tokens = _batch([n])
        sizes.append(build_report(model, ids, mask, tmp_path / str(n), tokens=tokens,
                                  faithfulness=False).stat().st_size)
    assert sizes[1] < 2 * sizes[0]


@pytest.mark.parametrize("layers, heads, n", [(6, 12, 128), (48, 16, 8), (2, 64, 12)])
def test_grid_pngs_stay_within_4000_pixels_and_the_title_clears_the_grids(layers, heads, n):
    rng = np.random.default_rng(0)
    A = rng.random((layers, heads, n, n))
    A /= A.sum(-1, keepdims=True)
    stoch = rng.integers(0, 2, (layers, heads))
    fig = plot_attention_grid({"raw A": A, "effective A_eff": A - A.mean(-1, keepdims=True), "witness A'": A},
                              null_dim=stoch, stochastic_null_dim=stoch, title="example 0: a title that must not "
                              "overlap the grids")
    png = figure_to_png(fig, dpi=fig.dpi)
    w, h = Image.open(io.BytesIO(png)).size
    assert max(w, h) <= MAX_PNG_SIDE and min(w, h) > 100
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    title = next(t for t in fig.texts if t.get_text().startswith("example 0"))
    top_of_grids = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes)  # head labels included
    assert title.get_window_extent(renderer).y0 > top_of_grids


def test_report_png_is_a_grid_within_bounds(tmp_path):
    torch.manual_seed(0)
    model = TransformerClassifier(40, 2, embed_dim=32, num_heads=8, num_layers=4).eval()
    ids, mask, tokens = _batch([30])
    build_report(model, ids, mask, tmp_path, tokens=tokens, faithfulness=False)
    w, h = Image.open(tmp_path / "example0.png").size
    assert max(w, h) <= MAX_PNG_SIDE and w > h / 3  # a grid of 8 heads a row, not a column of 32 heads


def test_report_json_carries_the_prediction_and_build_report_takes_the_explainers(tmp_path):
    torch.manual_seed(0)
    model = TransformerClassifier(40, 3, embed_dim=8, num_heads=2).eval()
    ids, mask, tokens = _batch([6, 9])
    build_report(model, ids, mask, tmp_path, tokens=tokens, label_names=["a", "b", "c"],
                 explainers=["attention", "loo"])
    report = json.loads((tmp_path / "report.json").read_text())
    with torch.no_grad():
        logits = model(ids, mask).logits.double()
    for b, ex in enumerate(report["examples"]):
        pred = ex["prediction"]
        assert ex["example"] == b and ex["length"] == int(mask[b].sum())
        assert pred["logits"] == pytest.approx(logits[b].tolist(), abs=1e-6)
        assert pred["probabilities"] == pytest.approx(torch.softmax(logits[b], -1).tolist(), abs=1e-6)
        assert pred["label_id"] == int(logits[b].argmax()) and pred["label"] == "abc"[pred["label_id"]]
    assert [set(f["metrics"]) for f in report["faithfulness"]] == [{"attention", "loo"}] * 2


@pytest.fixture(scope="module")
def tiny_bert_pair(tmp_path_factory):
    """A random 2-layer BERT classifier and a bare encoder sharing its weights, with a WordPiece vocabulary."""
    transformers = pytest.importorskip("transformers")
    words = "the a film was good bad plot dull it and".split()
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64, num_labels=2,
                                     id2label={0: "negative", 1: "positive"})
    torch.manual_seed(0)
    folders = {}
    for name, cls in (("classifier", transformers.BertForSequenceClassification), ("encoder", transformers.BertModel)):
        folders[name] = tmp_path_factory.mktemp(name)
        cls(config).eval().save_pretrained(folders[name])
        transformers.BertTokenizer(vocab=vocab).save_pretrained(folders[name])
    return folders


def test_a_sentence_pair_gets_hugging_faces_own_prediction_and_a_bare_encoder_none(tiny_bert_pair, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from identifiable_transformers.diagnostics.render.report_html import tokens_for_batch
    from identifiable_transformers.loading import load_hf_classifier

    folder = tiny_bert_pair["classifier"]
    model, _ = load_hf_classifier(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    enc = tokenizer(["the film was good", "the plot"], ["it was bad", "dull and bad film"], padding=True,
                    return_tensors="pt")
    assert enc["token_type_ids"].any()  # a pair: the second segment has token type 1
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    tokens = [[tokenizer.convert_ids_to_tokens(int(i)) for i in row[m]] for row, m in zip(ids, mask)]
    build_report(model, ids, mask, tmp_path / "pair", tokens=tokens, label_names=model.label_names,
                 faithfulness=False)
    with torch.no_grad():  # independent reference: Hugging Face's model on its own tokenizer's inputs
        ref = AutoModelForSequenceClassification.from_pretrained(folder).eval()(**enc).logits.double()
    examples = json.loads((tmp_path / "pair" / "report.json").read_text())["examples"]
    for b, ex in enumerate(examples):
        assert ex["prediction"]["logits"] == pytest.approx(ref[b].tolist(), abs=1e-5)
        assert ex["prediction"]["label"] == ["negative", "positive"][int(ref[b].argmax())]

    encoder, _ = load_hf_classifier(str(tiny_bert_pair["encoder"]))
    assert not encoder.has_head
    build_report(encoder, ids, mask, tmp_path / "bare", tokens=tokens_for_batch(None, ids, mask))
    examples = json.loads((tmp_path / "bare" / "report.json").read_text())["examples"]
    assert [ex["prediction"] for ex in examples] == [None, None]
