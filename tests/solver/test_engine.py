"""The one Sinkhorn iteration (``sketchot.solver.engine``) on the exact kernel, against POT.

Tolerances: the multiplicative strategy performs POT's operations in POT's order, so its
iterates match ``ot.sinkhorn`` to rounding (absolute 1e-12 on the log-scalings after a few
hundred iterations; measured 4e-14) and it stops at the same iteration. The absorbed strategy
runs the same iteration on a rescaled kernel, so it matches to rounding as well, up to the
constant shift ``(log u + c, log v - c)`` that leaves the plan unchanged (POT's log-domain
solver starts from ``u = 1`` instead of ``1/n``). Converged plans of different solvers agree to
about the stopping tolerance (L1 1e-8 for ``tol = 1e-10``). float32 kernels resolve marginal
errors down to about ``1e-6 ||b||_2`` (relative rounding ~6e-8 per entry, summed over a row).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.gibbs import GibbsGeometry, gibbs_log_matvec
from sketchot.kernels import exact
from sketchot.kernels.exact import ExactKernel
from sketchot.solver import engine, stopping, strategies
from sketchot.solver.drivers import SymmetricRun, TwoSidedRun
from sketchot.solver.engine import epsilon_schedule, iterate
from sketchot.solver.paper import PaperRun
from sketchot.solver.plans import plan_summary
from sketchot.solver.problem import make_problem
from sketchot.solver.stopping import ResidualNorm, Stopper

INF = float("inf")


def centred(X, Y):
    center = (X.sum(axis=0) + Y.sum(axis=0)) / (len(X) + len(Y))
    return X - center, Y - center


@pytest.fixture
def problem(colours):
    X, Y = centred(*colours)
    a = np.full(len(X), 1.0 / len(X))
    b = np.full(len(Y), 1.0 / len(Y))
    return X, Y, a, b


def outlier_problem():
    """A colour so far from every target that its kernel row underflows at reg 0.003."""
    rng = np.random.default_rng(7)
    X = rng.random((80, 3))
    X[0] = 1.0
    Xc, Yc = centred(X, 0.12 * rng.random((60, 3)))
    return Xc, Yc, np.full(80, 1 / 80), np.full(60, 1 / 60), 0.003


def kernel(Xc, Yc, reg, **params):
    return sketchot.make_kernel(Xc, Yc, reg, "exact", **params)


def plan(log_u, log_v, Xc, Yc, reg):
    return np.exp(log_u[:, None] - ot.dist(Xc, Yc) / reg + log_v[None, :])


def pot_sinkhorn_log(a, b, M, reg, **options):
    """``ot.bregman.sinkhorn_log``'s log; it warns when exp(log u) overflows in its log dict."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ot.bregman.sinkhorn_log(a, b, M, reg, log=True, **options)


def true_l1_errors(log_u, log_v, Xc, Yc, a, b, reg):
    """Relative L1 marginal errors of the scalings, with an exact log-sum-exp."""
    rows = np.exp(log_u + gibbs_log_matvec(Xc, Yc, reg, log_v))
    cols = np.exp(log_v + gibbs_log_matvec(Yc, Xc, reg, log_u))
    rows[a == 0] = 0.0
    cols[b == 0] = 0.0
    return np.abs(rows - a).sum() / a.sum(), np.abs(cols - b).sum() / b.sum()


