"""analyze.py's report shows progress (issue 32): a log line as each stage starts and ends, and over the examples a
tqdm bar on a terminal, else a log line every tenth of them."""

import logging
import sys

import pytest
import torch

from identifiable_transformers.diagnostics.render.report_html import build_report
from identifiable_transformers.models import TransformerClassifier

LOGGER = "identifiable_transformers.diagnostics.render.report_html"


def _report(tmp_path, n_examples: int, key_aware: bool = False):
    torch.manual_seed(0)
    model = TransformerClassifier(12, 2, embed_dim=8, num_heads=2).eval()
    ids = torch.randint(4, 12, (n_examples, 5))
    mask = torch.ones_like(ids, dtype=torch.bool)
    tokens = [[str(int(t)) for t in row] for row in ids]
    build_report(model, ids, mask, tmp_path, tokens=tokens, key_aware=key_aware, faithfulness=n_examples < 5)


def test_each_stage_and_every_tenth_example_is_a_log_line(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _report(tmp_path, 3, key_aware=True)
    told = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    lines = [m for m in told if m.startswith("report:")]
    stages = ["report: identifiability of 3 example(s) of up to 5 tokens",
              "report: key-aware count of 3 example(s) x 1 layer(s) x 2 head(s), up to 5 tokens (dense Jacobians: "
              "minutes for long inputs)",
              "report: token explanations and their faithfulness for 3 example(s)"]
    expected = [line for s in stages for line in (f"{s} ...", f"{s}: done in")]
    assert [m if m.endswith("...") else m[:m.index(": done in") + 9] for m in lines[:6]] == expected
    assert lines[6:9] == [f"report: {b}/3 examples drawn" for b in (1, 2, 3)]
    equivalence = "report: output-equivalent explanations of 3 example(s) (linear programs)"
    assert [m if m.endswith("...") else m[:m.index(": done in") + 9] for m in lines[9:]] == \
        [f"{equivalence} ...", f"{equivalence}: done in"]
    assert "examples" not in capsys.readouterr().err  # no bar when stderr is not a terminal
    assert "identifiability: layer 1/1 done (2 heads, 3 example(s))" in told  # inside the identifiability stage
    # inside the faithfulness stage (issue 56): each explainer, then erasure with a line per window of its scan
    start, end = told.index(f"{stages[2]} ..."), next(i for i, m in enumerate(told) if m.startswith(f"{stages[2]}:"))
    inner = told[start + 1:end]
    begun = [m.split(" (")[0].removesuffix(" ...") for m in inner if m.endswith("...")]
    assert begun == ["explainers: attention maps", "explainers: context mixing", "explainer: grad_input",
                     "explainer: loo", "erasure"]
    assert all(any(m.startswith(f"{b}: done in") for m in inner) for b in begun)
    assert any(m.startswith("erasure: ") and "removal curves still unflipped" in m for m in inner)


@pytest.mark.parametrize("n, shown", [(11, [2, 4, 6, 8, 10, 11])])  # every ceil(11 / 10) = 2, and the last
def test_example_lines_come_every_tenth(tmp_path, caplog, n, shown):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _report(tmp_path, n)
    drawn = [r.getMessage() for r in caplog.records if r.getMessage().endswith("examples drawn")]
    assert drawn == [f"report: {b}/{n} examples drawn" for b in shown]


def test_a_terminal_gets_a_bar_instead(tmp_path, caplog, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _report(tmp_path, 3)
    assert "report: examples" in capsys.readouterr().err
    assert not [r for r in caplog.records if r.getMessage().endswith("examples drawn")]
