"""The forms of a cost matrix ``M`` (``sketchot/matrix.py``, ``sketchot/cost_matrix.py``,
``sketchot/solver/matrix.py``): ``+inf`` entries (forbidden pairs), negative entries, NaN,
infeasible supports; and POT's Sinkhorn entries on ``M`` (``sketchot.matrix.sinkhorn``,
``sinkhorn2``, ``sinkhorn_unbalanced``) with POT's return values and log conventions.

Tolerances: against POT on the same problem, plans to ``atol=1e-5`` (POT
test/test_bregman.py::test_sinkhorn_variants, its tolerance between Sinkhorn solvers) with
POT's stopThr ``1e-9`` passed as ``tol`` on our side and POT run to ``stopThr=1e-12``;
values to ``rtol=1e-5`` (``np.allclose``'s, POT test_solvers.py's ``assert_allclose_sol``).
POT's reference for forbidden pairs is the dense ``M`` with a large finite cost there
(``1e3`` times the largest allowed cost: ``exp(-1e3 max / reg)`` is 0 in float64 at every
reg used, so POT's plan is exactly 0 there too).
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
import sketchot.matrix
from sketchot.cost_matrix import FORBIDDEN_LOG, CostMatrixGeometry, check_support

POT_TOL = 1e-9
PLAN_ATOL = 1e-5


def case(seed=0, n=40, m=30):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), rng.random((m, 2))
    a, b = rng.random(n) + 0.1, rng.random(m) + 0.1
    M = ot.dist(X, Y)
    return a / a.sum(), b / b.sum(), M / M.max()


def forbid(M, fraction, seed=1):
    """``M`` with about ``fraction`` of its pairs forbidden (``+inf``), and POT's stand-in."""
    rng = np.random.default_rng(seed)
    out = M.copy()
    out[rng.random(M.shape) < fraction] = np.inf
    return out, np.where(np.isinf(out), 1e3 * M.max(), out)


# ------------------------------------------------------------------ forbidden pairs


@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_forbidden_pairs_match_pot_on_a_large_finite_cost(reg):
    a, b, M = case()
    forbidden, stand_in = forbid(M, 0.3)
    result = sketchot.solve(forbidden, a, b, reg=reg, tol=POT_TOL)
    plan = ot.sinkhorn(a, b, stand_in, reg, method="sinkhorn_log", stopThr=1e-12,
                       numItermax=100_000)  # fmt: skip
    assert result.status == "converged" and result.accuracy_met
    np.testing.assert_allclose(result.plan, plan, atol=PLAN_ATOL)
    assert np.all(result.plan[np.isinf(forbidden)] == 0.0)  # exactly: the kernel is 0 there
    assert math.isfinite(result.value) and math.isfinite(result.value_linear)
    assert result.value_linear == pytest.approx(ot.sinkhorn2(
        a, b, stand_in, reg, method="sinkhorn_log", stopThr=1e-12, numItermax=100_000
    ), rel=1e-5)  # fmt: skip
    reference = ot.solve(stand_in, a, b, reg=reg, tol=1e-12, max_iter=100_000)
    assert result.value == pytest.approx(float(reference.value), rel=1e-5)


def test_forbidden_pairs_unbalanced_and_semi_relaxed_match_pot():
    a, b, M = case(2)
    forbidden, stand_in = forbid(M, 0.4, seed=3)
    for unbalanced in (1.0, (math.inf, 0.5)):
        result = sketchot.solve(forbidden, a, 2 * b, reg=0.05, unbalanced=unbalanced,
                                tol=POT_TOL)  # fmt: skip
        reference = ot.solve(stand_in, a, 2 * b, reg=0.05, unbalanced=unbalanced, tol=1e-12,
                             max_iter=100_000)  # fmt: skip
        np.testing.assert_allclose(result.plan, reference.plan, atol=PLAN_ATOL)
        assert np.all(result.plan[np.isinf(forbidden)] == 0.0)


def test_forbidden_blocks_that_carry_different_masses_are_refused():
    """Two blocks of allowed pairs: balanced transport cannot move mass between them."""
    M = np.full((4, 4), np.inf)
    M[:2, :2] = M[2:, 2:] = 1.0
    a = np.array([0.3, 0.3, 0.2, 0.2])
    with pytest.raises(ValueError, match=r"split the weights into 2 independent blocks.*"
                       r"mass 0\.6 in a and 0\.5 in b"):  # fmt: skip
        sketchot.solve(M, a, np.full(4, 0.25), reg=0.1)
    # the same masses in each block: solvable, and the plan stays in the blocks
    result = sketchot.solve(M, np.full(4, 0.25), np.full(4, 0.25), reg=0.1)
    assert result.accuracy_met and np.all(result.plan[np.isinf(M)] == 0.0)
    # unbalanced: mass may be destroyed, no refusal
    assert sketchot.solve(M, a, np.full(4, 0.25), reg=0.1, unbalanced=1.0).accuracy_met


