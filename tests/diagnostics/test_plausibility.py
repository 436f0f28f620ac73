"""Plausibility metrics (rationale_auprc, rationale_f1), the per-example random control and the uniform gap,
against known answers."""

import math

import numpy as np
import pytest
import torch

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.models import TransformerClassifier

CLS, MARK = 2, 5
OTHERS = [1, 3, 4, 6, 7, 8, 9]


def _rationale_model(key_logit: float = 2.0) -> TransformerClassifier:
    """Class 0's logit grows with the attention mass on the MARK tokens, and nothing else reaches <cls>.

    MARK's key logit is ``key_logit`` (0 for every other token) and only MARK has a nonzero value, so the
    <cls> output is m (1, -1, 0, 0) with m the total attention on MARKs. Removing a MARK lowers m, removing
    any other token raises it: leave-one-out is > 0 exactly on the MARKs and < 0 elsewhere, and the
    gradient x embedding is exactly 0 off the MARKs (keys and values read only embedding dim 0, which is 0
    there). The MARK positions are the rationale the decision reads.
    """
    m = TransformerClassifier(10, 2, embed_dim=4, num_heads=1, key_dim=1, ffn_dim=4, dropout=0.0, positional="none")
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for ln in (m.layers[0].norm1, m.layers[0].norm2):
            ln.weight.fill_(1.0)
        emb = torch.zeros(10, 4)
        emb[CLS] = torch.tensor([0.0, 0.0, 1.0, -1.0])
        emb[MARK] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        for t in OTHERS:
            emb[t, 1:] = torch.randn(3, generator=torch.Generator().manual_seed(t))
        m.token_embedding.weight.copy_(emb)
        attn = m.layers[0].attn
        attn.q_proj.bias.fill_(1.0)
        attn.k_proj.weight[0, 0] = key_logit
        attn.v_proj.weight[0, 0] = 1.0
        attn.out_proj.weight[:, 0] = torch.tensor([1.0, -1.0, 0.0, 0.0])
        m.head.weight[0, 0] = 3.0
        m.head.bias[1] = 0.5
    return m.eval()


def _rationale_batch(B=16, T=14, seed=0):
    """Varying lengths (right padding), 1-3 MARKs per example at random positions; rationale = the MARKs."""
    rng = np.random.default_rng(seed)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        n = int(rng.integers(6, T + 1))
        ids[b, :n] = torch.tensor(rng.choice(OTHERS, n))
        ids[b, 0] = CLS
        marks = rng.choice(np.arange(1, n), int(rng.integers(1, 4)), replace=False)
        ids[b, marks] = MARK
        mask[b, :n] = True
    return ids, mask, (ids == MARK)


def _expected_random_ap(n: int, k: int) -> float:
    """E[average precision] of a uniformly random order of n items with k positives.

    A positive at rank r has on average 1 + (r - 1)(k - 1)/(n - 1) positives at ranks <= r, and r is uniform on 1..n.
    """
    h = sum(1.0 / r for r in range(1, n + 1))
    return (k - 1) / max(n - 1, 1) + h * (n - k) / (n * max(n - 1, 1))


# ------------------------------------------------------------------------------- plausibility
def test_average_precision_and_top_k_f1_hand_computed():
    mask = torch.ones(3, 5, dtype=torch.bool)
    rat = torch.zeros(3, 5, dtype=torch.bool)
    scores = torch.zeros(3, 5)
    # example 0: scores 0.9 0.8 0.7 0.6 at positions 1-4, rationale at 1 and 3 -> AP = (1/1 + 2/3) / 2
    scores[0, 1:] = torch.tensor([0.9, 0.8, 0.7, 0.6])
    rat[0, [1, 3]] = True
    # example 1: a tie: scores 1 1 0 0, rationale at 1 and 3. Thresholds >= 1: P 1/2, R 1/2; >= 0: P 2/4, R 1
    # -> AP = 1/2 * 1/2 + 1/2 * 1/2 = 0.5; top-2 (ties by position) = {1, 2} -> F1 = 1/2
    scores[1, 1:] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    rat[1, [1, 3]] = True
    # example 2: no rationale -> NaN, left out
    scores[2, 1:] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out = F.plausibility_metrics({"x": scores}, mask, rat)
    ap, f1 = out["x/rationale_auprc"], out["x/rationale_f1"]
    assert float(ap[0]) == pytest.approx((1 + 2 / 3) / 2)
    assert float(ap[1]) == pytest.approx(0.5)
    assert float(f1[0]) == pytest.approx(0.5) and float(f1[1]) == pytest.approx(0.5)
    assert math.isnan(float(ap[2])) and math.isnan(float(f1[2]))


