"""A head's eps_tv (and its bound) is the largest over its rows (docs/identifiability.md 2.6), on heads whose
tv_eps has a closed form per row:

* all value rows equal (T = 1 t^T): every a' gives the same output, so tv_eps(a) = 1 - min_j a_j (the farthest
  vertex of the simplex), at every eps;
* n = 2, T = [[1], [0]]: a' T = a'_1, so ||(a' - a) T|| <= eps ||a T|| allows |a'_1 - a_1| <= eps a_1, and
  TV(a, a') = |a'_1 - a_1|: tv_eps(a) = eps a_1 (for eps < 1 the simplex never stops it first).
"""

import pytest
import torch

from identifiable_transformers.diagnostics.maths.epsilon import EPS_BOUNDS, EPS_LEVELS, epsilon_tv_metrics

F64 = torch.float64


def test_equal_value_rows_give_the_farthest_vertex_of_the_worst_row():
    A = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=F64)  # rows: 2/3, 0.9, 0.8
    T = torch.tensor([[1.0, 2.0]] * 3, dtype=F64)
    metrics = epsilon_tv_metrics(A.unsqueeze(0), T.unsqueeze(0))
    for name in (*EPS_LEVELS, *EPS_BOUNDS):
        assert metrics[name].shape == (1,)
        assert float(metrics[name][0]) == pytest.approx(0.9, abs=1e-12), name  # not the mean, 0.789


def test_one_value_direction_gives_eps_times_the_largest_weight_on_it():
    # two heads (a batch dimension): rows with a_1 = 0.2, 0.9 and 0.7, 0.5
    A = torch.tensor([[[0.2, 0.8], [0.9, 0.1]], [[0.7, 0.3], [0.5, 0.5]]], dtype=F64)
    T = torch.tensor([[1.0], [0.0]], dtype=F64).expand(2, 2, 1)
    metrics = epsilon_tv_metrics(A, T)
    for levels in (EPS_LEVELS, EPS_BOUNDS):
        for (name, eps) in zip(levels, EPS_LEVELS.values()):
            assert metrics[name].tolist() == pytest.approx([0.9 * eps, 0.7 * eps], rel=1e-9), name


@pytest.mark.parametrize("head_combine", ["concat", "add"])
def test_key_dim_1_heads_are_bracketed_by_a_brute_force_search(head_combine):
    """model.key_dim=1 (the long_range sweep's smallest): rank-1 attention logits, often near one-hot rows. Every
    row's found value is achieved (at most the brute force's, up to its sampling) and its bound lies above it."""
    from test_epsilon_identifiability import _brute

    from identifiable_transformers.diagnostics.maths import attention_identifiability
    from identifiable_transformers.diagnostics.maths.epsilon import epsilon_alternative_tv
    from identifiable_transformers.diagnostics.maths.internals import value_output_matrices
    from identifiable_transformers.models import TransformerClassifier

    torch.manual_seed(0)
    model = TransformerClassifier(vocab_size=30, num_classes=2, embed_dim=8, num_heads=2, key_dim=1, max_len=16,
                                  head_combine=head_combine).eval()
    ids = torch.randint(3, 30, (2, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 4:] = False
    rep = attention_identifiability(model, ids, mask)
    for k in (*EPS_LEVELS, *EPS_BOUNDS):
        assert bool(((rep[k] >= 0) & (rep[k] <= 1)).all()), k
    A_all, T_all = value_output_matrices(model.attention_internals(ids, mask))
    g = torch.Generator().manual_seed(0)
    for b, n in enumerate(mask.sum(1).tolist()):
        for h in range(2):
            A, T = A_all[b, 0, h, :n, :n], T_all[b, 0, h, :n]
            for eps in EPS_LEVELS.values():
                found, bound = epsilon_alternative_tv(A, T, eps)
                for i in range(n):
                    brute = _brute(A[i], T, eps, g, samples=4000)
                    assert float(found[i]) <= brute + 0.02 and float(bound[i]) >= brute - 1e-12
