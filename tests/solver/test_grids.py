"""Small reg on grids and histograms: the Sinkhorn-Newton stage (``sketchot.solver.newton``).

Below a grid's squared spacing the first-order iteration stalls (POT's 1-D histograms on
``dist0(100)`` at reg 0.1 reached max_iter, at 1e-2 and 1e-3 gave an impossible value);
the Newton stage finishes them. Tolerances:

* the default accuracy contract: relative L1 marginal error 1e-3, certified by the
  true-kernel check (exhaustive on these small grids);
* the value's bracket: a plan missing the marginals by ``e`` (relative L1, both sides) can
  cost at most ``e * max cost`` less than the exact optimum ``ot.emd2`` (it is a coupling
  of marginals ``e`` away), and the entropic optimum costs at most ``reg * log(n m)`` more
  (``<P, M> - reg H(P)`` is at most the optimum's, and ``0 <= H(P) <= log(n m)``).
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
from sketchot.solver import newton
from sketchot.solver.problem import make_problem

ACCURACY = 1e-3  # the default accuracy (sketchot._defaults.DEFAULT_ACCURACY)


def grid(n: int) -> np.ndarray:
    """Points 0, 1, ..., n - 1: the squared Euclidean cost is POT's ``ot.utils.dist0(n)``."""
    return np.arange(n, dtype=float)[:, None]


#: POT's 1-D histograms (test_bregman.py: means and widths of make_1D_gauss on n = 100).
POT_PAIRS = {
    "20/5 to 60/10": ((20, 5), (60, 10)),
    "30/10 to 40/10": ((30, 10), (40, 10)),  # test_sinkhorn_stabilization's
}


