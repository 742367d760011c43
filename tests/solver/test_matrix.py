"""Solves on a cost matrix ``M`` (``sketchot.solver.matrix``): the one solver on the exact
kernel ``exp(-M / reg)``, against the same solve on point clouds and against POT on POT's own
test inputs.

Tolerances: against the clouds, 1e-10 on the potentials and values (the brief's; the costs
are the same numbers, so the iterations are too); against POT, POT's own tolerances of the
test each case ports (named in each test); the certified value bracket of
``tests/solver/test_grids.py`` for the 1-D histograms at small reg.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

import sketchot
from sketchot.cost_matrix import PointsRequiredError
from sketchot.solver import SolverOptions
from sketchot.solver.matrix import sinkhorn_matrix

ACCURACY = 1e-3  # the default accuracy (sketchot._defaults.DEFAULT_ACCURACY)


def on_matrix(a, b, M, reg, *, reg_m=None, warmstart=None, dtype=np.float64,
              max_dense_bytes=1 << 30, **options):  # fmt: skip
    return sinkhorn_matrix(
        a, b, M, reg, reg_m=reg_m, warmstart=warmstart, dtype=dtype,
        max_dense_bytes=max_dense_bytes, options=SolverOptions(**options),
    )  # fmt: skip


def on_clouds(a, b, X, Y, reg, *, reg_m=None, **options):
    if reg_m is None:
        return sketchot.sinkhorn(a, b, X, Y, reg, backend="exact", **options)
    return sketchot.sinkhorn_unbalanced(a, b, X, Y, reg, reg_m, backend="exact", **options)


def random_case(seed=0, n=60, m=45):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2)) + 0.5
    a, b = rng.random(n) + 0.1, rng.random(m) + 0.1
    return X, Y, a / a.sum(), b / b.sum()


def assert_same_solve(mine, theirs, atol=1e-10):
    for left, right in zip(mine.potentials, theirs.potentials, strict=True):
        np.testing.assert_allclose(left, right, atol=atol)
    assert mine.value == pytest.approx(theirs.value, abs=atol)
    assert mine.value_linear == pytest.approx(theirs.value_linear, abs=atol)
    assert mine.n_iter == theirs.n_iter and mine.stop == theirs.stop


# ------------------------------------------------------------------------ as on the clouds


@pytest.mark.parametrize("reg_m", [None, 0.5, (math.inf, 0.3)])
@pytest.mark.parametrize("log_domain", ["auto", False])
@pytest.mark.parametrize("epsilon_scaling", [False, True])
def test_a_solve_on_M_is_the_solve_on_the_clouds(reg_m, log_domain, epsilon_scaling):
    """Clouds with the cost as a callable (``ot.dist``): the same costs and the same largest
    cost, so the same epsilon schedule, iterations and plan."""
    X, Y, a, b = random_case()
    options = dict(tol=1e-11, log_domain=log_domain, epsilon_scaling=epsilon_scaling)
    mine = on_matrix(a, b, ot.dist(X, Y), 0.2, reg_m=reg_m, **options)
    theirs = on_clouds(a, b, X, Y, 0.2, reg_m=reg_m, metric=lambda A, B: ot.dist(A, B),
                       **options)  # fmt: skip
    assert mine.converged
    assert_same_solve(mine, theirs)
    assert mine.iteration_info["strategy"] == theirs.iteration_info["strategy"]
    np.testing.assert_allclose(mine.plan, theirs.plan, atol=1e-12)


@pytest.mark.parametrize("reg_m", [None, 0.5])
@pytest.mark.parametrize("log_domain", ["auto", False])
def test_a_solve_on_pots_M_is_the_solve_on_the_default_clouds(reg_m, log_domain):
    """``ot.dist(X, Y)`` against the clouds' own squared-Euclidean cost (the same costs to
    float64 rounding)."""
    X, Y, a, b = random_case(1)
    options = dict(tol=1e-11, log_domain=log_domain, epsilon_scaling=False)
    mine = on_matrix(a, b, ot.dist(X, Y), 0.3, reg_m=reg_m, **options)
    theirs = on_clouds(a, b, X, Y, 0.3, reg_m=reg_m, coarse_to_fine=False, **options)
    assert_same_solve(mine, theirs)


@pytest.mark.parametrize("metric", ["cityblock", "euclidean"])
def test_other_metrics_match_the_clouds(metric):
    X, Y, a, b = random_case(2)
    mine = on_matrix(a, b, ot.dist(X, Y, metric=metric), 0.1, tol=1e-11)
    theirs = on_clouds(a, b, X, Y, 0.1, metric=metric, tol=1e-11, coarse_to_fine=False)
    assert_same_solve(mine, theirs)


# ------------------------------------------------------------------------- against POT


def pot_sinkhorn_case():
    """POT test_bregman.py::test_sinkhorn's inputs (POT's RandomState stream, a local
    generator, reproduces them)."""
    n = 100
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    return ot.utils.unif(n), ot.dist(x, x)


@pytest.mark.parametrize(
    ("method", "log_domain"), [("sinkhorn", False), ("sinkhorn_log", True), ("sinkhorn", "auto")]
)
def test_pots_sinkhorn(method, log_domain):
    """POT test_bregman.py::test_sinkhorn (marginals to 1e-5) and ::test_sinkhorn_variants
    (plans of two solvers to 1e-5), on POT's M."""
    u, M = pot_sinkhorn_case()
    result = on_matrix(u, u, M, 1, tol=1e-10, log_domain=log_domain)
    G = result.plan
    np.testing.assert_allclose(u, G.sum(1), atol=1e-05)
    np.testing.assert_allclose(u, G.sum(0), atol=1e-05)
    np.testing.assert_allclose(G, ot.sinkhorn(u, u, M, 1, method=method, stopThr=1e-10),
                               atol=1e-05)  # fmt: skip
    np.testing.assert_allclose(result.value_linear, ot.sinkhorn2(u, u, M, 1, stopThr=1e-10),
                               atol=1e-05)  # fmt: skip


