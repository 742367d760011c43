"""A SciPy sparse cost matrix (``sketchot/sparse_cost.py``, ``kernels/matrix_exact.py``): its
stored entries are the allowed pairs, the missing ones forbidden.

The reference everywhere is the same problem given densely, ``+inf`` at the missing pairs
(the dense path, tested against POT in ``test_solve_matrix*.py``): both run the same solver on
the same kernel entries, so plans and values agree to rounding at moderate reg
(``atol=1e-10`` on plans of mass 1, ``rtol=1e-10`` on values: a sum over ``nnz`` instead of
``n m`` terms, zeros left out); at small reg, where the two part ways by rounding, both are
solved to ``tol=1e-12``. Against POT, ``ot.sinkhorn(..., method='sinkhorn_log')`` on the
dense ``M`` with a large finite cost at the missing pairs (its kernel is 0 there in
float64): plans of different Sinkhorn solvers to ``atol=1e-5`` (POT
test_bregman.py::test_sinkhorn_variants).
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
import sketchot.matrix as pot_names
from sketchot.kernels import SparseExactKernel, build_exact_from_cost
from sketchot.sparse_cost import SparseCostMatrixGeometry, check_sparse_cost

FORMATS = ("csr", "csc", "coo")


def case(seed, n=40, m=30, density=0.4, negative=False):
    """``(a, b, sparse M, dense M with +inf at the missing pairs)``: squared distances on
    a random pattern (every row and column keeps a pair), ``a`` and ``b`` the marginals of a
    random plan on it (so that balanced transport is feasible)."""
    rng = np.random.default_rng(seed)
    M = ot.dist(rng.random((n, 2)), rng.random((m, 2)))
    if negative:
        M -= 0.3
    mask = rng.random((n, m)) < density
    mask[np.arange(n), np.arange(n) % m] = True
    mask[np.arange(m) % n, np.arange(m)] = True
    rows, cols = np.nonzero(mask)
    sparse = scipy.sparse.coo_array((M[rows, cols], (rows, cols)), shape=(n, m))
    # the marginals of a plan on the allowed pairs: a coupling exists (Hall's condition)
    plan = np.where(mask, rng.random((n, m)) + 0.1, 0.0)
    plan /= plan.sum()
    return plan.sum(axis=1), plan.sum(axis=0), sparse, np.where(mask, M, np.inf)


def as_format(M, fmt):
    return {"csr": M.tocsr, "csc": M.tocsc, "coo": M.tocoo}[fmt]()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"unbalanced": 0.5},
        {"unbalanced": 1.0, "unbalanced_type": "TV"},
        {"reg_type": "entropy", "unbalanced": 0.3},
        {"c": "ones2"},
        {"reg": 0.002, "tol": 1e-12},
    ],
    ids=["balanced", "kl", "tv", "entropy", "c", "small-reg"],
)
def test_a_sparse_M_solves_the_dense_problem_with_forbidden_pairs(fmt, kwargs):
    a, b, sparse, dense = case(0)
    kwargs = {"reg": 0.05, **kwargs}
    if kwargs.get("c") == "ones2":
        kwargs["c"] = np.full(dense.shape, 2.0)
    on_sparse = sketchot.solve(as_format(sparse, fmt), a, b, **kwargs)
    on_dense = sketchot.solve(dense, a, b, **kwargs)
    assert on_sparse.status == on_dense.status == "converged"
    # at small reg the two iterations part ways after ~20 iterations (rounding grows where
    # plan entries are 1e-100): both stop at tol=1e-12, so the plans agree to ~tol
    np.testing.assert_allclose(on_sparse.plan.toarray(), on_dense.plan, rtol=0, atol=1e-10)
    np.testing.assert_allclose(on_sparse.value, on_dense.value, rtol=1e-10)
    np.testing.assert_allclose(on_sparse.value_linear, on_dense.value_linear, rtol=1e-10)
    assert np.all(on_sparse.plan.toarray()[np.isinf(dense)] == 0.0)


def test_negative_costs_and_several_targets():
    a, b, sparse, dense = case(1, negative=True)
    on_sparse = sketchot.solve(sparse, a, b, reg=0.05)
    on_dense = sketchot.solve(dense, a, b, reg=0.05)
    np.testing.assert_allclose(on_sparse.plan.toarray(), on_dense.plan, rtol=0, atol=1e-12)
    np.testing.assert_allclose(on_sparse.value, on_dense.value, rtol=1e-10)
    a, b, sparse, dense = case(2)
    targets = np.random.default_rng(3).random((30, 3)) + 0.1
    targets /= targets.sum(axis=0)
    on_sparse = sketchot.solve(sparse, a, targets, reg=0.05)
    on_dense = sketchot.solve(dense, a, targets, reg=0.05)
    np.testing.assert_allclose(on_sparse.value, on_dense.value, rtol=1e-10)


def test_POTs_log_sinkhorn_on_a_large_cost_at_the_missing_pairs():
    a, b, sparse, dense = case(4)
    reg = 0.01
    pot = ot.sinkhorn(
        a, b, np.where(np.isinf(dense), 1e6, dense), reg, method="sinkhorn_log",
        numItermax=100_000, stopThr=1e-12,
    )  # fmt: skip
    ours = sketchot.solve(sparse, a, b, reg=reg, tol=1e-12)
    assert scipy.sparse.issparse(ours.plan)  # POT's sparse-cost convention: a sparse plan
    np.testing.assert_allclose(ours.plan.toarray(), pot, atol=1e-5)
    np.testing.assert_allclose(
        pot_names.sinkhorn2(a, b, sparse, reg), pot_names.sinkhorn2(a, b, dense, reg), rtol=1e-10
    )


def test_exact_transport_goes_to_POT_on_the_allowed_pairs():
    a, b, sparse, dense = case(5)
    exact = sketchot.solve(sparse, a, b)
    expected = ot.emd2(a, b, np.where(np.isinf(dense), 1e6, dense))
    np.testing.assert_allclose(exact.value, expected, rtol=1e-9)


def test_no_dense_rows_are_read():
    # the passes, the log-stable path and the summary run on the stored entries only (the
    # Newton stage, for small problems that the first-order run leaves unconverged, is
    # dense by design: a reg where the first-order run converges)
    a, b, sparse, dense = case(6, n=300, m=250, density=0.02)
    geometry = SparseCostMatrixGeometry(sparse, 0.005)
    for name in ("log_block", "block", "cost_block", "columns"):
        setattr(geometry, name, _refuse(name))
    result = sketchot.matrix.sinkhorn_matrix(
        a, b, geometry, 0.005, options=sketchot.SolverOptions(tol=1e-12), backend="exact"
    )
    expected = sketchot.solve(dense, a, b, reg=0.005, tol=1e-12)
    assert result.status == "converged" and result.log_domain
    np.testing.assert_allclose(result.value_linear, expected.value_linear, rtol=1e-10)
    assert isinstance(result.kernel, SparseExactKernel)


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} read dense rows of a sparse M")

    return refuse


def test_stored_zeros_are_allowed_pairs_and_stored_inf_forbidden():
    a, b, sparse, dense = case(7)
    csr = sparse.tocsr()
    csr.data[0] = 0.0  # an explicit zero: a pair of cost 0
    row, col = 0, csr.indices[0]
    assert sketchot.solve(csr, a, b, reg=0.05).plan.toarray()[row, col] > 0
    csr = sparse.tocsr()
    csr.data[0] = np.inf  # a stored +inf: forbidden like a missing entry
    on_sparse = sketchot.solve(csr, a, b, reg=0.05)
    dense = dense.copy()
    dense[row, col] = np.inf
    np.testing.assert_allclose(
        on_sparse.plan.toarray(), sketchot.solve(dense, a, b, reg=0.05).plan, atol=1e-12
    )
    assert on_sparse.plan.toarray()[row, col] == 0.0


def test_the_callers_matrix_is_left_alone_and_the_same_call_gives_the_same_bits():
    a, b, sparse, _ = case(8)
    csr = sparse.tocsr()
    before = (csr.data.copy(), csr.indices.copy(), csr.indptr.copy())
    csr.data.flags.writeable = False
    first = sketchot.solve(csr, a, b, reg=0.01)
    second = sketchot.solve(csr, a, b, reg=0.01)
    assert np.array_equal(first.plan.data, second.plan.data) and first.value == second.value
    for kept, now in zip(before, (csr.data, csr.indices, csr.indptr), strict=True):
        assert np.array_equal(kept, now)


def test_a_float32_M_gives_a_float32_sparse_plan():
    # POT's convention: results in M's floating dtype (the solve runs in float64)
    a, b, sparse, _ = case(12)
    result = sketchot.solve(sparse.astype(np.float32), a, b, reg=0.05)
    assert scipy.sparse.issparse(result.plan) and result.plan.dtype == np.float32
    assert isinstance(result.value, np.float32)


def test_a_warm_start_from_the_solution_takes_fewer_iterations():
    a, b, sparse, _ = case(9)
    cold = sketchot.solve(sparse, a, b, reg=0.005, tol=1e-10)
    warm = sketchot.solve(sparse, a, b, reg=0.005, tol=1e-10, potentials_init=cold.potentials)
    assert warm.n_iter < cold.n_iter
    np.testing.assert_allclose(warm.plan.data, cold.plan.data, atol=1e-9)  # both to tol=1e-10


@pytest.mark.parametrize(
    "M, error, match",
    [
        (scipy.sparse.csr_array(np.array([[np.nan, 1.0]])), ValueError, r"M must contain real "
         r"costs on its stored entries .* got NaN in 1 of its 2 stored entries"),
        (scipy.sparse.csr_array(np.array([[-np.inf, 1.0]])), ValueError, r"got 1 entries -inf"),
        (scipy.sparse.csr_array((2, 3)), ValueError, r"M must have at least one allowed pair"),
        (scipy.sparse.csr_array(np.array([[np.inf, 0.0]])), ValueError, r"at least one allowed"),
        (scipy.sparse.csr_array(np.ones((2, 2), dtype=complex)), TypeError, r"real costs"),
    ],
)  # fmt: skip
def test_bad_sparse_matrices_are_refused_by_name(M, error, match):
    with pytest.raises(error, match=match):
        check_sparse_cost(M)
    with pytest.raises(error, match=match):
        sketchot.solve(M, reg=1.0)


def test_a_low_rank_backend_is_refused_on_a_sparse_M():
    a, b, sparse, _ = case(10)
    with pytest.raises(ValueError, match=r"backend='cur' on a sparse M: .*forbidden pairs"):
        sketchot.solve(sparse, a, b, reg=0.05, backend="cur")


def test_infeasible_support_is_refused_naming_the_row():
    M = scipy.sparse.csr_array(np.array([[1.0, 0.0], [0.0, 0.0]]))
    M.eliminate_zeros()  # row 1 has no allowed pair
    with pytest.raises(ValueError, match=r"no allowed pair .* row 1"):
        sketchot.solve(M, reg=0.1)


def test_the_kernel_operator_on_the_pattern():
    _, _, sparse, dense = case(11)
    kernel = build_exact_from_cost(sparse, 0.05)
    K = np.where(np.isinf(dense), 0.0, np.exp(-np.where(np.isinf(dense), 0, dense) / 0.05))
    V = np.random.default_rng(0).random((30, 2))
    np.testing.assert_allclose(kernel.matmat(V), K @ V, rtol=1e-13)
    np.testing.assert_allclose(kernel.rmatmat(K @ V), K.T @ (K @ V), rtol=1e-13)
    np.testing.assert_allclose(kernel.to_dense(), K, rtol=1e-14)  # M * (1 / reg)
    np.testing.assert_allclose(kernel.at_reg(0.1).to_dense()[K > 0], np.sqrt(K[K > 0]), rtol=1e-13)
    alpha, beta = np.linspace(-1, 1, 40), np.linspace(0, 2, 30)
    absorbed = kernel.absorbed(alpha, beta).to_dense()
    np.testing.assert_allclose(absorbed, np.exp(alpha)[:, None] * K * np.exp(beta), rtol=1e-13)
    assert build_exact_from_cost(sparse, 0.05, dtype=np.float32).matmat(V).dtype == np.float64


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    density=st.floats(0.05, 1.0),
    log_reg=st.floats(-3, 0),
)
def test_log_products_are_the_dense_logsumexp(seed, density, log_reg):
    # the segment log-sum-exp equals the dense one with -inf at the missing pairs
    rng = np.random.default_rng(seed)
    n, m = 7, 5
    mask = rng.random((n, m)) < density
    mask[0, 0] = True
    M = rng.random((n, m)) * 3
    rows, cols = np.nonzero(mask)
    geometry = SparseCostMatrixGeometry(
        scipy.sparse.coo_array((M[rows, cols], (rows, cols)), shape=(n, m)), 10.0**log_reg
    )
    log_w = rng.normal(size=m) * 5
    logits = np.where(mask, -M / 10.0**log_reg + log_w, -np.inf)
    with np.errstate(divide="ignore"):
        top = logits.max(axis=1)
        shift = np.where(np.isfinite(top), top, 0.0)
        expected = shift + np.log(np.exp(logits - shift[:, None]).sum(axis=1))
    np.testing.assert_allclose(geometry.log_matvec(slice(None), log_w), expected, rtol=1e-12)
    log_u = rng.normal(size=n)
    logits_t = np.where(mask, -M / 10.0**log_reg + log_u[:, None], -np.inf).T
    with np.errstate(divide="ignore"):
        top = logits_t.max(axis=1)
        shift = np.where(np.isfinite(top), top, 0.0)
        expected = shift + np.log(np.exp(logits_t - shift[:, None]).sum(axis=1))
    np.testing.assert_allclose(
        geometry.log_matvec(slice(None), log_u, transpose=True), expected, rtol=1e-12
    )


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize(
    "index", [np.array([3, 0, 3, 17]), slice(2, 9), 5, np.array([], dtype=np.intp)]
)
def test_products_of_some_rows_read_only_their_entries(index, transpose):
    # a sampled check's rows (any index form, repeats and empty rows included) equal the
    # full products at those rows, computed from their stored entries alone: the full
    # pass's O(nnz) exponentials are refused
    _, _, sparse, _ = case(9, n=40, m=30, density=0.1)
    sparse = sparse.tolil()
    sparse[3, :] = 0.0  # a row (or column) without pairs reads -inf and 0
    geometry = SparseCostMatrixGeometry(scipy.sparse.csr_array(sparse.tocsr()), 0.05)
    width = 40 if transpose else 30
    rng = np.random.default_rng(1)
    log_v, V = rng.normal(size=width), rng.normal(size=(width, 2))
    with np.errstate(divide="ignore"):
        full_log = geometry.log_matvec(slice(None), log_v, transpose=transpose)
    full = geometry.matmat(slice(None), V, transpose=transpose)
    geometry._neg_cost_entries = _refuse("the full pass")
    geometry.kernel_matrix = _refuse("the full kernel")
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(
            geometry.log_matvec(index, log_v, transpose=transpose), full_log[index]
        )
    np.testing.assert_allclose(
        geometry.matmat(index, V, transpose=transpose), full[index], rtol=1e-14
    )
