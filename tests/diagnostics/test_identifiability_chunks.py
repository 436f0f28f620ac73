"""The identifiability pass in chunks (issue 39: never the whole probe's float64 stacks): the same report, and
the same logged metrics, with one example per chunk as with the whole probe at once (integers exactly, floats up to
the float32 rounding of the model's forward at another batch size); and the layer-by-layer
maths against an independent float64 computation of each head's null space."""

import pytest
import torch

from identifiable_transformers.diagnostics.callbacks.identifiability import summarize_report
from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.models import TransformerClassifier

VOCAB = 200
LENGTHS = [3, 17, 9, 17, 1, 30, 12, 5]  # unsorted, a repeated length, below and above the head size


def _probe():
    torch.manual_seed(0)
    model = TransformerClassifier(VOCAB, 2, embed_dim=16, num_heads=4, num_layers=2, head_combine="concat",
                                  positional="none", dropout=0.0, max_len=40).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
    return model, ids, ids != 0


def _same(a, b) -> bool:
    """Integers (null dims, ranks) exactly; floats up to the float32 rounding of the model's forward, which may
    differ in the last bit between batch sizes (a chunk of 1 example against 8: CPU GEMM kernels block by size)."""
    if a.dtype.is_floating_point:
        return torch.allclose(a, b, rtol=1e-6, atol=1e-9)
    return torch.equal(a, b)


@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chunks_give_the_whole_probes_report_and_metrics(chunk_size):
    model, ids, mask = _probe()
    whole = attention_identifiability(model, ids, mask, return_maps=True)
    chunked = attention_identifiability(model, ids, mask, return_maps=True, chunk_size=chunk_size)
    assert set(chunked) == set(whole)
    for key, value in whole.items():
        if key == "maps":
            for a, b in zip(value, chunked[key]):
                # The witness is one of the row's output-equivalent maps that the search found: where candidate
                # directions tie to rounding, another one may win (its largest TV, compared below, does not move).
                assert a.keys() == b.keys() and all(_same(a[k], b[k]) for k in ("attention", "effective"))
                assert bool((b["witness_rel_error"] < 1e-10).all())
        elif isinstance(value, torch.Tensor):
            assert _same(chunked[key], value), key
        else:
            assert chunked[key] == value, key
    bins = [4, 16, 32]
    logged, expected = summarize_report(chunked, bins=bins), summarize_report(whole, bins=bins)
    assert logged.keys() == expected.keys()
    assert all(logged[k] == pytest.approx(v, rel=1e-6, abs=1e-9) for k, v in expected.items())  # the logged metrics


def test_null_dims_match_an_independent_float64_computation():
    model, ids, mask = _probe()
    report = attention_identifiability(model, ids, mask, chunk_size=2)
    with torch.no_grad():
        internals = model.attention_internals(ids, mask)
    for b, n in enumerate(LENGTHS):
        for l, layer in enumerate(internals):
            for h in range(model.num_heads):
                T = layer.values[b, h, :n].double() @ layer.out_proj[h].double()  # T = V W_o^h (n, d)
                assert int(report["null_dim"][b, l, h]) == n - int(torch.linalg.matrix_rank(T))


def test_chunk_size_must_be_positive():
    model, ids, mask = _probe()
    with pytest.raises(ValueError, match="chunk_size"):
        attention_identifiability(model, ids, mask, chunk_size=0)
