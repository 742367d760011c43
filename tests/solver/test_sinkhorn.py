import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot import AccuracyWarning, sinkhorn
from sketchot.solver.plans import barycentric


def weighted_problem(seed, n=60, m=45):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 3)), rng.beta(2, 5, size=(m, 3))
    a, b = rng.random(n) + 0.1, rng.random(m) + 0.1
    return a / a.sum(), b / b.sum(), X, Y


@pytest.mark.parametrize("reg", [1.0, 0.1, 0.02])
def test_exact_reproduces_pot(reg, library):
    a, b, X, Y = weighted_problem(0)
    M = ot.dist(X, Y)
    plan, log = ot.sinkhorn(a, b, M, reg, log=True)
    # POT's criterion at POT's tolerance (the default stops at the accuracy, sooner)
    ours = sinkhorn(*library(a, b, X, Y), reg=reg, backend="exact", anderson=0, tol=1e-9)
    assert library.owns(ours.plan) and library.owns(ours.u) and library.owns(ours.potentials[0])
    assert ours.converged and ours.log_domain  # the stabilised path, POT's iterates
    assert ours.n_iter == log["niter"] + 1  # POT's niter is the 0-based index of the last one
    # same iteration from the same start: agreement to rounding, far below the 1e-8 required
    np.testing.assert_allclose(ours.plan, plan, rtol=1e-8, atol=1e-8 * plan.max())
    np.testing.assert_allclose(ours.u, log["u"], rtol=1e-8)
    np.testing.assert_allclose(ours.v, log["v"], rtol=1e-8)
    assert ours.value_linear == pytest.approx(np.sum(plan * M), rel=1e-8)
    value = sketchot.sinkhorn2(*library(a, b, X, Y), reg, "exact", anderson=0, tol=1e-9)
    assert float(value) == pytest.approx(ot.sinkhorn2(a, b, M, reg), rel=1e-8)


@pytest.mark.parametrize("reg", [1.0, 0.1, 0.02])
def test_anderson_reaches_pots_fixed_point_in_fewer_iterations(reg):
    a, b, X, Y = weighted_problem(0)
    M = ot.dist(X, Y)
    plan = ot.sinkhorn(a, b, M, reg, stopThr=1e-12, numItermax=10**5)
    ours = sinkhorn(a, b, X, Y, reg=reg, backend="exact", tol=1e-12, max_iter=10**5)
    plain = sinkhorn(a, b, X, Y, reg=reg, backend="exact", tol=1e-12, max_iter=10**5, anderson=0)
    assert ours.converged and ours.n_iter <= plain.n_iter
    # both stop at marginal error 1e-12: the plans agree to about that over the plan's scale
    np.testing.assert_allclose(ours.plan, plan, rtol=1e-6, atol=1e-9 * plan.max())
    assert ours.value_linear == pytest.approx(np.sum(plan * M), rel=1e-9)


def test_streamed_exact_equals_dense(library):
    a, b, X, Y = library(*weighted_problem(1))
    dense = sinkhorn(a, b, X, Y, reg=0.1, backend="exact")
    streamed = sinkhorn(a, b, X, Y, reg=0.1, backend="exact", max_dense_bytes=0)
    assert not streamed.kernel.is_dense  # ExactKernel's own attribute
    np.testing.assert_allclose(streamed.u, dense.u, rtol=1e-12)
    np.testing.assert_allclose(streamed.v, dense.v, rtol=1e-12)
    # values are 0-d tensors on tensors (POT's convention): compared as numbers
    assert float(streamed.value_linear) == pytest.approx(float(dense.value_linear), rel=1e-12)


def test_log_domain_matches_multiplicative_and_pot_log():
    a, b, X, Y = weighted_problem(2)
    options = {"reg": 0.05, "backend": "exact", "tol": 1e-9}  # the 1e-9 the comparison needs
    multiplicative = sinkhorn(a, b, X, Y, log_domain=False, **options)
    stabilised = sinkhorn(a, b, X, Y, log_domain=True, **options)
    assert stabilised.log_domain and stabilised.converged
    # both stop at a column error < 1e-9 (L2), i.e. plans equal to ~1e-9
    np.testing.assert_allclose(stabilised.plan, multiplicative.plan, atol=1e-9)
    pot_plan = ot.sinkhorn(a, b, ot.dist(X, Y), 0.05, method="sinkhorn_log", stopThr=1e-12)
    np.testing.assert_allclose(stabilised.plan, pot_plan, atol=1e-9)


