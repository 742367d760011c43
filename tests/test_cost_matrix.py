"""The cost-matrix geometry (``sketchot.cost_matrix``) and the exact kernel on it.

The geometry's contract is checked against :class:`~sketchot.gibbs.GibbsGeometry` on the
matrix the clouds give. Tolerances: the same entries bit for bit when ``M`` is the cloud
geometry's own cost blocks; against ``ot.dist(X, Y)`` (``cdist`` on the raw points, the cloud
geometry expands ``||x||^2 + ||y||^2 - 2 x.y`` in centred coordinates) the costs differ by
float64 rounding of the largest cost, ``1e-13 * max_cost`` in ``-M / reg`` units.
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import logsumexp

from sketchot._arrays import NUMPY
from sketchot.cost_matrix import (
    CostMatrixGeometry,
    PointsRequiredError,
    check_cost_matrix,
    has_points,
)
from sketchot.gibbs import GibbsGeometry, dual_lower_bound
from sketchot.kernels import ExactKernel, build_exact_from_cost
from sketchot.kernels.exact import LOG_FLOOR

REG = 0.7


def clouds(seed: int = 0, n: int = 40, m: int = 55, d: int = 3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=(m, d)) + 0.5


def both(metric="sqeuclidean", reg=REG, own=False):
    """The cloud geometry and the cost-matrix geometry of its costs (``own``: the cloud
    geometry's own cost blocks, else ``ot.dist``)."""
    X, Y = clouds()
    cloud = GibbsGeometry(X, Y, reg, metric)
    M = cloud.cost_block(slice(None)) if own else ot.dist(X, Y, metric=metric)
    return cloud, CostMatrixGeometry(M, reg)


def rounding(geometry) -> float:
    """Float64 rounding of ``-M / reg`` (module notes)."""
    return 1e-13 * geometry.max_cost() / geometry.reg


# --------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "cityblock"])
def test_the_blocks_are_the_cloud_geometrys(metric):
    cloud, matrix = both(metric)
    rng = np.random.default_rng(1)
    n, m = matrix.shape
    assert matrix.shape == cloud.shape
    atol = rounding(matrix)
    rows = np.array([0, 3, 17, 39])
    for index in (slice(None), slice(5, 12), rows):
        np.testing.assert_allclose(matrix.log_block(index), cloud.log_block(index), atol=atol)
        np.testing.assert_allclose(
            matrix.cost_block(index), cloud.cost_block(index), atol=atol * REG
        )
        np.testing.assert_allclose(matrix.block(index), cloud.block(index), rtol=atol)
    log_v, log_u = rng.normal(size=m), rng.normal(size=n)
    V, U = rng.normal(size=(m, 2)), rng.normal(size=(n, 2))
    for index in (slice(None), rows):
        np.testing.assert_allclose(
            matrix.log_matvec(index, log_v), cloud.log_matvec(index, log_v), atol=atol
        )
        np.testing.assert_allclose(matrix.matmat(index, V), cloud.matmat(index, V), rtol=1e-12)
    cols = np.array([1, 2, 30])
    np.testing.assert_allclose(
        matrix.log_matvec(cols, log_u, transpose=True),
        cloud.log_matvec(cols, log_u, transpose=True),
        atol=atol,
    )
    np.testing.assert_allclose(
        matrix.matmat(cols, U, transpose=True), cloud.matmat(cols, U, transpose=True), rtol=1e-12
    )
    for transpose, weights, values in ((False, log_v, V), (True, log_u, U)):
        np.testing.assert_allclose(
            matrix.softmax_average(None, weights, values, transpose=transpose),
            cloud.softmax_average(None, weights, values, transpose=transpose),
            atol=1e-12,
        )


@pytest.mark.parametrize("metric", ["sqeuclidean", "cityblock"])
def test_the_cloud_geometrys_own_costs_give_the_same_bits(metric):
    """In float64; in float32 too for costs the cloud geometry computes in float64 (its
    squared-Euclidean float32 blocks expand the distance in float32: 8 eps32 of the largest
    ``|-M / reg|`` apart from the float64 cost rounded once)."""
    cloud, matrix = both(metric, own=True)
    everything = slice(None)
    np.testing.assert_array_equal(matrix.log_block(everything), cloud.log_block(everything))
    np.testing.assert_array_equal(matrix.block(slice(3, 9)), cloud.block(slice(3, 9)))
    single = matrix.log_block(everything, np.float32)
    assert single.dtype == np.float32
    if metric == "sqeuclidean":
        atol = 8 * np.finfo(np.float32).eps * matrix.max_cost() / REG
        np.testing.assert_allclose(single, cloud.log_block(everything, np.float32), atol=atol)
    else:
        np.testing.assert_array_equal(single, cloud.log_block(everything, np.float32))


def test_the_largest_cost_is_the_largest_entry():
    """Exact, as the cloud geometry's for a callable metric (a named metric's is a bound)."""
    X, Y = clouds()
    M = ot.dist(X, Y)
    matrix = CostMatrixGeometry(M, REG)
    assert matrix.max_cost() == M.max()
    assert matrix.max_cost() == GibbsGeometry(X, Y, REG, lambda A, B: ot.dist(A, B)).max_cost()
    assert matrix.max_cost() <= GibbsGeometry(X, Y, REG).max_cost()


def test_at_reg_keeps_the_matrix():
    cloud, matrix = both()
    other = matrix.at_reg(3.0)
    assert other.M is matrix.M  # not copied
    assert other.reg == 3.0 and matrix.reg == REG
    assert other.max_cost() == matrix.max_cost()
    np.testing.assert_allclose(
        other.log_block(slice(None)), cloud.at_reg(3.0).log_block(slice(None)), atol=1e-13
    )


def test_a_sample_draws_as_the_cloud_geometry():
    """The same generator draws the same rows and columns (rows first); the sampled clouds
    are centred anew, hence the rounding tolerance."""
    cloud, matrix = both(own=True)
    small_cloud = cloud.sample(10, np.random.default_rng(4))
    small = matrix.sample(10, np.random.default_rng(4))
    assert small.shape == (10, 10) and small.reg == REG
    np.testing.assert_allclose(
        small.M, small_cloud.cost_block(slice(None)), atol=1e-13 * matrix.max_cost()
    )
    assert small.max_cost() == small.M.max()
    assert matrix.sample(1000, np.random.default_rng(4)).shape == matrix.shape


def test_a_sample_of_forbidden_pairs_only_has_a_zero_kernel():
    """A draw that meets only ``+inf`` entries gives the all-forbidden geometry (its kernel is
    0, its cost spread 0), as :meth:`CostMatrixGeometry.all_forbidden` builds it."""
    M = np.full((6, 5), np.inf)
    M[0, 0] = 1.0  # the geometry is valid; a 1-row sample without row 0 forbids everything
    rng = np.random.default_rng(7)
    sample = next(
        s for s in (CostMatrixGeometry(M, REG).sample(1, rng) for _ in range(50)) if s.forbidden
    )
    assert sample.shape == (1, 1) and sample.forbidden == 1 and sample.max_cost() == 0.0
    direct = CostMatrixGeometry.all_forbidden((3, 2), REG)
    assert direct.forbidden == 6 and np.isinf(direct.M).all() and direct.reg == REG
    np.testing.assert_array_equal(ExactKernel(direct).matvec(np.ones(2)), np.zeros(3))
    with pytest.raises(ValueError, match=r"reg must be > 0; got -1"):
        CostMatrixGeometry.all_forbidden((3, 2), -1.0)
    with pytest.raises(ValueError, match=r"shape must be \(n, m\); got \(3,\)"):
        CostMatrixGeometry.all_forbidden((3,), REG)


def test_it_lives_on_the_host():
    _, matrix = both()
    assert matrix.context is NUMPY
    assert not matrix.computes_on_device()
    assert not matrix.cost.sqeuclidean and not matrix.cost.translation_invariant
    assert "cost matrix M of shape (40, 55)" in str(matrix.cost)


def test_the_matrix_is_kept_not_copied():
    M = ot.dist(*clouds())
    assert CostMatrixGeometry(M, REG).M is M
    integers = np.arange(12).reshape(3, 4)  # converted once
    assert CostMatrixGeometry(integers, REG).M.dtype == np.float64
    fortran = np.asfortranarray(M)
    assert CostMatrixGeometry(fortran, REG).M.flags.c_contiguous


def test_the_dual_bound_is_the_clouds():
    """``sketchot.gibbs.dual_lower_bound`` from the same potential (a zero weight too)."""
    X, Y = clouds()
    cloud, matrix = both(own=True)
    rng = np.random.default_rng(2)
    f = rng.normal(size=len(X))
    a, b = ot.unif(len(X)), ot.unif(len(Y))
    a[3] = 0.0
    a /= a.sum()
    expected = dual_lower_bound(cloud.Xc, cloud.Yc, f, a, b)
    assert matrix.dual_lower_bound(f, a, b) == pytest.approx(expected, rel=1e-13)
    assert matrix.dual_lower_bound(f, a, b) <= ot.emd2(a, b, matrix.M) + 1e-12


@settings(max_examples=25, deadline=None)
@given(
    M=arrays(
        np.float64, st.tuples(st.integers(1, 6), st.integers(1, 6)), elements=st.floats(0.0, 1e4)
    ),
    log_reg=st.floats(-4.0, 2.0),
    data=st.data(),
)
def test_log_products_are_logsumexp(M, log_reg, data):
    """For any cost matrix (not one that points give) and any finite weights: the log
    products are SciPy's log-sum-exp of ``log_v - M / reg`` (to 1e-12 of its largest term)."""
    reg = 10.0**log_reg
    n, m = M.shape
    log_v = data.draw(arrays(np.float64, m, elements=st.floats(-50.0, 50.0)))
    log_u = data.draw(arrays(np.float64, n, elements=st.floats(-50.0, 50.0)))
    geometry = CostMatrixGeometry(M, reg)
    expected = logsumexp(log_v[None, :] - M / reg, axis=1)
    scale = 1.0 + np.abs(log_v).max() + M.max() / reg
    np.testing.assert_allclose(
        geometry.log_matvec(slice(None), log_v), expected, atol=1e-12 * scale
    )
    expected_t = logsumexp(log_u[:, None] - M / reg, axis=0)
    np.testing.assert_allclose(
        geometry.log_matvec(slice(None), log_u, transpose=True), expected_t, atol=1e-12 * scale
    )


def test_a_row_without_weight_is_minus_infinity():
    geometry = CostMatrixGeometry(np.ones((2, 3)), 1.0)
    out = geometry.log_matvec(slice(None), np.full(3, -np.inf))
    assert np.all(out == -np.inf)


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("M", "error", "match"),
    [
        (np.ones(4), ValueError, r"M must be a 2-D cost matrix .* got 1-D input of shape \(4,\)"),
        (np.ones((2, 2, 2)), ValueError, r"M must be a 2-D .* got 3-D"),
        (np.ones((0, 3)), ValueError, r"M must be non-empty; got shape \(0, 3\)"),
        (np.array([[0.0, np.nan], [1.0, np.nan]]), ValueError,
         r"M must contain real costs \(\+inf for a forbidden pair\); got NaN for 2 of its 4 "
         r"entries"),
        (np.array([[0.0, -np.inf], [1.0, 2.0]]), ValueError,
         r"got 1 entries -inf of its 4: a pair of cost -inf makes the transport problem "
         r"unbounded"),
        (np.full((2, 2), np.inf), ValueError,
         r"M must have at least one finite cost \(an allowed pair\); got 4 entries \+inf"),
        (np.ones((2, 2), dtype=complex), TypeError, r"M must be a 2-D array of real costs .* "
         r"dtype complex128"),
        ([["a", "b"]], TypeError, r"M must be a 2-D array of real costs"),
        (np.ma.masked_array(np.ones((2, 2)), mask=[[1, 0], [0, 0]]), TypeError, r"M"),
    ],
)  # fmt: skip
def test_bad_matrices_are_refused_by_name(M, error, match):
    with pytest.raises(error, match=match):
        CostMatrixGeometry(M, 1.0)
    with pytest.raises(error, match=match):
        build_exact_from_cost(M, 1.0)


