"""The removal curve scanned on a grid (``flip_resolution``, for long texts): its flip fraction against the full
curve run removal by removal (explicit loops), and exactly the full scan where n <= the resolution."""

import pytest
import torch
from diag_helpers import random_batch, random_model

from identifiable_transformers.diagnostics import faithfulness as F


def _argmax(model, seq):
    with torch.no_grad():
        return int(model(seq[None], torch.ones(1, len(seq), dtype=torch.bool)).logits[0].argmax())


def _full_curve(model, seq, order):
    """flipped[s - 1] for every s = 1..n: the prediction without the top s tokens differs from the full input's."""
    pred, n_all = _argmax(model, seq), len(seq)
    return [_argmax(model, seq[[j for j in range(n_all) if j not in order[:s]]]) != pred
            for s in range(1, len(order) + 1)]


def _grid_answer(curve, resolution):
    """What the grid scan must report, from the full curve, by an explicit loop: the first flip among the points
    it evaluates (every g-th removal, the last, and the removals comprehensiveness runs anyway: the top
    ceil(k n / 100)); then, between the point before it and it, the same on a grid a quarter as wide, down to
    single removals; 1.0 when none of the first points flips."""
    n = len(curve)
    g = -(-n // resolution)
    evaluated = {*range(g, n + 1, g), n, *(min(n, max(1, -(-k * n // 100))) for k in F.AOPC_BINS)}
    hi = next((s for s in sorted(evaluated) if curve[s - 1]), None)
    if hi is None:
        return 1.0
    lo = (hi - 1) // g * g
    while hi - lo > 1:
        sub = -(-(hi - lo) // 4)
        evaluated |= {lo + sub * k for k in range(1, 4) if lo + sub * k < hi}
        hi = next(s for s in sorted(evaluated) if lo < s <= hi and curve[s - 1])
        lo = max(s for s in {lo, *(lo + sub * k for k in range(1, 4))} if s < hi)
    return hi / n


@pytest.mark.parametrize("resolution", [2, 3, 7])
def test_grid_scan_against_the_full_curve(resolution):
    model = random_model(layers=2, pooling="mean", seed=3)
    with torch.no_grad():
        model.head.weight.mul_(8.0)  # a sharp head: removals flip the prediction at various points
    ids, mask = random_batch(T=30, seed=2)
    scores = {"a": torch.randn(ids.shape, generator=torch.Generator().manual_seed(4))}
    scores["reversed"] = -scores["a"]
    rep = F.faithfulness_report(model, ids, mask, explainers=list(scores), precomputed=scores, random_draws=1,
                                flip_resolution=resolution)
    exact = F.faithfulness_report(model, ids, mask, explainers=list(scores), precomputed=scores, random_draws=1)
    checked_grid = 0
    for name, sc in scores.items():
        for b in range(ids.shape[0]):
            n_all = int(mask[b].sum())
            order = sorted(range(1, n_all), key=lambda j: (-float(sc[b, j]), j))
            curve = _full_curve(model, ids[b, :n_all], order)
            got = float(rep["per_example"][f"{name}/flip_frac"][b])
            assert got == pytest.approx(_grid_answer(curve, resolution)), (name, b)
            checked_grid += len(curve) > resolution
            for m in ("comprehensiveness", "sufficiency"):  # the grid changes only the flip fraction
                assert float(rep["per_example"][f"{name}/{m}"][b]) == float(exact["per_example"][f"{name}/{m}"][b])
    assert checked_grid >= 4  # examples long enough for a stride above 1


def test_grid_scan_is_the_full_scan_up_to_the_resolution():
    model = random_model(layers=2, seed=1)
    ids, mask = random_batch(T=9, seed=5)
    scores = {"a": torch.randn(ids.shape, generator=torch.Generator().manual_seed(6))}
    rep = F.faithfulness_report(model, ids, mask, explainers=["a"], precomputed=scores, random_draws=1,
                                flip_resolution=8)  # n <= 8 scorable tokens in every example
    exact = F.faithfulness_report(model, ids, mask, explainers=["a"], precomputed=scores, random_draws=1)
    assert torch.equal(rep["per_example"]["a/flip_frac"], exact["per_example"]["a/flip_frac"])
