"""EquivalenceCallback through the real training app (tiny CPU run): its metrics, its file, and its off switch."""

import json
import math

import pytest
import torch

from identifiable_transformers.diagnostics import equivalence_range
from identifiable_transformers.diagnostics.faithfulness.equivalent import equivalent_explanations
from identifiable_transformers.models import TransformerClassifier
from identifiable_transformers.run.training import run


def test_training_logs_ranges_and_writes_equivalence_json(make_cfg, tmp_path):
    cfg = make_cfg("trainer.max_epochs=1", "test=false", "callbacks.faithfulness.final=false")
    m = run(cfg)["metrics"]
    for key in ("range_top", "range_mean_top", "range_loo", "range_free_frac", "range_headmean/loo_low",
                "range_headmean/loo_high", "range_comprehensiveness_best", "range_comprehensiveness_worst",
                "l0_h0/range_top", "equivalence_compute_s"):
        assert f"val/ident/{key}" in m, key
    assert m["val/ident/range_headmean/loo_low"] <= m["val/ident/range_headmean/loo_high"]
    assert any(k.startswith("val/ident/len_le_") and k.endswith("/range_top") for k in m)
    record = json.loads((tmp_path / "run" / "identifiability" / "epoch_000" / "equivalence.json").read_text())
    assert record["objectives"][:3] == ["top", "mean_top", "loo"] and record["guide"] == "loo"
    for ex in record["ranges"]:
        for head in ex:
            for low, value, high in head:
                assert low <= value + 1e-12 and value <= high + 1e-12


def test_equivalence_can_be_turned_off(make_cfg):
    cfg = make_cfg("trainer.max_epochs=1", "test=false", "callbacks.equivalence=null", "callbacks.faithfulness=null")
    m = run(cfg)["metrics"]
    assert not any("/range_" in k for k in m)


def _tiny_batch():
    torch.manual_seed(0)
    model = TransformerClassifier(60, 2, embed_dim=16, num_heads=4, key_dim=2, max_len=32).eval()
    lengths = torch.tensor([3, 9, 14])
    ids = torch.randint(3, 60, (3, 14))
    ids[:, 0] = 2
    mask = torch.arange(14)[None] < lengths[:, None]
    ids[~mask] = 0
    return model, ids, mask, lengths


def test_report_rows_match_the_library_on_each_unpadded_row():
    # each (example, head) bound is equivalence_range on that head's <cls> row and T = V W_o^h cut to the real length
    model, ids, mask, lengths = _tiny_batch()
    rationale = torch.zeros_like(mask)
    rationale[:, 1] = True
    rep = equivalent_explanations(model, ids, mask, rationale_mask=rationale)
    with torch.no_grad():
        last = model.attention_internals(ids, mask)[-1]
    names = rep["objectives"]
    for b, n in enumerate(lengths.tolist()):
        for h in range(4):
            a = last.attention[b, h, 0, :n].double()
            a = a / a.sum()
            T = (last.values[b, h, :n].double() @ last.out_proj[h].double())
            w = torch.zeros(n, dtype=torch.float64)
            w[1] = 1.0
            low, high = equivalence_range(T, a, w)
            j = names.index("rationale")
            assert (float(rep["low"][b, h, j]), float(rep["high"][b, h, j])) == pytest.approx((low, high), abs=1e-9)
        # n = 3 <= d/h + 1 = 5: identifiable, every range a point; n = 14 is not
        assert (rep["free_dim"][b] == 0).all() == (n <= 5)
    # the best and worst explanations are head-means of rows in each head's class: rationale weight ordered
    best, worst = rep["scores"]["best"], rep["scores"]["worst"]
    assert bool((best[:, 1] >= worst[:, 1] - 1e-6).all())
    assert float(best[0, 1]) == pytest.approx(float(worst[0, 1]), abs=1e-6)  # the identifiable example
    assert torch.equal(best[~mask], torch.zeros_like(best[~mask])) and not bool(best[:, 0].any())
    auprc = rep["per_example"]["best/rationale_auprc"], rep["per_example"]["worst/rationale_auprc"]
    assert bool((auprc[0] >= auprc[1]).all()) and not math.isnan(float(auprc[0][1]))


def test_mean_pooling_is_refused_by_the_library():
    model = TransformerClassifier(60, 2, embed_dim=16, num_heads=4, max_len=32, pooling="mean")
    ids = torch.tensor([[2, 5, 6, 7]])
    with pytest.raises(ValueError, match="pooling=cls"):
        equivalent_explanations(model, ids, ids != 0)
