"""The coarse stages of sketchot.sinkhorn_batch (issue 47: batches at small reg)."""

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.solver import batch as batch_module
from sketchot.solver.batch import COARSE_ITER, COARSE_MIN_SPREAD, COARSE_STEP, coarse_factors


def clouds(seed, B=6, n=30, m=35, d=2):
    rng = np.random.default_rng(seed)
    X = rng.random((B, n, d))
    Y = rng.random((B, m, d)) * rng.uniform(0.8, 1.2, size=(B, 1, 1)) + 0.2
    return X, Y


def spreads(X, Y, reg):
    return np.array([ot.dist(x, y).max() / reg for x, y in zip(X, Y, strict=True)])


@given(st.floats(min_value=1.0, max_value=1e7))
@settings(max_examples=200, deadline=None)
def test_coarse_factors_are_the_stages_above_the_minimum_spread(spread):
    factors = coarse_factors(spread)
    # powers of the step, largest first, down to COARSE_STEP itself
    expected = [COARSE_STEP**k for k in range(len(factors), 0, -1)]
    assert factors == pytest.approx(expected)
    # every stage's own spread at least the minimum, one more stage's below it
    assert all(spread / f >= COARSE_MIN_SPREAD for f in factors)
    assert spread / (COARSE_STEP ** (len(factors) + 1)) < COARSE_MIN_SPREAD


def test_no_coarse_stage_at_large_reg(monkeypatch):
    """Below COARSE_STEP x COARSE_MIN_SPREAD (reg large next to the costs) the solve is the
    cold one: the same bits as with the stages switched off."""
    X, Y = clouds(1)
    reg = 0.05
    assert spreads(X, Y, reg).max() < COARSE_STEP * COARSE_MIN_SPREAD
    res = sketchot.sinkhorn_batch(X, Y, reg=reg)
    monkeypatch.setattr(batch_module, "COARSE_MIN_SPREAD", np.inf)
    cold = sketchot.sinkhorn_batch(X, Y, reg=reg)
    np.testing.assert_array_equal(res.potentials[0], cold.potentials[0])
    np.testing.assert_array_equal(res.n_iter, cold.n_iter)


@pytest.mark.parametrize("tol", [None, 1e-9])
def test_small_reg_pairs_are_certified_by_their_exact_plans(tol):
    """At reg = 5e-4 x the largest cost (one or two coarse stages a pair, in one stack), every
    pair converges, and its
    reported marginals, value and error are those of its plan rebuilt here in float64 from
    the potentials and the true kernel (rtol 1e-12: float64 sums in another order). Same
    bits on a second call."""
    X, Y = clouds(2)
    reg = 5e-4 * max(ot.dist(x, y).max() for x, y in zip(X, Y, strict=True))
    assert {len(coarse_factors(s)) for s in spreads(X, Y, reg)} == {1, 2}
    options = {} if tol is None else {"tol": tol}
    res = sketchot.sinkhorn_batch(X, Y, reg=reg, **options)
    assert res.converged.all()
    for k in range(len(X)):
        C = ot.dist(X[k], Y[k])
        P = np.exp(res.potentials[0][k][:, None] + res.potentials[1][k][None, :] - C / reg)
        np.testing.assert_allclose(res.marginals[0][k], P.sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(res.marginals[1][k], P.sum(axis=0), rtol=1e-12)
        assert res.value_linear[k] == pytest.approx(float((P * C).sum()), rel=1e-12)
        if res.norm == "l1":
            error = np.abs(P.sum(axis=0) - res.b[k]).sum() / res.a[k].sum()
        else:
            error = np.linalg.norm(P.sum(axis=0) - res.b[k]) / res.b[k].sum()
        # abs 1e-12: exponents of size 1e3 round to 1e-13 relative per entry of the plan
        assert res.errors[k] == pytest.approx(error, rel=1e-6, abs=1e-12) and error <= res.tol
    again = sketchot.sinkhorn_batch(X, Y, reg=reg, **options)
    np.testing.assert_array_equal(res.potentials[0], again.potentials[0])
    np.testing.assert_array_equal(res.value, again.value)


def test_small_reg_agrees_with_the_cold_solve(monkeypatch):
    """The coarse start changes the iterations, not the answer: values within 1e-6
    relative of the cold solve at tol 1e-9 (both plans within 1e-9 of their marginals)."""
    X, Y = clouds(3)
    reg = 2e-3 * max(ot.dist(x, y).max() for x, y in zip(X, Y, strict=True))
    res = sketchot.sinkhorn_batch(X, Y, reg=reg, tol=1e-9, max_iter=5000)
    monkeypatch.setattr(batch_module, "COARSE_MIN_SPREAD", np.inf)
    cold = sketchot.sinkhorn_batch(X, Y, reg=reg, tol=1e-9, max_iter=5000)
    assert res.converged.all() and cold.converged.all()
    np.testing.assert_allclose(res.value, cold.value, rtol=1e-6)


def test_with_coarse_stages_each_pair_runs_its_own_iterates():
    """A pair's stages depend on its own spread and run a fixed count: its iterates are the
    same in a stack as alone (tol 1e-15: every pair runs max_iter iterations)."""
    X, Y = clouds(4, B=4)
    reg = 1e-3 * max(ot.dist(x, y).max() for x, y in zip(X, Y, strict=True))
    plans = {len(coarse_factors(s)) for s in spreads(X, Y, reg)}
    assert plans == {1}  # the same number of stages, so the same max_iter for each
    options = dict(reg=reg, max_iter=2 * COARSE_ITER + 10, tol=1e-15, round_iter=100)
    together = sketchot.sinkhorn_batch(X, Y, **options)
    for k in range(4):
        alone = sketchot.sinkhorn_batch(X[k : k + 1], Y[k : k + 1], **options)
        assert together.n_iter[k] == alone.n_iter[0] == options["max_iter"]
        assert together.value[k] == pytest.approx(alone.value[0], rel=1e-10)


def test_the_coarse_stages_fit_half_of_max_iter(monkeypatch):
    """With max_iter below 2 COARSE_ITER no stage runs: the cold solve, bit for bit."""
    X, Y = clouds(5)
    reg = 1e-3 * max(ot.dist(x, y).max() for x, y in zip(X, Y, strict=True))
    options = dict(reg=reg, max_iter=2 * COARSE_ITER - 1)
    res = sketchot.sinkhorn_batch(X, Y, **options)
    monkeypatch.setattr(batch_module, "COARSE_MIN_SPREAD", np.inf)
    cold = sketchot.sinkhorn_batch(X, Y, **options)
    np.testing.assert_array_equal(res.potentials[1], cold.potentials[1])
    np.testing.assert_array_equal(res.n_iter, cold.n_iter)
