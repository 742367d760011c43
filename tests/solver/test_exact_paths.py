"""Exact-kernel Sinkhorn paths against POT, on small problems drawn from explicit generators.

Tolerances: the dense path performs POT's operations in POT's order, so its iterates match
``ot.sinkhorn`` to rounding (relative 1e-12 after a few hundred iterations) and it stops at the
same iteration. The stabilised path runs the same iteration on a rescaled kernel, so it matches
to rounding as well, up to the constant shift ``(log u + c, log v - c)`` that leaves the plan
unchanged (POT's log-domain solver starts from ``u = 1`` instead of ``1/n``). Converged plans of
different solvers agree to about the stopping tolerance (L1 1e-8 for ``tol = 1e-10``).
"""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchot.gibbs import gibbs_log_matvec
from sketchot.solver import exact_paths
from sketchot.solver.exact_paths import (
    anneal,
    dense_sinkhorn,
    epsilon_schedule,
    exact_sinkhorn,
    stabilized_sinkhorn,
)


def centred(X, Y):
    center = (X.sum(axis=0) + Y.sum(axis=0)) / (len(X) + len(Y))
    return X - center, Y - center


@pytest.fixture
def problem(colours):
    X, Y = centred(*colours)
    a = np.full(len(X), 1.0 / len(X))
    b = np.full(len(Y), 1.0 / len(Y))
    return X, Y, a, b


def plan(log_u, log_v, Xc, Yc, reg):
    return np.exp(log_u[:, None] - ot.dist(Xc, Yc) / reg + log_v[None, :])


