"""The analyze report's equivalence section: report.json records and the HTML table."""

import json

import pytest
import torch

from identifiable_transformers.diagnostics.render.report_html import build_report
from identifiable_transformers.models import TransformerClassifier


def test_report_lists_each_heads_ranges_and_the_head_mean(tmp_path):
    torch.manual_seed(0)
    model = TransformerClassifier(30, 2, embed_dim=8, num_heads=2, max_len=32).eval()  # concat, d/h = 4
    lengths = [4, 12]
    ids = torch.zeros(2, 12, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(4, 30, (n,))
    ids[:, 0] = 2
    mask = ids != 0
    tokens = [[f"w{int(t)}" for t in row[:n]] for row, n in zip(ids, lengths)]
    page = build_report(model, ids, mask, tmp_path, tokens=tokens, rationales=[[1], [2, 3]]).read_text()
    assert "Output-equivalent explanations" in page
    records = json.loads((tmp_path / "report.json").read_text())["equivalence"]
    heads = [r for r in records if r["head"] != "mean"]
    assert [(r["example"], r["head"]) for r in heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in heads:
        # rank([T, 1]) <= d/h + 1 = 5, generically equal: the class has n - 5 free dimensions
        assert r["free_dim"] == max(0, r["length"] - 5)
        assert r["top_token"] in tokens[r["example"]][1:]
        for low, value, high in r["ranges"].values():
            assert low <= value + 1e-12 <= high + 2e-12
            if r["free_dim"] == 0:
                assert low == pytest.approx(high, abs=1e-12)
    # the rationale weight of a free row can move (token 2 or 3 share a 7-dimensional class with the others)
    assert any(r["ranges"]["rationale"][2] - r["ranges"]["rationale"][0] > 1e-3 for r in heads if r["free_dim"])
    mean = [r for r in records if r["head"] == "mean"]
    assert len(mean) == 2 and set(mean[1]["extremes"]) >= {"best/comprehensiveness", "worst/rationale_auprc"}
    assert mean[1]["extremes"]["best/rationale_auprc"] >= mean[1]["extremes"]["worst/rationale_auprc"]
