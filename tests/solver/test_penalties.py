"""Marginal penalties owned by the problem: the KL and total-variation steps, in every form.

The total-variation problem (POT's ``ot.solve(M, a, b, reg, unbalanced=reg_m,
unbalanced_type='TV')``)::

    min_P <P, M> + reg KL(P | a b^T) + reg_m (||P 1 - a||_1 + ||P^T 1 - b||_1)

POT solves it with L-BFGS-B on the primal, whose objective is not smooth: it stops short
(below, its objective at its own plan is above ours on every case). The reference here is
its dual, smooth and concave over a box::

    max_{|f| <= reg_m, |g| <= reg_m} <a, f> + <b, g> - reg <a b^T, exp((f + g - M) / reg) - 1>

solved by SciPy's L-BFGS-B to its optimality conditions (``f = clip(-reg log(K (b e^(g /
reg))), -reg_m, reg_m)`` and the same for ``g``), which every reference is checked against, so
that a reference that stopped early fails loudly instead of passing for the truth.
"""

from __future__ import annotations

import math
import warnings
from functools import cache

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import logsumexp

import sketchot
from sketchot.kernels import RatioStep
from sketchot.solver import KL, TV, Balanced

INF = math.inf
N_SOURCE, N_TARGET = 70, 60
# reg and reg_m as multiples of the mean squared distance (both are in units of the cost)
CASES = [(1.0, 0.1), (1.0, 1.0), (0.1, 0.1), (0.1, (INF, 0.3)), (0.03, 0.05)]
# The reference's optimality residual (max over the potentials, relative to reg): L-BFGS-B
# reaches 1e-10 on these sizes; a looser reference would not test the 1e-6 below.
REFERENCE_RESIDUAL = 1e-8
# The agreement with the reference (relative L1 of the plans, relative values)
# at tol=1e-12.
AGREEMENT = 1e-6


def clouds(seed: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_SOURCE, 2))
    Y = rng.normal(size=(N_TARGET, 2)) * 0.8 + 1.0
    a = rng.random(N_SOURCE) + 0.2
    b = rng.random(N_TARGET) + 0.2
    return X, Y, a / a.sum(), 1.3 * b / b.sum()


def scaled(case):
    X, Y, a, b = clouds()
    M = ot.dist(X, Y)
    unit = float(M.mean())
    reg_factor, reg_m_factor = case
    pair = reg_m_factor if isinstance(reg_m_factor, tuple) else (reg_m_factor, reg_m_factor)
    return X, Y, a, b, M, reg_factor * unit, tuple(r * unit for r in pair)


def softmin(M, log_w, potential, reg, axis):
    """``-reg log sum_j w_j exp((potential_j - M_ij) / reg)`` along ``axis``."""
    if axis == 1:
        return -reg * logsumexp(log_w[None, :] + (potential[None, :] - M) / reg, axis=1)
    return -reg * logsumexp(log_w[:, None] + (potential[:, None] - M) / reg, axis=0)


def optimality_residual(M, a, b, reg, reg_m, f, g) -> float:
    """``max |f - aprox(h_f)|, |g - aprox(h_g)|`` over ``reg``: 0 at the optimum."""
    h_f = softmin(M, np.log(b), g, reg, 1)
    h_g = softmin(M, np.log(a), f, reg, 0)
    out = 0.0
    for pot, h, r in ((f, h_f, reg_m[0]), (g, h_g, reg_m[1])):
        target = h if math.isinf(r) else np.clip(h, -r, r)
        out = max(out, float(np.max(np.abs(pot - target))) / reg)
    return out


