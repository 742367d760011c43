"""The default stopping rule: the iteration stops at the accuracy asked for."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.solver import options as solver_options
from sketchot.solver.options import (
    CERTIFY_FRACTION,
    KERNEL_SHARE,
    POT_TOL,
    STOP_FRACTION,
    SolverOptions,
)


def mean_squared_distance(X, Y):
    return float(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1).mean())


def test_default_stops_once_the_accuracy_is_met_and_before_pot_tol(colours):
    X, Y = colours
    reg = 0.1 * mean_squared_distance(X, Y)
    default = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact")
    pot = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact", tol=1e-9)
    assert default.converged and pot.converged
    assert default.iteration_info["norm"] == "l1" and pot.iteration_info["norm"] == "l2"
    # the exact kernel bounds its error (0): the first, certified stop
    assert default.tol == CERTIFY_FRACTION * default.options["accuracy"]
    assert "resumed_at" not in default.iteration_info
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


def test_first_target_needs_a_kernel_that_bounds_its_error():
    options = SolverOptions(accuracy=1e-3)
    tol, norm = options.stopping()
    assert options.first_target(tol, norm, 0.0) == CERTIFY_FRACTION * 1e-3
    assert options.first_target(tol, norm, KERNEL_SHARE * 1e-3) == CERTIFY_FRACTION * 1e-3
    assert options.first_target(tol, norm, 2 * KERNEL_SHARE * 1e-3) == tol
    assert options.first_target(tol, norm, None) == tol  # low rank: unbounded error
    # a caller's tol (POT's criterion) is never relaxed
    explicit = SolverOptions(tol=1e-7, accuracy=1e-3)
    assert explicit.first_target(*explicit.stopping(), 0.0) == 1e-7
    # a float32 floor above the first target wins
    assert options.first_target(0.9e-3, norm, 0.0) == 0.9e-3


def test_product_rtol_of_the_kernels(colours):
    X, Y = colours
    exact = sketchot.make_kernel(X, Y, 0.05, "exact")
    assert exact.info.product_rtol == 0.0
    assert sketchot.make_kernel(X, Y, 0.05, "exact", dtype=np.float32).info.product_rtol < 1e-5
    assert sketchot.make_kernel(X, Y, 0.05, "nystrom", rng=0).info.product_rtol is None
    local = sketchot.make_kernel(X, Y, 0.05, "polyts_local", rng=0)
    params = local.info.params
    assert local.info.product_rtol == params["entry_error_bound"] + params["truncate"]


def test_a_missed_first_check_goes_on_to_the_full_fraction(colours, monkeypatch):
    """A first stop the check cannot certify (here forced: a first target above the
    accuracy) resumes from its potentials to STOP_FRACTION x accuracy."""
    X, Y = colours
    reg = 0.1 * mean_squared_distance(X, Y)
    monkeypatch.setattr(solver_options, "CERTIFY_FRACTION", 5.0)
    result = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact", accuracy=1e-3, check_every=1)
    first = result.iteration_info["resumed_at"]
    assert 0 < first < result.n_iter
    assert result.tol == STOP_FRACTION * 1e-3 and result.converged
    assert result.true_kernel.bound <= result.tol
    assert any("went on to" in note for note in result.notes)
    # one history over both runs: iterations numbered on, the first run's last check above
    # the accuracy, the resumed run's below tol
    iterations = [i for i, _ in result.error_history]
    assert iterations == sorted(iterations) and iterations[-1] == result.n_iter
    at_stop = dict(result.error_history)[first]
    assert 1e-3 < at_stop <= 5e-3 and result.error_history[-1][1] <= result.tol


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
    pytest.importorskip("dask")  # sketchot.distributed imports Dask (the dask extra)
    from sketchot.distributed.kernels import _norm_of_chunks, _scaled_norm_parts

    values = np.random.default_rng(0).normal(size=30) * 1e200
    parts = [_scaled_norm_parts(chunk, norm) for chunk in np.split(values, [7, 19])]
    expected = 1e200 * np.linalg.norm(values / 1e200, ord=order)
    assert _norm_of_chunks(*parts, norm=norm) == pytest.approx(expected, rel=1e-12)
