"""Tests of sketchot.convolutional: convolutional barycenters on grids (against POT's
``convolutional_barycenter2d`` and ``_debiased``, POT's own test cases ported, and a dense
log-kernel reference) and the Sinkhorn divergence on grids with its weight gradients (against
``sketchot.sinkhorn_divergence`` on the grid's points and finite differences)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

import sketchot
from sketchot.convolutional import (
    convolutional_barycenter,
    convolutional_barycenter2d,
    convolutional_barycenter2d_debiased,
    sinkhorn_divergence_grid,
)
from sketchot.grid import RegularGrid, log_convolve

POT_BARYCENTERS = {
    False: (convolutional_barycenter2d, ot.bregman.convolutional_barycenter2d),
    True: (convolutional_barycenter2d_debiased, ot.bregman.convolutional_barycenter2d_debiased),
}


def create_random_images_dist(seed, size=20):
    """POT's test/test_bregman.py helper of the same name (inputs of its 2-D tests)."""
    rng = np.random.RandomState(seed)
    images = []
    for _ in range(2):
        image = rng.rand(size, size)
        image += image.min()
        images.append(image / np.sum(image))
    return np.stack(images)


def blobs(shape, centres, widths):
    """Normalised Gaussian blobs on POT's grid (``linspace(0, 1, n)`` axes); far from their
    centres the pixels fall to 1e-100 and 1e-218 (the test's blobs): what breaks POT's
    multiplicative form at small reg."""
    axes = np.meshgrid(*[np.linspace(0, 1, n) for n in shape], indexing="ij")
    out = []
    for centre, width in zip(centres, widths, strict=True):
        r2 = sum((x - c) ** 2 for x, c in zip(axes, centre, strict=True))
        out.append(np.exp(-r2 / width))
    A = np.stack(out)
    return A / A.sum(axis=tuple(range(1, A.ndim)), keepdims=True)


def dense_barycenter(A, grid, reg, weights, debiased, n_iter):
    """The same iteration on the dense N x N log-kernel (``scipy.special.logsumexp``), for
    ``n_iter`` iterations: the reference for small grids."""
    P = grid.points()
    L = -((P[:, None, :] - P[None, :, :]) ** 2).sum(-1) / reg

    def conv(x):
        return logsumexp(L[None] + x.reshape(-1, 1, grid.size), axis=2).reshape(x.shape)

    with np.errstate(divide="ignore"):
        log_a = np.log(A)
    G = np.zeros(A.shape)
    log_d = np.zeros(grid.shape)
    for _ in range(n_iter):
        F = log_a - conv(G)
        Lk = conv(F)
        log_p = np.tensordot(weights, Lk, axes=1)
        if debiased:
            log_p = log_p + log_d
            for _ in range(10):
                log_d = 0.5 * (log_d + log_p - conv(log_d[None])[0])
        G = log_p[None] - Lk
    return np.exp(log_p)


# --------------------------------------------------------------------------- products
@pytest.mark.parametrize(("shape", "reg"), [((50,), 1e-3), ((30, 20), 2e-4), ((6, 5, 7), 1e-2)])
def test_linear_pass_with_log_fallback_is_exact(shape, reg):
    """The jobs' product (linear-domain axis passes, rows whose sums fall below 1e-200
    recomputed by log_convolve) against the exact log-sum-exp, with a weight range far
    beyond float64's and zero mass: equal up to rounding (sketchot.grid's 1e-13)."""
    from sketchot.convolutional import _LogKernel

    rng = np.random.default_rng(7)
    grid = RegularGrid.from_shape(shape, extent=1.0)
    X = rng.normal(size=(2, *shape)) * 300
    X[0].flat[::3] = -np.inf
    X[1][(slice(None),) * (len(shape) - 1) + (slice(1, None),)] = -np.inf  # one live line
    kernel = _LogKernel(grid, reg)
    out = kernel(X)
    ref = log_convolve(X, grid, grid, reg, method="logsumexp")
    assert np.array_equal(np.isfinite(out), np.isfinite(ref))
    finite = np.isfinite(ref)
    assert np.abs(out[finite] - ref[finite]).max() <= 1e-13 * np.abs(ref[finite]).max()
    if reg < 1e-2:
        assert kernel.fallback_rows > 0  # the far outputs took the log-domain path