def test_cls_and_padding_are_never_scored():
    # A huge score at <cls> and at padding, and a rationale flag there, change nothing: only real tokens count.
    mask = torch.tensor([[True, True, True, True, False, False]])
    scores = torch.tensor([[9.0, 0.1, 0.5, 0.2, 9.0, 9.0]])
    rat = torch.tensor([[True, False, True, False, True, True]])
    out = F.plausibility_metrics({"x": scores}, mask, rat)
    assert float(out["x/rationale_auprc"][0]) == 1.0 and float(out["x/rationale_f1"][0]) == 1.0
    rat2 = torch.tensor([[True, True, False, False, True, True]])  # the lowest of 3 real tokens' ... at rank 3
    out = F.plausibility_metrics({"x": scores}, mask, rat2)
    assert float(out["x/rationale_auprc"][0]) == pytest.approx(1 / 3) and float(out["x/rationale_f1"][0]) == 0.0


def test_model_reading_the_rationale_gives_auprc_one_for_loo_and_grad_input():
    model = _rationale_model()
    ids, mask, rat = _rationale_batch()
    rep = F.faithfulness_report(model, ids, mask, explainers=["loo", "grad_input", "random", "attention"],
                                rationale_mask=rat)
    assert (rep["predicted"] == 0).all()
    pe, m = rep["per_example"], rep["metrics"]
    for e in ("loo", "grad_input", "attention"):
        assert torch.equal(pe[f"{e}/rationale_auprc"], torch.ones(len(ids))), e
        assert torch.equal(pe[f"{e}/rationale_f1"], torch.ones(len(ids))), e
        assert m[f"{e}/rationale_auprc"] == 1.0
    # random: the expected AP of a random order, per example (n real tokens, k of them the rationale)
    n = (mask.sum(1) - 1).tolist()
    k = rat.sum(1).tolist()
    expected = np.mean([_expected_random_ap(a, b) for a, b in zip(n, k)])
    assert m["random/rationale_auprc"] == pytest.approx(expected, abs=0.06)
    assert m["random/rationale_auprc"] < 0.8
    assert m["random/rationale_auprc_std"] > 0  # ten draws, each its own order


def test_random_auprc_is_about_the_rationale_share_on_long_inputs():
    # 60 real tokens, 15 in the rationale: a random order's AP is about the share 15/60; exactly, on average,
    # 14/59 + H_60 45/3540 = 0.297 (the formula above; the excess over the share vanishes as n grows).
    B, T = 32, 61
    mask = torch.ones(B, T, dtype=torch.bool)
    ids = torch.randint(3, 1000, (B, T), generator=torch.Generator().manual_seed(0))
    rat = torch.zeros(B, T, dtype=torch.bool)
    rat[:, 1:16] = True
    aps = [F.plausibility_metrics({"r": F.random_scores(ids, mask, seed=0, draw=d)}, mask, rat)["r/rationale_auprc"]
           for d in range(10)]
    mean = float(torch.stack(aps).mean())
    assert _expected_random_ap(60, 15) == pytest.approx(0.2968, abs=1e-4)
    assert mean == pytest.approx(_expected_random_ap(60, 15), abs=0.02)


def test_no_rationale_means_no_plausibility_keys():
    model = _rationale_model()
    ids, mask, _ = _rationale_batch(B=4)
    rep = F.faithfulness_report(model, ids, mask, explainers=["loo"])
    assert not any("rationale" in k for k in rep["metrics"])


# ------------------------------------------------------------------------------- random control
def test_random_scores_do_not_depend_on_batch_row_or_padding():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 10, (4, 10), generator=g)
    ids[:, 0] = CLS
    mask = torch.arange(10) < torch.tensor([10, 7, 5, 9])[:, None]
    ids = ids.masked_fill(~mask, 0)
    full = F.explain(_rationale_model(), ids, mask, ["random"], seed=3)["random"]
    for b in range(4):
        n = int(mask[b].sum())
        alone = F.random_scores(ids[b : b + 1, :n], mask[b : b + 1, :n], seed=3)
        assert torch.equal(alone[0], full[b, :n])  # alone, at row 0, no padding
        wide = torch.zeros(1, 25, dtype=torch.long)
        wide[0, :n] = ids[b, :n]
        wide_s = F.random_scores(wide, wide != 0, seed=3)
        assert torch.equal(wide_s[0, :n], full[b, :n]) and (wide_s[0, n:] == 0).all()  # padded wider
    other = F.random_scores(ids.flip(0), mask.flip(0), seed=3).flip(0)  # other rows, other batch order
    assert torch.equal(other, full)
    assert torch.equal(F.random_scores(torch.cat([ids, ids[:2]]), torch.cat([mask, mask[:2]]), seed=3)[:4], full)