def test_a_sparse_matrix_is_sent_to_its_own_geometry():
    # the dense geometry names the sparse one; the builder takes a sparse M itself
    with pytest.raises(TypeError, match=r"M must be a dense 2-D array .*SparseCostMatrixGeometry"):
        CostMatrixGeometry(scipy.sparse.eye(3, format="csr"), 1.0)
    kernel = build_exact_from_cost(scipy.sparse.eye(3, format="csr"), 1.0)
    assert type(kernel).__name__ == "SparseExactKernel"


def test_bad_reg_is_refused_by_name():
    with pytest.raises(ValueError, match=r"reg must be > 0; got -1"):
        CostMatrixGeometry(np.ones((2, 2)), -1.0)
    with pytest.raises(ValueError, match=r"reg=1e-310 is too small for this cost matrix"):
        CostMatrixGeometry(np.full((2, 2), 1e10), 1e-310)
    geometry = CostMatrixGeometry(np.full((2, 2), 1e10), 1.0)
    with pytest.raises(ValueError, match=r"reg=1e-310 is too small"):
        geometry.at_reg(1e-310)


def test_the_check_returns_the_array_it_checked():
    M = np.array([[0.0, 1.0], [2.0, 0.0]])
    assert check_cost_matrix(M) is M
    with pytest.raises(ValueError, match=r"^C must be"):
        check_cost_matrix(np.ones(3), "C")


