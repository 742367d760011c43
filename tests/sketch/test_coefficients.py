import numpy as np
import pytest
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P
from scipy.optimize import lsq_linear

from sketchot.sketch import (
    CallableFunction,
    PolyTensorSketch,
    chebyshev_to_monomial,
    ridge_diagonal,
)
from sketchot.sketch.coefficients import chebyshev_normal_equations, solve_regression


@pytest.mark.parametrize(("degree", "a"), [(0, 1.0), (3, 0.5), (6, 2.5), (10, 1.3)])
def test_chebyshev_to_monomial_matches_numpy(degree, a):
    rng = np.random.default_rng(degree)
    cheb = rng.standard_normal(degree + 1)
    t = np.linspace(-a, a, 17)
    R = chebyshev_to_monomial(degree, a)
    # relative to the largest value: the monomial form loses ~2^r digits at degree r
    np.testing.assert_allclose(
        P.polyval(t, R @ cheb), C.chebval(t / a, cheb), atol=1e-11 * 2**degree
    )


def cubic(t):
    return 0.5 - 1.5 * t + 0.25 * t**2 + 2.0 * t**3


@pytest.mark.parametrize(
    ("method", "variant"), [("optimal", "paper"), ("coreset", "paper"), ("coreset", "improved")]
)
@pytest.mark.parametrize("degree", [3, 5])
def test_regression_recovers_a_polynomial_when_w_is_off(method, variant, degree):
    """A cubic is its own best fit. The improved variant (rank 1 + r * 20, degrees searched up
    to 16) has degrees 1-3 exact in d = 3, so no variance term shrinks them."""
    rng = np.random.default_rng(7)
    U, V = rng.standard_normal((40, 3)) / 2, rng.standard_normal((30, 3)) / 2
    sketch = PolyTensorSketch(
        CallableFunction(cubic),
        degree=degree,
        coefficients=method,
        coreset_size=5,
        regularizer="none",
        variant=variant,
        fit_tolerance=None,  # about the coefficients: the paper's m = 20 sketch adds 50% noise
        rng=0,
    ).fit(U, V)
    expected = np.zeros(sketch.coef_.shape[0])  # improved: the degree it searched up to
    expected[:4] = [0.5, -1.5, 0.25, 2.0]
    # exact in exact arithmetic; rounding of the normal equations in the Chebyshev basis
    np.testing.assert_allclose(sketch.coef_, expected, atol=1e-8)


def test_ridge_diagonal_conventions():
    su = np.array([1.0, 4.0])  # ||u_i||^2
    sv = np.array([9.0])
    r, m = 2, 5
    shifted = ridge_diagonal(su, sv, r, m, "shifted")
    theorem = ridge_diagonal(su, sv, r, m, "theorem")
    S = lambda norms, p: np.sum(norms**p)  # noqa: E731
    assert shifted[0] == theorem[0] == 0.0
    for j in (1, 2):
        assert shifted[j] == pytest.approx(
            np.sqrt(r * (2 + 3 ** (j + 1)) * S(su, j + 1) * S(sv, j + 1) / m)
        )
        assert theorem[j] == pytest.approx(np.sqrt(r * (2 + 3**j) * S(su, j) * S(sv, j) / m))
    assert np.all(ridge_diagonal(su, sv, r, m, "none") == 0)


def test_strong_regulariser_keeps_only_the_constant():
    """W_0 = 0, W_j huge: c_j -> 0 for j >= 1 and c_0 -> the weighted mean of f."""
    t = np.linspace(-1, 1, 41)
    values = np.exp(t)
    gram, moment = chebyshev_normal_equations(t, values, None, 3, 1.0)
    coef, _ = solve_regression(gram, moment, np.array([0.0, 1e9, 1e9, 1e9]), 1.0)
    assert np.all(np.abs(coef[1:]) < 1e-6)
    assert coef[0] == pytest.approx(values.mean(), rel=1e-6)