@cache
def reference(case):
    """The dual's maximiser by L-BFGS-B (see the module notes), checked."""
    _, _, a, b, M, reg, reg_m = scaled(case)
    n, m = M.shape

    def negative_dual(z):
        f, g = z[:n], z[n:]
        E = a[:, None] * b[None, :] * np.exp((f[:, None] + g[None, :] - M) / reg)
        value = a @ f + b @ g - reg * (E.sum() - a.sum() * b.sum())
        grad = np.concatenate([a - E.sum(axis=1), b - E.sum(axis=0)])
        return -value, -grad

    bounds = [(None, None) if math.isinf(reg_m[0]) else (-reg_m[0], reg_m[0])] * n
    bounds += [(None, None) if math.isinf(reg_m[1]) else (-reg_m[1], reg_m[1])] * m
    solution = minimize(
        negative_dual, np.zeros(n + m), jac=True, method="L-BFGS-B", bounds=bounds,
        options={"maxiter": 100_000, "maxfun": 200_000, "ftol": 1e-16, "gtol": 1e-14},
    )  # fmt: skip
    f, g = solution.x[:n], solution.x[n:]
    # polish: a few exact alternate updates finish what L-BFGS-B's stopping left
    for _ in range(200):
        h = softmin(M, np.log(b), g, reg, 1)
        f = h if math.isinf(reg_m[0]) else np.clip(h, -reg_m[0], reg_m[0])
        h = softmin(M, np.log(a), f, reg, 0)
        g = h if math.isinf(reg_m[1]) else np.clip(h, -reg_m[1], reg_m[1])
    residual = optimality_residual(M, a, b, reg, reg_m, f, g)
    assert residual <= REFERENCE_RESIDUAL, f"the reference did not converge: {residual:.2e}"
    plan = a[:, None] * b[None, :] * np.exp((f[:, None] + g[None, :] - M) / reg)
    return plan, primal(plan, M, a, b, reg, reg_m)


def primal(P, M, a, b, reg, reg_m) -> float:
    """POT's objective of the TV problem at ``P`` (the module notes)."""
    c = a[:, None] * b[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.sum(np.where(P > 0, P * np.log(P / c), 0.0)) - P.sum() + c.sum()
    value = float(np.sum(P * M) + reg * kl)
    for r, marginal, w in ((reg_m[0], P.sum(1), a), (reg_m[1], P.sum(0), b)):
        if not math.isinf(r):
            value += r * float(np.abs(marginal - w).sum())
    return value


def relative_l1(x, y) -> float:
    return float(np.abs(x - y).sum() / np.abs(y).sum())


# --------------------------------------------------------------------- the steps
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    penalty=st.sampled_from(["balanced", "kl", "tv"]),
    reg=st.floats(1e-3, 10.0),
    reg_m_over_reg=st.floats(0.05, 20.0),
)
def test_a_step_is_the_same_update_in_every_form(seed, penalty, reg, reg_m_over_reg):
    """The step a pass applies, multiplicative on absorbed variables (the numerator and
    bounds shifted by the offsets), log-domain, and the penalty's ``log_scaling`` are one
    update: ``log u = log w + aprox(-reg log(K v)) / reg``. ``reg_m >= 0.05 reg``: below,
    KL's linear numerator ``w^(1/rho)`` leaves float64 (hypothesis found it at 0.004)."""
    rng = np.random.default_rng(seed)
    reg_m = reg_m_over_reg * reg
    n = 40
    log_w = rng.normal(size=n) - 3.0
    log_w[3] = -np.inf  # a zero weight stays zero
    log_product = rng.normal(size=n) * 2.0  # log(K v) of the true kernel
    offset = rng.normal(size=n) * 3.0  # absorbed log-scalings
    p = {"balanced": Balanced(), "kl": KL(reg_m), "tv": TV(reg_m)}[penalty]
    expected = p.log_scaling(log_w, log_product, reg)
    # log form, no offsets: ratios are numerator - products
    log_ratios = p.log_numerator(log_w, reg) - log_product
    log_form = p.step(log_w, 0.0, reg, log=True).apply_log(log_ratios)
    finite = np.isfinite(log_w)
    np.testing.assert_allclose(log_form[finite], expected[finite], rtol=1e-12, atol=1e-9)
    # absorbed multiplicative form: K~ v~ = e^offset K v, s~ = s e^-offset
    numerator = np.exp(p.log_numerator(log_w, reg) + p.numerator_shift(offset, reg))
    ratios = numerator / np.exp(offset + log_product)
    absorbed = p.step(log_w, offset, reg, log=False).apply(ratios)
    with np.errstate(divide="ignore"):
        got = offset + np.log(absorbed)
    # the linear form holds where its numbers are normal floats (KL's w^(1/rho) leaves
    # float64 for rho << 1: the log form, checked above on every entry, covers that range)
    tiny = np.finfo(np.float64).tiny
    linear = finite & (numerator > tiny) & np.isfinite(ratios) & (ratios > tiny)
    linear &= np.isfinite(absorbed) & (absorbed > tiny)
    np.testing.assert_allclose(got[linear], expected[linear], rtol=1e-10, atol=1e-8)
    assert absorbed[3] == 0.0 and expected[3] == -np.inf