# --------------------------------------------------------------------------- POT's cases
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("method", ["sinkhorn", "sinkhorn_log"])
def test_wasserstein_bary_2d_pot_case(method, debiased, capsys):
    """POT test/test_bregman.py::test_wasserstein_bary_2d and ::test_wasserstein_bary_2d_
    debiased: reg 1e-2 on two random 20 x 20 images; POT's assertions (sum 1 to rtol 1e-3;
    POT's barycenter to atol 1e-3)."""
    ours_fn, pot_fn = POT_BARYCENTERS[debiased]
    A = create_random_images_dist(42, size=20)
    bary, log = ours_fn(A, 1e-2, method=method, verbose=False, log=True)
    pot = pot_fn(A, 1e-2, method=method)
    np.testing.assert_allclose(1, np.sum(bary), rtol=1e-3)
    np.testing.assert_allclose(bary, pot, atol=1e-3)
    # measured: 8.6e-8 (plain) and 7.1e-5 (debiased) apart, the iterations stopping within
    # POT's tenth-iteration test; both stop on POT's criterion
    assert np.abs(bary - pot).max() < (1e-4 if debiased else 1e-6)
    assert log["converged"] and log["err_all"][-1] < (1e-3 if debiased else 1e-4)
    assert log["method"] == method and log["niter"] + 1 == len(log["err_all"])
    # POT's "log and verbose do not bug the function"
    ours_fn(A, 1e-2, log=True, verbose=True)
    assert "|" in capsys.readouterr().out


def test_convolutional_barycenter_non_square():
    """POT test/test_bregman.py::test_convolutional_barycenter_non_square: the barycenter of
    two uniform 2 x 3 images is uniform (atol 1e-2), here to rounding."""
    A = np.ones((2, 2, 3)) / (2 * 3)
    bary = convolutional_barycenter2d(A, 1e-03)
    np.testing.assert_allclose(np.ones((2, 3)) / (2 * 3), bary, atol=1e-2)
    np.testing.assert_allclose(bary, ot.bregman.convolutional_barycenter2d(A, 1e-3), atol=1e-12)


def test_not_implemented_method():
    """POT test/test_bregman.py::test_not_implemented_method: an unknown method is a
    ValueError (here naming ``method``)."""
    A = create_random_images_dist(42, size=6)
    for fn in (convolutional_barycenter2d, convolutional_barycenter2d_debiased):
        with pytest.raises(ValueError, match="method"):
            fn(A, 0.01, method="new_method")