@pytest.mark.parametrize("name", ["X", "Y", "Xc", "Yc", "x_sq", "y_sq", "center"])
def test_coordinates_are_refused_naming_what_needs_points(name):
    _, matrix = both()
    with pytest.raises(PointsRequiredError, match=r"needs point clouds X, Y; this kernel was "
                       r"built on a cost matrix M of shape \(40, 55\)"):  # fmt: skip
        getattr(matrix, name)
    assert getattr(matrix, name, None) is None  # an AttributeError: "no points"
    assert not has_points(matrix)
    assert has_points(both()[0])


def test_sketches_on_points_are_refused():
    _, matrix = both()
    rng = np.random.default_rng(0)
    with pytest.raises(PointsRequiredError, match="fit_clouds"):
        matrix.fit_clouds(rng)
    with pytest.raises(PointsRequiredError, match="union_rows"):
        matrix.union_rows()
    with pytest.raises(PointsRequiredError, match="rows"):
        matrix.rows("x", [0])
    with pytest.raises(PointsRequiredError, match="new points"):
        matrix.softmax_average(np.zeros((1, 3)), np.zeros(55), np.zeros((55, 1)))


# ------------------------------------------------------------------- the exact kernel on M


def kernel_pair(max_dense_bytes=1 << 30, dtype=np.float64):
    cloud, matrix = both(metric="cityblock", own=True)
    on_matrix = build_exact_from_cost(matrix.M, REG, dtype=dtype, max_dense_bytes=max_dense_bytes)
    on_cloud = ExactKernel(cloud, dtype=dtype, max_dense_bytes=max_dense_bytes)
    return on_cloud, on_matrix