def test_a_bounded_step_keeps_bad_entries_at_zero():
    """A clip must not lift the zero ratio of a bad product (or a zero weight) to its lower
    bound: the kernel contract's bad entries stay 0."""
    from sketchot.kernels import ratios_and_bad

    numerator = np.array([1.0, 1.0, 0.0, 1.0])
    products = np.array([2.0, -1.0, 1.0, np.inf])
    step = RatioStep(1.0, np.full(4, 0.6), np.full(4, 3.0))
    ratios, bad = ratios_and_bad(numerator, products, step)
    np.testing.assert_array_equal(bad, [False, True, False, True])
    np.testing.assert_array_equal(ratios, [0.6, 0.0, 0.0, 0.0])


# ------------------------------------------------------------- against the reference
@pytest.mark.parametrize("log_domain", ["auto", True, False])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_tv_matches_the_dual_reference(case, log_domain):
    """The exact kernel's TV solve equals the dual's maximiser (module notes) to 1e-6, in
    every form of the iteration (absorbed, log-domain, multiplicative)."""
    X, Y, a, b, M, reg, reg_m = scaled(case)
    plan, value = reference(case)
    res = sketchot.sinkhorn(
        a, b, X, Y, reg=reg, reg_m=reg_m, unbalanced_type="TV", backend="exact", tol=1e-12,
        max_iter=200_000, log_domain=log_domain,
    )  # fmt: skip
    assert res.converged
    assert relative_l1(res.plan, plan) <= AGREEMENT
    assert res.value == pytest.approx(value, rel=AGREEMENT)
    # the returned value is the objective at the returned plan
    assert res.value == pytest.approx(primal(res.plan, M, a, b, reg, reg_m), rel=1e-9)
    # the true-kernel check measures the TV fixed point: 0 up to the tolerance
    assert res.true_kernel.bound <= 1e-9


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tv_is_never_worse_than_pot_in_pots_own_objective(case):
    """POT's ``ot.solve(..., unbalanced_type='TV')`` (L-BFGS-B on the primal): our plan's
    objective, computed by POT's formula, is at most POT's at its own plan (POT stops short
    on the non-smooth primal)."""
    _, _, a, b, M, reg, reg_m = scaled(case)
    ours = sketchot.solve(M, a, b, reg=reg, unbalanced=reg_m, unbalanced_type="TV", tol=1e-12)
    pot = ot.solve(M, a, b, reg=reg, unbalanced=reg_m, unbalanced_type="TV")
    assert ours.value == pytest.approx(primal(ours.plan, M, a, b, reg, reg_m), rel=1e-9)
    assert ours.value <= primal(pot.plan, M, a, b, reg, reg_m) + 1e-12


def test_semi_relaxed_tv_keeps_the_hard_marginal():
    X, Y, a, b, _, reg, _ = scaled((0.1, 1.0))
    res = sketchot.sinkhorn(
        a, b * (a.sum() / b.sum()) * 1.5, X, Y, reg=reg, reg_m=(INF, 0.3 * reg),
        unbalanced_type="tv", backend="exact", tol=1e-12,
    )  # fmt: skip
    np.testing.assert_allclose(res.marginals[0], a, rtol=1e-9)
    f = res.reg * (np.asarray(res.potentials[1]) - np.log(res.b))
    assert np.all(np.abs(f) <= 0.3 * reg * (1 + 1e-9))  # the relaxed side's box


def test_large_tv_penalty_is_the_balanced_problem():
    """Once ``reg_m`` exceeds the spread of the balanced potentials the box never binds: the
    balanced plan (equal masses)."""
    X, Y, a, _, M, reg, _ = scaled((0.1, 1.0))
    b = np.full(N_TARGET, a.sum() / N_TARGET)
    balanced = sketchot.sinkhorn(a, b, X, Y, reg=reg, backend="exact", tol=1e-12)
    tv = sketchot.sinkhorn(
        a, b, X, Y, reg=reg, reg_m=100 * M.max(), unbalanced_type="TV", backend="exact",
        tol=1e-12,
    )  # fmt: skip
    assert relative_l1(tv.plan, balanced.plan) <= 1e-8