def pot_sinkhorn_log(a, b, M, reg, **options):
    """``ot.bregman.sinkhorn_log``'s log; it warns when exp(log u) overflows in its log dict."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ot.bregman.sinkhorn_log(a, b, M, reg, log=True, **options)


def true_l1_errors(result, Xc, Yc, a, b, reg):
    """Relative L1 marginal errors of the returned scalings, with an exact log-sum-exp."""
    rows = np.exp(result.log_u + gibbs_log_matvec(Xc, Yc, reg, result.log_v))
    cols = np.exp(result.log_v + gibbs_log_matvec(Yc, Xc, reg, result.log_u))
    rows[a == 0] = 0.0
    cols[b == 0] = 0.0
    return np.abs(rows - a).sum() / a.sum(), np.abs(cols - b).sum() / b.sum()


# ------------------------------------------------------------------------- dense path
@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_dense_reproduces_pot_iterates(problem, reg):
    Xc, Yc, a, b = problem
    M = ot.dist(Xc, Yc)
    _, log = ot.sinkhorn(a, b, M, reg, log=True)
    result = dense_sinkhorn(np.exp(-M / reg), a, b)
    assert result.converged
    assert result.n_iter == log["niter"] + 1  # POT reports the 0-based index
    np.testing.assert_allclose(result.log_u, np.log(log["u"]), rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.log_v, np.log(log["v"]), rtol=0, atol=1e-10)
    np.testing.assert_allclose([e for _, e in result.history], log["err"], rtol=1e-6)


def test_dense_float32_reaches_float32_tolerance(problem):
    Xc, Yc, a, b = problem
    reg = 0.05
    K = np.exp(-ot.dist(Xc, Yc) / reg)
    reference = dense_sinkhorn(K, a, b, tol=1e-12)
    tol = 1e-6 * np.linalg.norm(b)  # float32 resolves ~1e-7 relative
    result = dense_sinkhorn(K.astype(np.float32), a, b, tol=tol)
    assert result.converged and result.log_u.dtype == np.float64
    P, P_ref = (plan(r.log_u, r.log_v, Xc, Yc, reg) for r in (result, reference))
    assert np.abs(P - P_ref).sum() < 1e-5


def test_dense_breakdown_returns_last_finite_iterate_like_pot():
    rng = np.random.default_rng(7)
    X = rng.random((80, 3))
    X[0] = 1.0  # a colour so far from every target that its kernel row underflows to 0
    Xc, Yc = centred(X, 0.12 * rng.random((60, 3)))
    a, b, reg = np.full(80, 1 / 80), np.full(60, 1 / 60), 0.003
    K = np.exp(-ot.dist(Xc, Yc) / reg)
    assert not K[0].any()
    result = dense_sinkhorn(K, a, b)
    assert not result.converged and result.info["breakdown"] == 1
    assert np.all(np.isfinite(result.log_u)) and np.all(np.isfinite(result.log_v))


# -------------------------------------------------------------------- stabilised path
def test_stabilized_matches_pot_up_to_the_plan_invariant_shift(problem):
    Xc, Yc, a, b = problem
    reg = 0.01
    M = ot.dist(Xc, Yc)
    _, log = pot_sinkhorn_log(a, b, M, reg, stopThr=1e-10)
    result = stabilized_sinkhorn(Xc, Yc, a, b, reg, tol=1e-10)
    assert result.converged
    assert result.n_iter == log["niter"] + 1
    shift = np.mean(result.log_u - log["log_u"])
    np.testing.assert_allclose(result.log_u - shift, log["log_u"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.log_v + shift, log["log_v"], rtol=0, atol=1e-9)
    P_pot = np.exp(log["log_u"][:, None] - M / reg + log["log_v"][None, :])
    assert np.abs(plan(result.log_u, result.log_v, Xc, Yc, reg) - P_pot).sum() < 1e-9


def test_stabilized_is_the_dense_iteration_when_nothing_underflows(problem):
    Xc, Yc, a, b = problem
    reg = 0.05
    dense = dense_sinkhorn(np.exp(-ot.dist(Xc, Yc) / reg), a, b)
    result = stabilized_sinkhorn(Xc, Yc, a, b, reg, threshold=3.0)  # forces absorptions
    assert result.info["absorptions"] > 0
    assert result.n_iter == dense.n_iter
    np.testing.assert_allclose(result.log_u, dense.log_u, atol=1e-9)
    np.testing.assert_allclose(result.log_v, dense.log_v, atol=1e-9)


def test_small_reg_where_multiplicative_breaks_down_reaches_target():
    rng = np.random.default_rng(7)
    X = rng.random((80, 3))
    X[0] = 1.0
    Xc, Yc = centred(X, 0.12 * rng.random((60, 3)))
    a, b, reg = np.full(80, 1 / 80), np.full(60, 1 / 60), 0.003
    M = ot.dist(Xc, Yc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # POT warns about its numerical errors
        _, pot_log = ot.sinkhorn(a, b, M, reg, log=True)
    assert pot_log["niter"] == 0  # POT stops at once: K v has a zero
    result = stabilized_sinkhorn(Xc, Yc, a, b, reg, tol=1e-10)
    assert result.converged
    assert max(true_l1_errors(result, Xc, Yc, a, b, reg)) < 1e-7
    _, log = pot_sinkhorn_log(a, b, M, reg, stopThr=1e-10)
    P_pot = np.exp(log["log_u"][:, None] - M / reg + log["log_v"][None, :])
    assert np.abs(plan(result.log_u, result.log_v, Xc, Yc, reg) - P_pot).sum() < 1e-8


def test_reg_0003_on_colours_reaches_tol_with_absorptions():
    rng = np.random.default_rng(11)
    Xc, Yc = centred(rng.random((150, 3)), rng.beta(2.0, 5.0, size=(130, 3)))
    a, b, reg = np.full(150, 1 / 150), np.full(130, 1 / 130), 0.003
    result = stabilized_sinkhorn(Xc, Yc, a, b, reg, max_iter=5000)
    assert result.converged and result.info["absorptions"] >= 1
    assert result.history[-1][1] < 1e-9
    assert max(true_l1_errors(result, Xc, Yc, a, b, reg)) < 1e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_streamed_equals_stored(problem, dtype, monkeypatch):
    Xc, Yc, a, b = problem
    reg = 0.003
    tol = 1e-9 if dtype == np.float64 else 1e-6 * np.linalg.norm(b)
    options = dict(tol=tol, max_iter=3000, dtype=dtype, threshold=5.0)
    stored = stabilized_sinkhorn(Xc, Yc, a, b, reg, **options)
    monkeypatch.setattr(exact_paths, "STREAM_BLOCK_BYTES", 40 * len(Yc) * 8)  # 3 blocks
    streamed = stabilized_sinkhorn(Xc, Yc, a, b, reg, max_dense_bytes=0, **options)
    assert stored.info["stored"] and not streamed.info["stored"]
    assert stored.converged and streamed.converged
    assert streamed.n_iter == stored.n_iter
    assert streamed.info["absorptions"] == stored.info["absorptions"] > 0
    # Same operations, different summation order (blocks, threads): rounding only.
    atol = 1e-8 if dtype == np.float64 else 1e-3
    np.testing.assert_allclose(streamed.log_u, stored.log_u, atol=atol)
    np.testing.assert_allclose(streamed.log_v, stored.log_v, atol=atol)


def test_float32_stabilized_close_to_float64(problem):
    Xc, Yc, a, b = problem
    reg = 0.003
    reference = stabilized_sinkhorn(Xc, Yc, a, b, reg, max_iter=3000)
    result = stabilized_sinkhorn(
        Xc, Yc, a, b, reg, max_iter=3000, dtype=np.float32, tol=1e-6 * np.linalg.norm(b)
    )
    assert result.converged and result.info["dtype"] == "float32"
    assert result.log_u.dtype == np.float64
    assert max(true_l1_errors(result, Xc, Yc, a, b, reg)) < 1e-4
    P, P_ref = (plan(r.log_u, r.log_v, Xc, Yc, reg) for r in (result, reference))
    assert np.abs(P - P_ref).sum() < 1e-4


@pytest.mark.parametrize("solver", ["dense", "stabilized", "annealed"])
def test_zero_weights(problem, solver):
    Xc, Yc, a, b = problem
    rng = np.random.default_rng(3)
    a, b = a.copy(), b.copy()
    a[rng.choice(a.size, 10, replace=False)] = 0.0
    b[rng.choice(b.size, 7, replace=False)] = 0.0
    a /= a.sum()
    b /= b.sum()
    reg = 0.02
    M = ot.dist(Xc, Yc)
    if solver == "dense":
        result = dense_sinkhorn(np.exp(-M / reg), a, b, tol=1e-10)
    else:
        result = exact_sinkhorn(Xc, Yc, a, b, reg, tol=1e-10, epsilon_scaling=solver == "annealed")
    assert result.converged
    assert np.all(np.isneginf(result.log_u[a == 0])) and np.all(np.isfinite(result.log_u[a > 0]))
    assert np.all(np.isneginf(result.log_v[b == 0])) and np.all(np.isfinite(result.log_v[b > 0]))
    # POT on the problem restricted to the support gives the same plan there.
    rows, cols = a > 0, b > 0
    reduced, _ = pot_sinkhorn_log(a[rows], b[cols], M[rows][:, cols], reg, stopThr=1e-11)
    P = plan(result.log_u, result.log_v, Xc, Yc, reg)
    assert not P[~rows].any() and not P[:, ~cols].any()
    assert np.abs(P[rows][:, cols] - reduced).sum() < 1e-8


# ---------------------------------------------------------------- the 2-D Gaussian case
def test_two_d_gaussian_converges_within_pot_iterations():
    """n = 2000, reg = 0.05 x median squared distance: seed 4 is a draw where today's solver
    switched to its 40x slower log domain ((max|x| + max|y|)^2 / reg = 576 > 500)."""
    rng = np.random.default_rng(4)
    Xc, Yc = centred(rng.standard_normal((2000, 2)), rng.standard_normal((2000, 2)))
    a = np.full(2000, 1 / 2000)
    M = ot.dist(Xc, Yc)
    reg = 0.05 * np.median(M)
    _, log = ot.sinkhorn(a, a, M, reg, log=True)
    pot_iterations = log["niter"] + 1
    dense = dense_sinkhorn(np.exp(-M / reg), a, a)
    stabilized = stabilized_sinkhorn(Xc, Yc, a, a, reg)
    for result in (dense, stabilized):
        assert result.converged
        assert result.n_iter <= pot_iterations + 10


# --------------------------------------------------------------------- epsilon-scaling
def test_annealing_reduces_iterations_at_small_reg():
    rng = np.random.default_rng(20261125)
    Xc, Yc = centred(rng.random((120, 3)), rng.beta(2.0, 5.0, size=(90, 3)))
    a, b, reg = np.full(120, 1 / 120), np.full(90, 1 / 90), 0.003
    # Measured: 961 iterations without, 861 with (the last stage's linear rate dominates).
    plain = exact_sinkhorn(Xc, Yc, a, b, reg, max_iter=10000)
    annealed = exact_sinkhorn(Xc, Yc, a, b, reg, max_iter=10000, epsilon_scaling=True)
    assert plain.converged and annealed.converged
    assert annealed.n_iter < 0.95 * plain.n_iter
    stages = annealed.info["stages"]
    assert stages[-1]["reg"] == reg and stages[-1]["tol"] == 1e-9
    assert all(s["tol"] > 1e-9 for s in stages[:-1])
    assert annealed.n_iter == sum(s["n_iter"] for s in stages)
    assert max(true_l1_errors(annealed, Xc, Yc, a, b, reg)) < 1e-6


def test_anneal_drives_any_stage_solver():
    calls = []

    def stage_solve(reg, f, g, tol, max_iter):
        calls.append((reg, None if f is None else f.copy(), tol, max_iter))
        f = np.full(3, reg) if f is None else f + reg
        return f, -f, 4, True, [(1, 0.5), (4, tol / 2)]

    result = anneal(stage_solve, 0.01, 0.08, 0.5, tol=1e-9, max_iter=100, stage_tol=1e-4)
    assert [c[0] for c in calls] == pytest.approx([0.08, 0.04, 0.02, 0.01])
    assert calls[0][1] is None
    np.testing.assert_allclose(calls[1][1], np.full(3, 0.08))  # warm start carried over
    assert [c[2] for c in calls] == [1e-4, 1e-4, 1e-4, 1e-9]
    assert [c[3] for c in calls] == [100, 96, 92, 88]  # the budget is shared
    assert result.n_iter == 16 and result.converged
    assert result.history[-2:] == [(13, 0.5), (16, 5e-10)]
    np.testing.assert_allclose(result.f, np.full(3, 0.15))


def test_anneal_stops_when_the_budget_is_spent():
    def stage_solve(reg, f, g, tol, max_iter):
        return np.zeros(2), np.zeros(2), max_iter, False, [(max_iter, 1.0)]

    result = anneal(stage_solve, 0.01, 1.0, 0.5, tol=1e-9, max_iter=50)
    assert len(result.stages) == 1 and not result.converged and result.n_iter == 50


@settings(max_examples=50, deadline=None)
@given(
    reg=st.floats(1e-4, 10.0),
    ratio=st.floats(0.1, 1e5),
    factor=st.floats(0.05, 0.95),
)
def test_epsilon_schedule_is_geometric_and_ends_at_reg(reg, ratio, factor):
    schedule = epsilon_schedule(reg, reg * ratio, factor)
    assert schedule[-1] == reg
    if ratio <= 1:
        assert schedule == [reg]
        return
    assert schedule[0] == pytest.approx(reg * ratio)
    steps = np.array(schedule[1:]) / np.array(schedule[:-1])
    assert np.all(steps < 1) and np.all(steps >= factor * (1 - 1e-9))
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)


# ------------------------------------------------------------------------- validation
def test_errors_name_the_argument(problem):
    Xc, Yc, a, b = problem
    with pytest.raises(ValueError, match="same total mass"):
        stabilized_sinkhorn(Xc, Yc, a, 2 * b, 0.1)
    with pytest.raises(ValueError, match="a must have len"):
        stabilized_sinkhorn(Xc, Yc, a[:-1], b[:-1] * len(b) / (len(b) - 1) * a[:-1].sum(), 0.1)
    with pytest.raises(ValueError, match="reg must be > 0"):
        stabilized_sinkhorn(Xc, Yc, a, b, 0.0)
    with pytest.raises(ValueError, match="dtype"):
        stabilized_sinkhorn(Xc, Yc, a, b, 0.1, dtype=np.float16)
    with pytest.raises(ValueError, match="K must be an array of shape"):
        dense_sinkhorn(np.ones((3, 3)), a, b)
    with pytest.raises(ValueError, match="b must be finite, non-negative"):
        dense_sinkhorn(np.ones((len(a), len(b))), a, -b)
    with pytest.raises(ValueError, match="factor must be in"):
        epsilon_schedule(0.1, 1.0, 1.5)
    with pytest.raises(TypeError, match="stage_solve must be callable"):
        anneal(None, 0.1, 1.0)