@pytest.mark.parametrize("debiased", [False, True])
def test_convergence_warning_barycenters(debiased):
    """POT test/test_bregman.py::test_convergence_warning_barycenters: one iteration warns
    (a UserWarning; here sketchot's AccuracyWarning, a subclass)."""
    w = 10
    a1 = ot.datasets.make_1D_gauss(w**2, m=30, s=10)
    a2 = ot.datasets.make_1D_gauss(w**2, m=40, s=10)
    A_img = np.vstack((a1, a2)).T.reshape(2, w, w)
    A_img /= A_img.sum((1, 2))[:, None, None]
    fn = POT_BARYCENTERS[debiased][0]
    with pytest.warns(UserWarning, match="did not converge"):
        fn(A_img, 0.1, np.array([0.5, 0.5]), numItermax=1)
    with pytest.warns(sketchot.AccuracyWarning):
        fn(A_img, 0.1, np.array([0.5, 0.5]), numItermax=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn(A_img, 0.1, np.array([0.5, 0.5]), numItermax=1, warn=False)


@pytest.mark.parametrize("debiased", [False, True])
def test_weights_match_pot(debiased):
    """Non-uniform barycentric weights: POT's barycenter at POT's tolerance (atol 1e-3) on
    the same call, and to 1e-4 of its largest pixel after POT's number of iterations (the
    rest is POT's ``stabThr``: it takes ``log(K u + 1e-15)`` in the debiased form)."""
    ours_fn, pot_fn = POT_BARYCENTERS[debiased]
    A = create_random_images_dist(3, size=15)
    weights = np.array([0.2, 0.8])
    bary = ours_fn(A, 2e-2, weights, stopThr=1e-6)
    pot, log = pot_fn(A, 2e-2, weights, stopThr=1e-6, log=True)
    np.testing.assert_allclose(bary, pot, atol=1e-3)
    same = ours_fn(A, 2e-2, weights, stopThr=1e-300, numItermax=log["niter"] + 1, warn=False)
    # measured 7e-5 (debiased) and 3e-9 (plain) of the largest pixel
    assert np.abs(same - pot).max() < (1e-3 if debiased else 1e-7) * pot.max()


def test_debiased_reports_its_fixed_point_residual():
    A = create_random_images_dist(3, size=15)
    _, log = convolutional_barycenter2d_debiased(A, 2e-2, stopThr=1e-6, log=True)
    # POT's criterion met, the debiasing potential off its fixed point by 3e-7 (measured)
    assert 0.0 < log["debias_error"] < 1e-5
    _, log = convolutional_barycenter2d(A, 2e-2, log=True)
    assert log["debias_error"] == 0.0


# --------------------------------------------------------------------------- references
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize(
    ("shape", "reg"),
    [((40,), 1e-3), ((9, 7), 2e-3), ((5, 4, 6), 1e-2)],
)
def test_barycenter_matches_dense_log_kernel(shape, reg, debiased):
    """1-D, 2-D (non-square) and 3-D grids: the same iterates as the dense log-kernel
    iteration (log_convolve is exact up to rounding: 1e-12 relative after 60 iterations)."""
    A = blobs(shape, [(0.2,) * len(shape), (0.7,) * len(shape), (0.5,) * len(shape)],
              [0.01, 0.02, 0.005])  # fmt: skip
    A[0].flat[:3] = 0.0  # zero pixels
    A /= A.sum(axis=tuple(range(1, A.ndim)), keepdims=True)
    weights = np.array([0.5, 0.3, 0.2])
    grid = RegularGrid.from_shape(shape, extent=1.0)
    res = convolutional_barycenter(
        A, reg, weights, debiased=debiased, max_iter=60, tol=1e-300, warn=False
    )
    ref = dense_barycenter(A, grid, reg, weights, debiased, 60)
    assert res.n_iter == 60 and not res.converged
    np.testing.assert_allclose(res.barycenter, ref, rtol=1e-10, atol=1e-12 * ref.max())


def test_small_reg_where_pot_fails():
    """reg = 1e-3 on a 30 x 30 grid with blobs whose far pixels are 1e-100 and 1e-218: POT's
    multiplicative form overflows (``overflow encountered in divide``) and returns NaN
    everywhere; the log-domain iteration converges, and its barycenter is the dense
    log-kernel reference's."""
    A = blobs((30, 30), [(0.2, 0.3), (0.8, 0.6)], [0.005, 0.002])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pot = ot.bregman.convolutional_barycenter2d(A, 1e-3, numItermax=200)
    assert np.isnan(pot).all()
    res = convolutional_barycenter(A, 1e-3, tol=1e-6)
    assert res.converged and np.isfinite(res.barycenter).all()
    assert abs(res.barycenter.sum() - 1) < 1e-5
    # the plans' a side misses by what the stopping rule allows
    assert res.marginal_errors.max() < 1e-4
    grid = RegularGrid.from_shape((30, 30), extent=1.0)
    ref = dense_barycenter(A, grid, 1e-3, np.array([0.5, 0.5]), False, res.n_iter)
    np.testing.assert_allclose(res.barycenter, ref, rtol=1e-9, atol=1e-12)
    # the mass sits between the blobs: the barycenter's mean is the blobs' mean average
    axes = np.meshgrid(np.linspace(0, 1, 30), np.linspace(0, 1, 30), indexing="ij")
    mean = [float((res.barycenter * x).sum()) for x in axes]
    np.testing.assert_allclose(mean, [0.5, 0.45], atol=1e-2)


def test_zero_regions_keep_the_exact_iterates():
    """Images with zero regions at reg = 1e-3 (16 x 16, 100 iterations, no stopping): the
    iterates are the dense log-kernel reference's to rounding, while POT's multiplicative
    ones leave them (POT 0.9.7: 0.59 apart in L1, measured; 8e-8 without the zeros)."""
    A = create_random_images_dist(42, size=16)
    A[0, :, :5] = 0.0
    A[1, 10:, :] = 0.0
    A /= A.sum(axis=(1, 2), keepdims=True)
    ours = convolutional_barycenter(A, 1e-3, max_iter=100, tol=1e-300, warn=False).barycenter
    grid = RegularGrid.from_shape((16, 16), extent=1.0)
    ref = dense_barycenter(A, grid, 1e-3, np.array([0.5, 0.5]), False, 100)
    assert np.abs(ours - ref).sum() < 1e-12
    pot = ot.bregman.convolutional_barycenter2d(A, 1e-3, numItermax=100, stopThr=1e-300,
                                                warn=False)  # fmt: skip
    assert np.abs(pot - ref).sum() > 0.1


def test_debiased_barycenter_of_one_histogram_is_itself():
    """Janati et al.: the debiased barycenter minimises a sum of Sinkhorn divergences, which
    is 0 at the histogram itself; the plain one is blurred. Weights (1, 0)."""
    A = blobs((40,), [(0.3,), (0.7,)], [0.01, 0.01])
    res = convolutional_barycenter(A, 2e-3, [1.0, 0.0], debiased=True, tol=1e-9)
    plain = convolutional_barycenter(A, 2e-3, [1.0, 0.0], tol=1e-9)
    # measured 2e-6 of the peak (the debiasing potential's ten steps per iteration)
    assert np.abs(res.barycenter - A[0]).max() < 1e-4 * A[0].max()
    assert np.abs(plain.barycenter - A[0]).max() > 0.05 * A[0].max()


def test_two_diracs_meet_in_the_middle():
    A = np.zeros((2, 61))
    A[0, 10], A[1, 50] = 1.0, 1.0
    res = convolutional_barycenter(A, 1e-3, debiased=True)
    assert int(np.argmax(res.barycenter)) == 30 and res.converged


def test_same_call_same_bits_and_inputs_untouched():
    A = create_random_images_dist(1, size=12)
    A[:, 0, :] = 0.0
    A /= A.sum(axis=(1, 2), keepdims=True)
    frozen = A.copy()
    frozen.setflags(write=False)
    strided = np.asfortranarray(A)[:, ::1, ::1]
    first = convolutional_barycenter2d(frozen, 5e-3)
    second = convolutional_barycenter2d(strided, 5e-3)
    assert np.array_equal(first, second)
    assert np.array_equal(frozen, A)


# --------------------------------------------------------------------------- bad inputs
def test_barycenter_bad_inputs_name_the_argument():
    A = create_random_images_dist(0, size=5)
    with pytest.raises(ValueError, match="weights must be barycentric"):
        convolutional_barycenter2d(A, 0.01, [0.5, 0.6])
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        convolutional_barycenter2d(A, 0.01, [1.0])
    with pytest.raises(ValueError, match="reg must be > 0"):
        convolutional_barycenter2d(A, 0.0)
    with pytest.raises(ValueError, match="A must hold histograms of equal mass"):
        convolutional_barycenter2d(A * np.array([1.0, 2.0])[:, None, None], 0.01)
    with pytest.raises(ValueError, match="A must be non-negative"):
        convolutional_barycenter2d(A - 1.0, 0.01)
    bad = A.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="A must contain only finite"):
        convolutional_barycenter2d(bad, 0.01)
    with pytest.raises(ValueError, match=r"A must have shape \(n_hists, width, height\)"):
        convolutional_barycenter2d(A[:, 0], 0.01)
    with pytest.raises(ValueError, match="A must have a positive mass"):
        convolutional_barycenter(np.zeros((2, 4)), 0.01)
    with pytest.raises(ValueError, match="grid has shape"):
        convolutional_barycenter(A, 0.01, grid=RegularGrid.from_shape((5, 6)))
    with pytest.raises(TypeError, match=r"grid must be a sketchot\.grid\.RegularGrid"):
        convolutional_barycenter(A, 0.01, grid=(5, 5))
    with pytest.raises(TypeError, match="debiased must be True or False"):
        convolutional_barycenter(A, 0.01, debiased=1)
    with pytest.raises(ValueError, match="max_iter must be >= 1"):
        convolutional_barycenter(A, 0.01, max_iter=0)