# ----------------------------------------------------------------- every backend
@pytest.mark.parametrize("backend", sketchot.available_backends())
def test_tv_on_every_backend_keeps_its_accuracy_contract(backend):
    """At reg = 1 x the mean squared distance (where the low-rank kernels can be accurate):
    a TV solve that meets its accuracy is within a few times its certified bound of the
    reference; one that does not says so. The step is the penalty's on every kernel."""
    case = (1.0, 0.3)
    X, Y, a, b, M, reg, reg_m = scaled(case)
    info = sketchot.get_backend(backend)
    if info.support == "grids":
        pytest.skip(f"{backend!r} takes grids (test_tv_on_a_grid below)")
    if "precomputed" in info.metrics:
        pytest.skip(f"{backend!r} is a kernel on M (test_tv_with_a_cost_matrix... below)")
    plan, _ = reference(case)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sketchot.sinkhorn(
            a, b, X, Y, reg=reg, reg_m=reg_m, unbalanced_type="TV", backend=backend, rng=0,
            errors="warn",
        )  # fmt: skip
    if not res.accuracy_met:
        assert any(issubclass(w.category, sketchot.AccuracyWarning) for w in caught)
        return
    bound = max(res.true_kernel.bound, 1e-9)
    log_u, log_v = (np.asarray(x) for x in res.potentials)
    certified = np.exp(log_u[:, None] - M / reg + log_v[None, :])  # with the true kernel
    # 5 x the bound: the factor test_unbalanced.py measured for the KL penalty
    assert relative_l1(certified, plan) <= 5.0 * bound


def test_tv_with_a_cost_matrix_and_a_low_rank_kernel():
    """``sketchot.solve(M, ...)`` with the low-rank kernel on ``M`` (``'cur'``)."""
    case = (1.0, 0.3)
    _, _, a, b, M, reg, reg_m = scaled(case)
    plan, _ = reference(case)
    res = sketchot.solve(
        M, a, b, reg=reg, unbalanced=reg_m, unbalanced_type="TV", backend="cur", rng=0
    )
    assert res.accuracy_met
    assert relative_l1(res.plan, plan) <= 5.0 * max(res.true_kernel.bound, 1e-9)


def test_tv_on_a_grid():
    """The grid backend's separable passes take the TV step too: a 2-D grid histogram
    against the exact kernel on the same points."""
    side = np.linspace(0.0, 1.0, 12)
    points = np.stack(np.meshgrid(side, side, indexing="ij"), axis=-1).reshape(-1, 2)
    rng = np.random.default_rng(5)
    a, b = rng.random(len(points)) + 0.1, rng.random(len(points)) + 0.1
    a, b = a / a.sum(), 1.4 * b / b.sum()
    solves = {}
    for backend in ("grid", "exact"):
        solves[backend] = sketchot.sinkhorn(
            a, b, points, points, reg=0.01, reg_m=0.02, unbalanced_type="TV",
            backend=backend, tol=1e-11,
        )  # fmt: skip
    assert solves["grid"].accuracy_met
    assert relative_l1(solves["grid"].plan, solves["exact"].plan) <= 1e-8
    assert solves["grid"].value == pytest.approx(solves["exact"].value, rel=1e-9)