def test_nonnegative_solution_is_the_bounded_least_squares_optimum():
    """Sigmoid has negative odd Taylor coefficients: the NNLS fit must clip them and still be
    optimal among non-negative coefficient vectors (checked with scipy's lsq_linear)."""
    t = np.linspace(-3, 3, 201)
    values = 1 / (1 + np.exp(-t))
    ridge = np.array([0.0, 0.5, 0.5, 0.5])
    gram, moment = chebyshev_normal_equations(t, values, None, 3, 3.0)
    coef, _ = solve_regression(gram, moment, ridge, 3.0, nonnegative=True)
    unconstrained, _ = solve_regression(gram, moment, ridge, 3.0)
    assert np.any(unconstrained < 0) and np.all(coef >= 0)
    design = np.vstack([np.vander(t, 4, increasing=True), np.diag(ridge)])
    target = np.concatenate([values, np.zeros(4)])
    reference = lsq_linear(design, target, bounds=(0, np.inf), tol=1e-14).x
    objective = lambda c: np.sum((design @ c - target) ** 2)  # noqa: E731
    # same optimum value up to the solvers' tolerances
    assert objective(coef) == pytest.approx(objective(reference), rel=1e-7)


def test_chebyshev_interpolates_at_the_chebyshev_points():
    rng = np.random.default_rng(1)
    U = rng.standard_normal((20, 2))
    sketch = PolyTensorSketch(
        "exp", degree=4, coefficients="chebyshev", variant="paper", fit_tolerance=None, rng=0
    ).fit(U)  # about the interpolation nodes, not the sketch's accuracy
    a = sketch.half_width_
    nodes = a * np.cos((2 * np.arange(5) + 1) * np.pi / 10)
    # monomial evaluation rounds relative to the largest value on the interval
    np.testing.assert_allclose(
        P.polyval(nodes, sketch.coef_), np.exp(nodes), atol=1e-12 * np.exp(a)
    )


def test_taylor_around_the_mean_entry():
    rng = np.random.default_rng(2)
    U = rng.standard_normal((15, 3)) / 3 + 0.2
    sketch = PolyTensorSketch(
        "exp", degree=6, coefficients="taylor", taylor_center="mean", variant="paper", rng=0
    ).fit(U)
    center = np.mean(U @ U.T)
    assert sketch.fit_info_.details["center"] == pytest.approx(center)
    # the Taylor polynomial and exp agree to 7th order around the centre
    t = center + np.array([-1e-2, 0.0, 1e-2])
    np.testing.assert_allclose(P.polyval(t, sketch.coef_), np.exp(t), rtol=1e-13)


@pytest.mark.parametrize("variant", ["paper", "improved"])
def test_coreset_uses_the_side_with_the_smaller_bound(variant):
    rng = np.random.default_rng(3)
    U = np.repeat(rng.standard_normal((4, 3)), 25, axis=0)  # 4 distinct rows: eps_U = 0 at k=4
    V = rng.standard_normal((60, 3))
    sketch = PolyTensorSketch(
        "exp", coreset_size=4, variant=variant, fit_tolerance=None, rng=0
    ).fit(U / 3, V / 3)  # about the coreset's side, not the sketch's accuracy
    details = sketch.fit_info_.details
    assert details["side"] == "U" and details["epsilon_U"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_array_equal(np.sort(details["cluster_sizes"]), [25, 25, 25, 25])


@pytest.mark.parametrize("degree", [0, 1, 3, 10])
def test_moment_normal_equations_equal_the_explicit_design(degree):
    """The Gram matrix from Chebyshev moments equals X_c^T D X_c of the explicit design."""
    rng = np.random.default_rng(degree)
    t = rng.uniform(-2, 2, size=(4, 300))
    values = np.exp(t)
    weights = np.array([1.0, 5.0, 0.0, 2.5])
    gram, moment = chebyshev_normal_equations(t, values, weights, degree, 2.0, block_entries=97)
    design = C.chebvander(t.ravel() / 2.0, degree)
    w = np.repeat(weights, 300)
    np.testing.assert_allclose(gram, design.T @ (w[:, None] * design), rtol=1e-11, atol=1e-9)
    np.testing.assert_allclose(moment, design.T @ (w * values.ravel()), rtol=1e-11, atol=1e-9)