# --------------------------------------------------------------------------- divergence
def histograms(rng, shape, zeros=True):
    a = rng.random(shape)
    if zeros:
        a.flat[:3] = 0.0
    b = rng.random(shape) ** 3
    return a / a.sum(), b / b.sum()


@pytest.mark.parametrize(
    ("reg", "reg_m", "spacing"),
    [(0.05, None, None), (1e-2, None, None), (2e-3, None, None), (0.05, 0.5, None),
     (1e-2, 0.1, None), (2.0, None, 1.0), (2.0, 5.0, 1.0)],
)  # fmt: skip
def test_divergence_matches_sinkhorn_divergence_on_the_points(reg, reg_m, spacing):
    """The grid's points as clouds, sketchot.sinkhorn_divergence on the exact kernel (tol
    1e-12): value and both gradients (measured 1e-13 and 4e-10 apart; tol=1e-9 on the
    log-scalings bounds the potentials' error by ~1e-9 reg)."""
    rng = np.random.default_rng(0)
    shape = (7, 6)
    a, b = histograms(rng, shape)
    grid = None if spacing is None else RegularGrid.from_shape(shape, spacing)
    res = sinkhorn_divergence_grid(a, b, reg, grid=grid, reg_m=reg_m)
    P = res.grid.points()
    ref = sketchot.sinkhorn_divergence(
        P, P, a.ravel(), b.ravel(), reg=reg, reg_m=reg_m, backend="exact", tol=1e-12,
        max_iter=100000,
    )  # fmt: skip
    assert res.converged
    assert abs(res.value - ref.value) < 1e-10 * max(1.0, abs(ref.value))
    scale = max(1.0, np.abs(ref.grad_a).max())
    assert np.abs(res.grad_a - ref.grad_a.reshape(shape)).max() < 1e-8 * scale
    assert np.abs(res.grad_b - ref.grad_b.reshape(shape)).max() < 1e-8 * scale
    if reg_m is None:
        assert res.marginal_error < 1e-8


