"""Long inputs are processed in smaller pieces (ALTI's and norm_resln's token decomposition a few query rows at a
time; erasure's copies within a token x width budget): the same numbers as in one piece."""

import torch
from diag_helpers import random_batch, random_model

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.diagnostics.faithfulness import context_mixing, readout


def test_decomposition_maps_by_query_rows_equal_the_whole(monkeypatch):
    model = random_model(layers=2, seed=4)
    ids, mask = random_batch(T=9, seed=3)
    whole = {k: getattr(F, k)(model, ids, mask) for k in ("alti", "norm_resln")}
    monkeypatch.setattr(context_mixing, "_CHUNK_ELEMENTS", 2 * 9 * 8)  # 2 query rows of one example a piece
    for k, expected in whole.items():
        torch.testing.assert_close(getattr(F, k)(model, ids, mask), expected, rtol=0, atol=1e-6)


def test_copies_within_a_width_budget_give_the_same_probabilities(monkeypatch):
    model = random_model(layers=2, pooling="mean", seed=2)
    ids, mask = random_batch(T=9, seed=1)
    whole = F.explain(model, ids, mask, ["loo"])["loo"]
    calls = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))
    monkeypatch.setattr(readout, "_CHUNK_ACTIVATIONS", 27 * model.embed_dim)  # 27 tokens a pass: 3 copies of 9
    chunked = F.explain(model, ids, mask, ["loo"])["loo"]
    copies = calls[1:]  # calls[0]: the prediction on the whole batch
    assert max(rows * length for rows, length in copies) <= 27, calls
    assert sum(rows for rows, _ in copies) == int((mask.sum(1) - 1).sum()) and len(copies) > 3, calls
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
