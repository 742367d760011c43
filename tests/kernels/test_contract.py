"""The operator contract, run over every registered backend."""

import numpy as np
import ot
import pytest
from backend_params import contract_clouds, contract_params
from scipy.sparse.linalg import aslinearoperator
from scipy.spatial.distance import cdist

import sketchot
from sketchot.gibbs import make_cost
from sketchot.kernels import KernelOperator, available_backends, get_backend, make_kernel
from sketchot.kernels.registry import rebuild_parameters
from sketchot.solver import plan_summary


@pytest.fixture(params=available_backends())
def kernel(request, colours, library):
    """Every registered backend at its record's test parameters (a new backend is tested
    without editing this file), built from NumPy arrays and from PyTorch tensors: the
    operator built where the tensors live must keep the contract the engine reads, with host
    vectors, at the same tolerances."""
    X, Y = library(*contract_clouds(request.param, *colours))
    params = contract_params(request.param)
    built = sketchot.make_kernel(X, Y, 0.5, request.param, rng=1, **params)
    return getattr(built, "host", built)  # a tensor call shows the operator behind a view


@pytest.mark.parametrize("backend", available_backends())
def test_a_fitted_kernel_builds_again_on_other_points(colours, backend):
    """rebuild_parameters keeps what the builder accepts of a kernel's info.params (the
    warm starts of the loss and the barycenter build the previous kernel choice again on
    moved points); the fit's own descriptions (clusters, degree, bounds) are left out."""
    X, Y = contract_clouds(backend, *colours)
    params = contract_params(backend)
    fitted = sketchot.make_kernel(X, Y, 0.5, backend, rng=1, **params)
    again = rebuild_parameters(backend, fitted.info.params)
    assert set(again) <= set(get_backend(backend).defaults)
    # (a grid backend's new points: a sub-grid, the first 30 and 30 points in C order)
    rebuilt = (
        sketchot.make_kernel(X[:40] + 0.01, Y[:30], 0.5, backend, rng=1, **again)
        if (get_backend(backend).support != "grids")
        else sketchot.make_kernel(
            X[:30] + 0.01, Y[np.lexsort(Y.T[::-1])][:30], 0.5, backend, **again
        )
    )
    # built on the new points (a backend may fit again from them, e.g. polyts's degree)
    assert rebuilt.shape[1] == 30 and set(again) <= set(rebuilt.info.params)


def test_registry_has_the_four_builtin_backends():
    assert {"exact", "rff", "nystrom", "polyts"} <= set(available_backends())


def test_operator_contract_is_small():
    """At most 12 public members on the base class (issue 9)."""
    public = {name for name in dir(KernelOperator) if not name.startswith("_")}
    public |= {"geometry", "info", "dtype"}  # instance attributes set by __init__
    assert len(public) <= 12, sorted(public)


def test_matvec_and_rmatvec_match_the_dense_matrix(kernel):
    rng = np.random.default_rng(0)
    dense = kernel.to_dense()
    assert dense.shape == kernel.shape == (120, 90)
    v, u = rng.standard_normal(90), rng.standard_normal(120)
    np.testing.assert_allclose(kernel.matvec(v), dense @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.rmatvec(u), dense.T @ u, rtol=1e-10, atol=1e-12)
    # the dot test: rmatvec is the adjoint of matvec
    assert kernel.matvec(v) @ u == pytest.approx(v @ kernel.rmatvec(u), rel=1e-10)


def test_a_kernel_travels_to_another_process(kernel):
    """Dask sends a result and its kernel to the workers with cloudpickle (a colour map of
    a Dask image): the copy applies the same products, bit for bit (no lock, cache or
    array namespace module in the way)."""
    cloudpickle = pytest.importorskip("cloudpickle")
    if getattr(getattr(kernel.geometry, "context", None), "library", None) == "jax":
        pytest.skip("a JAX Device object does not pickle (JAX's limit): JAX kernels stay put")
    copy = cloudpickle.loads(cloudpickle.dumps(kernel))
    v = np.random.default_rng(0).random(kernel.shape[1])
    np.testing.assert_array_equal(copy.matvec(v), kernel.matvec(v))
    np.testing.assert_array_equal(copy.matvec(v), kernel.matvec(v))  # a second call: caches