@pytest.mark.parametrize("reg_m", [None, 0.1])
def test_divergence_gradient_by_finite_differences(reg_m):
    """Central differences along directions that keep the masses equal (balanced) or any
    direction (unbalanced), zero pixels of a kept at zero: agreement to 1e-6 relative
    (the h^2 term at h = 1e-6 and the solves' tol=1e-13)."""
    rng = np.random.default_rng(1)
    shape = (6, 5)
    a, b = histograms(rng, shape)
    reg, h = 1e-2, 1e-6
    res = sinkhorn_divergence_grid(a, b, reg, reg_m=reg_m, tol=1e-13)
    for side, base in (("a", a), ("b", b)):
        d = rng.normal(size=shape) * base  # relative steps: never below zero
        if reg_m is None:
            d -= base * d.sum() / base.sum()
        args = {"a": a, "b": b}

        def value(t, side=side, d=d, args=args):
            moved = dict(args, **{side: args[side] + t * d})
            return sinkhorn_divergence_grid(moved["a"], moved["b"], reg, reg_m=reg_m,
                                            tol=1e-13).value  # fmt: skip

        fd = (value(h) - value(-h)) / (2 * h)
        grad = res.grad_a if side == "a" else res.grad_b
        assert abs(fd - np.vdot(grad, d)) <= 1e-6 * max(abs(fd), 1e-3), side


