"""The coarse-to-fine start on grids (sketchot.solver.grid_start): the pyramid of halved grids
only changes where the fine iteration starts, never the certified answer."""

from __future__ import annotations

import numpy as np
import pytest

import sketchot
from sketchot import RegularGrid
from sketchot.solver.grid_start import MIN_AXIS, halve

# Two certified solves at accuracy 1e-3 (relative L1 marginal error) give values that differ
# by at most about 2 * accuracy * largest cost (here 2, the unit square's squared diameter);
# the measured gaps are 10x below.
ACCURACY = 1e-3
# grids from 96 x 96 on: N^2 = 8.5e7 kernel entries, above the 5e7 from which "auto" starts coarse
VALUE_ATOL = 2 * ACCURACY * 2.0


def image(rng, size, centre, width):
    """A smooth positive histogram on a size x size grid (a blob plus noise and a floor)."""
    x = np.linspace(0, 1, size)
    blob = np.exp(-((x[:, None] - centre[0]) ** 2 + (x[None, :] - centre[1]) ** 2) / width)
    w = blob + 0.05 * rng.random((size, size)) + 1e-3
    return w / w.sum()


def test_halve_sums_the_weights_and_averages_the_coordinates():
    grid = RegularGrid([np.arange(2 * MIN_AXIS + 1.0), np.arange(MIN_AXIS - 1.0)])
    rng = np.random.default_rng(0)
    w = rng.random(grid.shape)
    coarse, cw = halve(grid, w)
    # the odd axis: pairs, the last cell three points; the short axis untouched
    assert coarse.shape == (MIN_AXIS, MIN_AXIS - 1)
    np.testing.assert_allclose(coarse.axes[0][:-1], np.arange(MIN_AXIS - 1) * 2 + 0.5)
    assert coarse.axes[0][-1] == np.mean([2 * MIN_AXIS - 2, 2 * MIN_AXIS - 1, 2 * MIN_AXIS])
    np.testing.assert_array_equal(coarse.axes[1], grid.axes[1])
    np.testing.assert_allclose(cw.sum(), w.sum(), rtol=1e-14)
    np.testing.assert_allclose(cw[0], w[0] + w[1], rtol=1e-14)
    np.testing.assert_allclose(cw[-1], w[-3:].sum(axis=0), rtol=1e-14)
    assert halve(RegularGrid.from_shape((MIN_AXIS, 3)), np.ones((MIN_AXIS, 3))) is None


@pytest.mark.parametrize("factor", [1e-2, 1e-3])
def test_the_pyramid_start_keeps_the_certified_answer(factor):
    rng = np.random.default_rng(1)
    a, b = image(rng, 96, (0.3, 0.4), 0.02), image(rng, 96, (0.6, 0.7), 0.05)
    grid = RegularGrid.from_shape(a.shape, extent=1.0)
    X = grid.points()
    reg = factor * grid.squared_diameter
    warm = sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, reg, warn=False)
    cold = sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, reg, warn=False, coarse_to_fine=False)
    info = warm.iteration_info["coarse_to_fine"]
    assert info["used"] and info["grids"][0] == ((48, 48), (48, 48))
    assert any("grids of shapes (48, 48)" in note for note in warm.notes)
    assert "coarse_to_fine" not in cold.iteration_info
    for result in (warm, cold):
        assert result.backend == "grid" and result.accuracy_met
        assert result.true_kernel.bound <= ACCURACY
    assert abs(warm.value_linear - cold.value_linear) <= VALUE_ATOL
    assert warm.n_iter < cold.n_iter


def test_rows_in_any_order_give_the_same_start():
    rng = np.random.default_rng(2)
    a, b = image(rng, 96, (0.3, 0.3), 0.03), image(rng, 96, (0.7, 0.6), 0.03)
    grid = RegularGrid.from_shape(a.shape, extent=1.0)
    X = grid.points()
    perm = rng.permutation(X.shape[0])
    reg = 1e-3 * grid.squared_diameter
    ordered = sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, reg, warn=False)
    shuffled = sketchot.sinkhorn(a.ravel()[perm], b.ravel(), X[perm], X, reg, warn=False)
    assert shuffled.iteration_info["coarse_to_fine"]["used"]
    # the same start and iteration, the rows permuted: equal to rounding
    np.testing.assert_allclose(shuffled.potentials[0], ordered.potentials[0][perm], rtol=1e-9)
    np.testing.assert_allclose(shuffled.value_linear, ordered.value_linear, rtol=1e-9)


