"""The grid backend (sketchot.kernels.grid) and its entries: sinkhorn(..., backend='grid'),
'auto' on grids, solve_grid. Against the exact backend on the same points, against POT on
the same cost, and the true kernel's entries."""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest

import sketchot
from sketchot import RegularGrid
from sketchot.kernels import make_kernel

# The grid kernel's entries are the true kernel's: its products agree with the dense exact
# kernel to the rounding of sums of ~100 positive terms.
PRODUCT_RTOL = 1e-12
# Two certified solves at accuracy 1e-3 (relative L1 marginal error): their values differ by
# at most about accuracy * max cost; POT's tests compare sinkhorn2 values at rtol 1e-5 for
# converged solves (test_bregman.py::test_sinkhorn), we ask accuracy=1e-7 for those below.
TIGHT = 1e-7


def histogram(rng, shape, zeros=0):
    w = rng.random(shape) + 0.1
    if zeros:
        w.flat[rng.choice(w.size, zeros, replace=False)] = 0.0
    return w / w.sum()


@pytest.mark.parametrize(
    "shapes",
    [((7,), (9,)), ((5, 4), (3, 6)), ((3, 4, 2), (2, 3, 3))],
    ids=["1d", "2d", "3d"],
)
def test_kernel_equals_true_kernel(shapes):
    rng = np.random.default_rng(0)
    gx, gy = (
        RegularGrid.from_shape(shapes[0], extent=1.0),
        RegularGrid([np.sort(rng.random(n)) for n in shapes[1]]),
    )
    X = gx.points()
    Y = gy.points()[rng.permutation(gy.size)]  # any row order
    K = make_kernel(X, Y, 0.05, "grid")
    dense = np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1) / 0.05)
    np.testing.assert_allclose(K.to_dense(), dense, rtol=PRODUCT_RTOL)
    v = rng.random((len(Y), 2))
    np.testing.assert_allclose(K.matmat(v), dense @ v, rtol=PRODUCT_RTOL)
    u = rng.random(len(X))
    np.testing.assert_allclose(K.rmatvec(u), dense.T @ u, rtol=PRODUCT_RTOL)
    pass_ = K.fused_pass("rows", np.log(v[:, 0]), np.log(u), log=True)
    np.testing.assert_allclose(pass_.products, np.log(dense @ v[:, 0]), rtol=PRODUCT_RTOL)
    log_sums, means = K.log_means("rows", np.log(v[:, 0]))
    weights = dense * v[:, 0][None, :]
    np.testing.assert_allclose(log_sums, np.log(weights.sum(1)), rtol=PRODUCT_RTOL)
    np.testing.assert_allclose(
        means, weights @ K.geometry.Yc / weights.sum(1)[:, None], rtol=1e-10, atol=1e-13
    )


def test_non_grid_clouds_are_refused_by_name():
    rng = np.random.default_rng(1)
    grid = RegularGrid.from_shape((4, 4)).points()
    with pytest.raises(ValueError, match="Y is not a tensor-product grid"):
        make_kernel(grid, rng.random((16, 2)), 1.0, "grid")
    with pytest.raises(ValueError, match="X is not a tensor-product grid"):
        sketchot.sinkhorn(None, None, grid[:-1], grid, 1.0, backend="grid")
    with pytest.raises(ValueError, match="backend 'grid' supports metric='sqeuclidean'"):
        make_kernel(grid, grid, 1.0, "grid", metric="cityblock")