def test_divergence_zero_pixels_get_the_continuous_extension():
    """Where a is 0 the gradient is finite: sketchot.sinkhorn_divergence's extension."""
    rng = np.random.default_rng(2)
    a, b = histograms(rng, (8, 8))
    a[2:5, 2:5] = 0.0
    a /= a.sum()
    res = sinkhorn_divergence_grid(a, b, 5e-3)
    assert np.isfinite(res.grad_a).all()
    P = res.grid.points()
    ref = sketchot.sinkhorn_divergence(P, P, a.ravel(), b.ravel(), reg=5e-3, backend="exact",
                                       tol=1e-12, max_iter=100000)  # fmt: skip
    zero = a.ravel() == 0
    np.testing.assert_allclose(res.grad_a.ravel()[zero], ref.grad_a[zero], atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), reg=st.sampled_from([2e-2, 0.1, 0.5]))
def test_divergence_symmetric_and_nonnegative(seed, reg):
    """reg from a third of the squared spacing (0.0625) up: below it the kernel is nearly
    diagonal and Sinkhorn needs more than max_iter (see the next test)."""
    rng = np.random.default_rng(seed)
    a, b = histograms(rng, (5, 4), zeros=False)
    ab = sinkhorn_divergence_grid(a, b, reg)
    ba = sinkhorn_divergence_grid(b, a, reg)
    # the same three problems, solved in the other order: tol-level agreement
    assert abs(ab.value - ba.value) < 1e-10
    np.testing.assert_allclose(ab.grad_a, ba.grad_b, atol=1e-8)
    assert ab.value > -1e-12


def test_divergence_warns_with_the_measured_error_below_the_grid_spacing():
    """reg = 3e-3 on a 5 x 4 grid (squared spacing 0.0625), b with pixels of 4e-7: 10,000
    iterations leave a marginal error of 3.6e-4 (measured), which the warning reports."""
    rng = np.random.default_rng(1454018448)  # found by hypothesis
    a, b = histograms(rng, (5, 4), zeros=False)
    with pytest.warns(sketchot.AccuracyWarning, match="below the squared grid spacing") as rec:
        res = sinkhorn_divergence_grid(a, b, 3e-3, max_iter=2000)
    assert not res.converged and f"{res.marginal_error:.2e}" in str(rec[0].message)


def test_divergence_of_identical_histograms_is_zero():
    rng = np.random.default_rng(3)
    a, _ = histograms(rng, (6, 6))
    res = sinkhorn_divergence_grid(a, a.copy(), 1e-2)
    assert res.value == 0.0 and not res.grad_a.any() and not res.grad_b.any()


def test_divergence_small_reg_on_an_image_grid():
    """reg = 5e-4 of the unit square on 48 x 48 (exponent range 2000, beyond float64's 700):
    every potential finite, the plan's a side within 1e-7. For a translate ``b = a(. - t)``
    the squared cost gives ``OT(a, b) = OT(a, a) + |t|^2`` and ``OT(b, b) = OT(a, a)``, so
    ``S = |t|^2 = 0.25``; the blobs are cut by the grid's edge (measured 0.2499963)."""
    A = blobs((48, 48), [(0.3, 0.3), (0.6, 0.7)], [0.01, 0.01])
    res = sinkhorn_divergence_grid(A[0], A[1], 5e-4, tol=1e-7)
    assert res.converged and np.isfinite(res.grad_a).all()
    assert res.marginal_error < 1e-7
    assert abs(res.value - 0.25) < 1e-5


