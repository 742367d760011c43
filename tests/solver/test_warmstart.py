"""Warm starts (``warmstart=(log u, log v)``, POT's name; ``potentials_init`` in
``solve_sample``): a start at the solution stops at the first check with the same answer, a
nearby start saves iterations, and bad starts are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import sketchot


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(7)
    return rng.random((150, 2)), rng.random((120, 2)) + 0.3


@pytest.mark.parametrize("reg_m", [None, 0.5])
def test_a_start_at_the_solution_stops_at_the_first_check(clouds, reg_m):
    X, Y = clouds
    cold = sketchot.sinkhorn(None, None, X, Y, 0.05, "exact", reg_m=reg_m)
    warm = sketchot.sinkhorn(
        None, None, X, Y, 0.05, "exact", reg_m=reg_m, warmstart=cold.potentials
    )
    assert cold.n_iter > 10
    assert warm.n_iter <= 10  # the first check (check_every=10) already meets the target
    # both are stopped at 0.1 x accuracy of the marginals: the values agree to that order
    assert warm.value == pytest.approx(cold.value, rel=1e-4)
    assert warm.accuracy_met


def test_a_nearby_start_saves_iterations(clouds):
    """The loop a gradient flow or a barycenter runs: the next problem's clouds moved a
    little; the previous potentials are a better start than zeros."""
    X, Y = clouds
    first = sketchot.sinkhorn(None, None, X, Y, 0.02, "exact", tol=1e-9)
    moved = Y + 0.01
    cold = sketchot.sinkhorn(None, None, X, moved, 0.02, "exact", tol=1e-9)
    warm = sketchot.sinkhorn(
        None, None, X, moved, 0.02, "exact", tol=1e-9, warmstart=first.potentials
    )
    assert warm.n_iter < cold.n_iter
    assert warm.value == pytest.approx(cold.value, rel=1e-7)  # both to tol=1e-9


def test_solve_sample_and_sinkhorn_kernel_take_it(clouds):
    X, Y = clouds
    cold = sketchot.solve_sample(X, Y, reg=0.05, backend="exact")
    warm = sketchot.solve_sample(X, Y, reg=0.05, backend="exact", potentials_init=cold.potentials)
    assert warm.n_iter <= 10
    kernel = sketchot.make_kernel(X, Y, 0.05, "exact")
    again = sketchot.sinkhorn_kernel(None, None, kernel, warmstart=cold.potentials)
    assert again.n_iter <= 10


@pytest.mark.parametrize(
    ("warmstart", "error", "match"),
    [
        (np.zeros(150), TypeError, "warmstart must be None or a pair"),
        (
            (np.zeros(150), np.zeros(5)),
            ValueError,
            r"warmstart\[1\] \(log v\) must have shape \(120,\)",
        ),
        (
            (np.full(150, np.nan), np.zeros(120)),
            ValueError,
            r"warmstart\[0\] \(log u\) must be finite",
        ),
    ],
)
def test_bad_starts_are_refused_by_name(clouds, warmstart, error, match):
    X, Y = clouds
    with pytest.raises(error, match=match):
        sketchot.sinkhorn(None, None, X, Y, 0.05, "exact", warmstart=warmstart)