def test_unbalanced_and_1d_grids_start_from_the_pyramid():
    rng = np.random.default_rng(3)
    n = 8192  # n^2 = 6.7e7 kernel entries: 'auto' starts coarse from 5e7 on
    x = np.linspace(0, 1, n)
    a = np.exp(-((x - 0.3) ** 2) / 0.01) + 0.1 * rng.random(n) + 1e-3
    b = np.exp(-((x - 0.6) ** 2) / 0.02) + 1e-3
    a, b = a / a.sum(), 1.3 * b / b.sum()
    for reg_m in (None, 0.5):
        warm = sketchot.solve_grid(a, b if reg_m else b / 1.3, 1e-3, reg_m=reg_m, warn=False)
        cold = sketchot.solve_grid(a, b if reg_m else b / 1.3, 1e-3, reg_m=reg_m, warn=False,
                                   coarse_to_fine=False)  # fmt: skip
        assert warm.result.iteration_info["coarse_to_fine"]["used"]
        assert warm.accuracy_met and cold.accuracy_met
        assert abs(warm.value_linear - cold.value_linear) <= 2 * ACCURACY


def test_the_same_call_twice_gives_the_same_bits():
    rng = np.random.default_rng(4)
    a, b = image(rng, 96, (0.4, 0.4), 0.02), image(rng, 96, (0.5, 0.7), 0.02)
    first = sketchot.solve_grid(a, b, 2e-3, warn=False)
    second = sketchot.solve_grid(a, b, 2e-3, warn=False)
    assert first.result.iteration_info["coarse_to_fine"]["used"]
    np.testing.assert_array_equal(first.f, second.f)
    np.testing.assert_array_equal(first.g, second.g)
    assert first.value_linear == second.value_linear


def test_uniform_halving_keeps_a_uniform_axis():
    """``halve(uniform=True)`` (1-D pyramids): pairs of points, an odd axis's last point a cell
    of its own half a step beyond it; the coarse axis uniform (the banded pass needs it)."""
    rng = np.random.default_rng(5)
    for n in (2 * MIN_AXIS, 2 * MIN_AXIS + 1, 1001):
        grid = RegularGrid.from_shape(n, extent=1.0)
        w = rng.random(n)
        coarse, cw = halve(grid, w, uniform=True)
        step = 1.0 / (n - 1)
        assert coarse.size == (n + 1) // 2
        np.testing.assert_allclose(np.diff(coarse.axes[0]), 2 * step, rtol=1e-12)
        np.testing.assert_allclose(coarse.axes[0][0], step / 2, rtol=1e-12)
        np.testing.assert_allclose(cw.sum(), w.sum(), rtol=1e-14)
        if n % 2:
            assert cw[-1] == w[-1]


def test_a_1d_histogram_at_small_reg_climbs_the_pyramid_with_the_schedule():
    """1-D: the epsilon schedule runs on levels that resolve each stage's blur (coarse while
    reg is large, finer as it falls); the fine solve stays certified and within the entropic
    gap of POT's exact ot.emd2_1d."""
    ot = pytest.importorskip("ot")
    n, reg = 20_000, 1e-6
    x = np.linspace(0, 1, n)
    a = np.exp(-((x - 0.3) ** 2) / 0.005) + 0.5 * np.exp(-((x - 0.7) ** 2) / 0.002) + 1e-3
    b = np.exp(-((x - 0.55) ** 2) / 0.01) + 1e-3
    a, b = a / a.sum(), b / b.sum()
    res = sketchot.solve_grid(a, b, reg, warn=False)
    info = res.result.iteration_info["coarse_to_fine"]
    assert info["used"] and res.accuracy_met
    stages = info["stages"]
    sizes = [st["shape"][0] for st in stages]
    regs = [st["reg"] for st in stages]
    assert sizes == sorted(sizes) and sizes[0] < 100 < sizes[-1] < n  # coarse to fine
    assert regs == sorted(regs, reverse=True) and regs[-1] > reg
    exact = float(ot.emd2_1d(x, x, a, b))
    # the entropic value lies within reg log(n^2) (the entropy's range) plus the certified
    # error's share of the largest cost (1) above the exact one
    gap = reg * np.log(float(n) * n) + 2 * ACCURACY
    assert abs(res.value_linear - exact) <= gap
