"""equivalence_range against brute force (every vertex of the polytope), closed forms and the head-mean claim."""

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from identifiable_transformers.diagnostics import equivalence_range, equivalence_ranges
from identifiable_transformers.diagnostics.maths.equivalence import LP_FEASIBILITY_TOL


def _vertices(T: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Every vertex of {x >= 0, x [T, 1] = a [T, 1]}: for each support S of rank([T, 1]) tokens whose square
    subsystem is invertible, x_S solves it and x is 0 elsewhere; kept when x >= 0 (explicit enumeration)."""
    E = np.c_[T, np.ones(len(a))].T  # (d + 1, n)
    f = E @ a
    # a basis of E's rows (random T of d + 1 <= n has full row rank; the degenerate cases below build theirs)
    rows = [i for i in range(E.shape[0]) if np.linalg.matrix_rank(E[: i + 1]) > np.linalg.matrix_rank(E[:i])]
    E, f = E[rows], f[rows]
    m, n = E.shape
    out = []
    for S in itertools.combinations(range(n), m):
        sub = E[:, S]
        if abs(np.linalg.det(sub)) < 1e-10:
            continue
        x = np.zeros(n)
        x[list(S)] = np.linalg.solve(sub, f)
        if x.min() >= -1e-10:
            out.append(x)
    return np.array(out)


def _case(seed: int, n: int, d: int):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.dirichlet(np.ones(n)), rng.normal(size=n)


@pytest.mark.parametrize("n,d", [(n, d) for n in (4, 5, 6) for d in (1, 2, 3)])
def test_range_matches_the_vertices(n, d):
    for seed in range(3):
        T, a, w = _case(seed, n, d)
        V = _vertices(T, a)
        assert len(V) >= 1
        low, high = equivalence_range(T, a, w)
        assert low == pytest.approx((V @ w).min(), abs=1e-7)
        assert high == pytest.approx((V @ w).max(), abs=1e-7)
        assert low - 1e-12 <= w @ a <= high + 1e-12


def test_batched_matches_the_vertices_and_returns_feasible_optima():
    R, k, n, d = 5, 3, 6, 2
    rng = np.random.default_rng(7)
    T = rng.normal(size=(R, n, d))
    a = rng.dirichlet(np.ones(n), size=R)
    W = rng.normal(size=(R, k, n))
    out = equivalence_ranges(T, a, W, vertices=True)
    assert out["free_dim"].tolist() == [n - d - 1] * R
    for r in range(R):
        V = _vertices(T[r], a[r])
        np.testing.assert_allclose(out["low"][r].numpy(), (V @ W[r].T).min(0), atol=1e-7)
        np.testing.assert_allclose(out["high"][r].numpy(), (V @ W[r].T).max(0), atol=1e-7)
        for which in ("argmin", "argmax"):
            x = out[which][r].numpy()  # (k, n): each optimum is in the class, within the stated tolerance
            assert x.min() >= -LP_FEASIBILITY_TOL
            np.testing.assert_allclose(x.sum(1), 1.0, atol=LP_FEASIBILITY_TOL)
            np.testing.assert_allclose(x @ T[r], np.broadcast_to(a[r] @ T[r], (k, d)), atol=1e-6)
        np.testing.assert_allclose(np.einsum("kn,kn->k", out["argmax"][r].numpy(), W[r]), out["high"][r], atol=1e-9)


def test_identifiable_row_is_a_point():
    # n <= d + 1 with random T: rank([T, 1]) = n, the class is {a}
    for n, d in ((3, 2), (4, 3), (4, 8)):
        T, a, w = _case(1, n, d)
        low, high = equivalence_range(torch.tensor(T), torch.tensor(a), torch.tensor(w))
        assert low == high == pytest.approx(float(w @ a), abs=1e-12)


def test_free_class_is_the_simplex():
    # T = 0: the output is 0 for every row, the class is the whole simplex, w . a' ranges over [min w, max w]
    rng = np.random.default_rng(3)
    a, w = rng.dirichlet(np.ones(5)), rng.normal(size=5)
    low, high = equivalence_range(np.zeros((5, 2)), a, w)
    assert (low, high) == pytest.approx((w.min(), w.max()), abs=1e-9)


def test_two_tokens_with_one_value_share_their_weight():
    # tokens 0 and 1 carry the same value vector: only a'_0 + a'_1 is fixed, so a'_0 ranges over [0, a_0 + a_1];
    # tokens 2 and 3 have independent values (rank([T, 1]) = 3 = n - 1), so their weights are pinned.
    T = np.array([[1.0, 2.0], [1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]])
    a = np.array([0.1, 0.2, 0.3, 0.4])
    assert equivalence_range(T, a, [1, 0, 0, 0]) == pytest.approx((0.0, 0.3), abs=1e-9)
    assert equivalence_range(T, a, [0, 1, 0, 0]) == pytest.approx((0.0, 0.3), abs=1e-9)
    assert equivalence_range(T, a, [0, 0, 1, 0]) == pytest.approx((0.3, 0.3), abs=1e-9)
    assert equivalence_range(T, a, [1, 1, 0, 0]) == pytest.approx((0.3, 0.3), abs=1e-9)


def test_tolerance_keeps_near_null_directions_out_and_scale_does_not_matter():
    # A T whose third token's value differs from the first by 1e-17 of its scale: numerically the same value,
    # so the class is free along e0 - e2 (the tolerance is sigma_max * max(n, d + 1) * eps, as stochastic_null_dim)
    T = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1e-17]])
    a = np.array([0.5, 0.25, 0.25])
    assert equivalence_range(T, a, [1, 0, 0]) == pytest.approx((0.0, 0.75), abs=1e-9)
    # ... but a real difference (1e-6) pins it; and rescaling T changes nothing
    T2 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1e-6]])
    assert equivalence_range(T2, a, [1, 0, 0]) == pytest.approx((0.5, 0.5), abs=1e-9)
    T3, a3, w3 = _case(4, 6, 2)
    np.testing.assert_allclose(equivalence_range(1e-8 * T3, a3, w3), equivalence_range(1e8 * T3, a3, w3), atol=1e-8)


def test_head_mean_range_is_the_mean_of_per_head_ranges():
    # The head-mean explanation (a1' + a2') / 2 with each a_h' in its own class: the joint LP over the product of
    # the two polytopes gives the mean of the per-head ranges, and so does brute force over all vertex pairs.
    n, d = 6, 2
    (T1, a1, w), (T2, a2, _) = _case(10, n, d), _case(11, n, d)
    V1, V2 = _vertices(T1, a1), _vertices(T2, a2)
    pairs = np.array([(v1 @ w + v2 @ w) / 2 for v1 in V1 for v2 in V2])
    E1, E2 = np.c_[T1, np.ones(n)].T, np.c_[T2, np.ones(n)].T
    A_eq = np.block([[E1, np.zeros_like(E2)], [np.zeros_like(E1), E2]])
    b_eq = np.r_[E1 @ a1, E2 @ a2]
    c = np.r_[w, w] / 2
    joint = [sign * linprog(sign * c, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs").fun for sign in (1, -1)]
    r1, r2 = equivalence_range(T1, a1, w), equivalence_range(T2, a2, w)
    mean = ((r1[0] + r2[0]) / 2, (r1[1] + r2[1]) / 2)
    assert mean == pytest.approx((pairs.min(), pairs.max()), abs=1e-7)
    assert mean == pytest.approx(tuple(joint), abs=1e-7)


def test_bad_rows_are_refused():
    T, a, w = _case(0, 4, 2)
    with pytest.raises(ValueError, match="distribution"):
        equivalence_range(T, a * 2, w)
    with pytest.raises(ValueError, match="same n"):
        equivalence_range(T[:3], a, w)
    with pytest.raises(ValueError, match="w must be"):
        equivalence_range(T, a, w[:3])
