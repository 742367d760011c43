"""The operator contract, run over every registered backend."""

import numpy as np
import ot
import pytest
from scipy.spatial.distance import cdist

import sketchot
from sketchot.kernels import available_backends, make_kernel

# Settings where every backend is a reasonable kernel (used for products, not accuracy).
PARAMS = {
    "exact": {},
    "rff": {"n_features": 40},
    "nystrom": {"n_landmarks": 30},
    "polyts": {"sketch_dim": 8, "degree": 3},
}


@pytest.fixture(params=available_backends())
def kernel(request, colours):
    X, Y = colours
    return make_kernel(X, Y, 0.5, request.param, rng=1, **PARAMS[request.param])


def test_registry_lists_the_four_backends():
    assert set(available_backends()) == {"exact", "rff", "nystrom", "polyts"}


def test_matvec_and_rmatvec_match_the_dense_matrix(kernel):
    rng = np.random.default_rng(0)
    dense = kernel.to_dense()
    assert dense.shape == kernel.shape == (120, 90)
    v, u = rng.standard_normal(90), rng.standard_normal(120)
    np.testing.assert_allclose(kernel.matvec(v), dense @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.rmatvec(u), dense.T @ u, rtol=1e-10, atol=1e-12)
    # the dot test: rmatvec is the adjoint of matvec
    assert kernel.matvec(v) @ u == pytest.approx(v @ kernel.rmatvec(u), rel=1e-10)


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
    np.testing.assert_allclose(
        kernel.matmat_new(kernel.X, V), kernel.matmat(V), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_allclose(
        kernel.rmatmat_new(kernel.Y, U), kernel.rmatmat(U), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_allclose(
        kernel.matmat_new(kernel.X[:7], V[:, 0]), kernel.matvec(V[:, 0])[:7], rtol=1e-9, atol=1e-12
    )


def test_rows_and_linear_operator(kernel):
    dense = kernel.to_dense()
    np.testing.assert_allclose(kernel.rows([3, 0, 7]), dense[[3, 0, 7]], rtol=1e-12, atol=1e-14)
    op = kernel.aslinearoperator()
    v = np.linspace(-1, 1, 90)
    np.testing.assert_allclose(op @ v, dense @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(op.H @ np.ones(120), dense.T @ np.ones(120), rtol=1e-10, atol=1e-12)


def test_fused_sweeps_agree_with_products(kernel):
    """sweep_right / sweep_left compute K^T u, v = b / K^T u, K v, u = a / K v in one pass;
    the guard sees exactly the non-positive denominators (a weak RFF has some)."""
    a, b = np.full(120, 1 / 120), np.full(90, 1 / 90)
    u0 = np.linspace(0.5, 1.5, 120)

    def set_to_one(den, index, bad):
        assert np.all(den[bad] <= 0)
        den[bad] = 1.0

    def expected_scaling(numerator, den):
        return numerator / np.where(den > 0, den, 1.0)

    z = kernel.sweep_start(u0)
    v, y, Ktu = kernel.sweep_right(z, b, set_to_one)
    np.testing.assert_allclose(Ktu, kernel.rmatvec(u0), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(v, expected_scaling(b, Ktu), rtol=1e-12)
    u, z2, Kv = kernel.sweep_left(y, a, set_to_one)
    np.testing.assert_allclose(Kv, kernel.matvec(v), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(u, expected_scaling(a, Kv), rtol=1e-12)
    _, _, Ktu2 = kernel.sweep_right(z2, b, set_to_one)
    np.testing.assert_allclose(Ktu2, kernel.rmatvec(u), rtol=1e-10, atol=1e-14)


def test_plan_summary_matches_dense_computation(kernel):
    rng = np.random.default_rng(3)
    log_u, log_v = rng.normal(size=120), rng.normal(size=90)
    plan = np.exp(log_u)[:, None] * kernel.to_dense() * np.exp(log_v)[None, :]
    summary = kernel.plan_summary(log_u, log_v)
    cost = cdist(kernel.X, kernel.Y, "sqeuclidean")
    np.testing.assert_allclose(summary.row_marginal, plan.sum(1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(summary.col_marginal, plan.sum(0), rtol=1e-9, atol=1e-12)
    assert summary.cost == pytest.approx(np.sum(plan * cost), rel=1e-9, abs=1e-12)
    assert summary.mass == pytest.approx(plan.sum(), rel=1e-10)


def test_float32_operator(colours):
    X, Y = colours
    for backend in available_backends():
        op64 = make_kernel(X, Y, 0.5, backend, rng=3, **PARAMS[backend])
        op32 = make_kernel(X, Y, 0.5, backend, rng=3, dtype=np.float32, **PARAMS[backend])
        v = np.ones(90)
        assert op32.matvec(v).dtype == np.float64  # results are always float64
        # float32 storage: relative rounding ~6e-8 per entry, accumulated over 90 terms
        np.testing.assert_allclose(op32.matvec(v), op64.matvec(v), rtol=1e-5)


def test_same_seed_same_kernel(colours):
    X, Y = colours
    for backend in ("rff", "nystrom", "polyts"):
        a = make_kernel(X, Y, 0.5, backend, rng=11, **PARAMS[backend]).to_dense()
        b = make_kernel(X, Y, 0.5, backend, rng=11, **PARAMS[backend]).to_dense()
        c = make_kernel(X, Y, 0.5, backend, rng=12, **PARAMS[backend]).to_dense()
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


def test_exact_rows_of_an_approximate_kernel_are_exact(colours):
    X, Y = colours
    op = make_kernel(X, Y, 0.5, "rff", n_features=5, rng=0)
    truth = np.exp(-cdist(X, Y, "sqeuclidean") / 0.5)
    v = np.linspace(1, 2, 90)
    np.testing.assert_allclose(op.exact_rows_matmat([4, 9], v), truth[[4, 9]] @ v, rtol=1e-12)
    np.testing.assert_allclose(
        op.exact_cols_rmatmat([2], np.ones(120)), truth[:, [2]].T @ np.ones(120), rtol=1e-12
    )


def test_comparable_parameters_are_the_papers():
    params = sketchot.comparable_parameters()
    assert params == {
        "polyts": {"sketch_dim": 20, "degree": 3},
        "rff": {"n_features": 60},
        "nystrom": {"n_landmarks": 8},
    }
    X = np.random.default_rng(0).random((30, 3))
    assert make_kernel(X, X, 1.0, "rff", rng=0).rank == 60
    assert make_kernel(X, X, 1.0, "nystrom", rng=0).params["n_landmarks"] == 8
    assert make_kernel(X, X, 1.0, "polyts", rng=0).rank == 61


@pytest.mark.parametrize(
    ("backend", "params", "error", "message"),
    [
        ("sinkhorn", {}, ValueError, "backend must be one of 'exact', 'nystrom', 'polyts', 'rff'"),
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
    with pytest.raises(ValueError, match="v must have length 4"):
        op.matvec(np.ones(3))
    with pytest.raises(ValueError, match="X_new must have 3 columns"):
        op.matmat_new(np.ones((2, 5)), np.ones(4))
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
        else make_kernel(X, Y, 0.5, backend, rng=0, sketch_dim=4)
    )
    a, v = np.full(120, 1 / 120), np.linspace(0.5, 1.5, 90)
    y = v if backend == "exact" else op.right.T @ v

    def no_repair(den, index, bad):
        raise AssertionError("no repair expected")

    single = op.sweep_left(y, a, no_repair)
    monkeypatch.setattr(base, "THREADED_PASS_MIN_ENTRIES", 0)
    monkeypatch.setattr(base, "pass_block_rows", lambda n_cols, entries=0: 7)
    if backend == "exact":
        monkeypatch.setattr(op, "_rows_per_block", 7)
    first = op.sweep_left(y, a, no_repair)
    second = op.sweep_left(y, a, no_repair)
    for x, y_, z in zip(single, first, second, strict=True):
        assert np.array_equal(y_, z)  # same split, same summation order: bit-identical
        np.testing.assert_allclose(y_, x, rtol=1e-12)  # other grouping of the sums