def test_a_row_or_column_without_allowed_pairs_is_refused_by_name():
    M = np.ones((3, 3))
    M[1, :] = np.inf
    with pytest.raises(ValueError, match=r"M has 1 row\(s\) with weight > 0 and no allowed pair"
                       r".*row 1 \(a\[1\] = 0\.333333\): there is no plan"):  # fmt: skip
        sketchot.solve(M, reg=0.1)
    with pytest.raises(ValueError, match=r"no allowed pair .* a soft marginal would destroy"):
        sketchot.solve(M, reg=0.1, unbalanced=1.0)
    # a zero weight on that row: nothing to carry, solved
    result = sketchot.solve(M, [0.5, 0.0, 0.5], [0.2, 0.3, 0.5], reg=0.1)
    assert result.accuracy_met and np.all(result.plan[1] == 0.0)
    M = np.ones((3, 3))
    M[:, 2] = np.inf
    with pytest.raises(ValueError, match=r"1 column\(s\) .* column 2 \(b\[2\]"):
        sketchot.solve(M, reg=0.1)


def test_the_support_check_on_a_sparse_pattern():
    import scipy.sparse

    allowed = scipy.sparse.csr_array(np.eye(3))
    check_support(allowed, np.full(3, 1 / 3), np.full(3, 1 / 3), (True, True))
    with pytest.raises(ValueError, match="3 independent blocks"):
        check_support(allowed, np.array([0.5, 0.25, 0.25]), np.full(3, 1 / 3), (True, True))


def test_the_geometry_of_forbidden_pairs():
    M = np.array([[1.0, np.inf], [2.0, 3.0]])
    g = CostMatrixGeometry(M, 0.5)
    assert g.forbidden == 1 and g.max_cost() == 3.0 and g.min_cost == 1.0
    np.testing.assert_array_equal(g.block(slice(None)), np.exp(-np.array([[2, 1e300], [4, 6]])))
    assert g.log_block([0])[0, 1] == -FORBIDDEN_LOG
    assert g.cost_block([0])[0, 1] == 0.5 * FORBIDDEN_LOG  # finite: 0 x it is 0, not NaN
    np.testing.assert_allclose(g.columns([1])[:, 0], [0.0, np.exp(-6.0)])
    assert np.isfinite(g.log_matvec(slice(None), np.zeros(2))).all()


# ------------------------------------------------------------------------ negative costs


@pytest.mark.parametrize("reg", [0.1, 0.01, 1e-3])
def test_negative_costs_balanced_give_the_value_of_the_given_M(reg):
    """Entropic OT is shift-invariant in the balanced case: the plan of M - c is M's, and
    the value is that of M itself (as POT's, which iterates on exp(-M / reg) as given)."""
    a, b, M = case(4)
    shifted = M - 0.7
    result = sketchot.solve(shifted, a, b, reg=reg, tol=POT_TOL)
    reference = ot.solve(shifted, a, b, reg=reg, tol=1e-12, max_iter=100_000,
                         method="sinkhorn_log")  # fmt: skip
    assert result.status == "converged"
    np.testing.assert_allclose(result.plan, reference.plan, atol=PLAN_ATOL)
    assert result.value_linear == pytest.approx(float(reference.value_linear), rel=1e-5)
    assert result.value == pytest.approx(float(reference.value), rel=1e-5)
    # the potentials are M's: P = diag(u) exp(-M / reg) diag(v)
    log_u, log_v = result.potentials
    plan = np.exp(log_u[:, None] - shifted / reg + log_v[None, :])
    np.testing.assert_allclose(plan, result.plan, rtol=1e-10, atol=1e-300)
    assert result.kernel.geometry.offset == 0.0  # the kernel of M itself
    assert "negative costs" in result.notes[-1]


def test_a_warm_start_from_a_negative_cost_result_is_in_ms_terms():
    a, b, M = case(16)
    first = sketchot.solve(M - 2.0, a, b, reg=0.01, tol=1e-10)
    again = sketchot.solve(M - 2.0, a, b, reg=0.01, tol=1e-10, potentials_init=first.potentials)
    assert again.n_iter <= 2  # started at the answer (a check, at most one pass)
    np.testing.assert_allclose(again.plan, first.plan, atol=1e-12)