def pot_pair(name: str, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    (m1, s1), (m2, s2) = POT_PAIRS[name]
    scale = n / 100
    a = ot.datasets.make_1D_gauss(n, m=m1 * scale, s=s1 * scale)
    b = ot.datasets.make_1D_gauss(n, m=m2 * scale, s=s2 * scale)
    return a, b


def solve(a, b, X, Y, reg, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sketchot.sinkhorn(a, b, X, Y, reg=reg, **options)
    return result, [str(w.message) for w in caught]


def assert_certified_value(result, a, b, X, Y, reg):
    """The accuracy met and certified, and the value inside the bracket of the module notes."""
    assert result.converged and result.accuracy_met
    assert result.true_kernel.bound <= ACCURACY
    M = ot.dist(X, Y)
    optimum = ot.emd2(a, b, M)
    missed = result.true_kernel.bound * M.max()
    assert optimum - missed <= result.value_linear
    assert result.value_linear <= optimum + reg * math.log(len(a) * len(b)) + missed


@pytest.mark.parametrize("name", sorted(POT_PAIRS))
@pytest.mark.parametrize("reg", [1e-1, 1e-2, 1e-3])
def test_pot_1d_histograms_are_certified_at_small_reg(name, reg):
    """Largest cost / reg 9.8e4 to 9.8e6 on dist0(100)."""
    a, b = pot_pair(name)
    X = grid(100)
    result, messages = solve(a, b, X, X, reg)
    assert_certified_value(result, a, b, X, X, reg)
    assert not any("miss" in m or "stopped" in m for m in messages)


def test_the_newton_stage_says_what_it_did():
    a, b = pot_pair("30/10 to 40/10")
    X = grid(100)
    result, _ = solve(a, b, X, X, 1e-2)
    assert result.iteration_info["strategy"] == "newton"
    assert result.iteration_info["newton_steps"] == sum(
        stage["steps"] for stage in result.iteration_info["newton"]
    )
    assert result.iteration_info["newton"][-1]["reg"] == 1e-2
    assert any("Sinkhorn-Newton steps" in note for note in result.notes)


def test_a_tight_tol_is_reached_with_pots_lower_bound():
    """POT's test_sinkhorn_stabilization asks for a value no cheaper than ot.emd2 - 1e-6;
    with POT's stopThr (1e-9, POT's default) Newton's quadratic convergence gets there at
    reg 1e-2 (largest cost / reg 9.8e5)."""
    a, b = pot_pair("30/10 to 40/10")
    X = grid(100)
    result, _ = solve(a, b, X, X, 1e-2, tol=1e-9)
    assert result.converged
    assert result.value_linear >= ot.emd2(a, b, ot.utils.dist0(100)) - 1e-6


@pytest.mark.parametrize("reg", [1e-3, 1e-4])
def test_a_2d_grid_at_small_reg(reg):
    k = 15
    X = np.stack(np.meshgrid(np.arange(k), np.arange(k)), axis=-1).reshape(-1, 2).astype(float)
    a = np.exp(-((X - [4, 4]) ** 2).sum(1) / 8)
    b = np.exp(-((X - [9, 10]) ** 2).sum(1) / 12)
    a, b = a / a.sum(), b / b.sum()
    result, _ = solve(a, b, X, X, reg)
    assert_certified_value(result, a, b, X, X, reg)


def test_the_same_call_twice_gives_the_same_bits():
    a, b = pot_pair("30/10 to 40/10")
    X = grid(100)
    first, _ = solve(a, b, X, X, 1e-3)
    second, _ = solve(a, b, X, X, 1e-3)
    for mine, again in zip(first.potentials, second.potentials, strict=True):
        np.testing.assert_array_equal(mine, again)
    assert first.value_linear == second.value_linear


def test_identical_histograms_cost_zero_not_an_error():
    """Found by the property test below: a == b on 20 bins at reg 1e-2 cost -2.8e-14
    (float64 rounding of ||x||^2 + ||y||^2 - 2 x.y), which was refused as impossible."""
    x = np.arange(20, dtype=float)
    a = np.exp(-(x**2) / (2 * 0.6**2))
    a /= a.sum()
    result, _ = solve(a, a, grid(20), grid(20), 1e-2)
    assert result.value_linear == 0.0


def test_a_converged_solve_never_runs_it():
    rng = np.random.default_rng(0)
    X, Y = rng.random((80, 2)), rng.random((70, 2))
    result, _ = solve(None, None, X, Y, 0.05, backend="exact")
    assert result.converged
    assert "newton" not in result.iteration_info
    assert result.iteration_info["strategy"] != "newton"


def test_it_applies_to_balanced_exact_problems_of_bounded_size():
    a, b = pot_pair("30/10 to 40/10")
    X = grid(100)
    exact = sketchot.make_kernel(X, X, 1e-2, backend="exact")
    balanced = make_problem(a, b, (100, 100), 1e-2)
    unbalanced = make_problem(a, b, (100, 100), 1e-2, 1.0)
    assert newton.applies(exact, balanced, "absorb")
    assert not newton.applies(exact, unbalanced, "absorb")
    assert not newton.applies(exact, balanced, "multiplicative")  # log_domain=False asked
    size = newton.NEWTON_MAX_SIZE // 2 + 1  # n + m just over the limit
    large = make_problem(None, None, (size, size), 1e-2)
    assert not newton.applies(exact, large, "absorb")


def test_each_piece_of_the_support_pins_its_heaviest_column():
    """Two pieces of the plan's support (rows 0-1 with columns 0-1, rows 2-3 with 2-4): one
    column pinned in each, the heaviest."""
    coupling = np.zeros((4, 5))
    coupling[:2, :2] = 0.5
    coupling[2:, 2:] = 0.3
    cols = np.array([0.1, 0.3, 0.2, 0.05, 0.25])
    free = newton._unpinned(coupling, cols)
    np.testing.assert_array_equal(free, [True, False, True, True, False])


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(20, 90),
    centres=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2),
    widths=st.lists(st.floats(0.03, 0.3), min_size=2, max_size=2),
    log_reg=st.floats(-4.0, -1.0),
)
def test_random_1d_histograms_are_certified(n, centres, widths, log_reg):
    """Gaussian histograms on a 1-D grid of n bins at reg 1e-4 to 1e-1 (largest cost / reg
    up to 8e7): certified to the default accuracy, the value inside its bracket."""
    x = np.arange(n, dtype=float)
    a, b = (
        np.exp(-((x - c * n) ** 2) / (2 * (w * n) ** 2))
        for c, w in zip(centres, widths, strict=True)
    )
    a, b = a / a.sum(), b / b.sum()
    reg = 10.0**log_reg
    X = grid(n)
    result, _ = solve(a, b, X, X, reg)
    assert_certified_value(result, a, b, X, X, reg)