def test_tiny_reg_uses_the_log_domain_without_nan():
    rng = np.random.default_rng(3)
    X, Y = rng.random((80, 3)), rng.random((70, 3))
    # multiplicative Sinkhorn underflows here: exp(-M / 1e-3) is 0 for most pairs
    with pytest.warns(UserWarning, match="did not converge"):
        # POT's criterion at 1e-9, out of reach in 300 iterations at this reg
        result = sinkhorn(None, None, X, Y, reg=1e-3, backend="exact", max_iter=300, tol=1e-9)
    assert result.log_domain
    assert np.all(np.isfinite(result.potentials[0])) and np.all(np.isfinite(result.potentials[1]))
    assert np.isfinite(result.value_linear)
    errors = [error for _, error in result.error_history]
    assert errors[-1] < errors[0] / 10  # it makes progress
    assert np.all(np.isfinite(result.lazy_plan.rows([0, 1])))


def test_far_outlier_row_stays_finite():
    """A far outlier row underflows completely in exp(-M / reg): the stabilised path
    absorbs its scaling instead."""
    rng = np.random.default_rng(4)
    X = rng.random((30, 2)) * 0.1
    Y = rng.random((30, 2)) * 0.1
    X[0] = [30.0, 30.0]  # every kernel entry of row 0 is exp(-1800 / reg): 0 in float64
    result = sinkhorn(None, None, X, Y, reg=2.5, backend="exact")
    assert result.log_domain and result.converged
    assert np.all(np.isfinite(result.marginals[0]))


def test_zero_weights_get_no_mass_and_no_nan(library):
    a, b, X, Y = weighted_problem(5)
    a[[0, 7]] = 0.0
    b[3] = 0.0
    a, b, X, Y = library(a / a.sum(), b / b.sum(), X, Y)
    for backend, params in [("exact", {}), ("nystrom", {"n_landmarks": 40}), ("polyts", {})]:
        # warn=False: polyts is coarse at reg = 0.5 (its true-kernel check would warn)
        result = sinkhorn(a, b, X, Y, reg=0.5, backend=backend, rng=0, warn=False, **params)
        row, col = map(np.asarray, result.marginals)
        assert library.owns(result.marginals[0])
        assert row[0] == 0.0 and row[7] == 0.0 and col[3] == 0.0
        assert np.all(np.isfinite(row)) and np.all(np.isfinite(col))
        assert np.isfinite(result.value) and np.isfinite(result.value_dual)
        assert np.all(np.isfinite(np.asarray(result.barycentric_map())))


def test_non_convergence_is_reported_and_warned():
    a, b, X, Y = weighted_problem(6)
    with pytest.warns(UserWarning, match="did not converge in 3 iterations"):
        result = sinkhorn(a, b, X, Y, reg=0.05, backend="exact", max_iter=3)
    assert not result.converged and result.n_iter == 3 and result.status == "max_iter reached"


def test_float32_tolerance_is_raised_with_a_warning():
    a, b, X, Y = weighted_problem(7)
    with pytest.warns(UserWarning, match="below what float32 kernels resolve"):
        # POT's criterion at 1e-9: below the float32 floor of the L2 norm
        result = sinkhorn(
            a, b, X, Y, reg=0.5, backend="nystrom", n_landmarks=40, rng=0, dtype=np.float32,
            tol=1e-9,
        )  # fmt: skip
    reference = sinkhorn(a, b, X, Y, reg=0.5, backend="nystrom", n_landmarks=40, rng=0)
    assert result.converged
    # float32 kernel: the plan cost differs by rounding of the stored factors (~1e-7 relative)
    assert result.value_linear == pytest.approx(reference.value_linear, rel=1e-4)


def test_result_quantities_are_consistent(library):
    a, b, X, Y = weighted_problem(8)
    result = sinkhorn(*library(a, b, X, Y), reg=0.3, backend="exact", tol=1e-12)
    plan, M = np.asarray(result.plan), ot.dist(X, Y)
    assert library.owns(result.marginals[0]) and library.owns(result.barycentric_map())
    np.testing.assert_allclose(result.potentials[0], np.log(np.asarray(result.u)))
    np.testing.assert_allclose(result.marginals[0], plan.sum(1), rtol=1e-10)
    assert sum(result.marginal_errors) < 1e-10
    # POT's ot.solve_sample convention: <P, M> + reg KL(P | a b^T), generalised KL
    kl = np.sum(plan * np.log(plan / np.outer(a, b))) - plan.sum() + a.sum() * b.sum()
    assert float(result.value) == pytest.approx(np.sum(plan * M) + 0.3 * kl, rel=1e-10)
    # strong duality at convergence
    assert float(result.value_dual) == pytest.approx(float(result.value), rel=1e-9)
    lazy = result.lazy_plan
    vec = np.linspace(0, 1, 45)
    np.testing.assert_allclose(lazy.matvec(library(vec)), plan @ vec, rtol=1e-10)
    np.testing.assert_allclose(lazy.rmatvec(np.ones(60)), plan.sum(0), rtol=1e-10)
    np.testing.assert_allclose(lazy.rows([2, 5]), plan[[2, 5]], rtol=1e-10)
    np.testing.assert_allclose(result.barycentric_map(), plan @ Y / plan.sum(1)[:, None], rtol=1e-9)
    np.testing.assert_allclose(
        result.inverse_barycentric_map(), plan.T @ X / plan.sum(0)[:, None], rtol=1e-9
    )
    assert result.timings["build"] >= 0 and result.timings["per_iteration"] > 0


