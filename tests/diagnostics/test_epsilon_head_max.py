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
