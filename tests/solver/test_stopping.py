"""The default stopping rule: the iteration stops at the accuracy asked for."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.distributed.kernels import _norm_of_chunks, _scaled_norm_parts
from sketchot.solver.options import POT_TOL, STOP_FRACTION, SolverOptions


def mean_squared_distance(X, Y):
    return float(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1).mean())


def test_default_stops_once_the_accuracy_is_met_and_before_pot_tol(colours):
    X, Y = colours
    reg = 0.1 * mean_squared_distance(X, Y)
    default = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact")
    pot = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact", tol=1e-9)
    assert default.converged and pot.converged
    assert default.iteration_info["norm"] == "l1" and pot.iteration_info["norm"] == "l2"
    assert default.tol == STOP_FRACTION * default.options["accuracy"]
    check = default.true_kernel
    assert check.exhaustive and check.bound <= default.options["accuracy"]
    assert default.n_iter < pot.n_iter
    # the exact kernel's row marginal is exact after the u half-step, so the L1 residual the
    # iteration stopped on is the checked column error (up to float64 rounding of the sums)
    assert check.relative_a < 1e-12
    assert check.relative_b == pytest.approx(default.error_history[-1][1], rel=1e-6)


@settings(max_examples=12, deadline=None)
@given(accuracy=st.floats(1e-6, 1e-2), seed=st.integers(0, 2**16))
def test_default_stop_meets_the_accuracy_with_the_exact_kernel(accuracy, seed):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((40, 3)), rng.beta(2.0, 5.0, size=(30, 3))
    result = sketchot.sinkhorn(None, None, X, Y, 0.05, backend="exact", accuracy=accuracy)
    assert result.converged
    assert result.true_kernel.exhaustive and result.true_kernel.bound <= accuracy


def test_stopping_rule_of_the_options():
    assert SolverOptions().stopping() == (STOP_FRACTION * SolverOptions().accuracy, "l1")
    assert SolverOptions(accuracy=None).stopping() == (POT_TOL, "l2")
    assert SolverOptions(tol=1e-7).stopping() == (1e-7, "l2")
    assert SolverOptions(tol=1e-7, accuracy=None).stopping() == (1e-7, "l2")


def test_float32_floor_in_both_norms():
    with pytest.warns(UserWarning, match="float32"):
        assert SolverOptions(accuracy=1e-6).stopping(True) == (1e-6, "l1")
    with pytest.warns(UserWarning, match="float32"):
        assert SolverOptions(tol=1e-9).stopping(True, lambda: 0.1) == (pytest.approx(1e-7), "l2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SolverOptions().stopping(True) == (1e-4, "l1")


@pytest.mark.parametrize("norm, order", [("l1", 1), ("l2", 2)])
def test_deferred_norm_of_chunks(norm, order):
    values = np.random.default_rng(0).normal(size=30) * 1e200
    parts = [_scaled_norm_parts(chunk, norm) for chunk in np.split(values, [7, 19])]
    expected = 1e200 * np.linalg.norm(values / 1e200, ord=order)
    assert _norm_of_chunks(*parts, norm=norm) == pytest.approx(expected, rel=1e-12)
