"""Analysis tiers (faithfulness/tiers.py, analyze.py explainers=): what each computes, and what the fast tier leaves
out, against the full faithfulness pass on the same inputs."""

import json
import math

import pytest
import torch
from diag_helpers import random_batch, random_model

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.diagnostics.faithfulness import readout
from identifiable_transformers.diagnostics.render.report_html import build_report


def test_tier_names_and_lists():
    assert F.resolve_tier("all").explainers == F.EXPLAINERS
    assert "integrated_gradients" not in F.resolve_tier("cheap").explainers
    fast = F.resolve_tier("fast")
    assert not {"loo", "value_zeroing", "integrated_gradients"} & set(fast.explainers)
    assert (fast.loo, fast.equivalence, fast.random_draws) == (False, False, 3)
    listed = F.resolve_tier(["attention", "alti_layer0", "attention"])
    assert listed.explainers == ("attention", "alti_layer0") and listed.loo and listed.equivalence
    for bad, says in (("quick", "neither a tier"), (["attention", "lime"], r"unknown \['lime'\]"), ([], "empty")):
        with pytest.raises(ValueError, match=says):
            F.resolve_tier(bad)


def test_without_loo_no_copy_runs_and_tau_is_nan_while_the_rest_is_unchanged(monkeypatch):
    model = random_model(layers=2, pooling="mean", seed=3)
    ids, mask = random_batch(T=12, seed=2)
    names = ["attention", "norm", "random"]
    full = F.faithfulness_report(model, ids, mask, explainers=names, random_draws=2)
    rows = []
    real = readout._MaskedCopies.__call__
    monkeypatch.setattr(readout._MaskedCopies, "__call__", lambda self, e, m: rows.append(len(e)) or real(self, e, m))
    fast = F.faithfulness_report(model, ids, mask, explainers=names, random_draws=2, loo=False)
    with_loo_rows = list(rows)
    rows.clear()
    F.faithfulness_report(model, ids, mask, explainers=names, random_draws=2)
    assert sum(rows) - sum(with_loo_rows) == int((mask.sum(1) - 1).sum())  # exactly the loo copies were saved
    assert fast["loo"] is None
    for e in names:
        assert math.isnan(fast["metrics"][f"{e}/tau_loo"]) and not math.isnan(full["metrics"][f"{e}/tau_loo"])
        for m in ("comprehensiveness", "sufficiency", "flip_frac"):
            assert torch.equal(fast["per_example"][f"{e}/{m}"], full["per_example"][f"{e}/{m}"]), (e, m)


@pytest.mark.parametrize("tier", ["fast", "cheap"])
def test_the_report_runs_the_tier(tmp_path, tier):
    model = random_model(layers=2, seed=1)
    ids, mask = random_batch(T=9, seed=5)
    tokens = [[str(int(t)) for t, m in zip(row, ms) if m] for row, ms in zip(ids, mask)]
    build_report(model, ids, mask, tmp_path, tokens=tokens, explainers=tier)
    rep = json.loads((tmp_path / "report.json").read_text())
    scored = {e for record in rep["faithfulness"] for e in record["scores"]}
    assert scored == set(F.resolve_tier(tier).explainers)
    assert ("equivalence" in rep) == (tier != "fast")
    if tier == "fast":
        assert all(m["tau_loo"] is None for record in rep["faithfulness"] for m in record["metrics"].values())


def test_analyze_refuses_an_unknown_tier_before_any_work(tmp_path, run_analyze):
    """A ValueError of the project's own checks is a user mistake (common/errors.py: one line, exit status 1)."""
    ckpt = tmp_path / "never_read.ckpt"
    ckpt.write_bytes(b"not a checkpoint: explainers= is checked first")
    with pytest.raises(ValueError, match="explainers='quick' is neither a tier"):
        run_analyze([f"ckpt_path={ckpt}", "text=a fine film", "explainers=quick", f"output_dir={tmp_path / 'out'}"])
    with pytest.raises(ValueError, match=r"unknown \['lime'\]"):
        run_analyze([f"ckpt_path={ckpt}", "text=a fine film", "explainers=[attention,lime]",
                     f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()