@pytest.mark.parametrize("reg", [1e-1, 1e-2, 2e-3])
@pytest.mark.parametrize("shape", [(12, 9), (30,), (5, 4, 6)], ids=["2d", "1d", "3d"])
def test_sinkhorn_matches_exact_backend_and_pot(shape, reg):
    rng = np.random.default_rng(2)
    grid = RegularGrid.from_shape(shape, extent=1.0)
    X = grid.points()
    a, b = histogram(rng, grid.size, zeros=3), histogram(rng, grid.size)
    kwargs = dict(reg=reg, accuracy=TIGHT, warn=False)
    res = sketchot.sinkhorn(a, b, X, X, backend="grid", **kwargs)
    ref = sketchot.sinkhorn(a, b, X, X, backend="exact", **kwargs)
    assert res.accuracy_met and ref.accuracy_met
    assert res.backend == "grid"
    assert res.value == pytest.approx(ref.value, rel=1e-5)
    if reg < 1e-2:  # POT's log-domain Sinkhorn takes minutes there (80 s at 3-D, 2e-3)
        return
    M = ot.dist(X, X)
    with np.errstate(divide="ignore"):  # POT's log of the zero weights
        pot = ot.sinkhorn2(a, b, M, reg, method="sinkhorn_log", stopThr=1e-12, numItermax=100_000)
    # POT's sinkhorn2 returns <P, M> (test_bregman.py compares at rtol 1e-5 / atol 1e-5)
    assert res.value_linear == pytest.approx(float(pot), rel=1e-5, abs=1e-7)


def test_small_reg_is_certified():
    """1e-4 x the squared diameter on a 24 x 20 grid: the log-domain axis products
    (several blocks per axis) converge and the exhaustive check certifies the result."""
    rng = np.random.default_rng(3)
    grid = RegularGrid.from_shape((24, 20), extent=1.0)
    a, b = histogram(rng, grid.shape), histogram(rng, grid.shape, zeros=5)
    res = sketchot.solve_grid(a, b, reg=1e-4 * grid.squared_diameter, grid=grid, warn=False)
    assert res.accuracy_met
    assert res.result.true_kernel is None or res.result.true_kernel.exhaustive in (True, None)
    exact = sketchot.sinkhorn(a.ravel(), b.ravel(), grid.points(), grid.points(),
                              1e-4 * grid.squared_diameter, "exact", warn=False)  # fmt: skip
    assert res.value_linear == pytest.approx(exact.value_linear, rel=5e-3)
    emd = ot.emd2(a.ravel(), b.ravel(), ot.dist(grid.points(), grid.points()))
    # entropic cost above the exact optimum by at most reg log(n m) plus the accuracy's slack
    assert res.value_linear >= emd * (1 - 1e-2)


def test_unbalanced_matches_exact_backend():
    rng = np.random.default_rng(4)
    grid = RegularGrid.from_shape((10, 8), extent=1.0)
    a, b = histogram(rng, grid.shape), 2.0 * histogram(rng, grid.shape)
    res = sketchot.solve_grid(a, b, reg=1e-2, grid=grid, reg_m=0.5, accuracy=TIGHT)
    X = grid.points()
    ref = sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, 1e-2, "exact", reg_m=0.5, accuracy=TIGHT)
    assert res.value == pytest.approx(ref.value, rel=1e-6)
    M = ot.dist(X, X)
    pot = ot.unbalanced.sinkhorn_unbalanced2(
        a.ravel(), b.ravel(), M, 1e-2, 0.5, method="sinkhorn_stabilized", stopThr=1e-12,
        numItermax=100_000, reg_type="kl",
    )  # fmt: skip
    assert res.value_linear == pytest.approx(float(pot), rel=1e-4)


def test_auto_chooses_the_grid_kernel_on_grids_only():
    rng = np.random.default_rng(5)
    grid = RegularGrid.from_shape((16, 12), spacing=0.1)
    X = grid.points()[rng.permutation(grid.size)]
    res = sketchot.sinkhorn(None, None, X, X, 0.05, warn=False)
    assert res.backend == "grid" and "tensor-product grids" in res.reason
    cloud = sketchot.sinkhorn(None, None, rng.random((50, 2)), rng.random((40, 2)), 0.05)
    assert cloud.backend != "grid"
    # the same call twice: the same bits
    again = sketchot.sinkhorn(None, None, X, X, 0.05, warn=False)
    assert again.value == res.value