@given(st.floats(-50.0, 50.0))
@settings(max_examples=10, deadline=None)
def test_a_shift_of_M_moves_the_balanced_value_by_the_shift(shift):
    """Invariant: value(M + s) = value(M) + s * mass, the same plan (rtol 1e-9: rounding of
    the shifted exponents, the two solves' iterations being the same up to it)."""
    a, b, M = case(5, n=12, m=9)
    base = sketchot.solve(M, a, b, reg=0.05, tol=1e-12)
    moved = sketchot.solve(M + shift, a, b, reg=0.05, tol=1e-12)
    assert moved.value == pytest.approx(base.value + shift, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(moved.plan, base.plan, atol=1e-9)


def test_negative_costs_unbalanced_are_refused_by_name():
    a, b, M = case(6)
    with pytest.raises(ValueError, match=r"M has negative costs \(smallest -0\.4997\d*\) and "
                       r"unbalanced=1\.0 makes the problem unbalanced.*POT's "
                       r"ot\.sinkhorn_unbalanced"):  # fmt: skip
        sketchot.solve(M - 0.5, a, b, reg=0.1, unbalanced=1.0)
    # semi-relaxed is unbalanced on one side: refused too; both hard is balanced
    with pytest.raises(ValueError, match="M has negative costs"):
        sketchot.solve(M - 0.5, a, b, reg=0.1, unbalanced=(math.inf, 1.0))
    assert sketchot.solve(M - 0.5, a, b, reg=0.1, unbalanced=math.inf).accuracy_met


def test_negative_costs_with_a_low_rank_backend_are_refused_and_auto_takes_the_exact_kernel():
    a, b, M = case(7)
    with pytest.raises(ValueError, match=r"backend='cur' on M with negative costs"):
        sketchot.solve(M - 1.0, a, b, reg=0.5, backend="cur")
    assert sketchot.solve(M - 1.0, a, b, reg=0.5).backend == "exact"


def test_a_sparse_matrix_of_allowed_pairs_is_the_dense_one_with_inf_at_the_missing_pairs():
    """POT's sparse-cost convention: the stored entries are the allowed pairs (more in
    ``tests/test_sparse_cost.py``)."""
    import scipy.sparse

    _, _, M = case(13, n=20, m=20)
    pattern = np.random.default_rng(14).random(M.shape) < 0.5
    np.fill_diagonal(pattern, True)  # a feasible support: the identity coupling of ...
    rows, cols = np.nonzero(pattern)
    sparse = scipy.sparse.csr_array((M[rows, cols], (rows, cols)), shape=M.shape)
    dense = np.where(pattern, M, np.inf)
    on_sparse = sketchot.solve(sparse, reg=0.1)  # ... uniform weights (feasible)
    on_dense = sketchot.solve(dense, reg=0.1)
    assert on_sparse.accuracy_met and np.all(on_sparse.plan.toarray()[~pattern] == 0.0)
    np.testing.assert_allclose(on_sparse.plan.toarray(), on_dense.plan, rtol=0, atol=1e-12)


def test_nan_is_refused_by_name():
    a, b, M = case(8)
    M[3, 4] = np.nan
    with pytest.raises(ValueError, match=r"M must contain real costs \(\+inf for a forbidden "
                       r"pair\); got NaN for 1 of its 1200 entries"):  # fmt: skip
        sketchot.solve(M, a, b, reg=0.1)


# ------------------------------------------------------------ POT's Sinkhorn entries on M


@pytest.mark.parametrize("method", ["sinkhorn", "sinkhorn_log", "sinkhorn_stabilized"])
def test_sinkhorn_on_M_is_pots(method):
    """POT test_bregman.py::test_sinkhorn_variants: the methods' plans agree to 1e-5."""
    a, b, M = case(9)
    plan, log = sketchot.matrix.sinkhorn(a, b, M, 0.05, method=method, stopThr=POT_TOL,
                                         log=True)  # fmt: skip
    reference = ot.sinkhorn(a, b, M, 0.05, method="sinkhorn_log", stopThr=1e-12,
                            numItermax=100_000)  # fmt: skip
    np.testing.assert_allclose(plan, reference, atol=PLAN_ATOL)
    # POT's log: u, v, log_u, log_v of P = diag(u) exp(-M / reg) diag(v)
    np.testing.assert_allclose(
        log["u"][:, None] * np.exp(-M / 0.05) * log["v"][None, :], plan, rtol=1e-9
    )
    np.testing.assert_allclose(log["log_u"], np.log(log["u"]))
    assert log["niter"] >= 1 and log["result"].accuracy_met
    value = sketchot.matrix.sinkhorn2(a, b, M, 0.05, method=method, stopThr=POT_TOL)
    assert value == pytest.approx(float(np.sum(reference * M)), rel=1e-5)


def test_pot_empty_weights_are_uniform_and_a_warm_start_is_pots():
    a, b, M = case(10)
    plan = sketchot.matrix.sinkhorn([], [], M, 0.1)
    np.testing.assert_allclose(plan, ot.sinkhorn([], [], M, 0.1), atol=PLAN_ATOL)
    _, log = sketchot.matrix.sinkhorn(a, b, M, 0.1, log=True, stopThr=1e-12)
    _, warm = sketchot.matrix.sinkhorn(
        a, b, M, 0.1, log=True, stopThr=1e-12, warmstart=(log["log_u"], log["log_v"])
    )
    assert warm["niter"] < log["niter"]
    with pytest.raises(ValueError, match=r"sinkhorn\(\): method must be one of POT's"):
        sketchot.matrix.sinkhorn(a, b, M, 0.1, method="sinkhorn_cryptic")


@pytest.mark.parametrize("reg_m", [1.0, (0.5, 2.0), (math.inf, 1.0)])
def test_sinkhorn_unbalanced_on_M_is_pots(reg_m):
    """POT's ot.sinkhorn_unbalanced (test/unbalanced/test_sinkhorn.py compares to 1e-5)."""
    a, b, M = case(11)
    plan, log = sketchot.matrix.sinkhorn_unbalanced(a, 2 * b, M, 0.05, reg_m, log=True,
                                                    stopThr=POT_TOL)  # fmt: skip
    reference, pot_log = ot.sinkhorn_unbalanced(a, 2 * b, M, 0.05, reg_m, log=True,
                                                stopThr=1e-12, numItermax=100_000)  # fmt: skip
    np.testing.assert_allclose(plan, reference, atol=PLAN_ATOL)
    # POT's unbalanced convention: P = diag(e^logu) (exp(-M / reg) a b^T) diag(e^logv)
    K = np.exp(-M / 0.05) * a[:, None] * (2 * b)[None, :]
    np.testing.assert_allclose(
        np.exp(log["logu"])[:, None] * K * np.exp(log["logv"])[None, :], plan, rtol=1e-9
    )
    assert log["cost"] == pytest.approx(pot_log["cost"], rel=1e-5)
    # POT's warm start in its own convention: a couple of checks, not a cold solve
    _, warm = sketchot.matrix.sinkhorn_unbalanced(
        a, 2 * b, M, 0.05, reg_m, log=True, warmstart=(pot_log["logu"], pot_log["logv"])
    )
    assert warm["niter"] < log["niter"]
    # POT's reg_type='entropy' (its c = 1: tests/test_solve_matrix_reference.py)
    entropy = sketchot.matrix.sinkhorn_unbalanced(a, 2 * b, M, 0.05, reg_m, reg_type="entropy",
                                                  stopThr=POT_TOL)  # fmt: skip
    with pytest.warns(UserWarning, match="c is overwritten by the one matrix"):
        reference = ot.sinkhorn_unbalanced(a, 2 * b, M, 0.05, reg_m, reg_type="entropy",
                                           stopThr=1e-12, numItermax=100_000)  # fmt: skip
    np.testing.assert_allclose(entropy, reference, atol=PLAN_ATOL)
    with pytest.raises(NotImplementedError, match="reg_type must be 'kl'"):
        sketchot.matrix.sinkhorn_unbalanced(a, b, M, 0.05, reg_m, reg_type="L2")


def test_pot_entries_take_forbidden_pairs():
    """Where POT's plain Sinkhorn gives NaN (0 x inf in sum(P * M)), sinkhorn2 on M with
    forbidden pairs returns the cost of the allowed pairs."""
    a, b, M = case(12)
    forbidden, stand_in = forbid(M, 0.2, seed=5)
    value = sketchot.matrix.sinkhorn2(a, b, forbidden, 0.05, stopThr=POT_TOL)
    reference = ot.sinkhorn2(a, b, stand_in, 0.05, method="sinkhorn_log", stopThr=1e-12,
                             numItermax=100_000)  # fmt: skip
    assert value == pytest.approx(float(reference), rel=1e-5)


def test_pots_positional_call_of_the_cloud_entries_points_to_the_matrix_ones():
    a, b, M = case(15)
    for function in (sketchot.sinkhorn, sketchot.sinkhorn2):
        name = function.__name__
        with pytest.raises(TypeError, match=rf"{name}\(\) takes point clouds.*got the number 0\.1 "
                           rf"as Y.*sketchot\.matrix\.{name}\(a, b, M, reg"):  # fmt: skip
            function(a, b, M, 0.1)
