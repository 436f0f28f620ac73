"""Explainers and tau on batches of mixed lengths: each example cut to its own width gives the scores and taus of
that example explained alone (an explicit per-example loop), whatever the grouping."""

import pytest
import torch
from diag_helpers import random_batch, random_model
from scipy.stats import kendalltau

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.diagnostics.faithfulness import _common

MAPS = ["attention", "effective", "norm", "rollout", "value_zeroing", "alti", "norm_resln", "alti_layer0"]


@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("layers,pooling", [(1, "cls"), (2, "mean")])
def test_map_explainers_of_a_mixed_batch_are_each_examples_alone(group, layers, pooling, monkeypatch):
    monkeypatch.setattr(_common, "WIDTH_GROUP", group)
    model = random_model(layers=layers, pooling=pooling, positional="learned")
    ids, mask = random_batch(B=5, T=9)
    ids, mask = ids[[3, 0, 4, 2, 1]], mask[[3, 0, 4, 2, 1]]  # lengths 3, 9, 2, 5, 8: not sorted
    batch = F.explain(model, ids, mask, MAPS)
    for b in range(5):
        n = int(mask[b].sum())
        alone = F.explain(model, ids[b : b + 1, :n], mask[b : b + 1, :n], MAPS)
        for name in MAPS:
            torch.testing.assert_close(batch[name][b, :n], alone[name][0], atol=1e-5, rtol=1e-4, msg=name)
            assert not batch[name][b, n:].any(), name  # padding scores 0


def test_by_width_cuts_each_group_to_its_longest_example():
    ids, mask = random_batch(B=5, T=9)  # lengths 9, 8, 5, 3, 2
    widths = []

    def fn(i, m):
        widths.append(i.shape[1])
        return {"n": m.sum(1, keepdim=True).expand_as(m).float()}

    out = _common.by_width(fn, ids, mask, group=2)
    assert widths == [3, 8, 9]  # (2, 3), (5, 8), (9)
    assert out["n"][:, 0].tolist() == [9, 8, 5, 3, 2]
    assert not out["n"][3, 3:].any()  # beyond its group's width: 0


@pytest.mark.parametrize("chunk", [None, 30])
def test_kendall_tau_b_of_rows_of_mixed_lengths_against_scipy(chunk, monkeypatch):
    from identifiable_transformers.diagnostics.faithfulness import agreement
    if chunk:
        monkeypatch.setattr(agreement, "_CHUNK_PAIRS", chunk)  # rows of 6+ valid positions run alone
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 4, (6, 12), generator=g).double(), torch.randn(6, 12, generator=g, dtype=torch.float64)
    lengths = [12, 3, 7, 1, 10, 5]
    valid = torch.arange(12) < torch.tensor(lengths)[:, None]
    valid[:, 0] = False  # <cls>
    tau = F.kendall_tau_b(x, y, valid)
    for b, n in enumerate(lengths):
        if n < 3:
            assert torch.isnan(tau[b])
        else:
            assert float(tau[b]) == pytest.approx(kendalltau(x[b, 1:n], y[b, 1:n]).statistic, abs=1e-12)


def test_kendall_taus_of_several_score_sets_equal_one_call_each():
    g = torch.Generator().manual_seed(2)
    xs = torch.randint(0, 5, (4, 6, 20), generator=g).double()
    y = torch.randn(6, 20, generator=g, dtype=torch.float64)
    valid = torch.arange(20) < torch.tensor([20, 2, 9, 15, 4, 11])[:, None]
    many = F.agreement.kendall_taus(xs, y, valid)
    for k in range(4):
        torch.testing.assert_close(many[k], F.kendall_tau_b(xs[k], y, valid), equal_nan=True)
        for b in range(6):
            n = int(valid[b].sum())
            ref = kendalltau(xs[k, b, :n], y[b, :n]).statistic  # NaN where x is constant
            assert float(many[k, b]) == pytest.approx(ref, abs=1e-12, nan_ok=True)