@pytest.mark.parametrize("backend", ["exact", "nystrom", "polyts", "rff"])
def test_out_of_sample_map_on_fitted_points(backend, library):
    a, b, X, Y = library(*weighted_problem(9))
    result = sinkhorn(a, b, X, Y, reg=1.0, backend=backend, rng=0, warn=False)
    fitted = result.barycentric_map()
    np.testing.assert_allclose(result.barycentric_map(X), fitted, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        result.inverse_barycentric_map(Y), result.inverse_barycentric_map(), rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("backend", ["exact", "nystrom"])
def test_fitted_maps_read_the_summary_moments(backend):
    """The fitted points' maps are the summary's moments over its marginals (no kernel
    product); a zero weight (its plan row is 0) sends them through the kernel instead. Both
    agree with the map computed through the kernel to rounding (1e-9 relative)."""
    a, b, X, Y = weighted_problem(11)
    result = sinkhorn(a, b, X, Y, reg=0.2, backend=backend, rng=0, warn=False)
    assert all(moments is not None for moments in result.plan_moments)
    through_kernel = barycentric(result.kernel, None, result.potentials[1], Y)[0]
    assert result._map_from_moments(0) is not None
    np.testing.assert_allclose(result.barycentric_map(), through_kernel, rtol=1e-9)
    a = a.copy()
    a[3] = 0.0
    result = sinkhorn(a / a.sum(), b, X, Y, reg=0.2, backend=backend, rng=0, warn=False)
    assert result._map_from_moments(0) is None and result._map_from_moments(1) is not None
    mapped = result.barycentric_map()
    assert np.all(np.isfinite(mapped))
    np.testing.assert_allclose(mapped, result.barycentric_map(X), rtol=1e-9, atol=1e-12)


def test_true_kernel_check(library):
    a, b, X, Y = library(*weighted_problem(10))
    exact = sinkhorn(a, b, X, Y, reg=0.5, backend="exact", tol=1e-12)
    check = exact.check_true_kernel()
    assert check.exhaustive and check.error_a < 1e-9 and check.error_b < 1e-9
    with pytest.warns(AccuracyWarning, match="against the exact kernel"):
        weak = sinkhorn(a, b, X, Y, reg=0.5, backend="rff", n_features=10, rng=0)
    # 60 x 60 entries: the solver's own check uses every row and column (exact, no sampling)
    assert weak.true_kernel.exhaustive and not weak.accuracy_met
    full = weak.check_true_kernel(n_samples=1000)
    sampled = weak.check_true_kernel(n_samples=20, rng=1)
    assert full.exhaustive and not sampled.exhaustive
    # a 10-feature RFF converges on its own kernel but is far off the true one
    assert sum(weak.marginal_errors) < 1e-6 and full.error_a > 1e-2
    # the sampled estimate is unbiased; with 20 of 60 rows it is within a factor ~2 here
    assert 0.3 < sampled.error_a / full.error_a < 3


def test_verbose_output(capsys):
    a, b, X, Y = weighted_problem(11)
    sinkhorn(a, b, X, Y, reg=1.0, backend="polyts", rng=0, verbose=True)
    out = capsys.readouterr().out
    assert "built" in out and "marginal err" in out and "true-kernel L1 marginal errors" in out


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    reg=st.floats(0.05, 5.0),
    n=st.integers(2, 25),
    m=st.integers(2, 25),
)
def test_exact_plan_is_a_coupling(seed, reg, n, m):
    """For any problem the exact solver returns a non-negative plan with marginals (a, b)."""
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), rng.random((m, 2))
    a, b = rng.random(n) + 0.01, rng.random(m) + 0.01
    a, b = a / a.sum(), b / b.sum()
    result = sinkhorn(a, b, X, Y, reg=reg, backend="exact", max_iter=5000, tol=1e-10)
    plan = result.plan
    assert np.all(plan >= 0)
    np.testing.assert_allclose(plan.sum(1), a, atol=1e-8)  # u is updated last: exact rows
    np.testing.assert_allclose(plan.sum(0), b, atol=1e-9)  # stopping criterion 1e-10 in L2
    assert result.value_linear >= 0