@pytest.mark.parametrize("backend", available_backends())
def test_a_kernel_on_identical_clouds_is_symmetric(colours, backend):
    """The symmetric iteration (OT(a, a) of a divergence) multiplies by K only: every backend
    builds K(X, X) with the same draws on both sides, so K = K^T to rounding."""
    X = contract_clouds(backend, *colours)[0]
    params = contract_params(backend)
    built = sketchot.make_kernel(X, X.copy(), 0.5, backend, rng=1, **params)
    u = np.random.default_rng(2).standard_normal(len(X))
    forward = built.matvec(u)
    scale = np.abs(forward).max()
    np.testing.assert_allclose(built.rmatvec(u), forward, rtol=1e-12, atol=1e-14 * scale)


def test_matrix_products_equal_stacked_vector_products(kernel):
    rng = np.random.default_rng(1)
    V, U = rng.standard_normal((90, 4)), rng.standard_normal((120, 3))
    np.testing.assert_allclose(
        kernel.matmat(V), np.column_stack([kernel.matvec(c) for c in V.T]), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(
        kernel.rmatmat(U), np.column_stack([kernel.rmatvec(c) for c in U.T]), rtol=1e-10, atol=1e-12
    )


def test_out_of_sample_on_fitted_points_equals_products(kernel):
    rng = np.random.default_rng(2)
    V, U = rng.standard_normal((90, 2)), rng.standard_normal((120, 2))
    X, Y = kernel.geometry.X, kernel.geometry.Y
    np.testing.assert_allclose(kernel.apply_new(X, V), kernel.matmat(V), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        kernel.apply_new(Y, U, side="target"), kernel.rmatmat(U), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_allclose(
        kernel.apply_new(X[:7], V[:, 0]), kernel.matvec(V[:, 0])[:7], rtol=1e-9, atol=1e-12
    )


def test_a_low_rank_kernel_maps_new_points_to_its_factor_rows(kernel):
    """``new_points_map(side)`` (what a Dask placement reads for out-of-sample products)
    gives the factor rows of the fitted points back: ``feature_map(X) @ projection = A``."""
    if "factors" not in kernel.info.capabilities:
        pytest.skip("not a low-rank kernel")
    for side, points, factor in (("source", kernel.geometry.X, kernel.left),
                                 ("target", kernel.geometry.Y, kernel.right)):  # fmt: skip
        feature_map, projection = kernel.new_points_map(side)
        rows = feature_map(points)
        rows = rows if projection is None else rows @ projection
        scale = np.abs(factor).max()
        np.testing.assert_allclose(rows, factor, rtol=1e-9, atol=1e-12 * scale)
    with pytest.raises(ValueError, match="side must be one of 'source', 'target'"):
        kernel.new_points_map("rows")


def test_rows_and_scipy_linear_operator(kernel):
    dense = kernel.to_dense()
    np.testing.assert_allclose(
        kernel.to_dense(rows=[3, 0, 7]), dense[[3, 0, 7]], rtol=1e-12, atol=1e-14
    )
    op = aslinearoperator(kernel)  # scipy's adapter accepts the operator as it is
    v = np.linspace(-1, 1, 90)
    np.testing.assert_allclose(op @ v, dense @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(op.H @ np.ones(120), dense.T @ np.ones(120), rtol=1e-10, atol=1e-12)


def test_column_vectors_follow_scipy_linear_operator_semantics(kernel):
    """matvec takes (m,) or (m, 1) and returns (n,) or (n, 1), as SciPy's LinearOperator."""
    dense = kernel.to_dense()
    v, u = np.linspace(-1, 1, 90), np.linspace(0, 2, 120)
    column = kernel.matvec(v[:, None])
    assert column.shape == (120, 1)
    # the same arithmetic on the same numbers: bit-identical to the 1-D product
    np.testing.assert_array_equal(column[:, 0], kernel.matvec(v))
    assert kernel.rmatvec(u[:, None]).shape == (90, 1)
    op = aslinearoperator(kernel)
    np.testing.assert_allclose(op @ v[:, None], dense @ v[:, None], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(op.H @ u[:, None], dense.T @ u[:, None], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"v must be a vector of shape \(90,\) or \(90, 1\)"):
        kernel.matvec(np.ones((90, 2)))


@pytest.mark.parametrize(
    ("backend", "reg"),
    # every backend where its test parameters are a fair kernel; exact at 0.002 as well, where
    # the plan is held in the log domain (another branch of the product)
    [*((backend, 1.0) for backend in available_backends()), ("exact", 0.002)],
)
def test_lazy_plan_takes_column_vectors(colours, backend, reg):
    X, Y = contract_clouds(backend, *colours)
    params = contract_params(backend)
    plan = sketchot.sinkhorn(None, None, X, Y, reg, backend, rng=1, warn=False, **params).lazy_plan
    x, y = np.linspace(0, 1, 90), np.linspace(1, 2, 120)
    assert plan.matvec(x[:, None]).shape == (120, 1)
    assert plan.rmatvec(y[:, None]).shape == (90, 1)
    # rtol: the column may take the matrix-product path, summing in another order
    np.testing.assert_allclose(plan.matvec(x[:, None])[:, 0], plan.matvec(x), rtol=1e-12)
    np.testing.assert_allclose(plan.rmatvec(y[:, None])[:, 0], plan.rmatvec(y), rtol=1e-12)
    with pytest.raises(ValueError, match=r"x must be a vector of shape \(90,\)"):
        plan.matvec(np.ones((90, 3)))


def test_fused_passes_agree_with_products(kernel):
    """A rows pass computes K v, u = a / K v and L^T u; a cols pass K^T u, v = b / K^T u and
    R^T v; bad denominators are reported in the mask with ratio 0, never repaired."""
    a, b = np.full(120, 1 / 120), np.full(90, 1 / 90)
    u0 = np.linspace(0.5, 1.5, 120)
    z = kernel.project("rows", u0)
    cols = kernel.fused_pass("cols", z, b)
    np.testing.assert_allclose(cols.products, kernel.rmatvec(u0), rtol=1e-10, atol=1e-14)
    # uniform weights: bad is exactly the non-positive (or non-finite) products
    assert np.array_equal(cols.bad, ~(cols.products > 0) | ~np.isfinite(cols.products))
    assert np.all(cols.ratios[cols.bad] == 0)
    good = ~cols.bad
    np.testing.assert_allclose(cols.ratios[good], b[good] / cols.products[good], rtol=1e-12)
    np.testing.assert_allclose(
        cols.projection, kernel.project("cols", cols.ratios), rtol=1e-10, atol=1e-14
    )
    rows = kernel.fused_pass("rows", cols.projection, a)
    np.testing.assert_allclose(rows.products, kernel.matvec(cols.ratios), rtol=1e-10, atol=1e-14)
    good = ~rows.bad
    np.testing.assert_allclose(rows.ratios[good], a[good] / rows.products[good], rtol=1e-12)
    assert np.array_equal(rows.bad, ~(rows.products > 0) | ~np.isfinite(rows.products))
    # project with an index is the projection of those rows only
    np.testing.assert_allclose(
        kernel.project("rows", rows.ratios[[2, 5]], [2, 5]),
        kernel.project("rows", np.where(np.isin(np.arange(120), [2, 5]), rows.ratios, 0.0)),
        rtol=1e-10,
        atol=1e-14,
    )


def test_plan_summary_matches_dense_computation(kernel):
    rng = np.random.default_rng(3)
    log_u, log_v = rng.normal(size=120), rng.normal(size=90)
    plan = np.exp(log_u)[:, None] * kernel.to_dense() * np.exp(log_v)[None, :]
    summary = plan_summary(kernel, log_u, log_v)
    cost = cdist(kernel.geometry.X, kernel.geometry.Y, "sqeuclidean")
    np.testing.assert_allclose(summary.row_marginal, plan.sum(1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(summary.col_marginal, plan.sum(0), rtol=1e-9, atol=1e-12)
    assert summary.cost == pytest.approx(np.sum(plan * cost), rel=1e-9, abs=1e-12)
    assert summary.mass == pytest.approx(plan.sum(), rel=1e-10)
    # the first moments, where the summary's products gave them (centred coordinates)
    g = kernel.geometry
    if summary.row_moments is not None:
        np.testing.assert_allclose(summary.row_moments, plan @ g.Yc, rtol=1e-9, atol=1e-12)
    if summary.col_moments is not None:
        np.testing.assert_allclose(summary.col_moments, plan.T @ g.Xc, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", available_backends())
def test_backends_build_the_metric_they_declare_and_refuse_the_others(colours, backend):
    """On a cityblock cost, a backend whose record declares it builds a kernel of that cost
    (products equal its dense matrix, and plan_summary's <P, M> is the cityblock one, to
    1e-9 relative: rounding of sums over 120 x 90 entries); any other refuses by name."""
    X, Y = colours
    record = get_backend(backend)
    if not record.supports(make_cost("cityblock")):
        with pytest.raises(ValueError, match=f"backend '{backend}' supports .* only; got metric="):
            make_kernel(X, Y, 0.5, backend, rng=1, metric="cityblock", **contract_params(backend))
        return
    kernel = make_kernel(X, Y, 0.5, backend, rng=1, metric="cityblock", **contract_params(backend))
    dense = kernel.to_dense()
    v = np.linspace(0.5, 1.5, 90)
    np.testing.assert_allclose(kernel.matvec(v), dense @ v, rtol=1e-10, atol=1e-12)
    rng = np.random.default_rng(3)
    log_u, log_v = rng.normal(size=120), rng.normal(size=90)
    plan = np.exp(log_u)[:, None] * dense * np.exp(log_v)[None, :]
    summary = plan_summary(kernel, log_u, log_v)
    assert summary.cost == pytest.approx(np.sum(plan * cdist(X, Y, "cityblock")), rel=1e-9)
    np.testing.assert_allclose(summary.row_marginal, plan.sum(1), rtol=1e-9, atol=1e-12)
    if record.exact:
        np.testing.assert_allclose(dense, np.exp(-cdist(X, Y, "cityblock") / 0.5), rtol=1e-12)


def test_float32_operator(colours):
    for backend in available_backends():
        X, Y = contract_clouds(backend, *colours)
        params = contract_params(backend)
        op64 = make_kernel(X, Y, 0.5, backend, rng=3, **params)
        op32 = make_kernel(X, Y, 0.5, backend, rng=3, dtype=np.float32, **params)
        v = np.ones(90)
        assert op32.matvec(v).dtype == np.float64  # results are always float64
        # float32 storage: relative rounding ~6e-8 per entry, accumulated over 90 terms
        np.testing.assert_allclose(op32.matvec(v), op64.matvec(v), rtol=1e-5)


def test_same_seed_same_kernel(colours):
    X, Y = colours
    for backend in ("rff", "nystrom", "polyts"):
        params = contract_params(backend)
        a = make_kernel(X, Y, 0.5, backend, rng=11, **params).to_dense()
        b = make_kernel(X, Y, 0.5, backend, rng=11, **params).to_dense()
        c = make_kernel(X, Y, 0.5, backend, rng=12, **params).to_dense()
        assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_exact_kernel_is_the_gibbs_kernel(colours):
    X, Y = colours
    expected = np.exp(-cdist(X, Y, "sqeuclidean") / 0.05)
    dense = make_kernel(X, Y, 0.05, "exact")
    streamed = make_kernel(X, Y, 0.05, "exact", max_dense_bytes=0)
    assert dense.is_dense and not streamed.is_dense
    np.testing.assert_allclose(dense.to_dense(), expected, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(streamed.to_dense(), expected, rtol=1e-12, atol=1e-300)
    v = np.linspace(0, 1, 90)
    np.testing.assert_allclose(streamed.matvec(v), dense.matvec(v), rtol=1e-12)
    np.testing.assert_allclose(
        streamed.rmatvec(np.ones(120)), dense.rmatvec(np.ones(120)), rtol=1e-12
    )


def test_low_rank_factors_feed_pots_low_rank_solver(colours):
    X, Y = colours
    op = make_kernel(X, Y, 1.0, "nystrom", n_landmarks=40, rng=0)
    A, B = op.factors
    np.testing.assert_allclose(A @ B.T, op.to_dense(), rtol=1e-12, atol=1e-14)
    a, b = np.full(120, 1 / 120), np.full(90, 1 / 90)
    u_pot, v_pot = ot.lowrank.sinkhorn_low_rank_kernel(A, B, a, b, stopThr=1e-12)[:2]
    ours = sketchot.sinkhorn_kernel(a, b, op, tol=1e-12)
    plan_pot = u_pot[:, None] * (A @ B.T) * v_pot[None, :]
    np.testing.assert_allclose(ours.plan, plan_pot, rtol=1e-8, atol=1e-14)


def test_geometry_gives_true_kernel_values_for_any_backend(colours):
    X, Y = colours
    op = make_kernel(X, Y, 0.5, "rff", n_features=5, rng=0)
    truth = np.exp(-cdist(X, Y, "sqeuclidean") / 0.5)
    v = np.linspace(1, 2, 90)
    np.testing.assert_allclose(op.geometry.matmat([4, 9], v), truth[[4, 9]] @ v, rtol=1e-12)
    np.testing.assert_allclose(
        op.geometry.matmat([2], np.ones(120), transpose=True),
        truth[:, [2]].T @ np.ones(120),
        rtol=1e-12,
    )


def test_comparable_parameters_are_the_papers():
    params = sketchot.comparable_parameters()
    assert params == {
        "polyts": {"sketch_dim": 20, "degree": 3, "variant": "paper"},
        "rff": {"n_features": 60},
        "nystrom": {"n_landmarks": 8},
    }
    X = np.random.default_rng(0).random((30, 3))
    assert make_kernel(X, X, 1.0, "rff", rng=0).info.rank == 60
    assert make_kernel(X, X, 1.0, "nystrom", rng=0).info.params["n_landmarks"] == 8
    assert make_kernel(X, X, 1.0, "polyts", rng=0, variant="paper").info.rank == 61


@pytest.mark.parametrize(
    ("backend", "params", "error", "message"),
    [
        (
            "sinkhorn",
            {},
            ValueError,
            "backend must be 'auto' or one of .*'exact', 'grid', 'nystrom', 'polyts'",
        ),
        ("rff", {"sketch_dim": 3}, TypeError, "unexpected parameter.*'sketch_dim'.*n_features"),
        ("rff", {"n_features": 0}, ValueError, "n_features must be >= 1"),
        ("nystrom", {"n_landmarks": 0}, ValueError, "n_landmarks must be >= 1"),
        ("nystrom", {"n_landmarks": 51}, ValueError, "n_landmarks must be <= 50"),
        ("nystrom", {"landmarks": "random"}, ValueError, "landmarks must be one of"),
        ("polyts", {"sketch_dim": 0}, ValueError, "sketch_dim must be >= 1"),
        ("polyts", {"degree": -1}, ValueError, "degree must be >= 0"),
        ("polyts", {"coreset_size": 0}, ValueError, "coreset_size must be >= 1"),
        ("polyts", {"coreset_size": 26}, ValueError, "coreset_size must be <= 25"),
        ("polyts", {"coefficients": "lasso"}, ValueError, "coefficients must be one of"),
        ("exact", {"dtype": np.int32}, ValueError, "dtype must be numpy.float64 or numpy.float32"),
    ],
)
def test_bad_backend_parameters(backend, params, error, message):
    rng = np.random.default_rng(0)
    with pytest.raises(error, match=message):
        make_kernel(rng.random((25, 3)), rng.random((25, 3)), 1.0, backend, **params)


def test_bad_points():
    good = np.ones((4, 3))
    with pytest.raises(ValueError, match="Y must have 3 columns"):
        make_kernel(good, np.ones((4, 2)), 1.0, "exact")
    with pytest.raises(ValueError, match="reg must be > 0"):
        make_kernel(good, good, 0.0, "exact")
    op = make_kernel(good, good, 1.0, "exact")
    with pytest.raises(ValueError, match=r"v must have shape \(4,\)"):
        op.matvec(np.ones(3))
    with pytest.raises(ValueError, match="points must have 3 columns"):
        op.apply_new(np.ones((2, 5)), np.ones(4))
    with pytest.raises(MemoryError, match="max_bytes"):
        op.to_dense(max_bytes=8)


@pytest.mark.parametrize("backend", ["polyts", "exact"])
def test_threaded_passes_are_deterministic_and_match(colours, monkeypatch, backend):
    """Large passes are split over threads; force that on a small problem."""
    import sketchot.kernels.base as base

    X, Y = colours
    op = (
        make_kernel(X, Y, 0.5, backend, rng=0, max_dense_bytes=0)
        if backend == "exact"
        else make_kernel(X, Y, 0.5, backend, rng=0, sketch_dim=4, variant="improved")
    )
    a, v = np.full(120, 1 / 120), np.linspace(0.5, 1.5, 90)
    y = v if backend == "exact" else op.right.T @ v
    single = op.fused_pass("rows", y, a)
    monkeypatch.setattr(base, "THREADED_PASS_MIN_ENTRIES", 0)
    monkeypatch.setattr(base, "SERIAL_PASS_ENTRIES", 7 * 90)
    monkeypatch.setattr(base, "PASS_BLOCK_ENTRIES", 7 * 90)
    if backend == "exact":
        monkeypatch.setattr(op, "_rows_per_block", 7)
    with sketchot.thread_limit(2):
        first = op.fused_pass("rows", y, a)
        second = op.fused_pass("rows", y, a)
    for field in ("products", "ratios", "projection", "bad"):
        x, y_, z = (getattr(p, field) for p in (single, first, second))
        assert np.array_equal(y_, z)  # same split, same summation order: bit-identical
        np.testing.assert_allclose(y_, x, rtol=1e-12)  # other grouping of the sums
