"""The absorbed strategy's threshold (sketchot.solver.strategies.absorb_threshold)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sketchot.kernels.base import LOG_FLOOR
from sketchot.kernels.stacked import StackedExactKernel, stacked_log_kernel
from sketchot.solver.engine import iterate
from sketchot.solver.problem import make_problem
from sketchot.solver.strategies import (
    ABSORB_THRESHOLD,
    ABSORB_THRESHOLD_MAX,
    Absorbed,
    absorb_threshold,
)

DTYPES = [np.dtype(np.float32), np.dtype(np.float64)]


def floor_effect(dtype, rows, cols, weight, tau):
    """The relative change of a row or column sum that entries clamped at the floor can make
    while the scalings stay within ``e^tau`` (AbsorbedExactKernel's bound)."""
    return max(rows, cols) * math.exp(LOG_FLOOR[dtype] + 2 * tau) / weight


@pytest.mark.parametrize("dtype", DTYPES)
@given(
    rows=st.integers(1, 10**8),
    cols=st.integers(1, 10**8),
    log_weight=st.floats(-60.0, 0.0),
)
def test_threshold_keeps_the_floor_below_rounding_or_is_the_base(dtype, rows, cols, log_weight):
    weight = math.exp(log_weight)
    tau = absorb_threshold(dtype, rows, cols, weight)
    assert ABSORB_THRESHOLD[dtype] <= tau <= ABSORB_THRESHOLD_MAX[dtype]
    if tau > ABSORB_THRESHOLD[dtype]:  # raised: only as far as the bound allows
        assert floor_effect(dtype, rows, cols, weight, tau) <= np.finfo(dtype).eps * (1 + 1e-9)
    # larger blocks or smaller weights never raise it
    assert absorb_threshold(dtype, 2 * rows, cols, weight) <= tau
    assert absorb_threshold(dtype, rows, cols, weight / 2) <= tau


def test_threshold_values():
    # float32, 200 x 200 points of uniform weights (the batch benchmark): 29.7; at 10^6
    # points per side the bound is 21.2; float64 stays at its 100
    assert absorb_threshold(np.float32, 200, 200, 1 / 200) == pytest.approx(29.73, abs=0.01)
    assert absorb_threshold(np.float32, 10**6, 10**6, 1e-6) == pytest.approx(21.21, abs=0.01)
    assert absorb_threshold(np.float64, 200, 200, 1 / 200) == 100.0
    # no positive weight, or a precision without a floor: the base
    assert absorb_threshold(np.float32, 200, 200, 0.0) == ABSORB_THRESHOLD[np.dtype(np.float32)]
    assert absorb_threshold(np.float16, 200, 200, 1 / 200) == 20.0


def test_the_strategy_reads_the_blocks_and_weights():
    """A stacked kernel's threshold is that of one pair's block, with the smallest positive
    weight of either side (zero weights ignored). Sizes where the bound is below the cap, so
    that the whole stack's shape, or a zero weight, would give another threshold."""
    rng = np.random.default_rng(0)
    B, n, m = 3, 300, 500
    X, Y = rng.random((B, n, 2)), rng.random((B, m, 2))
    kernel = StackedExactKernel(stacked_log_kernel(X, Y, 0.1), 0.1, dtype=np.float32)
    a = np.full(B * n, 1 / n)
    b = rng.random(B * m) + 0.5
    b[::7] = 0.0
    b /= b.reshape(B, m).sum(axis=1).repeat(m)  # each pair's mass 1
    strategy = Absorbed(kernel, make_problem(a, b, kernel.shape, 0.1))
    expected = absorb_threshold(np.float32, n, m, float(b[b > 0].min()))
    assert ABSORB_THRESHOLD[np.dtype(np.float32)] < expected < 30.0  # neither limit
    assert strategy.tau == expected
    assert strategy.tau != absorb_threshold(np.float32, B * n, B * m, float(b[b > 0].min()))


def test_a_float32_batch_converges_as_before_with_fewer_absorptions(monkeypatch):
    """The raised threshold changes when the kernel is re-absorbed, not the fixed point: the
    same stack of pairs run with the base threshold (the old behaviour) and with the raised
    one stops within the float32 passes' tolerance of each other, with fewer absorptions."""
    rng = np.random.default_rng(1)
    B, n = 6, 60
    X = rng.random((B, n, 2))
    Y = 0.3 + 0.2 * rng.normal(size=(B, n, 2))
    reg = 0.004
    log_kernel = stacked_log_kernel(X, Y, reg)
    a = np.full(B * n, 1 / n)
    runs = {}
    for name, cap in (("base", ABSORB_THRESHOLD[np.dtype(np.float32)]), ("raised", None)):
        if cap is not None:
            monkeypatch.setitem(ABSORB_THRESHOLD_MAX, np.dtype(np.float32), cap)
        else:
            monkeypatch.undo()
        kernel = StackedExactKernel(log_kernel, reg, dtype=np.float32)
        problem = make_problem(a, a.copy(), kernel.shape, reg)
        runs[name] = iterate(
            kernel, problem, tol=1e-5, max_iter=2000, strategy="absorb", anderson=5
        )
    base, raised = runs["base"], runs["raised"]
    assert base.converged and raised.converged
    assert raised.info["absorptions"] < base.info["absorptions"]
    # both fixed points of the same map to its float32 tolerance (potentials in reg units)
    for ours, theirs in zip((raised.log_u, raised.log_v), (base.log_u, base.log_v), strict=True):
        diff = (ours - theirs).reshape(B, n)
        diff -= diff.mean(axis=1, keepdims=True)  # each pair's potentials up to a constant
        # float32 entries and a stop at tol 1e-5: 2.2e-4 measured
        assert np.abs(diff).max() < 1e-2
