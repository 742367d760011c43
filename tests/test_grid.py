"""Tests of sketchot.grid: tensor-product grids and the separable log-domain Gibbs
convolution, against the dense definition ``log sum_j exp(-|x_i - y_j|^2 / reg + w_j)``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from sketchot.grid import GridConvolution, RegularGrid, log_convolve

# Exact up to rounding: the module's bound gives relative errors of a few ulps per axis
# pass (sum of non-negative terms); 1e-13 of the largest magnitude leaves room for d passes.
RTOL = 1e-13


def dense(log_w, source, target, reg):
    """The definition, on the N x M cost (small grids only)."""
    X, Y = target.points(), source.points()
    C = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    lead = log_w.shape[: log_w.ndim - source.ndim]
    flat = log_w.reshape(-1, source.size)
    out = np.stack([logsumexp(-C / reg + row[None, :], axis=1) for row in flat])
    return out.reshape(*lead, *target.shape)


def close(out, ref):
    finite = np.isfinite(ref)
    assert np.array_equal(finite, np.isfinite(out))
    scale = max(1.0, np.abs(ref[finite]).max()) if finite.any() else 1.0
    assert np.abs(out[finite] - ref[finite]).max() <= RTOL * scale


def random_grid(rng, shape, span=1.0):
    return RegularGrid([np.sort(rng.random(n)) * span for n in shape])


@pytest.mark.parametrize(
    ("shape_s", "shape_t", "reg"),
    [
        ((9,), (9,), 0.5),
        ((7,), (11,), 1e-3),
        ((5, 6), (5, 6), 1e-2),
        ((6, 4), (3, 8), 1e-4),  # non-square, different grids, tiny reg: many blocks
        ((4, 5, 3), (3, 5, 6), 3e-3),
    ],
)
def test_log_convolve_matches_dense_definition(shape_s, shape_t, reg):
    rng = np.random.default_rng(0)
    source, target = random_grid(rng, shape_s, 2.0), random_grid(rng, shape_t)
    log_w = rng.normal(size=shape_s) * 200  # a dynamic range far beyond float64's
    log_w.flat[::4] = -np.inf
    ref = dense(log_w, source, target, reg)
    close(log_convolve(log_w, source, target, reg), ref)
    close(log_convolve(log_w, source, target, reg, method="logsumexp"), ref)


def test_small_reg_uses_blocks_and_stays_exact():
    grid = RegularGrid.from_shape((60, 50), extent=1.0)
    reg = 1e-4 * grid.squared_diameter
    conv = GridConvolution(grid, grid, reg)
    assert all(len(a.s_blocks) > 2 for a in conv._axes)  # several blocks per axis
    rng = np.random.default_rng(1)
    log_w = rng.normal(size=grid.shape) * 1e3
    close(conv.log_apply(log_w), conv.log_apply(log_w, method="logsumexp"))


def test_large_reg_uses_one_block():
    grid = RegularGrid.from_shape((64, 64), extent=1.0)
    conv = GridConvolution(grid, grid, 1e-3 * grid.squared_diameter)
    assert all(len(a.s_blocks) == 2 for a in conv._axes)


def test_streamed_axis_matches_stored(monkeypatch):
    import sketchot.grid as module

    rng = np.random.default_rng(2)
    grid = RegularGrid.from_shape(300, extent=1.0)
    log_w = rng.normal(size=(2, 300)) * 50
    log_w[1, :150] = -np.inf
    ref = dense(log_w, grid, grid, 1e-4)
    monkeypatch.setattr(module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    monkeypatch.setattr(module, "STREAM_BLOCK", 64)
    conv = GridConvolution(grid, grid, 1e-4)
    assert conv._axes[0].matrix is None
    close(conv.log_apply(log_w), ref)


def test_batch_axes_and_transpose():
    rng = np.random.default_rng(3)
    source, target = random_grid(rng, (4, 5)), random_grid(rng, (6, 3))
    conv = GridConvolution(source, target, 0.05)
    log_w = rng.normal(size=(3, 4, 5))
    close(conv.log_apply(log_w), dense(log_w, source, target, 0.05))
    log_v = rng.normal(size=(2, 6, 3))
    close(conv.log_apply_transpose(log_v), dense(log_v, target, source, 0.05))


def test_all_zero_mass_gives_minus_inf():
    grid = RegularGrid.from_shape((3, 4))
    out = log_convolve(np.full((3, 4), -np.inf), grid, grid, 1.0)
    assert np.all(out == -np.inf)


def test_readonly_and_noncontiguous_weights():
    rng = np.random.default_rng(4)
    grid = RegularGrid.from_shape((6, 5), spacing=0.1)
    big = rng.normal(size=(12, 10))
    view = big[::2, ::2]  # non-contiguous
    ref = log_convolve(view.copy(), grid, grid, 0.01)
    view.setflags(write=False)
    np.testing.assert_array_equal(log_convolve(view, grid, grid, 0.01), ref)
    np.testing.assert_array_equal(log_convolve(view.T.T, grid, grid, 0.01), ref)


@settings(max_examples=25, deadline=None)
@given(
    n1=st.integers(1, 6),
    n2=st.integers(1, 6),
    log_reg=st.floats(-4, 0),
    seed=st.integers(0, 2**32 - 1),
)
def test_separability_and_symmetry(n1, n2, log_reg, seed):
    """Two invariants: a product of 1-D weights convolves to the sum of the 1-D results
    (separability), and on one grid the kernel is symmetric: <u, K v> = <v, K u>."""
    rng = np.random.default_rng(seed)
    reg = 10.0**log_reg
    grid = random_grid(rng, (n1, n2))
    a, b = rng.normal(size=n1) * 5, rng.normal(size=n2) * 5
    joint = log_convolve(a[:, None] + b[None, :], grid, grid, reg)
    ga, gb = RegularGrid([grid.axes[0]]), RegularGrid([grid.axes[1]])
    parts = log_convolve(a, ga, ga, reg)[:, None] + log_convolve(b, gb, gb, reg)[None, :]
    np.testing.assert_allclose(joint, parts, rtol=RTOL, atol=RTOL * np.abs(parts).max())
    u, v = rng.normal(size=(2, n1, n2))
    left = logsumexp(u + log_convolve(v, grid, grid, reg))
    right = logsumexp(v + log_convolve(u, grid, grid, reg))
    assert abs(left - right) <= RTOL * max(1.0, abs(left))


def test_grid_construction():
    grid = RegularGrid.from_shape((3, 4), extent=1.0)
    np.testing.assert_array_equal(grid.axes[1], np.linspace(0, 1, 4))
    assert grid.shape == (3, 4) and grid.size == 12 and grid.ndim == 2
    assert grid.squared_diameter == pytest.approx(2.0)
    pts = grid.points()
    assert pts.shape == (12, 2)
    np.testing.assert_array_equal(pts[5], [0.5, 1 / 3])  # C order: index (1, 1)
    grid2 = RegularGrid.from_shape(5, spacing=0.5, origin=1.0)
    np.testing.assert_array_equal(grid2.axes[0], [1.0, 1.5, 2.0, 2.5, 3.0])
    assert RegularGrid([np.arange(3.0)]) == RegularGrid(np.arange(3.0))


def test_from_points_recovers_any_order():
    rng = np.random.default_rng(5)
    grid = random_grid(rng, (4, 3, 2))
    pts = grid.points()
    perm = rng.permutation(grid.size)
    found, order = RegularGrid.from_points(pts[perm])
    assert found == grid
    np.testing.assert_array_equal(pts[perm][order], pts)
    with pytest.raises(ValueError, match="Y is not a tensor-product grid"):
        RegularGrid.from_points(pts[1:], name="Y")
    with pytest.raises(ValueError, match="X is not a tensor-product grid"):
        RegularGrid.from_points(rng.random((12, 2)))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda g: log_convolve(np.zeros((2, 2)), g, g, 1.0), ValueError, "log_w must have"),
        (lambda g: log_convolve(np.full((3, 4), np.nan), g, g, 1.0), ValueError, "log_w"),
        (lambda g: log_convolve(np.zeros((3, 4)), g, g, -1.0), ValueError, "reg must be > 0"),
        (lambda g: log_convolve(np.zeros((3, 4)), "grid", g, 1.0), TypeError, "source_grid"),
        (lambda g: log_convolve(np.zeros((3, 4)), g, g, 1.0, method="fft"), ValueError, "method"),
        (lambda g: RegularGrid([[0.0, 0.0, 1.0]]), ValueError, "strictly increasing"),
        (lambda g: RegularGrid.from_shape((3, 0)), ValueError, "shape"),
        (lambda g: RegularGrid.from_shape(3, spacing=1.0, extent=2.0), ValueError, "not both"),
    ],
)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(RegularGrid.from_shape((3, 4)))


@pytest.mark.parametrize(
    ("n_s", "n_t", "origin", "reg"),
    [
        (300, 300, 0.0, 1e-3),  # one grid, a wide kernel: every pair near the band
        (400, 257, 0.37, 1e-4),  # different lengths and origins, a narrow kernel
        (500, 500, 0.0, 5e-4),  # blocks of one point (sqrt(reg) / 2 below the spacing)
    ],
)
def test_banded_axis_matches_dense(monkeypatch, n_s, n_t, origin, reg):
    """Uniform axes too long to store take the banded pass (block pairs by offset, the pairs
    below 1e-20 of their output's lower bound skipped): the dense definition to rounding."""
    import sketchot.grid as module

    rng = np.random.default_rng(5)
    h = 1.0 / 299
    source = RegularGrid([h * np.arange(n_s)])
    target = RegularGrid([origin + h * np.arange(n_t)])
    log_w = rng.normal(size=(3, n_s)) * 30
    log_w[0] += (source.axes[0] - 0.5) ** 2 / reg * 0.3  # mass far from the diagonal
    log_w[1, : n_s // 3] = -np.inf  # a zero-mass stretch
    log_w[2, ::7] = -np.inf
    monkeypatch.setattr(module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    conv = GridConvolution(source, target, reg)
    assert conv._axes[0].banded is not None and conv._axes[0].matrix is None
    close(conv.log_apply(log_w), dense(log_w, source, target, reg))
    log_v = rng.normal(size=(2, n_t)) * 30
    close(conv.log_apply_transpose(log_v), dense(log_v, target, source, reg))


def test_banded_axis_needs_uniform_axes(monkeypatch):
    import sketchot.grid as module

    monkeypatch.setattr(module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    rng = np.random.default_rng(6)
    uneven = RegularGrid([np.sort(rng.random(200))])
    conv = GridConvolution(uneven, uneven, 1e-3)
    assert conv._axes[0].banded is None and conv._axes[0].matrix is None  # streamed
    log_w = rng.normal(size=200)
    close(conv.log_apply(log_w), dense(log_w, uneven, uneven, 1e-3))


def test_a_1d_solve_on_the_banded_pass_equals_the_stored_one(monkeypatch):
    import sketchot
    import sketchot.grid as module

    x = np.linspace(0, 1, 600)
    a = np.exp(-((x - 0.3) ** 2) / 0.01) + 1e-3
    b = np.exp(-((x - 0.6) ** 2) / 0.02) + 1e-3
    a, b = a / a.sum(), b / b.sum()
    stored = sketchot.solve_grid(a, b, 1e-3, warn=False)
    monkeypatch.setattr(module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    module._CACHE.clear()
    banded = sketchot.solve_grid(a, b, 1e-3, warn=False)
    assert banded.accuracy_met and stored.accuracy_met
    assert banded.result.n_iter == stored.result.n_iter
    # the same iteration on products equal to rounding
    np.testing.assert_allclose(banded.value_linear, stored.value_linear, rtol=1e-9)
    np.testing.assert_allclose(banded.f, stored.f, rtol=1e-9, atol=1e-12)


def test_from_points_in_c_order_needs_no_sort():
    grid = RegularGrid.from_shape((4, 3, 5), spacing=(0.5, 1.0, 2.0))
    found, order = RegularGrid.from_points(grid.points())
    assert found == grid
    np.testing.assert_array_equal(order, np.arange(grid.size))
    # a C-ordered grid with one point moved is not a grid in C order: the general path
    pts = grid.points()
    pts[[3, 4]] = pts[[4, 3]]
    found, order = RegularGrid.from_points(pts)
    np.testing.assert_array_equal(pts[order], grid.points())
    with pytest.raises(ValueError, match="Y is not a tensor-product grid"):
        RegularGrid.from_points(np.vstack([grid.points(), grid.points()[:1]]), name="Y")


@pytest.mark.parametrize("reg", [1e-3, 1e-4])
def test_banded_axis_between_a_grid_and_its_halving(monkeypatch, reg):
    """Spacings in ratio 2 (the coarse-to-fine start's carry): blocks of w and 2 w points."""
    import sketchot.grid as module

    rng = np.random.default_rng(7)
    fine = RegularGrid.from_shape(600, extent=1.0)
    coarse = RegularGrid([fine.axes[0].reshape(300, 2).mean(axis=1)])
    monkeypatch.setattr(module, "MAX_AXIS_KERNEL_ENTRIES", 1000)
    conv = GridConvolution(coarse, fine, reg)
    assert conv._axes[0].banded is not None
    log_w = rng.normal(size=300) * 30 + (coarse.axes[0] - 0.4) ** 2 / reg * 0.2
    close(conv.log_apply(log_w), dense(log_w, coarse, fine, reg))
    log_v = rng.normal(size=600) * 30
    close(conv.log_apply_transpose(log_v), dense(log_v, fine, coarse, reg))


# --- the banded pass's pair bounds (sketchot.grid._BandedAxis) -------------------------------


def _pair_logs(B, s, t, x):
    """``(R, j_out * w_out, j_in)``: the exact log-contribution of every input block to every
    output (the dense definition, summed block by block) and ``(R, n_t)`` the outputs."""
    R = x.shape[0]
    E = x[:, None, :] - ((t[:, None] - s[None, :]) ** 2)[None] / B.reg  # (R, n_t, n_s)
    padded = np.full((R, t.size, B.j_in * B.w_in), -np.inf)
    padded[:, :, : s.size] = E
    per_block = logsumexp(padded.reshape(R, t.size, B.j_in, B.w_in), axis=3)
    return per_block, logsumexp(E, axis=2)


def check_left_out_pairs(s, t, reg, x):
    """Every block pair the banded pass leaves out adds at most ``SKIP_FRACTION / j_in`` of
    each output of its block (the bound the pass states), so all of them together at most
    ``SKIP_FRACTION``; the pass equals the dense definition to rounding."""
    from sketchot.grid import SKIP_FRACTION, _BandedAxis

    B = _BandedAxis.build(s, t, reg)
    if B is None:  # refused only where a block's Gaussian would underflow: spacings >> sqrt(reg)
        assert max(s[1] - s[0], t[1] - t[0]) ** 2 / reg > 25.0
        return
    _, (src, _, _, _, group) = B._kept_pairs(x)
    R = x.shape[0]
    kept = np.zeros((R, B.j_out, B.j_in), dtype=bool)
    kept[group // B.j_out, group % B.j_out, src % B.j_in] = True
    per_block, out = _pair_logs(B, s, t, x)
    c_of = np.arange(t.size) // B.w_out
    left_out = ~kept[:, c_of, :]  # (R, n_t, j_in)
    limit = out[:, :, None] + np.log(SKIP_FRACTION) - np.log(B.j_in)
    finite = np.isfinite(out)[:, :, None] & left_out
    # rounding of the dense reference: a few ulps of the largest exponent
    scale = np.where(np.isfinite(out), np.abs(out), 0.0)
    slack = 1e-12 * np.maximum(1.0, scale)[:, :, None]
    with np.errstate(invalid="ignore"):  # rows without mass: -inf limits, not compared
        bound = np.broadcast_to(limit + slack, per_block.shape)
    assert np.all(per_block[finite] <= bound[finite])
    # rows with no mass keep no pair and give -inf
    assert not kept[~np.isfinite(out).all(axis=1)].any()
    got = B.apply(x[:, :, None])[:, :, 0]
    close(got, out)


@settings(max_examples=40, deadline=None)
@given(
    n_s=st.integers(20, 300),
    n_t=st.integers(20, 300),
    ratio=st.sampled_from([1, 2, 3]),
    log10_reg=st.floats(-8, -1.5),
    origin=st.floats(-0.5, 0.5),
    tilt=st.floats(-1.0, 1.0),
    spread=st.floats(0, 300),
    dead=st.floats(0, 0.6),
    seed=st.integers(0, 2**16),
)
def test_banded_pairs_left_out_are_below_their_bound(
    n_s, n_t, ratio, log10_reg, origin, tilt, spread, dead, seed
):
    """Invariant (the bound of ``_BandedAxis._tight`` and ``_candidates``): on random uniform
    axes of spacings in an integer ratio, random ``reg`` and random potentials (a transport
    tilt ``tilt (s - 1/2)^2 / reg``, noise of any spread, stretches of zero mass), no pair
    left out exceeds its share of the true output."""
    rng = np.random.default_rng(seed)
    h = 1.0 / 199
    s = h * np.arange(n_s)
    t = origin + h * ratio * np.arange(n_t)
    if rng.random() < 0.5:
        s, t = t, s  # the coarse side as the input
    reg = 10.0**log10_reg
    x = rng.normal(size=(2, s.size)) * spread + tilt * (s - 0.5) ** 2 / reg
    x[rng.random(x.shape) < dead] = -np.inf
    x[1, : s.size // 3] = -np.inf
    check_left_out_pairs(s, t, reg, x)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(20, 4000),
    log10_reg=st.floats(-8, -3),
    spread=st.floats(0, 1e3),
    tilt=st.floats(-1.0, 1.0),
    dead=st.floats(0, 0.95),
    seed=st.integers(0, 2**16),
)
def test_banded_leaders_maximise_over_the_live_blocks(n, log10_reg, spread, tilt, dead, seed):
    """Invariant (``_BandedAxis._leaders``, a divide and conquer that relies on the
    maximiser never decreasing along the outputs): every row's leader of every output block
    is a live block whose ``mu_b - (t_c - s_b)^2 / reg`` is the brute-force maximum over the
    row's live blocks (to rounding of the largest term); the lower bounds of ``_lows`` are
    -inf exactly on the rows without a live block."""
    from sketchot.grid import _BandedAxis

    rng = np.random.default_rng(seed)
    h = 1.0 / 199
    s, t = h * np.arange(n), 0.01 + h * np.arange(n // 2) * 2
    B = _BandedAxis.build(s, t, 10.0**log10_reg)
    if B is None:
        return
    blocks = np.arange(B.j_in)
    mu = rng.normal(size=(4, B.j_in)) * spread + tilt * (blocks * B.length) ** 2 / B.reg
    live = rng.random(mu.shape) >= dead
    live[:, rng.integers(B.j_in)] = True
    live[3] = False  # a dead row
    leader = B._leaders(mu[:3], live[:3])
    alpha = B.length**2 / B.reg
    points = np.arange(B.j_out) + (B.t0 - B.s0) / B.length
    objective = np.where(
        live[:3, None, :], mu[:3, None, :] - alpha * (points[:, None] - blocks) ** 2, -np.inf
    )  # (rows, j_out, j_in)
    chosen = np.take_along_axis(objective, leader[:, :, None], axis=2)[:, :, 0]
    best = objective.max(axis=2)
    assert np.take_along_axis(live[:3], leader, axis=1).all()
    np.testing.assert_allclose(chosen, best, rtol=1e-12, atol=1e-9 * np.abs(best).max())
    low = B._lows(mu, live)
    assert np.isfinite(low[:3]).all() and np.isneginf(low[3]).all()


@pytest.mark.parametrize("reg", [1e-7, 1e-5, 1e-4, 1e-3, 5e-2])
@pytest.mark.parametrize("shape", ["same", "coarse_out", "coarse_in"])
@pytest.mark.parametrize("potential", ["transport", "noise", "zero_stretches"])
def test_banded_pairs_left_out_on_a_grid_of_cases(reg, shape, potential):
    """The same invariant on a fixed grid of cases: blocks of one point (reg 1e-7 on a
    1/299 spacing), the 16-point minimum, the low-rank Gaussian (reg 5e-2), spacings 1:2
    either way, mass moving far, any dynamic range, no mass in places."""
    rng = np.random.default_rng(7)
    h = 1.0 / 299
    s, t = h * np.arange(300), h * np.arange(300) + 0.013
    if shape == "coarse_out":
        t = 0.2 + 2 * h * np.arange(150)
    elif shape == "coarse_in":
        s = 2 * h * np.arange(150)
    x = np.zeros((3, s.size))
    if potential == "transport":
        x += np.array([[0.9], [-0.5], [0.2]]) * (s - 0.4) ** 2 / reg
    elif potential == "noise":
        x += rng.normal(size=x.shape) * np.array([[1.0], [50.0], [500.0]])
    else:
        x += rng.normal(size=x.shape) * 20
        x[0, 40:200] = -np.inf
        x[1, ::3] = -np.inf
        x[2] = -np.inf  # a row with no mass
    check_left_out_pairs(s, t, reg, x)


@pytest.mark.parametrize(("w", "h", "reg"), [(24, 1e-6, 1e-7), (158, 1e-6, 1e-7),
                                             (63, 1 / 1999, 4e-3), (200, 1e-3, 0.16)])  # fmt: skip
def test_the_gaussian_blocks_low_rank_form_is_within_its_bound(w, h, reg):
    """``_gauss_factors``: every entry of ``left @ right`` within ``2^-56`` (the truncation,
    stated there) plus a few ulps of rounding of the Gaussian block's entry."""
    from sketchot.grid import _gauss_factors

    v = u = h * np.arange(w)
    factors = _gauss_factors(v, u, reg)
    exact = np.exp(-((u[None, :] - v[:, None]) ** 2) / reg)
    if (w * h) ** 2 / reg > 0.3:  # blocks longer than sqrt(reg) / 2: not low rank enough
        assert factors is None
        return
    assert factors is not None
    left, right = factors
    assert left.shape[1] * 2 < w
    assert np.max(np.abs(left @ right / exact - 1.0)) <= 8e-16