@pytest.mark.parametrize("max_dense_bytes", [1 << 30, 0])
def test_the_kernel_on_M_is_the_kernel_on_the_clouds(max_dense_bytes):
    """Stored and streamed: products, fused passes (linear and log), projections and
    rows give the cloud kernel's numbers (its costs are M's bits: 1e-12 is BLAS's order of
    summation)."""
    on_cloud, on_matrix = kernel_pair(max_dense_bytes)
    assert on_matrix.is_dense == on_cloud.is_dense == (max_dense_bytes > 0)
    n, m = on_matrix.shape
    rng = np.random.default_rng(5)
    V, U = rng.random((m, 3)), rng.random((n, 2))
    np.testing.assert_allclose(on_matrix.matmat(V), on_cloud.matmat(V), rtol=1e-12)
    np.testing.assert_allclose(on_matrix.rmatmat(U), on_cloud.rmatmat(U), rtol=1e-12)
    # -M / reg and M * (-1 / reg) round apart: exp of it, |M / reg| eps relative
    np.testing.assert_allclose(
        on_matrix.to_dense(), np.exp(-on_matrix.geometry.M / REG), rtol=1e-14
    )
    w, a = rng.random(m), rng.random(n)
    for log in (False, True):
        weights = np.log(w) if log else w
        mine = on_matrix.fused_pass("rows", weights, a, log=log)
        theirs = on_cloud.fused_pass("rows", weights, a, log=log)
        for name in ("products", "ratios", "projection"):
            np.testing.assert_allclose(getattr(mine, name), getattr(theirs, name), rtol=1e-12)
    index = np.array([2, 7, 11])
    for log in (False, True):
        values = np.log(a[index]) if log else a[index]
        np.testing.assert_allclose(
            on_matrix.project("rows", values, index, log=log),
            on_cloud.project("rows", values, index, log=log),
            rtol=1e-12,
        )