def pot_unbalanced_case(scale_b=1.5):
    """POT unbalanced/test_sinkhorn.py's inputs (``n = 100``, ``RandomState(42)``)."""
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    return ot.utils.unif(n), ot.utils.unif(n) * scale_b, ot.dist(x, x)


@pytest.mark.parametrize("reg_m", [1.0, (1.0, 2.0), (math.inf, 1.0)])
def test_pots_unbalanced_convergence(reg_m):
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_convergence (``reg_type='kl'``): the
    fixed point of POT's log form to 1e-5 and the value ``sinkhorn_unbalanced2`` equal to
    ``<G, M>`` to 1e-5, at POT's stopThr 1e-6; the plan against POT's to 1e-5 (POT's
    tolerance between its methods). POT's ``logu`` scales ``a b^T exp(-M / reg)``:
    ``logu = log u - log a``."""
    a, b, M = pot_unbalanced_case()
    epsilon = 1.0
    result = on_matrix(a, b, M, epsilon, reg_m=reg_m, tol=1e-6)
    G = result.plan
    logu, logv = result.potentials[0] - np.log(a), result.potentials[1] - np.log(b)
    fi_a, fi_b = result.problem.exponents
    log_ab = np.log(a + 1e-16)[:, None] + np.log(b + 1e-16)[None, :]
    logKtu = logsumexp(logu[None, :] - M.T / epsilon + log_ab.T, axis=1)
    logKv = logsumexp(logv[None, :] - M / epsilon + log_ab, axis=1)
    np.testing.assert_allclose(fi_b * (np.log(b + 1e-16) - logKtu), logv, atol=1e-05)
    np.testing.assert_allclose(fi_a * (np.log(a + 1e-16) - logKv), logu, atol=1e-05)
    pot_reg_m = list(reg_m) if isinstance(reg_m, tuple) else reg_m
    G_pot = ot.sinkhorn_unbalanced(a, b, M, epsilon, pot_reg_m, stopThr=1e-10)
    np.testing.assert_allclose(G, G_pot, atol=1e-05)
    loss = ot.sinkhorn_unbalanced2(a, b, M, epsilon, pot_reg_m, stopThr=1e-10)
    np.testing.assert_allclose(np.sum(G * M), loss, atol=1e-5)
    np.testing.assert_allclose(result.value_linear, np.sum(G * M), rtol=1e-12)


def test_a_matrix_no_cloud_gives():
    """A random cost matrix: not symmetric, not square, no triangle inequality (no point
    cloud gives it): POT's plans balanced and unbalanced to 1e-5 (POT's tolerance)."""
    rng = np.random.default_rng(3)
    M = rng.random((30, 50)) * 4.0
    a, b = rng.random(30) + 0.1, rng.random(50) + 0.1
    a, b = a / a.sum(), b / b.sum()
    balanced = on_matrix(a, b, M, 0.2, tol=1e-10)
    np.testing.assert_allclose(balanced.plan, ot.sinkhorn(a, b, M, 0.2, stopThr=1e-10),
                               atol=1e-05)  # fmt: skip
    unbalanced = on_matrix(a, b, M, 0.2, reg_m=0.7, tol=1e-10)
    expected = ot.sinkhorn_unbalanced(a, b, M, 0.2, 0.7, stopThr=1e-10, numItermax=10_000)
    np.testing.assert_allclose(unbalanced.plan, expected, atol=1e-05)


# ------------------------------------------------------------ small reg on 1-D histograms


def pot_histograms(n=100):
    """POT test_bregman.py's 1-D histograms (test_sinkhorn_stabilization's pair)."""
    return (ot.datasets.make_1D_gauss(n, m=30, s=10), ot.datasets.make_1D_gauss(n, m=40, s=10))


@pytest.mark.parametrize("reg", [1e-1, 1e-2, 1e-3])
def test_pots_1d_histograms_are_certified_at_small_reg(reg):
    """``ot.utils.dist0(100)`` (largest cost / reg 9.8e4 to 9.8e6): the epsilon schedule,
    the absorbed iteration and the Newton stage; certified by the exhaustive check, the
    value inside the bracket of ``tests/solver/test_grids.py``."""
    a, b = pot_histograms()
    M = ot.utils.dist0(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = on_matrix(a, b, M, reg)
    assert not caught, [str(w.message) for w in caught]
    assert result.converged and result.accuracy_met and result.true_kernel.exhaustive
    assert result.true_kernel.bound <= ACCURACY
    assert result.iteration_info["stages"]  # the epsilon schedule ran
    if reg <= 1e-2:
        assert result.iteration_info["strategy"] == "newton"
    optimum = ot.emd2(a, b, M)
    missed = result.true_kernel.bound * M.max()
    assert optimum - missed <= result.value_linear
    assert result.value_linear <= optimum + reg * math.log(100 * 100) + missed


def test_one_iteration_is_refused_as_for_the_clouds():
    """POT test_bregman.py::test_convergence_warning on M: the plan of one iteration is
    refused (the lower bound of the exact cost comes from M's own c-transform)."""
    a, b = pot_histograms()
    tiny = np.finfo(float).tiny
    with pytest.raises(sketchot.InvalidResultError, match="max_iter"):
        on_matrix(a, b, ot.utils.dist0(100), 1.0, tol=tiny, max_iter=1)


def test_the_lower_bound_is_the_clouds():
    """A balanced solve that missed its accuracy and costs less than the weak-duality bound
    of the exact OT cost is refused with the same bound from M's rows as from the clouds
    (the same costs)."""
    X, Y, a, b = random_case(4)
    options = dict(max_iter=2, errors="warn", warn=False, epsilon_scaling=False)
    with pytest.warns(sketchot.InvalidResultWarning, match="a lower bound") as mine:
        result = on_matrix(a, b, ot.dist(X, Y), 0.05, **options)
    with pytest.warns(sketchot.InvalidResultWarning, match="a lower bound") as theirs:
        on_clouds(a, b, X, Y, 0.05, metric=lambda A, B: ot.dist(A, B), **options)
    assert result.accuracy_met is False
    assert [str(w.message) for w in mine] == [str(w.message) for w in theirs]


# ---------------------------------------------------------------- the result and checks


def test_the_true_kernel_check_is_exhaustive_on_K_itself():
    X, Y, a, b = random_case(5)
    result = on_matrix(a, b, ot.dist(X, Y), 0.1)
    check = result.true_kernel
    assert check.exhaustive and result.accuracy_met
    again = result.check_true_kernel(n_samples=10_000)  # every row and column, from M
    assert again.exhaustive
    assert again.bound == pytest.approx(check.bound, rel=1e-6, abs=1e-15)
    sampled = result.check_true_kernel(n_samples=10, rng=np.random.default_rng(0))
    assert sampled.n_rows == 10 and not sampled.exhaustive


def test_what_needs_points_is_refused_and_the_plan_answers_instead():
    X, Y, a, b = random_case(6)
    result = on_matrix(a, b, ot.dist(X, Y), 0.2)
    assert result.plan_moments == (None, None)
    for call in (result.barycentric_map, result.inverse_barycentric_map, result.moments):
        with pytest.raises(PointsRequiredError, match="needs point clouds X, Y"):
            call()
    with pytest.raises(PointsRequiredError, match="apply_new"):
        result.kernel.apply_new(X[:2], np.ones(len(Y)))
    # the map the error advises: the plan's product with the caller's coordinates
    mapped = result.lazy_plan.matmat(Y) / result.marginal_a[:, None]
    clouds = on_clouds(a, b, X, Y, 0.2, metric=lambda A, B: ot.dist(A, B))
    np.testing.assert_allclose(mapped, clouds.barycentric_map(), atol=1e-10)


def test_weights_must_match_M_by_name():
    M = np.ones((3, 4))
    with pytest.raises(ValueError, match=r"^a must have one weight per row of M \(3\); got 4"):
        on_matrix(np.ones(4) / 4, None, M, 1.0)
    with pytest.raises(ValueError, match=r"^b must have one weight per column of M \(4\); got 3"):
        on_matrix(None, np.ones(3) / 3, M, 1.0)
    with pytest.raises(ValueError, match=r"M has negative costs .* unbalanced"):
        on_matrix(None, None, -M, 1.0, reg_m=1.0)
    with pytest.raises(ValueError, match="same total mass"):
        on_matrix(np.ones(3), np.ones(4), M, 1.0)


def test_read_only_strided_and_repeated_calls():
    """A read-only matrix is read, never written; a strided view solves as its copy; the
    same call twice gives the same bits."""
    X, Y, a, b = random_case(7, m=90)
    full = ot.dist(X, Y)
    view = full[:, ::2]
    frozen = np.ascontiguousarray(view)
    frozen.setflags(write=False)
    b = b[::2] / b[::2].sum()
    first = on_matrix(a, b, frozen, 0.1)
    again = on_matrix(a, b, frozen, 0.1)
    strided = on_matrix(a, b, view, 0.1)
    for left, right, other in zip(first.potentials, again.potentials, strided.potentials,
                                  strict=True):  # fmt: skip
        np.testing.assert_array_equal(left, right)
        np.testing.assert_array_equal(left, other)
    np.testing.assert_array_equal(frozen, full[:, ::2])


def test_streamed_float32_and_warm_started_solves():
    X, Y, a, b = random_case(8)
    M = ot.dist(X, Y)
    stored = on_matrix(a, b, M, 0.1, tol=1e-10)
    streamed = on_matrix(a, b, M, 0.1, tol=1e-10, max_dense_bytes=0)
    assert not streamed.kernel.is_dense
    for left, right in zip(stored.potentials, streamed.potentials, strict=True):
        np.testing.assert_allclose(left, right, atol=1e-10)
    single = on_matrix(a, b, M, 0.1, dtype=np.float32)
    assert single.kernel.dtype == np.float32 and single.accuracy_met
    warm = on_matrix(a, b, M, 0.1, tol=1e-10, warmstart=stored.potentials)
    assert warm.n_iter < stored.n_iter
    assert warm.value == pytest.approx(stored.value, abs=1e-10)