# -------------------------------------------------------------------- gradients
def test_tv_gradients_are_those_of_the_value():
    """Finite differences of ``value`` against the autograd gradients (envelope theorem
    for the points, the dual's Danskin formula for the weights), relaxed and semi-relaxed."""
    torch = pytest.importorskip("torch")
    X, Y, a, b, _, _, _ = scaled((0.1, 1.0))
    X, Y, a, b = X[:25], Y[:20], a[:25] / a[:25].sum(), b[:20] / b[:20].sum() * 1.2
    reg = 0.05

    def value(X, a, b, reg_m):
        return sketchot.sinkhorn(
            a, b, X, Y, reg=reg, reg_m=reg_m, unbalanced_type="TV", backend="exact",
            tol=1e-13, max_iter=100_000,
        ).value  # fmt: skip

    h = 1e-6  # central differences: truncation ~h^2, rounding ~1e-16 / h
    for reg_m in [(0.05, 0.05), (INF, 0.05)]:
        tX, ta, tb = (torch.tensor(v, requires_grad=True) for v in (X, a, b))
        value(tX, ta, tb, reg_m).backward()
        for name, array, grad in (("X", X, tX.grad), ("a", a, ta.grad), ("b", b, tb.grad)):
            index = (3, 1) if array.ndim == 2 else (3,)
            up, down = array.copy(), array.copy()
            up[index] += h
            down[index] -= h
            args = {"X": X, "a": a, "b": b}
            fd = (value(**{**args, name: up}, reg_m=reg_m)
                  - value(**{**args, name: down}, reg_m=reg_m)) / (2 * h)  # fmt: skip
            assert float(grad[index]) == pytest.approx(fd, rel=1e-5, abs=1e-8), (reg_m, name)


# --------------------------------------------------------------------- refusals
@pytest.mark.parametrize("kind", ["L2", "cryptic divergence"])
def test_unknown_unbalanced_type_is_refused_by_name(kind):
    X, Y, a, b, _, reg, _ = scaled((1.0, 1.0))
    with pytest.raises(ValueError, match="unbalanced_type") as error:
        sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=1.0, unbalanced_type=kind)
    assert isinstance(error.value, NotImplementedError)  # POT's error type too
    with pytest.raises(TypeError, match="unbalanced_type"):
        sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=1.0, unbalanced_type=1)


def test_tv_with_several_targets_is_refused_by_name():
    X, Y, a, b, M, reg, _ = scaled((1.0, 1.0))
    B = np.column_stack([b, b])
    with pytest.raises(NotImplementedError, match=r"unbalanced_type='TV'.*several targets"):
        sketchot.sinkhorn(a, B, X, Y, reg=reg, reg_m=1.0, unbalanced_type="TV")
    with pytest.raises(NotImplementedError, match=r"unbalanced_type='TV'.*several targets"):
        sketchot.solve(M, a, B, reg=reg, unbalanced=1.0, unbalanced_type="TV")


def test_tv_on_dask_arrays_is_refused_by_name():
    """Refused before anything is computed (no cluster needed): the Dask passes ship only
    a power of the ratios to the workers."""
    da = pytest.importorskip("dask.array")
    X, Y, a, b, _, reg, _ = scaled((1.0, 1.0))
    with pytest.raises(NotImplementedError, match=r"unbalanced_type='TV'.*Dask arrays"):
        sketchot.sinkhorn(
            a, b, da.from_array(X, chunks=35), Y, reg=reg, reg_m=1.0, unbalanced_type="TV"
        )


def test_tv_on_read_only_views_twice_gives_the_same_bits():
    """A read-only, non-contiguous view of the points (every other column of a wider
    array), a randomised backend, the same call twice with the same rng: the same bits, and
    the inputs untouched."""
    X, Y, a, b, _, reg, _ = scaled((1.0, 0.3))
    wide = np.repeat(X, 2, axis=1)
    view = wide[:, ::2]
    view.flags.writeable = False
    before = view.copy()
    calls = [
        sketchot.sinkhorn(
            a,
            b,
            view,
            Y,
            reg=reg,
            reg_m=0.3 * reg,
            unbalanced_type="TV",
            backend="polyts",
            rng=7,
        )
        for _ in range(2)
    ]
    np.testing.assert_array_equal(calls[0].potentials[0], calls[1].potentials[0])
    np.testing.assert_array_equal(calls[0].potentials[1], calls[1].potentials[1])
    assert calls[0].value == calls[1].value
    np.testing.assert_array_equal(view, before)
    assert calls[0].accuracy_met


def test_kl_is_the_default_and_unchanged():
    """``unbalanced_type='KL'`` (the default) is the same solve, bit for bit."""
    X, Y, a, b, _, reg, _ = scaled((1.0, 1.0))
    one = sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=0.5, backend="exact")
    two = sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=0.5, backend="exact", unbalanced_type="kl")
    np.testing.assert_array_equal(one.potentials[0], two.potentials[0])
    assert one.value == two.value