def test_the_absorbed_kernel_on_M():
    """``exp(alpha_i + beta_j - M_ij / reg)`` with the floor, entry by entry (a zero weight's
    ``-inf`` offset gives the floor)."""
    _, kernel = kernel_pair()
    rng = np.random.default_rng(6)
    n, m = kernel.shape
    alpha, beta = rng.normal(size=n) * 30, rng.normal(size=m) * 30
    alpha[0] = -np.inf
    absorbed = kernel.absorbed(alpha, beta)
    exponent = alpha[:, None] + beta[None, :] - kernel.geometry.M / REG
    expected = np.exp(np.maximum(exponent, LOG_FLOOR[np.dtype(np.float64)]))
    np.testing.assert_allclose(absorbed.to_dense(), expected, rtol=1e-13)
    again = kernel.absorbed(alpha + 1.0, beta, previous=absorbed)
    np.testing.assert_allclose(again.to_dense()[1:], np.e * expected[1:], rtol=1e-13)


def test_the_kernel_at_another_reg_and_in_float32():
    _, kernel = kernel_pair()
    other = kernel.at_reg(2.0)
    assert isinstance(other, ExactKernel) and other.geometry.M is kernel.geometry.M
    np.testing.assert_allclose(other.to_dense(), np.exp(-kernel.geometry.M / 2.0), rtol=1e-14)
    _, single = kernel_pair(dtype=np.float32)
    assert single.dtype == np.float32
    # float32 storage: 8 eps32 relative (the kernel's declared product_rtol)
    assert single.info.product_rtol == pytest.approx(8 * np.finfo(np.float32).eps)
    v = np.ones(kernel.shape[1])
    np.testing.assert_allclose(single.matvec(v), kernel.matvec(v), rtol=single.info.product_rtol)


def test_out_of_sample_products_need_points():
    _, kernel = kernel_pair()
    assert "out_of_sample" not in kernel.info.capabilities
    assert {"exact", "absorb", "log_products"} <= kernel.info.capabilities
    with pytest.raises(PointsRequiredError, match=r"out-of-sample product \(apply_new\) needs"):
        kernel.apply_new(np.zeros((1, 3)), np.ones(kernel.shape[1]))


def test_the_builder_checks_its_parameters():
    with pytest.raises(ValueError, match="max_dense_bytes must be >= 0"):
        build_exact_from_cost(np.ones((2, 2)), 1.0, max_dense_bytes=-1)
    with pytest.raises(ValueError, match=r"dtype must be numpy\.float64 or numpy\.float32"):
        build_exact_from_cost(np.ones((2, 2)), 1.0, dtype=np.int32)
    kernel = build_exact_from_cost(np.ones((2, 3)), 1.0)
    assert kernel.info.backend == "exact" and kernel.shape == (2, 3)
    assert kernel.info.build_time >= 0.0