# ------------------------------------------------------------ multiplicative strategy
@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_plain_reproduces_pot_iterates(problem, reg):
    Xc, Yc, a, b = problem
    M = ot.dist(Xc, Yc)
    _, log = ot.sinkhorn(a, b, M, reg, log=True)
    # POT's criterion at POT's tolerance (the default stops at the accuracy, sooner)
    result = sketchot.sinkhorn_kernel(
        a, b, kernel(Xc, Yc, reg), log_domain=False, anderson=0, tol=1e-9
    )
    assert result.converged and result.iteration_info["strategy"] == "multiplicative"
    assert result.n_iter == log["niter"] + 1  # POT reports the 0-based index
    log_u, log_v = result.potentials
    np.testing.assert_allclose(log_u, np.log(log["u"]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(log_v, np.log(log["v"]), rtol=0, atol=1e-12)
    # the same errors at the same checks; POT's einsum sums in another order
    assert [i for i, _ in result.error_history] == list(range(1, result.n_iter + 1, 10))
    np.testing.assert_allclose([e for _, e in result.error_history], log["err"], rtol=1e-6)


def test_plain_float32_reaches_float32_tolerance(problem):
    Xc, Yc, a, b = problem
    reg = 0.05
    options = dict(log_domain=False, anderson=0)
    reference = sketchot.sinkhorn_kernel(a, b, kernel(Xc, Yc, reg), tol=1e-12, **options)
    tol = 1e-6 * np.linalg.norm(b)  # float32 resolves ~1e-7 relative
    K32 = kernel(Xc, Yc, reg, dtype=np.float32)
    result = sketchot.sinkhorn_kernel(a, b, K32, tol=tol, **options)
    assert result.converged and result.potentials[0].dtype == np.float64
    P, P_ref = (plan(*r.potentials, Xc, Yc, reg) for r in (result, reference))
    assert np.abs(P - P_ref).sum() < 1e-5


def test_plain_breakdown_returns_last_finite_iterate_like_pot():
    Xc, Yc, a, b, reg = outlier_problem()
    M = ot.dist(Xc, Yc)
    K = kernel(Xc, Yc, reg)
    assert not K.to_dense()[0].any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # POT warns about its numerical errors
        _, log = ot.sinkhorn(a, b, M, reg, log=True)
    options = dict(log_domain=False, anderson=0, warn=False, accuracy=None)
    # 'propagate' lets the division by zero through, as POT does: the start comes back
    result = sketchot.sinkhorn_kernel(a, b, K, safeguard="propagate", **options)
    assert result.stop == "breakdown" and result.n_iter == log["niter"] == 0
    np.testing.assert_allclose(result.potentials[0], np.log(log["u"]), rtol=1e-15)
    np.testing.assert_allclose(result.potentials[1], np.log(log["v"]), rtol=1e-15)
    # the default safeguard repairs the vanished product: finite, but not a solution
    repaired = sketchot.sinkhorn_kernel(a, b, K, **options)
    assert not repaired.converged and repaired.safeguard["rows_repaired"] > 0
    assert all(np.all(np.isfinite(p)) for p in repaired.potentials)


# ------------------------------------------------------------------ absorb strategy
def test_absorbed_matches_pot_up_to_the_plan_invariant_shift(problem):
    Xc, Yc, a, b = problem
    reg = 0.01
    M = ot.dist(Xc, Yc)
    _, log = pot_sinkhorn_log(a, b, M, reg, stopThr=1e-10)
    result = sketchot.sinkhorn_kernel(a, b, kernel(Xc, Yc, reg), tol=1e-10, anderson=0)
    assert result.converged and result.iteration_info["strategy"] == "absorb"
    assert result.n_iter == log["niter"] + 1
    log_u, log_v = result.potentials
    shift = np.mean(log_u - log["log_u"])
    np.testing.assert_allclose(log_u - shift, log["log_u"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(log_v + shift, log["log_v"], rtol=0, atol=1e-9)
    P_pot = np.exp(log["log_u"][:, None] - M / reg + log["log_v"][None, :])
    assert np.abs(plan(log_u, log_v, Xc, Yc, reg) - P_pot).sum() < 1e-9


def test_absorbed_is_the_plain_iteration_when_nothing_underflows(problem, monkeypatch):
    Xc, Yc, a, b = problem
    K = kernel(Xc, Yc, 0.05)
    plain = sketchot.sinkhorn_kernel(a, b, K, log_domain=False, anderson=0)
    for thresholds in (engine.ABSORB_THRESHOLD, strategies.ABSORB_THRESHOLD_MAX):
        monkeypatch.setitem(thresholds, np.dtype(np.float64), 3.0)  # absorb often
    result = sketchot.sinkhorn_kernel(a, b, K, anderson=0)
    assert result.iteration_info["absorptions"] > 0
    assert result.n_iter == plain.n_iter
    # the same products regrouped at each absorption: rounding of a few hundred operations
    for ours, theirs in zip(result.potentials, plain.potentials, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)


def test_small_reg_where_multiplicative_breaks_down_reaches_target():
    Xc, Yc, a, b, reg = outlier_problem()
    M = ot.dist(Xc, Yc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # POT warns about its numerical errors
        _, pot_log = ot.sinkhorn(a, b, M, reg, log=True)
    assert pot_log["niter"] == 0  # POT stops at once: K v has a zero
    result = sketchot.sinkhorn_kernel(a, b, kernel(Xc, Yc, reg), tol=1e-10)
    assert result.converged
    # POT's start u = 1/n underflows in the linear kernel: one exact log iteration first
    assert result.iteration_info["first_exact"] == 1
    assert max(true_l1_errors(*result.potentials, Xc, Yc, a, b, reg)) < 1e-7
    _, log = pot_sinkhorn_log(a, b, M, reg, stopThr=1e-10)
    P_pot = np.exp(log["log_u"][:, None] - M / reg + log["log_v"][None, :])
    assert np.abs(plan(*result.potentials, Xc, Yc, reg) - P_pot).sum() < 1e-8


def test_a_vanished_product_without_a_safeguard_is_repaired_not_zeroed(monkeypatch):
    """With the absorbed strategy a vanished product (flagged bad by the pass) is a
    breakdown even when the run has no safeguard (the batch solver's): it is repaired by an
    exact log-domain iteration, never returned as a zero scaling, whose log would become an
    infinite offset at the next absorption."""
    Xc, Yc, a, b, reg = outlier_problem()
    original = exact.AbsorbedExactKernel.fused_pass
    dropped = []

    def dropping(self, side, w, numerator, **options):
        result = original(self, side, w, numerator, **options)
        if side == "cols" and not dropped:
            dropped.append(True)
            result.products[0], result.ratios[0], result.bad[0] = 0.0, 0.0, True
        return result

    monkeypatch.setattr(exact.AbsorbedExactKernel, "fused_pass", dropping)
    op = kernel(Xc, Yc, reg)
    state = iterate(op, make_problem(a, b, op.shape, reg), tol=1e-10, max_iter=2000,
                    strategy="absorb")  # fmt: skip
    assert dropped and state.info["resets"] >= 1 and state.converged
    assert np.isfinite(state.log_v).all()
    assert max(true_l1_errors(state.log_u, state.log_v, Xc, Yc, a, b, reg)) < 1e-8


def test_reg_0003_on_colours_reaches_tol_with_absorptions():
    rng = np.random.default_rng(11)
    Xc, Yc = centred(rng.random((150, 3)), rng.beta(2.0, 5.0, size=(130, 3)))
    a, b, reg = np.full(150, 1 / 150), np.full(130, 1 / 130), 0.003
    # the L2 criterion at 1e-9: the tolerance this test is about
    result = sketchot.sinkhorn_kernel(a, b, kernel(Xc, Yc, reg), max_iter=5000, tol=1e-9)
    assert result.converged and result.iteration_info["absorptions"] >= 1
    assert result.error_history[-1][1] < 1e-9
    # L2 residual 1e-9 over 130 columns: L1 at most sqrt(130) 1e-9, about 1.2e-8
    assert max(true_l1_errors(*result.potentials, Xc, Yc, a, b, reg)) < 1e-6
    assert result.accuracy_met


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_streamed_equals_stored(problem, dtype, monkeypatch):
    """The engine on both storages of the absorbed kernel (``iterate`` directly: the public
    float32 solve at this reg trips the plan summary, see
    ``test_float32_summary_at_small_reg_is_finite``)."""
    Xc, Yc, a, b = problem
    reg = 0.003
    tol = 1e-9 if dtype == np.float64 else 1e-6 * np.linalg.norm(b)
    for thresholds in (engine.ABSORB_THRESHOLD, strategies.ABSORB_THRESHOLD_MAX):
        monkeypatch.setitem(thresholds, np.dtype(dtype), 5.0)  # absorb often
    monkeypatch.setattr(exact, "block_rows", lambda *args, **kwargs: 40)  # 3 blocks
    geometry = GibbsGeometry(Xc, Yc, reg)
    runs = []
    for max_dense_bytes in (exact.DEFAULT_MAX_DENSE_BYTES, 0):
        K = ExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
        state = iterate(
            K, make_problem(a, b, K.shape, reg), tol=tol, max_iter=3000, strategy="absorb"
        )
        runs.append((K.is_dense, state))
    (stored_dense, stored), (streamed_dense, streamed) = runs
    assert stored_dense and not streamed_dense
    assert stored.converged and streamed.converged
    assert streamed.n_iter == stored.n_iter
    assert streamed.info["absorptions"] == stored.info["absorptions"] > 0
    # Same operations, different summation order (blocks, threads): rounding only.
    atol = 1e-8 if dtype == np.float64 else 1e-3
    np.testing.assert_allclose(streamed.log_u, stored.log_u, atol=atol)
    np.testing.assert_allclose(streamed.log_v, stored.log_v, atol=atol)


def test_float32_absorbed_close_to_float64(problem):
    """float32 against float64 through ``iterate`` (see ``test_streamed_equals_stored``)."""
    Xc, Yc, a, b = problem
    reg = 0.003
    # a float64 reference far tighter than float32 resolves (the default stops at 1e-4 L1)
    reference = sketchot.sinkhorn_kernel(
        a, b, kernel(Xc, Yc, reg), max_iter=3000, anderson=0, tol=1e-9
    )
    K32 = kernel(Xc, Yc, reg, dtype=np.float32)
    result = iterate(
        K32, make_problem(a, b, K32.shape, reg), tol=1e-6 * np.linalg.norm(b), max_iter=3000,
        strategy="absorb",
    )  # fmt: skip
    assert result.converged and result.log_u.dtype == np.float64
    # float32 resolves marginals to ~1e-7 relative per entry: L1 1e-4 over 120 rows leaves room
    assert max(true_l1_errors(result.log_u, result.log_v, Xc, Yc, a, b, reg)) < 1e-4
    P = plan(result.log_u, result.log_v, Xc, Yc, reg)
    assert np.abs(P - plan(*reference.potentials, Xc, Yc, reg)).sum() < 1e-4


def test_float32_summary_at_small_reg_is_finite(problem):
    Xc, Yc, a, b = problem
    K32 = kernel(Xc, Yc, 0.003, dtype=np.float32)
    result = sketchot.sinkhorn_kernel(a, b, K32, tol=1e-6 * np.linalg.norm(b))
    assert result.converged and math.isfinite(result.mass)


# ------------------------------------------------------------------ zero weights
@pytest.mark.parametrize(
    "options",
    [dict(log_domain=False, anderson=0), {}, dict(epsilon_scaling=True)],
    ids=["plain", "absorbed", "epsilon-scaled"],
)
def test_zero_weights(problem, options):
    Xc, Yc, a, b = problem
    rng = np.random.default_rng(3)
    a, b = a.copy(), b.copy()
    a[rng.choice(a.size, 10, replace=False)] = 0.0
    b[rng.choice(b.size, 7, replace=False)] = 0.0
    a /= a.sum()
    b /= b.sum()
    reg = 0.02
    result = sketchot.sinkhorn_kernel(a, b, kernel(Xc, Yc, reg), tol=1e-10, **options)
    assert result.converged
    log_u, log_v = result.potentials
    assert np.all(np.isneginf(log_u[a == 0])) and np.all(np.isfinite(log_u[a > 0]))
    assert np.all(np.isneginf(log_v[b == 0])) and np.all(np.isfinite(log_v[b > 0]))
    # POT on the problem restricted to the support gives the same plan there.
    M = ot.dist(Xc, Yc)
    rows, cols = a > 0, b > 0
    reduced, _ = pot_sinkhorn_log(a[rows], b[cols], M[rows][:, cols], reg, stopThr=1e-11)
    P = plan(log_u, log_v, Xc, Yc, reg)
    assert not P[~rows].any() and not P[:, ~cols].any()
    assert np.abs(P[rows][:, cols] - reduced).sum() < 1e-8


# ---------------------------------------------------------------- the 2-D Gaussian case
def test_two_d_gaussian_converges_within_pot_iterations():
    """n = 600, reg = 0.05 x median squared distance: seed 30 is a draw where the cheap bound
    ``(max|x| + max|y|)^2 / reg`` (517) exceeds 500 while the true ``max C / reg`` is 474, so
    nothing underflows: no strategy may need more iterations than POT (241), whatever such a
    bound says."""
    rng = np.random.default_rng(30)
    Xc, Yc = centred(rng.standard_normal((600, 2)), rng.standard_normal((600, 2)))
    a = np.full(600, 1 / 600)
    M = ot.dist(Xc, Yc)
    reg = 0.05 * np.median(M)
    _, log = ot.sinkhorn(a, a, M, reg, log=True)
    pot_iterations = log["niter"] + 1
    K = kernel(Xc, Yc, reg)
    plain = sketchot.sinkhorn_kernel(a, a, K, log_domain=False, anderson=0, accuracy=None)
    absorbed = sketchot.sinkhorn_kernel(a, a, K, anderson=0, accuracy=None)
    default = sketchot.sinkhorn_kernel(a, a, K, accuracy=None)
    assert plain.converged and absorbed.converged and default.converged
    assert plain.n_iter == absorbed.n_iter == pot_iterations
    assert default.n_iter <= pot_iterations


# --------------------------------------------------------------------- epsilon schedule
def test_epsilon_scaling_reduces_iterations_at_small_reg(colours):
    Xc, Yc = centred(*colours)
    a, b, reg = np.full(120, 1 / 120), np.full(90, 1 / 90), 0.003
    K = kernel(Xc, Yc, reg)
    # Measured: 961 iterations without, 862 with (the last stage's linear rate dominates).
    # POT's criterion at 1e-9: the measured counts and the 1e-6 error below are at that tol
    plain = sketchot.sinkhorn_kernel(a, b, K, max_iter=10000, anderson=0, tol=1e-9)
    scaled = sketchot.sinkhorn_kernel(
        a, b, K, max_iter=10000, anderson=0, epsilon_scaling=True, tol=1e-9
    )
    assert plain.converged and scaled.converged
    assert scaled.n_iter < 0.95 * plain.n_iter
    stages = scaled.iteration_info["stages"]
    expected = epsilon_schedule(reg, K.geometry.max_cost())
    assert [s["reg"] for s in stages] == pytest.approx(expected, rel=1e-12)
    assert stages[-1]["reg"] == reg
    assert all(s["status"] == "converged" for s in stages)
    assert scaled.n_iter == sum(s["n_iter"] for s in stages)
    assert max(true_l1_errors(*scaled.potentials, Xc, Yc, a, b, reg)) < 1e-6


def test_schedule_warm_starts_each_stage_in_cost_units(problem):
    """A schedule is its stages run one after the other, each from the previous potentials
    (``f = reg log u``), with the iteration budget shared."""
    Xc, Yc, a, b = problem
    first, last = kernel(Xc, Yc, 0.04), kernel(Xc, Yc, 0.01)
    base = make_problem(a, b, last.shape, 0.01)
    options = dict(strategy="absorb", max_iter=500)
    scheduled = iterate(last, base, tol=1e-9, schedule=[first], **options)
    stage_1 = iterate(first, base.at_reg(0.04, None, None), tol=engine.STAGE_TOL, check_every=1,
                      **options)  # fmt: skip
    warm = base.at_reg(0.01, 0.04 * stage_1.log_u, 0.04 * stage_1.log_v)
    stage_2 = iterate(last, warm, tol=1e-9, strategy="absorb", max_iter=500 - stage_1.n_iter)
    assert [
        {key: stage[key] for key in ("reg", "n_iter", "status")}
        for stage in scheduled.info["stages"]
    ] == [
        {"reg": 0.04, "n_iter": stage_1.n_iter, "status": "converged"},
        {"reg": 0.01, "n_iter": stage_2.n_iter, "status": "converged"},
    ]
    assert scheduled.n_iter == stage_1.n_iter + stage_2.n_iter
    np.testing.assert_array_equal(scheduled.log_u, stage_2.log_u)
    np.testing.assert_array_equal(scheduled.log_v, stage_2.log_v)
    # the history runs on across stages
    offset = [(i + stage_1.n_iter, e) for i, e in stage_2.history]
    assert scheduled.history == stage_1.history + offset


def test_schedule_stops_when_the_budget_is_spent(problem):
    Xc, Yc, a, b = problem
    schedule = [kernel(Xc, Yc, reg) for reg in (0.08, 0.04, 0.02)]
    K = kernel(Xc, Yc, 0.003)
    result = iterate(K, make_problem(a, b, K.shape, 0.003), tol=1e-9, max_iter=3,
                     strategy="absorb", schedule=schedule)  # fmt: skip
    assert result.n_iter == 3 and not result.converged and result.status == "max_iter"
    assert len(result.info["stages"]) < len(schedule) + 1


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
    # the count of stages rounds log(ratio) / log(1 / factor) up (1e-12 slack in the engine)
    assert np.all(steps < 1) and np.all(steps >= factor * (1 - 1e-9))
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)


@pytest.mark.parametrize("factor", [1.5, 1.0, 0.0])
def test_epsilon_schedule_rejects_factor_outside_unit_interval(factor):
    with pytest.raises(ValueError, match="factor"):
        epsilon_schedule(0.1, 1.0, factor)


# ------------------------------------------------------------------ the iteration's options
def test_paper_order_runs_a_fixed_count_and_times_it(problem):
    Xc, Yc, a, b = problem
    K = kernel(Xc, Yc, 0.05)
    base = make_problem(a, b, K.shape, 0.05)
    paper = iterate(K, base, tol=1e-9, max_iter=7, order="paper", timed=True)
    assert paper.status == "fixed" and paper.n_iter == 7 and paper.history == []
    assert len(paper.info["iteration_times"]) == 7
    assert all(t > 0 for t in paper.info["iteration_times"])
    pot = iterate(K, base, tol=1e-9, max_iter=1000, timed=True)
    assert pot.converged and len(pot.info["iteration_times"]) == pot.n_iter
    assert "iteration_times" not in iterate(K, base, tol=1e-9, max_iter=7).info


# ------------------------------------------------------------------ unbalanced transport
def unbalanced_problem(colours):
    """Unequal masses (1 and 1.5) and non-uniform weights on the colour fixture."""
    Xc, Yc = centred(*colours)
    rng = np.random.default_rng(5)
    a = rng.random(len(Xc)) + 0.1
    b = rng.random(len(Yc)) + 0.1
    return Xc, Yc, a / a.sum(), 1.5 * b / b.sum()


def unbalanced_kernel(strategy, Xc, Yc, reg):
    """``(kernel, options)`` that select ``strategy`` in the solver."""
    if strategy == "log":
        # entries to 1e-9 (the accuracy sizes them): plans comparable to POT's at 1e-8
        local = sketchot.make_kernel(Xc, Yc, reg, "polyts", variant="local", accuracy=1e-7, rng=0)
        return local, {}
    return kernel(Xc, Yc, reg), ({"log_domain": False} if strategy == "multiplicative" else {})


STRATEGIES = ["multiplicative", "absorb", "log"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_unbalanced_matches_pot(colours, strategy):
    Xc, Yc, a, b = unbalanced_problem(colours)
    reg, reg_m = 0.1, 1.0
    P_pot = ot.unbalanced.sinkhorn_unbalanced(a, b, ot.dist(Xc, Yc), reg, reg_m, stopThr=1e-12)
    K, options = unbalanced_kernel(strategy, Xc, Yc, reg)
    result = sketchot.sinkhorn_kernel(a, b, K, reg_m=reg_m, tol=1e-12, **options)
    assert result.converged and result.iteration_info["strategy"] == strategy
    assert np.abs(plan(*result.potentials, Xc, Yc, reg) - P_pot).sum() < 1e-8


def test_unbalanced_strategies_reach_the_same_plan(colours):
    """Whatever the objective's convention: one fixed point. The local kernel's entries are
    within 1e-9 (relative) of the true ones, so its plan is within ~1e-9 L1 of the exact."""
    Xc, Yc, a, b = unbalanced_problem(colours)
    reg, reg_m = 0.1, 1.0
    plans = []
    for strategy in STRATEGIES:
        K, options = unbalanced_kernel(strategy, Xc, Yc, reg)
        result = sketchot.sinkhorn_kernel(a, b, K, reg_m=reg_m, tol=1e-12, **options)
        assert result.converged and result.iteration_info["strategy"] == strategy
        plans.append(plan(*result.potentials, Xc, Yc, reg))
    for other in plans[1:]:
        assert np.abs(other - plans[0]).sum() < 1e-8


@pytest.mark.parametrize("strategy", ["multiplicative", "absorb"])
def test_semi_relaxed_row_marginal_is_a(colours, strategy):
    Xc, Yc, a, b = unbalanced_problem(colours)
    reg = 0.1
    K, options = unbalanced_kernel(strategy, Xc, Yc, reg)
    result = sketchot.sinkhorn_kernel(a, b, K, reg_m=(INF, 1.0), tol=1e-12, **options)
    assert result.converged
    # the rows' update is the last half-step: a hard row constraint holds to rounding
    np.testing.assert_allclose(result.marginals[0], a, rtol=1e-12)
    P = plan(*result.potentials, Xc, Yc, reg)
    np.testing.assert_allclose(P.sum(axis=1), a, rtol=1e-12)
    assert not np.allclose(P.sum(axis=0), b, rtol=1e-3)  # the columns are free


# ------------------------------------------------------------------------- validation
def test_errors_name_the_argument(problem):
    Xc, Yc, a, b = problem
    K = kernel(Xc, Yc, 0.1)
    with pytest.raises(ValueError, match="same total mass"):
        sketchot.sinkhorn_kernel(a, 2 * b, K)
    with pytest.raises(ValueError, match="a must have one weight per row of X"):
        sketchot.sinkhorn_kernel(a[:-1], b, K)
    with pytest.raises(ValueError, match="b must be non-negative"):
        sketchot.sinkhorn_kernel(a, -b, K)
    with pytest.raises(ValueError, match="reg must be > 0"):
        kernel(Xc, Yc, 0.0)
    with pytest.raises(ValueError, match="dtype"):
        kernel(Xc, Yc, 0.1, dtype=np.float16)
    with pytest.raises(TypeError, match="kernel must be a sketchot KernelOperator"):
        sketchot.sinkhorn_kernel(a, b, np.ones((len(a), len(b))))
    with pytest.raises(ValueError, match="reg_m must be > 0 on each side"):
        sketchot.sinkhorn_kernel(a, b, K, reg_m=(INF, -1.0))
    nystrom = sketchot.make_kernel(Xc, Yc, 0.1, "nystrom", rank=10, rng=0)
    with pytest.raises(ValueError, match="epsilon_scaling=True needs"):
        sketchot.sinkhorn_kernel(a, b, nystrom, epsilon_scaling=True)
    with pytest.raises(ValueError, match="log_domain=True needs"):
        sketchot.sinkhorn_kernel(a, b, nystrom, log_domain=True)
    with pytest.raises(ValueError, match="order must be one of"):
        iterate(K, make_problem(a, b, K.shape, 0.1), tol=1e-9, max_iter=10, order="posthoc")


@pytest.mark.parametrize("anderson", [0, 5])
@pytest.mark.parametrize("reg_m", [None, 0.5])
def test_log_products_of_the_last_passes_are_those_of_the_final_scalings(colours, anderson, reg_m):
    """A log-domain run on a kernel with ``R = I`` returns ``log(K v)`` and ``log(K^T u)`` of
    its final scalings (the summary's marginals without a product), with or without Anderson
    mixing, balanced or not: they equal fresh products of those scalings."""
    X, Y = colours
    kernel = sketchot.make_kernel(X, Y, 0.01, "polyts_local", rng=0)
    problem = make_problem(None, None, kernel.shape, 0.01, reg_m)
    state = iterate(kernel, problem, tol=1e-6, max_iter=200, strategy="log", anderson=anderson)
    assert state.log_products is not None
    log_kv, log_ktu = state.log_products
    n = kernel.shape[0]
    fresh_kv = kernel.fused_pass("rows", state.log_v, np.zeros(n), log=True).products
    np.testing.assert_allclose(log_kv, fresh_kv, rtol=0, atol=1e-12)
    np.testing.assert_allclose(log_ktu, kernel.project("rows", state.log_u, log=True), atol=1e-12)
    # the summary from them is the summary from fresh products
    given = plan_summary(kernel, state.log_u, state.log_v, log_products=state.log_products)
    fresh = plan_summary(kernel, state.log_u, state.log_v)
    np.testing.assert_allclose(given.row_marginal, fresh.row_marginal, rtol=1e-12)
    np.testing.assert_allclose(given.col_marginal, fresh.col_marginal, rtol=1e-12)
    assert given.cost == pytest.approx(fresh.cost, rel=1e-12)


def test_no_log_products_where_the_passes_do_not_give_them(colours):
    """The absorbing strategy (its passes are of an absorbed kernel) and a low-rank kernel
    (``R != I``) return none."""
    X, Y = colours
    problem = make_problem(None, None, (len(X), len(Y)), 0.5)
    exact = sketchot.make_kernel(X, Y, 0.5, "exact")
    assert iterate(exact, problem, tol=1e-6, max_iter=100, strategy="absorb").log_products is None
    nystrom = sketchot.make_kernel(X, Y, 0.5, "nystrom", rng=0)
    assert iterate(nystrom, problem, tol=1e-6, max_iter=100).log_products is None


def test_a_warm_log_run_starts_from_its_v(colours):
    """The log-domain run uses a warm start's ``v`` (its first half-step computes ``u`` from
    it) instead of projecting ``u``: converged ``v`` with an uninformed ``u`` converges at
    the check that follows that half-step, with no iteration and two products."""
    X, Y = colours
    kernel = sketchot.make_kernel(X, Y, 0.01, "polyts_local", rng=0)
    cold = make_problem(None, None, kernel.shape, 0.01)
    solved = iterate(kernel, cold, tol=1e-9, max_iter=500, strategy="log", anderson=5)
    assert solved.converged
    warm = make_problem(
        None, None, kernel.shape, 0.01, log_u0=np.zeros(kernel.shape[0]), log_v0=solved.log_v
    )
    calls = []
    for name in ("log_matvec", "log_rmatvec"):
        original = getattr(kernel.expansion, name)

        def counted(*args, _original=original, _name=name):
            calls.append(_name)
            return _original(*args)

        setattr(kernel.expansion, name, counted)
    again = iterate(kernel, warm, tol=1e-8, max_iter=50, strategy="log", check_every=1)
    assert again.converged and again.n_iter == 0
    # K v0 and K^T u1: the check reads K^T u1 (the rows are exact after the half-step)
    assert calls == ["log_matvec", "log_rmatvec"]
    assert again.history[0][0] == 0 and again.history[0][1] < 1e-8
    # the summary's marginals come from those two passes: (log K v0, log K^T u1)
    assert again.log_products is not None


# ------------------------------------------------------------------ the symmetric iteration
def symmetric_problem(reg_m=None, zero=False):
    rng = np.random.default_rng(11)
    X = rng.random((150, 2))
    a = rng.random(150) + 0.1
    if zero:
        a[:5] = 0.0
    return X, a / a.sum(), reg_m


@pytest.mark.parametrize("strategy", ["absorb", "log", "multiplicative"])
@pytest.mark.parametrize("reg_m", [None, 0.5])
@pytest.mark.parametrize("zero", [False, True])
def test_symmetric_iteration_reaches_the_two_sided_solution(strategy, reg_m, zero):
    X, a, reg_m = symmetric_problem(reg_m, zero)
    K = kernel(X, X, 0.05)
    problem = make_problem(a, a, K.shape, 0.05, reg_m)
    sym = iterate(K, problem, tol=1e-12, max_iter=2000, strategy=strategy, symmetric=True)
    two = iterate(K, problem, tol=1e-12, max_iter=5000, strategy=strategy)
    assert sym.converged and two.converged and sym.info["symmetric"]
    # one scaling for both sides; the two-sided one is (w e^c, w e^-c) for balanced transport
    # (the plan's invariant shift), w itself for unbalanced: their mean is the symmetric one.
    # Both stop at 1e-12 (relative marginal residual): potentials agree to ~1e-9
    np.testing.assert_array_equal(sym.log_u, sym.log_v)
    active = a > 0
    assert np.all(np.isneginf(sym.log_u[~active]))
    np.testing.assert_allclose(sym.log_u[active], 0.5 * (two.log_u + two.log_v)[active], atol=1e-8)


def test_symmetric_iteration_contracts_at_any_reg():
    """Its Jacobian at the solution has eigenvalues in [0, 1/2] for the (positive semi-
    definite) Gibbs kernel: the iterations to a tolerance do not grow as reg shrinks, while
    the two-sided iteration's do (plain iterations, no Anderson mixing)."""
    X, a, _ = symmetric_problem()
    counts = {}
    for reg in (0.05, 0.005):
        K = kernel(X, X, reg)
        problem = make_problem(a, a, K.shape, reg, None)
        sym = iterate(K, problem, tol=1e-10, max_iter=500, strategy="absorb", symmetric=True)
        two = iterate(K, problem, tol=1e-10, max_iter=500, strategy="absorb")
        counts[reg] = (sym.n_iter, two.n_iter)
        assert sym.converged
    # 1/2 per iteration from a start within 1 of the solution: 1e-10 in at most ~34 + a few
    assert max(sym for sym, _ in counts.values()) <= 40, counts
    assert counts[0.005][1] >= 500 > 10 * counts[0.005][0], counts


def test_symmetric_iteration_takes_one_product_per_iteration(monkeypatch):
    X, a, _ = symmetric_problem()
    K = kernel(X, X, 0.05)
    calls = []
    matvec = type(K).matvec
    monkeypatch.setattr(type(K), "matvec", lambda self, v: calls.append(1) or matvec(self, v))
    problem = make_problem(a, a, K.shape, 0.05, None)
    state = iterate(K, problem, tol=1e-10, max_iter=500, strategy="multiplicative",
                    symmetric=True)  # fmt: skip
    # the n_iter updates and the check of the returned scaling
    assert len(calls) == state.n_iter + 1


def test_warm_symmetric_start_meeting_tol_takes_no_iteration():
    X, a, _ = symmetric_problem()
    K = kernel(X, X, 0.05)
    problem = make_problem(a, a, K.shape, 0.05, None)
    solved = iterate(K, problem, tol=1e-11, max_iter=500, strategy="absorb", symmetric=True)
    warm = make_problem(a, a, K.shape, 0.05, None, log_u0=solved.log_u, log_v0=solved.log_v)
    again = iterate(K, warm, tol=1e-10, max_iter=500, strategy="absorb", symmetric=True)
    assert again.n_iter == 0 and again.converged
    # a cold start is not a solve: one iteration at least, whatever tol
    cold = iterate(K, problem, tol=10.0, max_iter=500, strategy="absorb", symmetric=True)
    assert cold.n_iter == 1


def test_solve_uses_the_symmetric_iteration_on_identical_sides(colours):
    X = colours[0]
    a = np.full(len(X), 1 / len(X))
    same = sketchot.sinkhorn(a, a, X, X.copy(), 0.1, "exact", tol=1e-10)
    assert same.iteration_info["symmetric"]
    # P = P^T: both marginals and both moments, with the value of the two-sided solve
    np.testing.assert_allclose(same.marginals[0], same.marginals[1], rtol=1e-12)
    np.testing.assert_allclose(same.moment(0), same.moment(1), rtol=1e-12)
    b = a.copy()
    b[0], b[1] = b[0] * (1 + 1e-9), b[1] - b[0] * 1e-9  # another problem by 1e-9: two-sided
    other = sketchot.sinkhorn(a, b, X, X, 0.1, "exact", tol=1e-10)
    assert "symmetric" not in other.iteration_info
    assert same.value == pytest.approx(other.value, rel=1e-7)


def test_a_symmetric_breakdown_is_solved_by_the_two_sided_iteration():
    """Random features at reg 0.05 go negative: the symmetric run has no safeguard, the
    two-sided one repairs the products."""
    rng = np.random.default_rng(0)
    X, a = rng.random((150, 2)), np.full(150, 1 / 150)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = sketchot.sinkhorn(a, a, X, X, 0.05, "rff", rng=0, rank=50, errors="warn")
    assert result.iteration_info["fallback"] == "two-sided"
    assert result.safeguard["rows_repaired"] > 0


def test_symmetric_needs_the_pot_order_and_immediate_passes():
    X, a, _ = symmetric_problem()
    K = kernel(X, X, 0.05)
    problem = make_problem(a, a, K.shape, 0.05, None)
    with pytest.raises(ValueError, match="order='pot'"):
        iterate(K, problem, tol=0, max_iter=3, order="paper", symmetric=True)


@pytest.mark.parametrize(
    ("backend", "reg", "params"), [("polyts_local", 0.05, {}), ("nystrom", 0.5, {"rank": 100})]
)
def test_symmetric_solve_on_an_approximate_kernel_mirrors_its_summary(
    colours, backend, reg, params
):
    """A log-domain (block-local) and a linear (low-rank) approximation: the symmetric
    iteration's plan is P = P^T, so the summary computes the rows' side only (the moments of
    the columns are those of the rows), and the true-kernel check still measures both."""
    X = colours[0]
    a = np.full(len(X), 1 / len(X))
    result = sketchot.sinkhorn(a, a, X, X, reg, backend, rng=0, **params)
    assert result.iteration_info["symmetric"]
    np.testing.assert_array_equal(result.plan_moments[1], result.plan_moments[0])
    assert result.accuracy_met
    reference = sketchot.sinkhorn(a, a, X, X, reg, "exact", tol=1e-12)
    # both within the default accuracy 1e-3 of the exact plan: moments to a few 1e-3
    scale = np.abs(reference.moment(0)).max()
    np.testing.assert_allclose(result.moment(0), reference.moment(0), atol=5e-3 * scale)


# ------------------------------------------------------------ the pieces: stopper, strategies
def stall_at(every: int, error: float = 0.995) -> int:
    """The iteration where a run checked every ``every`` iterations, whose error stays at
    ``error`` after a first check at 1.0, stops as stalled."""
    stopper = Stopper(tol=1e-12)
    assert stopper.check(0, 1.0) is None
    for iteration in range(every, 100_000, every):
        status = stopper.check(iteration, error)
        if status is not None:
            assert status == "stalled"
            return iteration
    raise AssertionError("no stall")


@pytest.mark.parametrize(("every", "expected"), [(1, 300), (10, 300), (20, 600)])
def test_the_stopper_stalls_after_enough_checks_and_iterations(every, expected):
    # STALL_CHECKS checks and STALL_ITERATIONS iterations without a 1% improvement, both
    assert (stopping.STALL_CHECKS, stopping.STALL_ITERATIONS) == (30, 300)
    assert stall_at(every) == expected


def test_a_one_percent_improvement_restarts_the_stall_count():
    stopper = Stopper(tol=1e-12)
    errors = [1.0] + [0.995] * 20 + [0.985] + [0.98] * 40
    statuses = [stopper.check(10 * k, e) for k, e in enumerate(errors)]
    # 0.985 < 0.99 * 1.0: the best moves to check 22 (iteration 210); 30 checks later, at
    # iteration 510, the run stalls
    assert statuses.index("stalled") == 51 and set(statuses[:51]) == {None}
    assert stopper.best == 0.985 and stopper.best_iteration == 210


def test_the_stopper_records_reports_and_converges():
    seen = []

    class Progress:
        def update(self, iteration, error, target):
            seen.append((iteration, error, target))

    stopper = Stopper(tol=1e-3, progress=Progress(), offset=7)
    assert stopper.check(0, 0.5, record=False) is None  # a cold start: not a check
    assert stopper.check(1, math.nan) == "breakdown"  # non-finite: never recorded
    assert stopper.check(2, 0.1) is None
    assert stopper.check(3, 1e-4) == "converged"
    assert stopper.history == [(9, 0.1), (10, 1e-4)] and stopper.checks == 2
    assert seen == [(9, 0.1, 1e-3), (10, 1e-4, 1e-3)]


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(-1e200, 1e200), min_size=6, max_size=6),
    norm=st.sampled_from(["l1", "l2"]),
)
def test_the_residual_norm_is_the_relative_norm_per_block(values, norm):
    """The scaled computation equals the plain norm (no overflow of the squares) and, for
    stacked problems, the largest block's norm over its own mass."""
    diff = np.array(values)
    a, b = np.array([1.0, 2.0, 3.0, 1.0, 1.0, 2.0]), np.array([2.0, 2.0, 1.0, 1.0, 3.0, 3.0])
    mass = a if norm == "l1" else b
    order = 1 if norm == "l1" else 2
    scale = max(np.abs(diff).max(), 1e-300)
    expected = scale * np.linalg.norm(diff / scale, ord=order) / mass.sum()
    assert ResidualNorm(norm, a, b)(diff) == pytest.approx(expected, rel=1e-12, abs=1e-300)
    blocks = [
        scale * np.linalg.norm(d / scale, ord=order) / w.sum()
        for d, w in zip(diff.reshape(2, 3), mass.reshape(2, 3), strict=True)
    ]
    assert ResidualNorm(norm, a, b, blocks=2)(diff) == pytest.approx(max(blocks), rel=1e-12)


@pytest.mark.parametrize("runner", ["two-sided", "symmetric"])
def test_both_drivers_stop_where_the_shared_stopper_says(monkeypatch, runner):
    """The symmetric run shares the two-sided run's stopper: replaying either history through
    a fresh :class:`Stopper` gives nothing until the last check, which stalls (a float32
    kernel at ``tol = 0`` plateaus at its rounding floor; small stall counts make it quick)."""
    monkeypatch.setattr(stopping, "STALL_CHECKS", 3)
    monkeypatch.setattr(stopping, "STALL_ITERATIONS", 6)
    X, a, _ = symmetric_problem()
    K = kernel(X, X, 0.05, dtype=np.float32)
    problem = make_problem(a, a, K.shape, 0.05, None)
    driver = TwoSidedRun if runner == "two-sided" else SymmetricRun
    state = driver(K, problem, "absorb", 0, None, None).run(0.0, 5000, 2, False)
    assert state.status == "stalled" and state.n_iter < 5000
    replay = Stopper(tol=0.0)
    statuses = [replay.check(i, e) for i, e in state.history]
    assert statuses[-1] == "stalled" and set(statuses[:-1]) == {None}


@pytest.fixture
def small():
    """A small exact problem and a positive scaling ``u`` of the rows."""
    rng = np.random.default_rng(4)
    X, Y = rng.random((30, 2)), rng.random((20, 2))
    a = rng.random(30) + 0.1
    b = rng.random(20) + 0.1
    return kernel(X, Y, 0.5), a / a.sum(), b / b.sum(), rng.random(30) + 0.5


@pytest.mark.parametrize("reg_m", [None, 1.0])
def test_each_strategy_half_step_is_the_sinkhorn_update(small, reg_m):
    """``v = b (K^T u)^-rho`` (``rho = 1``: balanced) from every form: plain scalings,
    absorbed ones (``u~ = u e^-alpha``, offsets ``beta`` added back) and logarithms. The
    passes and the dense product sum in different orders: rounding, 1e-12."""
    K, a, b, u = small
    problem = make_problem(a, b, K.shape, 0.5, reg_m)
    rho = problem.exponents[1]
    expected = np.log(b) - rho * np.log(K.to_dense().T @ u)
    plain = strategies.Multiplicative(K, problem)
    v, _, result = plain.half_step("cols", plain.project("rows", u), None)
    assert result.n_bad == 0
    np.testing.assert_allclose(np.log(v), expected, rtol=0, atol=1e-12)
    absorbed = strategies.Absorbed(K, problem)
    rng = np.random.default_rng(5)
    alpha, beta = rng.normal(size=30), rng.normal(size=20)
    absorbed.absorb(alpha, beta)
    u_tilde = u * np.exp(-alpha)
    v_tilde, _, _ = absorbed.half_step("cols", absorbed.project("rows", u_tilde), None)
    log_u, log_v = absorbed.log_scalings(u_tilde, v_tilde)
    np.testing.assert_allclose(log_u, np.log(u), rtol=0, atol=1e-12)
    np.testing.assert_allclose(log_v, expected, rtol=0, atol=1e-12)
    logs = strategies.LogDomain(K, problem)
    log_v, _, _ = logs.half_step("cols", logs.project("rows", np.log(u)), None)
    np.testing.assert_allclose(log_v, expected, rtol=0, atol=1e-12)


def test_a_vanished_product_is_zero_plain_and_infinite_absorbed():
    """Without a safeguard the multiplicative half-step keeps the pass's zero ratio; the
    absorbed one turns it into an infinite scaling (a breakdown the driver repairs by an exact
    log-domain iteration, never a zero whose log would poison the offsets)."""
    Xc, Yc, a, b, reg = outlier_problem()
    K = kernel(Xc, Yc, reg)
    problem = make_problem(a, b, K.shape, reg)
    v = np.full(len(b), 1 / len(b))
    plain = strategies.Multiplicative(K, problem)
    u, _, result = plain.half_step("rows", plain.project("cols", v), v)
    assert result.bad[0] and u[0] == 0.0 and np.all(u[1:] > 0)
    absorbed = strategies.Absorbed(K, problem)
    absorbed.absorb(np.zeros(len(a)), np.zeros(len(b)))
    u, _, _ = absorbed.half_step("rows", absorbed.project("cols", v), v)
    assert np.isposinf(u[0]) and np.all(np.isfinite(u[1:]))


def test_the_paper_driver_is_algorithm_1_from_v_one(problem):
    """``order='paper'``: ``u = a / K v`` then ``v = b / K^T u`` from ``v = 1``, a fixed
    count, no check (a tol the first check would meet does not stop it). Dense products sum
    in another order: 1e-12."""
    Xc, Yc, a, b = problem
    K = kernel(Xc, Yc, 0.1)
    dense = K.to_dense()
    v = np.ones(len(b))
    for _ in range(5):
        u = a / (dense @ v)
        v = b / (dense.T @ u)
    base = make_problem(a, b, K.shape, 0.1)
    state = iterate(K, base, tol=1.0, max_iter=5, check_every=1, order="paper")
    assert state.status == "fixed" and state.n_iter == 5 and state.history == []
    assert not state.converged and state.strategy == "multiplicative"
    np.testing.assert_allclose(state.scalings[0], u, rtol=1e-12)
    np.testing.assert_allclose(state.scalings[1], v, rtol=1e-12)
    # the driver itself, as iterate runs it: the same bits
    direct = PaperRun(K, base, "multiplicative", 0, None, None).run(0.0, 5, 1, False)
    np.testing.assert_array_equal(direct.log_u, state.log_u)
    np.testing.assert_array_equal(direct.log_v, state.log_v)
    # the log-domain form of the protocol: the same iterates to rounding
    logs = iterate(K, base, tol=1.0, max_iter=5, order="paper", strategy="log")
    assert logs.status == "fixed" and logs.log_products is None
    np.testing.assert_allclose(logs.log_u, np.log(u), rtol=0, atol=1e-11)
    np.testing.assert_allclose(logs.log_v, np.log(v), rtol=0, atol=1e-11)