def test_solve_grid_shapes_views_and_errors():
    rng = np.random.default_rng(6)
    big = histogram(rng, (20, 16))
    a = big[::2, ::2] / big[::2, ::2].sum()  # non-contiguous
    a.setflags(write=False)
    b = histogram(rng, (10, 8))
    res = sketchot.solve_grid(a, b, reg=1e-2)
    again = sketchot.solve_grid(a.copy(), b, reg=1e-2)
    assert res.value == again.value and res.f.shape == (10, 8) and res.g.shape == (10, 8)
    assert res.grids[0].axes[0][-1] == 1.0  # the default extent=1 (POT's linspace(0, 1))
    spaced = sketchot.solve_grid(a, b, reg=1e-2 * 81, extent=9.0)  # every length x 9
    assert spaced.value_linear == pytest.approx(res.value_linear * 81, rel=1e-3)
    with pytest.raises(ValueError, match=r"b must have the grid's shape \(10, 8\)"):
        sketchot.solve_grid(a, b.ravel(), reg=1e-2)
    with pytest.raises(TypeError, match=r"grid must be a sketchot\.RegularGrid"):
        sketchot.solve_grid(a, b, reg=1e-2, grid="pixels")
    with pytest.raises(TypeError, match="do not pass backend"):
        sketchot.solve_grid(a, b, reg=1e-2, backend="exact")
    with pytest.raises(ValueError, match="reg must be > 0"):
        sketchot.solve_grid(a, b, reg=-1.0)


def test_different_grids_and_zero_weights():
    rng = np.random.default_rng(7)
    ga = RegularGrid.from_shape((6, 5), extent=1.0)
    gb = RegularGrid([np.linspace(0.2, 1.2, 4), np.linspace(-0.5, 0.5, 7)])
    a, b = histogram(rng, ga.shape, zeros=6), histogram(rng, gb.shape)
    res = sketchot.solve_grid(a, b, reg=2e-2, grid=(ga, gb), accuracy=TIGHT)
    M = ot.dist(ga.points(), gb.points())
    with np.errstate(divide="ignore"):  # POT's log of the zero weights
        pot = ot.sinkhorn2(a.ravel(), b.ravel(), M, 2e-2, method="sinkhorn_log", stopThr=1e-12,
                           numItermax=100_000)  # fmt: skip
    assert res.value_linear == pytest.approx(float(pot), rel=1e-5)
    assert np.all(np.isneginf(res.f[a == 0])) and np.all(np.isfinite(res.f[a > 0]))


def test_no_runtime_warning_on_a_grid_solve():
    rng = np.random.default_rng(8)
    grid = RegularGrid.from_shape((8, 8), extent=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sketchot.solve_grid(histogram(rng, grid.shape, zeros=10), histogram(rng, grid.shape),
                            reg=1e-3, grid=grid)  # fmt: skip


def test_linear_products_on_an_axis_too_long_to_store(monkeypatch):
    """A 1-D axis beyond MAX_AXIS_KERNEL_ENTRIES stores no kernel: its linear products are
    the log convolutions of the positive and negative parts, the stored kernel's to rounding
    (signed operands, several columns)."""
    import sketchot.grid as grid_module
    import sketchot.kernels.grid as kernel_module

    X = np.linspace(0, 1, 300)[:, None]
    stored = make_kernel(X, X, 1e-3, backend="grid")
    monkeypatch.setattr(grid_module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    monkeypatch.setattr(kernel_module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    grid_module._CACHE.clear()
    long = make_kernel(X, X, 1e-3, backend="grid")
    assert long._mats is None
    V = np.random.default_rng(0).normal(size=(300, 2))
    scale = np.abs(stored.matmat(np.abs(V))).max()
    np.testing.assert_allclose(long.matmat(V), stored.matmat(V), atol=PRODUCT_RTOL * scale)
    np.testing.assert_allclose(long.rmatmat(V[:, 0]), stored.rmatmat(V[:, 0]),
                               atol=PRODUCT_RTOL * scale)  # fmt: skip
    assert long._mats is None  # no 1-D kernel was built