def test_divergence_descends_in_an_optimiser_loop():
    """Mirror descent on a's weights, updated in place: S decreases step after step."""
    rng = np.random.default_rng(4)
    a, b = histograms(rng, (10, 10), zeros=False)
    values = []
    for _ in range(5):
        res = sinkhorn_divergence_grid(a, b, 1e-2, tol=1e-10)
        values.append(res.value)
        a *= np.exp(-2.0 * res.grad_a)
        a /= a.sum()
    assert all(later < earlier for earlier, later in itertools.pairwise(values))


def test_divergence_bad_inputs_name_the_argument():
    rng = np.random.default_rng(5)
    a, b = histograms(rng, (4, 4))
    with pytest.raises(ValueError, match="b must have a's shape"):
        sinkhorn_divergence_grid(a, b[:3], 0.1)
    with pytest.raises(ValueError, match="a and b must have equal masses"):
        sinkhorn_divergence_grid(a, 2 * b, 0.1)
    with pytest.raises(ValueError, match="a must be non-negative"):
        sinkhorn_divergence_grid(-a, b, 0.1)
    with pytest.raises(ValueError, match="b must contain only finite"):
        sinkhorn_divergence_grid(a, b * np.nan, 0.1)
    with pytest.raises(ValueError, match="reg_m must be > 0"):
        sinkhorn_divergence_grid(a, b, 0.1, reg_m=-1.0)
    with pytest.raises(TypeError, match="reg must be a real number"):
        sinkhorn_divergence_grid(a, b, "0.1")
    with pytest.raises(ValueError, match="grid has shape"):
        sinkhorn_divergence_grid(a, b, 0.1, grid=RegularGrid.from_shape((4, 5)))
    with pytest.raises(ValueError, match="a must have a positive total mass"):
        sinkhorn_divergence_grid(0 * a, b, 0.1, reg_m=1.0)


# --------------------------------------------------------------------------- PyTorch
def test_divergence_on_tensors_is_a_loss():
    """Tensors in, a differentiable 0-d tensor out (its dtype), whose gradient is grad_a;
    an optimiser on logits, updating them in place, lowers S; no second derivative."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    a, b = histograms(rng, (8, 7), zeros=False)
    ta = torch.tensor(a, requires_grad=True)
    value = sketchot.sinkhorn_divergence_grid(ta, b, 1e-2)
    value.backward()
    ref = sinkhorn_divergence_grid(a, b, 1e-2)
    assert value.item() == ref.value
    np.testing.assert_array_equal(ta.grad.numpy(), ref.grad_a)

    logits = torch.zeros((8, 7), dtype=torch.float32, requires_grad=True)
    target = torch.tensor(b, dtype=torch.float32)
    optimiser = torch.optim.SGD([logits], lr=50.0)
    values = []
    for _ in range(4):
        optimiser.zero_grad()
        loss = sketchot.sinkhorn_divergence_grid(torch.softmax(logits.ravel(), 0).reshape(8, 7),
                                                 target, 1e-2)  # fmt: skip
        assert loss.dtype == torch.float32
        loss.backward()
        optimiser.step()
        values.append(loss.item())
    assert all(later < earlier for earlier, later in itertools.pairwise(values))

    tb = torch.tensor(b, requires_grad=True)
    (grad,) = torch.autograd.grad(sketchot.sinkhorn_divergence_grid(ta, tb, 1e-2), tb,
                                  create_graph=True)  # fmt: skip
    with pytest.raises(RuntimeError):
        grad.sum().backward()