def test_random_orders_differ_between_examples_seeds_and_draws():
    # 40 different examples of one length: 40 different orders (one seed reused for every example would give one).
    ids = torch.randint(3, 1000, (40, 9), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = CLS
    mask = torch.ones_like(ids, dtype=torch.bool)
    s = F.random_scores(ids, mask, seed=0)
    orders = {tuple(torch.argsort(r[1:], descending=True).tolist()) for r in s}
    assert len(orders) == 40
    assert (torch.sort(s[:, 1:], dim=1).values == torch.arange(1, 9) / 8).all()  # a permutation of 1..n / n
    assert not torch.equal(F.random_scores(ids, mask, seed=1), s)
    assert not torch.equal(F.random_scores(ids, mask, seed=0, draw=1), s)
    assert torch.equal(F.random_scores(ids, mask, seed=0, draw=0), s)


def test_random_metrics_are_the_mean_of_ten_draws_with_their_spread():
    model = _rationale_model()
    ids, mask, rat = _rationale_batch(B=8)
    rep = F.faithfulness_report(model, ids, mask, explainers=["random"], seed=5, rationale_mask=rat)
    assert torch.equal(rep["scores"]["random"], F.random_scores(ids, mask, seed=5, draw=0))
    per_draw = [F.faithfulness_report(model, ids, mask, explainers=["random"], rationale_mask=rat,
                                      precomputed={"random": F.random_scores(ids, mask, seed=5, draw=d)})["metrics"]
                for d in range(F.RANDOM_DRAWS)]
    for metric in (*F.METRICS, *F.PLAUSIBILITY_METRICS):
        vals = np.array([d[f"random/{metric}"] for d in per_draw])
        assert rep["metrics"][f"random/{metric}"] == pytest.approx(vals.mean(), abs=1e-6), metric
        assert rep["metrics"][f"random/{metric}_std"] == pytest.approx(vals.std(ddof=1), abs=1e-6), metric
    assert rep["metrics"]["random/comprehensiveness_std"] > 0
    one = F.faithfulness_report(model, ids, mask, explainers=["random"], seed=5, random_draws=1)
    assert one["metrics"]["random/comprehensiveness"] == pytest.approx(per_draw[0]["random/comprehensiveness"])
    assert not any(k.endswith("_std") for k in one["metrics"])


# ------------------------------------------------------------------------------- uniform gap
def test_uniform_acc_gap_is_against_the_labels_not_the_predictions():
    # With the key logit 30 every example has (nearly) all attention on its one MARK: class 0 is predicted.
    # Under uniform attention the MARK mass is 1/n (n = 10 keys): m = 0.1, LN gives dim 0 = 0.1/sqrt(1.01/2)
    # = 0.141, class 0's logit 3 * 0.141 = 0.42 < 0.5: class 1 everywhere.
    model = _rationale_model(key_logit=30.0)
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.choice(OTHERS, size=(8, 10)))
    ids[:, 0] = CLS
    ids[torch.arange(8), torch.tensor(rng.integers(1, 10, 8))] = MARK
    mask = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])  # the model is wrong on the last two
    rep = F.faithfulness_report(model, ids, mask, labels=labels, explainers=["attention"])
    assert (rep["predicted"] == 0).all()
    assert (F.uniform_attention_logits(model, ids, mask).argmax(-1) == 1).all()
    # accuracy 6/8, uniform accuracy 2/8 (computed against the predictions it would read 1 - 0 = 1)
    assert rep["uniform_acc_gap"] == 0.5


def test_batched_average_precision_matches_torchmetrics_row_by_row():
    from torchmetrics.functional.classification import binary_average_precision

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (200, 12), generator=g).float()  # many ties
    scores[100:] = torch.rand(100, 12, generator=g)  # and none
    valid = torch.rand(200, 12, generator=g) < 0.8
    target = (torch.rand(200, 12, generator=g) < 0.3) & valid
    ap = F.average_precision(scores, target, valid)
    for r in range(200):
        if target[r].any():
            ref = binary_average_precision(scores[r][valid[r]], target[r][valid[r]].long())
            assert float(ap[r]) == pytest.approx(float(ref), abs=1e-6), r
        else:
            assert math.isnan(float(ap[r]))
