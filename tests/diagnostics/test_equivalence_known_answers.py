"""equivalence_range's known answers where its numerical shortcuts decide (docs/identifiability.md section 2.8):
the rank tolerance (eps-scaled, as stochastic_null_dim's) on rows that are identifiable, however close their tokens'
value-output rows are; and the constant-objective shortcut on token weights that sum to zero, whose range over
the class is not a point."""

import pytest
import torch

from identifiable_transformers.diagnostics.maths.equivalence import equivalence_range, equivalence_ranges


@pytest.mark.parametrize("gap", [1e-13, 1e-11, 1e-9, 1e-7])
def test_two_tokens_with_different_value_rows_are_identifiable(gap):
    """T = [[1], [1 + gap]]: a' T = a T and sum a' = 1 are two independent equations in two unknowns for any
    gap != 0, so P(a) = {a} and the range of w . a' is the point w . a = 0.5, exactly. A tolerance that counts
    gaps of 1e-13..1e-7 as zero would free the row (the whole simplex: (0, 1))."""
    T = torch.tensor([[1.0], [1.0 + gap]], dtype=torch.float64)
    assert equivalence_range(T, [0.5, 0.5], [1.0, 0.0]) == (0.5, 0.5)
    out = equivalence_ranges(T[None], torch.tensor([[0.5, 0.5]]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))
    assert out["free_dim"].tolist() == [0]


def test_three_tokens_two_of_them_close():
    """T = [[0, 0], [1, 0], [1 + 1e-10, 1]]: the three rows and the ones column have rank 3, so P(a) = {a}."""
    T = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0 + 1e-10, 1e-10]], dtype=torch.float64)
    a = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    for w in ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]):
        want = float(torch.tensor(w, dtype=torch.float64) @ a)
        assert equivalence_range(T, a, w) == pytest.approx((want, want), abs=1e-12)


@pytest.mark.parametrize("a", [[0.55, 0.45], [0.45, 0.35, 0.2], [0.1, 0.2, 0.3, 0.4]])
def test_token_weights_summing_to_zero_range_over_the_whole_simplex(a):
    """T = 0: every distribution gives the same output, so P(a) is the whole simplex and w = e0 - e1 ranges over
    [-1, 1] (all mass on token 1, all on token 0). w sums to 0: its part along the ones column is 0, its part in
    the null space all of it; a shortcut that read the other part would call w constant (the point w . a)."""
    n = len(a)
    w = torch.zeros(n, dtype=torch.float64)
    w[0], w[1] = 1.0, -1.0
    low, high = equivalence_range(torch.zeros(n, 3, dtype=torch.float64), a, w)
    assert low == pytest.approx(-1.0, abs=1e-7) and high == pytest.approx(1.0, abs=1e-7)


def test_constant_weights_are_a_point_and_a_one_hot_is_the_simplex():
    """The shortcut's other side: w = 1 is the same (1) on every distribution; a one-hot on T = 0 ranges over
    [0, 1]."""
    a = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    T = torch.zeros(3, 2, dtype=torch.float64)
    assert equivalence_range(T, a, [1.0, 1.0, 1.0]) == pytest.approx((1.0, 1.0), abs=1e-12)
    assert equivalence_range(T, a, [0.0, 0.0, 1.0]) == pytest.approx((0.0, 1.0), abs=1e-7)
