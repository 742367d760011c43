"""LocalGaussianExpansion: every kernel entry to a small relative error, in every product form.

Tolerances: the expansion promises ``|K~_ij / K_ij - 1| <= entry_error_bound_`` (about 5.5e-10
with the defaults: the polynomial's relative error on [-tau, tau] plus rounding). A product
with non-negative weights inherits the same relative bound (a positive combination of entries
each off by at most that factor); the exact reference (``sketchot.gibbs``) adds its own
rounding of ``||x||^2 + ||y||^2 - 2 x.y``, a few eps times ``max ||x - y||^2 / reg``, which the
small ``ROUNDING`` slack covers. Signed weights are compared relative to ``|K| |V|``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.gibbs import gibbs_block, gibbs_log_matvec, gibbs_matmat, gibbs_softmax_average
from sketchot.sketch import local
from sketchot.sketch.local import (
    LocalGaussianExpansion,
    _cover,
    _local_monomials,
    _MonomialPlan,
)

IMAGES = Path(__file__).resolve().parents[2] / "images"
REGS = (0.1, 0.03, 0.01, 0.003)
# Slack for the exact reference's own rounding (exponents up to ~3 / 0.003 = 1000).
ROUNDING = 1e-12


def colours(n: int, seed: int, name: str = "default_source.png") -> np.ndarray:
    return sample_pixels(load_image(IMAGES / name), n, rng=seed, replace=True).colors


def clouds(kind: str, n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "photo":
        return colours(n, seed), colours(m, seed + 1, "default_target.png")
    rng = np.random.default_rng(seed)
    return rng.random((n, 3)), rng.random((m, 3))


@pytest.mark.parametrize("exact_below", [0, 8])
@pytest.mark.parametrize("kind", ["photo", "uniform"])
@pytest.mark.parametrize("reg", REGS)
def test_every_entry_within_reported_bound(kind, reg, exact_below):
    X, Y = clouds(kind, 120, 140, seed=3)
    kernel = LocalGaussianExpansion(reg, exact_below=exact_below, rng=0).fit(X, Y)
    approx = kernel.matmat(np.eye(Y.shape[0]))
    exact = gibbs_block(X, Y, reg)
    # Entries below ~1e-250 are at the edge of float64 in the exact kernel too.
    live = exact > 1e-250
    assert np.all(approx[live] > 0)
    rel = np.abs(approx[live] / exact[live] - 1)
    assert rel.max() <= kernel.entry_error_bound_ + ROUNDING
    assert kernel.entry_error_bound_ < 1e-9


@pytest.mark.parametrize("reg", REGS)
def test_linear_products_match_exact(reg):
    rng = np.random.default_rng(5)
    X, Y = clouds("photo", 300, 250, seed=7)
    kernel = LocalGaussianExpansion(reg, rng=1).fit(X, Y)
    bound = kernel.entry_error_bound_ + ROUNDING
    v = rng.random(250)
    exact = gibbs_matmat(X, Y, reg, v)
    assert np.max(np.abs(kernel.matmat(v) / exact - 1)) <= bound
    V = rng.normal(size=(250, 3))
    scale = gibbs_matmat(X, Y, reg, np.abs(V))  # |K| |V|: the scale of a signed product
    assert np.max(np.abs(kernel.matmat(V) - gibbs_matmat(X, Y, reg, V)) / scale) <= bound
    U = rng.normal(size=(300, 2))
    scale = gibbs_matmat(Y, X, reg, np.abs(U))
    assert np.max(np.abs(kernel.rmatmat(U) - gibbs_matmat(Y, X, reg, U)) / scale) <= bound
    assert kernel.rmatmat(U[:, 0]).shape == (250,)


@pytest.mark.parametrize("reg", REGS)
def test_log_products_with_scalings_spanning_hundreds_of_orders(reg):
    rng = np.random.default_rng(11)
    X, Y = clouds("photo", 400, 350, seed=13)
    kernel = LocalGaussianExpansion(reg, rng=2).fit(X, Y)
    # log relative error = log(1 + delta): within the entry bound (plus exponent rounding,
    # a few eps times |log values| ~ 1000).
    tol = kernel.entry_error_bound_ + 1e-11
    log_v = 300 * rng.normal(size=350)
    log_u = 300 * rng.normal(size=400)
    assert np.max(np.abs(kernel.log_matvec(log_v) - gibbs_log_matvec(X, Y, reg, log_v))) <= tol
    assert np.max(np.abs(kernel.log_rmatvec(log_u) - gibbs_log_matvec(Y, X, reg, log_u))) <= tol


def test_zero_weights_in_log_domain():
    X, Y = clouds("photo", 200, 220, seed=17)
    kernel = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    log_v = np.zeros(220)
    log_v[::3] = -np.inf
    keep = np.isfinite(log_v)
    expected = gibbs_log_matvec(X, Y[keep], 0.01, log_v[keep])
    assert np.max(np.abs(kernel.log_matvec(log_v) - expected)) <= 1e-9
    assert np.all(kernel.log_matvec(np.full(220, -np.inf)) == -np.inf)


def test_out_of_sample_points_and_barycentric_map():
    rng = np.random.default_rng(19)
    X, Y = clouds("photo", 500, 400, seed=21)
    reg = 0.01
    kernel = LocalGaussianExpansion(reg, rng=3).fit(X, Y)
    # New pixels from the same image (mostly in fitted clusters) and uniform points (many
    # outside every fitted cluster: they get clusters of their own).
    X_new = np.concatenate([colours(300, 23), rng.random((100, 3))])
    log_v = 50 * rng.normal(size=400)
    exact = gibbs_log_matvec(X_new, Y, reg, log_v)
    assert np.max(np.abs(kernel.log_matvec_new(X_new, log_v) - exact)) <= 1e-9
    mapped = kernel.barycentric_map(X_new, log_v)
    expected = gibbs_softmax_average(X_new, Y, reg, log_v, Y)
    # Signed values [1, y - c]: the average's error is relative to the spread of Y (< 1).
    assert np.max(np.abs(mapped - expected)) <= 1e-8


@pytest.mark.parametrize("truncate", [0.0, 1e-6])
@pytest.mark.parametrize("exact_below", [0, 8])
@pytest.mark.parametrize("kind", ["photo", "uniform"])
def test_log_means_are_the_weighted_means_of_the_other_cloud(kind, exact_below, truncate):
    """``log_means`` gives ``log(K e^w)`` within the product's bound and the means of the
    other cloud within ``means_error_bound_`` (``2 (entry bound + truncate) reach +
    poly_error' rho``, the offsets' degree r - 1 fit), both ways, with zero weights."""
    X, Y = clouds(kind, 500, 420, seed=61)
    reg = 0.01
    rng = np.random.default_rng(6)
    kernel = LocalGaussianExpansion(
        reg, tau=2.0, rtol=1e-7, exact_below=exact_below, truncate=truncate, rng=0
    ).fit(X, Y)
    assert kernel.supports_means
    for transpose, (P, Q) in ((False, (X, Y)), (True, (Y, X))):
        log_w = 20 * rng.normal(size=Q.shape[0])
        log_w[::7] = -np.inf
        keep = np.isfinite(log_w)
        log_sum, means = kernel.log_means(log_w, transpose=transpose)
        expected = gibbs_log_matvec(P, Q[keep], reg, log_w[keep])
        bound = kernel.entry_error_bound_ + truncate + ROUNDING
        assert np.max(np.abs(log_sum - expected)) <= bound
        tol = kernel.means_error_bound_ + ROUNDING
        exact = gibbs_softmax_average(P, Q[keep], reg, log_w[keep], Q[keep])
        assert np.max(np.abs(means - exact)) <= tol
    # a row with no weight: -inf and means 0
    log_sum, means = kernel.log_means(np.full(420, -np.inf))
    assert np.all(log_sum == -np.inf) and np.all(means == 0.0)


def test_log_means_need_degree_three():
    X = np.random.default_rng(0).random((50, 3))
    kernel = LocalGaussianExpansion(0.1, degree=2, rng=0).fit(X)
    assert not kernel.supports_means and not kernel.means_match_products
    assert kernel.means_error_bound_ == np.inf
    with pytest.raises(NotImplementedError, match="degree >= 3"):
        kernel.log_means(np.zeros(50))


def test_the_block_local_kernel_declares_means_where_they_match_products():
    """Small clusters (uniform points at reg 0.01, tau = 4, the default accuracy's rtol):
    the offsets' degree r - 1 error over the radius stays below the centres' share, and the
    kernel declares 'log_means'; clusters of radius 0.7 over the unit cube (reg 1) leave
    most of the spread to the offsets: a log product per coordinate instead."""
    from sketchot.gibbs import GibbsGeometry
    from sketchot.kernels.local import build_local

    rng = np.random.default_rng(2)
    X, Y = rng.random((400, 3)), rng.random((300, 3))
    small = build_local(GibbsGeometry(X, Y, 0.01), rng=0, tau=4.0, rtol=2e-5)
    assert small.expansion.means_match_products
    assert "log_means" in small.info.capabilities
    wide = build_local(GibbsGeometry(X, Y, 1.0), rng=0, rtol=2e-5)
    assert wide.expansion.rho_ > 0.7 and not wide.expansion.means_match_products
    assert "log_means" not in wide.info.capabilities


def test_dimension_limit_is_refused_with_a_clear_error():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"d = 5 .* d <= 4"):
        LocalGaussianExpansion(0.1).fit(rng.random((50, 5)))
    kernel = LocalGaussianExpansion(0.5, rng=0).fit(rng.random((60, 4)))
    assert kernel.n_features_ == 715  # C(9 + 4, 4)
    exact = gibbs_block(kernel._x.points_centred(), kernel._x.points_centred(), 0.5)
    assert np.allclose(kernel.matmat(np.ones(60)), exact.sum(axis=1), rtol=1e-9, atol=0)
    # A larger feature budget is an explicit choice.
    LocalGaussianExpansion(0.1, max_features=3000, rng=0).fit(rng.random((20, 5)))


@pytest.mark.parametrize("kind", ["photo", "uniform"])
def test_clusters_cover_within_radius(kind):
    X, Y = clouds(kind, 3000, 2000, seed=29)
    kernel = LocalGaussianExpansion(0.01, rng=4).fit(X, Y)
    assert max(kernel.cluster_radius_) <= kernel.rho_
    labels, centers = _cover(X, 0.05, np.random.default_rng(0))
    assert np.linalg.norm(X - centers[labels], axis=1).max() <= 0.05
    assert np.all(np.bincount(labels) > 0)  # no empty cluster
    # Sampled first pass, then the leftovers: every point still covered.
    labels, centers = _cover(X, 0.05, np.random.default_rng(0), centers=centers[:3])
    assert np.linalg.norm(X - centers[labels], axis=1).max() <= 0.05


def test_local_monomials_expand_the_polynomial_exactly():
    rng = np.random.default_rng(31)
    coef = rng.random(7) + 0.1
    plan = _MonomialPlan(3, 6, coef)
    assert plan.n_features == 84  # C(6 + 3, 3)
    U, W = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    gram = _local_monomials(U, plan) @ _local_monomials(W, plan).T
    expected = np.polynomial.polynomial.polyval(U @ W.T, coef)
    assert np.allclose(gram, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(0.002), np.log(1.0)),
    tau=st.sampled_from([0.5, 1.0, 2.0]),
    spread=st.floats(0.1, 3.0),
)
def test_relative_error_of_positive_products_within_bound(seed, log_reg, tau, spread):
    """Invariant: for positive v, |(K~ v) / (K v) - 1| <= entry_error_bound_ on any cloud."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    X = spread * rng.random((int(rng.integers(1, 80)), 3))
    Y = spread * rng.normal(size=(int(rng.integers(1, 80)), 3))
    kernel = LocalGaussianExpansion(reg, tau=tau, rng=rng).fit(X, Y)
    log_v = 20 * rng.normal(size=Y.shape[0])
    error = np.abs(kernel.log_matvec(log_v) - gibbs_log_matvec(X, Y, reg, log_v))
    # Exponents reach spread^2 / reg ~ 4500: the reference's rounding grows with them.
    assert error.max() <= kernel.entry_error_bound_ + 1e-15 * (1 + 9 * spread**2 / reg)


def test_invalid_arguments():
    X = np.random.default_rng(0).random((10, 3))
    with pytest.raises(RuntimeError, match="not fitted"):
        LocalGaussianExpansion(0.1).log_matvec(np.zeros(10))
    with pytest.raises(ValueError, match="reg must be > 0"):
        LocalGaussianExpansion(0.0).fit(X)
    with pytest.raises(ValueError, match="tau must be <= 4"):
        LocalGaussianExpansion(0.1, tau=5.0).fit(X)
    with pytest.raises(ValueError, match="rtol"):
        LocalGaussianExpansion(0.1, rtol=1e-20).fit(X)
    kernel = LocalGaussianExpansion(0.1, rng=0).fit(X)
    with pytest.raises(ValueError, match=r"log_v must have shape \(10,\)"):
        kernel.log_matvec(np.zeros(9))
    with pytest.raises(ValueError, match="NaN"):
        kernel.log_matvec(np.full(10, np.nan))
    with pytest.raises(ValueError, match="V must have shape"):
        kernel.matmat(np.zeros((3, 10)))
    with pytest.raises(ValueError, match="X_new must have 3 columns"):
        kernel.log_matvec_new(np.zeros((4, 2)), np.zeros(10))


def test_features_recomputed_when_over_budget_give_the_same_products():
    X, Y = clouds("photo", 300, 200, seed=37)
    log_v = np.random.default_rng(1).normal(size=200)
    stored = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    streamed = LocalGaussianExpansion(0.01, max_feature_bytes=0, rng=0).fit(X, Y)
    assert streamed._x.features is None
    assert np.allclose(stored.log_matvec(log_v), streamed.log_matvec(log_v), rtol=0, atol=1e-13)


def test_kept_padded_features_give_the_same_products():
    X, Y = clouds("uniform", 400, 300, seed=61)
    log_v = np.random.default_rng(2).normal(size=300)
    kernel = LocalGaussianExpansion(0.03, exact_below=0, truncate=1e-9, rng=0).fit(X, Y)
    first = kernel.log_matvec(log_v)
    assert kernel._y.padded  # the input side's batches were kept
    assert np.array_equal(kernel.log_matvec(log_v), first)
    # features stored, no budget left for padded copies: the same products
    exact_fit = (400 + 300) * kernel.n_features_ * 8
    fresh = LocalGaussianExpansion(
        0.03, exact_below=0, truncate=1e-9, max_feature_bytes=exact_fit, rng=0
    ).fit(X, Y)
    assert fresh._y.features is not None and fresh._y.padded_budget == 0
    assert np.allclose(fresh.log_matvec(log_v), first, rtol=0, atol=1e-13)
    assert not fresh._y.padded


def test_padded_features_kept_by_concurrent_threads_stay_within_their_budget():
    """The products' pool threads fill the padded cache together (a product at 10^5 points
    once failed with 'dictionary changed size during iteration'): many threads asking for
    every batch at once keep each batch once, the byte count exact and within the budget,
    and every answer equal to the features it pads."""
    from concurrent.futures import ThreadPoolExecutor

    X, Y = clouds("uniform", 600, 500, seed=67)
    kernel = LocalGaussianExpansion(0.03, exact_below=0, rng=0).fit(X, Y)
    side = kernel._y
    batches = [b for b in side.batches(np.arange(side.n_clusters), 4) if b.index is not None]
    assert len(batches) > 10
    sizes = [side.features[b.index].nbytes for b in batches]
    side.padded_budget = sum(sizes) // 2  # room for about half of them
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(side.batch_features, batches * 8))
    for batch, answer in zip(batches * 8, answers, strict=True):
        assert np.array_equal(answer, side.features[batch.index])
    assert side.padded_bytes == sum(a.nbytes for a in side.padded.values())
    assert 0 < side.padded_bytes <= side.padded_budget


def test_large_clusters_in_row_blocks_give_the_same_products(monkeypatch):
    """Clusters above the row block are streamed (two passes for the input side's shift)."""
    X, Y = clouds("photo", 3000, 2500, seed=47)
    rng = np.random.default_rng(3)
    log_v, V = 30 * rng.normal(size=2500), rng.random((2500, 2))
    kernel = LocalGaussianExpansion(0.03, rng=0).fit(X, Y)
    expected_log, expected = kernel.log_matvec(log_v), kernel.matmat(V)
    monkeypatch.setattr(local.clusters, "_ROW_BLOCK", 64)
    assert np.allclose(kernel.log_matvec(log_v), expected_log, rtol=0, atol=1e-12)
    assert np.allclose(kernel.matmat(V), expected, rtol=1e-12, atol=0)
    exact = gibbs_log_matvec(X[:200], Y, 0.03, log_v)
    assert np.max(np.abs(kernel.log_matvec(log_v)[:200] - exact)) <= 1e-9


def test_log_domain_sinkhorn_reaches_true_kernel_marginals():
    """The library's log-domain Sinkhorn on the expansion reaches the true kernel's marginals.

    At reg 0.01 on 2000 photo colours the scalings span about twenty orders of magnitude; with
    entries exact to ~1e-9 the true-kernel marginal error of the returned scalings reaches
    1e-6 (the approximate fixed point is within ~entry error of the true one).
    """
    reg = 0.01
    X = colours(2000, 41)
    Y = colours(2000, 43, "default_target.png")
    # entries to 1e-9 (sized from the accuracy)
    kernel = sketchot.make_kernel(X, Y, reg, "polyts", variant="local", accuracy=1e-7, rng=0)
    # L2 residual 1e-10 over 2000 columns: L1 at most sqrt(2000) 1e-10, below 1e-8
    result = sketchot.sinkhorn_kernel(None, None, kernel, tol=1e-10, accuracy=None)
    assert result.converged and result.iteration_info["strategy"] == "log"
    log_u, log_v = result.potentials
    assert np.ptp(log_v) > 40  # scalings spanning > 1e17: absolute-error kernels fail here
    a = np.full(2000, 1 / 2000)
    rows = np.exp(log_u + gibbs_log_matvec(X, Y, reg, log_v))
    cols = np.exp(log_v + gibbs_log_matvec(Y, X, reg, log_u))
    error = np.abs(rows - a).sum() + np.abs(cols - a).sum()
    assert error <= 1e-6


# ---------------------------------------------------------------------- truncation
def _pair_sums(kernel, log_v):
    """Exact ``S_iB = sum_{j in B} exp(log_v_j - ||x_i - y_j||^2 / reg)`` per row (sorted
    order) and expanded input cluster, with the inputs ``_kept_pairs`` reads."""
    x, y = kernel._x, kernel._y
    w = log_v[y.order]
    kb = y.n_small
    starts = y.offsets[kb:-1]
    with np.errstate(invalid="ignore"):  # a cluster of zero weights only: NaN, its sum is 0
        S = np.stack(
            [
                np.exp(gibbs_log_matvec(x.points, y.points[s:e], kernel.reg, w[s:e]))
                for s, e in zip(starts, y.offsets[kb + 1 :], strict=True)
            ],
            axis=1,
        )
    S = np.nan_to_num(S, nan=0.0)
    bounds = local._input_bounds(y, w)
    return S, bounds


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(0.003), np.log(0.3)),
    spread=st.floats(0.5, 3.0),
    weight_spread=st.floats(0.0, 30.0),
    truncate=st.sampled_from([1e-12, 1e-6, 1e-2]),
)
def test_skipped_cluster_pairs_hold_at_most_truncate_of_every_row(
    seed, log_reg, spread, weight_spread, truncate
):
    """Invariant (the bound of ``_kept_pairs``, stated there): for any clouds and weights,
    the pairs a truncated product skips carry at most ``truncate`` of each row's exact sum."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    X, Y = spread * rng.random((150, 3)), spread * rng.random((130, 3))
    kernel = LocalGaussianExpansion(reg, exact_below=0, rng=rng).fit(X, Y)
    log_v = weight_spread * rng.normal(size=130)
    S, bounds = _pair_sums(kernel, log_v)
    x, y = kernel._x, kernel._y
    pair_sq = np.sum((x.centers[:, None, :] - y.centers[None, :, :]) ** 2, axis=2)
    keep = local._kept_pairs(pair_sq, x.centers, x.cluster_radius, bounds, reg, truncate)
    labels = np.repeat(np.arange(x.n_clusters), np.diff(x.offsets))
    skipped = np.where(keep[labels], 0.0, S).sum(axis=1)
    # exp() of the reference rounds at a few eps relative
    assert np.all(skipped <= truncate * S.sum(axis=1) * (1 + 1e-12))
    assert np.all(keep.any(axis=1))  # a row never loses all of its pairs


def _kept_pairs_by_full_sort(pair_sq, centers, radius, bounds, reg, truncate, exact_first):
    """The rule of ``_kept_pairs`` as first written: every bound of a row sorted and summed
    in order (the reference for its shortcut)."""
    distance = np.sqrt(pair_sq)
    near = np.maximum(distance - radius[:, None] - bounds.radius[None, :], 0.0)
    upper = bounds.log_size + bounds.top - near * near / reg
    lower = local.truncation._row_sum_lower_bound(distance, centers, radius, bounds, reg)
    with np.errstate(invalid="ignore"):
        order = np.argsort(upper, axis=1)
        running = np.logaddexp.accumulate(np.take_along_axis(upper, order, axis=1), axis=1)
        skipped = running <= (lower + np.log(truncate))[:, None]
        exact = np.take_along_axis(
            np.broadcast_to(np.arange(upper.shape[1]) < exact_first, upper.shape), order, axis=1
        )
        limit = lower + np.log(min(truncate, local.truncation.EXACT_SKIP))
        skipped &= ~exact | (running <= limit[:, None])
    keep = np.ones_like(upper, dtype=bool)
    np.put_along_axis(keep, order, ~skipped, axis=1)
    return keep


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(0.002), np.log(0.1)),
    weight_spread=st.floats(0.0, 30.0),
    zero_weights=st.booleans(),
    truncate=st.sampled_from([1e-12, 2e-5, 1e-2]),
    exact_share=st.floats(0.0, 1.0),
)
def test_kept_pairs_sort_only_the_bounds_that_can_be_kept(
    seed, log_reg, weight_spread, zero_weights, truncate, exact_share
):
    """``_kept_pairs`` sorts and sums in order only the bounds above the row's smallest limit
    less log k (those below are skipped whatever comes first, their sum taken at once): the
    same pairs as sorting every bound of the row, exactly handled columns (EXACT_SKIP) and
    clusters of zero weights (bounds -inf) included; the running sums differ in rounding
    only, so a pair could differ only at a bound within rounding of the limit."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    X, Y = rng.random((250, 3)), rng.random((230, 3))
    kernel = LocalGaussianExpansion(reg, exact_below=0, rng=rng).fit(X, Y)
    log_v = weight_spread * rng.normal(size=230)
    if zero_weights:
        log_v[kernel._y.order[: kernel._y.offsets[3]]] = -np.inf  # the first clusters
    x, y = kernel._x, kernel._y
    bounds = local._input_bounds(y, log_v[y.order], first=0)
    pair_sq = np.sum((x.centers[:, None, :] - y.centers[None, :, :]) ** 2, axis=2)
    exact_first = int(exact_share * y.n_clusters)
    args = (pair_sq, x.centers, x.cluster_radius, bounds, reg, truncate)
    keep = local._kept_pairs(*args, exact_first=exact_first)
    np.testing.assert_array_equal(keep, _kept_pairs_by_full_sort(*args, exact_first))


@pytest.mark.parametrize("kind", ["photo", "uniform"])
def test_truncated_log_products_within_entry_bound_plus_truncate(kind):
    """A truncated product misses at most ``truncate`` of a row: its log is within
    ``entry_error_bound_ + truncate`` of the exact one, and at small reg it skips pairs."""
    # uniform points at this reg are nearly a cluster each: fewer keep the test short
    n, m = (1500, 1400) if kind == "photo" else (400, 350)
    X, Y = clouds(kind, n, m, seed=53)
    reg, truncate = 0.003, 1e-6
    rng = np.random.default_rng(4)
    log_v, log_u = 5 * rng.normal(size=m), 5 * rng.normal(size=n)
    # every cluster expanded (uniform points at this reg make only small ones)
    full = LocalGaussianExpansion(reg, exact_below=0, rng=0).fit(X, Y)
    cut = LocalGaussianExpansion(reg, exact_below=0, truncate=truncate, rng=0).fit(X, Y)
    tol = cut.entry_error_bound_ + truncate + 1e-12
    assert np.max(np.abs(cut.log_matvec(log_v) - gibbs_log_matvec(X, Y, reg, log_v))) <= tol
    assert np.max(np.abs(cut.log_rmatvec(log_u) - gibbs_log_matvec(Y, X, reg, log_u))) <= tol
    X_new = colours(200, 59)
    expected = gibbs_log_matvec(X_new, Y, reg, log_v)
    assert np.max(np.abs(cut.log_matvec_new(X_new, log_v) - expected)) <= tol
    # skipping only removes positive terms
    assert np.all(cut.log_matvec(log_v) <= full.log_matvec(log_v) + 1e-12)
    # linear products are never truncated
    V = rng.random((m, 2))
    assert np.array_equal(cut.matmat(V), full.matmat(V))
    # the bound skips most pairs here: clusters far apart against sqrt(reg) ~ 0.05
    _, bounds = _pair_sums(cut, log_v)
    x = cut._x
    ka = x.n_small
    pair_sq = np.sum((x.centers[ka:, None, :] - cut._y.centers[None, cut._y.n_small :]) ** 2, 2)
    keep = local._kept_pairs(pair_sq, x.centers[ka:], x.cluster_radius[ka:], bounds, reg, truncate)
    assert keep.mean() < 0.5


def _batches(cuts: list[int], size: int) -> list:
    """Contiguous batches ``first:stop`` of ``size`` clusters cut at ``cuts``."""
    edges = [0, *sorted(set(cuts) - {0, size}), size]
    return [
        local._Batch(np.arange(a, b), a, b, None, None, None, None)
        for a, b in itertools.pairwise(edges)
    ]


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_out=st.integers(1, 12),
    n_in=st.integers(1, 12),
    density=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_sparse_pairs_compute_every_kept_pair(seed, n_out, n_in, density, data):
    """Invariant of ``_Sparsity`` (truncated products): for any kept pairs and any batches
    of either side, a kept pair ``(A, B)`` has its moments formed (``A`` among the columns
    of ``B``'s input batch) and read (``B`` among the inputs of ``A``'s output batch), and
    a batch forms or reads nothing that no kept pair of its clusters needs."""
    keep = np.random.default_rng(seed).random((n_out, n_in)) < density
    in_cuts = data.draw(st.lists(st.integers(0, n_in), max_size=n_in))
    out_cuts = data.draw(st.lists(st.integers(0, n_out), max_size=n_out))
    in_batches, out_batches = _batches(in_cuts, n_in), _batches(out_cuts, n_out)
    sparsity = local.products._Sparsity(keep, in_batches, out_batches)
    formed = np.zeros_like(keep)
    for batch in in_batches:
        columns = sparsity.columns[batch.first]
        columns = np.arange(n_out) if columns is None else columns
        formed[columns, batch.first : batch.stop] = True
        assert np.array_equal(np.sort(columns), np.flatnonzero(keep[:, batch.ids].any(axis=1)))
    read = np.zeros_like(keep)
    for batch in out_batches:
        inputs = sparsity.inputs[batch.first]
        inputs = np.arange(n_in) if inputs is None else inputs
        read[batch.first : batch.stop, inputs] = True
        assert np.array_equal(np.sort(inputs), np.flatnonzero(keep[batch.ids].any(axis=0)))
    assert np.all(formed[keep]) and np.all(read[keep])
    assert sum(sparsity.n_columns(b) * (b.stop - b.first) for b in in_batches) == formed.sum()


@pytest.mark.parametrize("row_block", [64, 4096])
def test_sparse_pairs_keep_the_certified_error(monkeypatch, row_block):
    """Truncated products form and read only the kept pairs' moments (``_Sparsity``)
    instead of every pair of a group of output clusters against the inputs the group keeps:
    fewer entries, and each product is still within ``entry_error_bound_ + truncate`` of the
    exact one (the means within ``means_error_bound_``), as the group-wide products were.
    ``row_block = 64`` makes every cluster a batch of its own and splits the large ones in
    row blocks, as at 10^6 points (the pair-level case); 4096: a few clusters a batch."""
    monkeypatch.setattr(local.clusters, "_ROW_BLOCK", row_block)
    monkeypatch.setattr(local.products, "_TRUNCATED_ROWS", row_block)
    X, Y = clouds("photo", 2000, 1800, seed=71)
    reg, truncate = 0.003, 1e-6
    rng = np.random.default_rng(8)
    log_v = -0.9 * np.sum((Y - 0.5) ** 2, axis=1) / reg + 3 * rng.normal(size=Y.shape[0])
    log_u = 5 * rng.normal(size=X.shape[0])
    kernel = LocalGaussianExpansion(
        reg, tau=2.0, rtol=1e-6, exact_below=0, truncate=truncate, rng=0
    ).fit(X, Y)
    tol = kernel.entry_error_bound_ + truncate + ROUNDING
    sparse = (kernel.log_matvec(log_v), kernel.log_rmatvec(log_u))
    sparse_means = kernel.log_means(log_v)
    sparse_work = kernel.iteration_work()["entries"]
    # the group-wide products: every pair of a group against the inputs it keeps
    monkeypatch.setattr(local.products._Sparsity, "of", classmethod(lambda *_: None))
    dense = (kernel.log_matvec(log_v), kernel.log_rmatvec(log_u))
    dense_work = kernel.iteration_work()["entries"]
    assert sparse_work < (0.8 if row_block == 64 else 1.0) * dense_work
    cases = ((X, Y, log_v), (Y, X, log_u))
    for ours, group_wide, (P, Q, w) in zip(sparse, dense, cases, strict=True):
        exact = gibbs_log_matvec(P, Q, reg, w)
        assert np.max(np.abs(ours - exact)) <= tol
        assert np.max(np.abs(group_wide - exact)) <= tol
        # fewer pairs: only positive terms the bound allows to skip are missing
        assert np.all(ours <= group_wide + 2 * kernel.entry_error_bound_ + ROUNDING)
    log_sum, means = sparse_means
    assert np.max(np.abs(log_sum - sparse[0])) <= 2 * kernel.entry_error_bound_
    exact_means = gibbs_softmax_average(X, Y, reg, log_v, Y)
    assert np.max(np.abs(means - exact_means)) <= kernel.means_error_bound_ + ROUNDING


@pytest.mark.parametrize("row_block", [64, 4096])
def test_shared_input_pass_is_the_per_group_arithmetic(monkeypatch, row_block):
    """A truncated product forms the moments of several groups of output clusters input
    batch by input batch (each batch's features read once for all of them, on the host one
    matrix product for all of their columns: ``_Compact``): the same pairs as the groups one
    after the other, to rounding (a wider matrix product may round a moment otherwise: 1 ulp
    measured; 1e-13 relative leaves room for the log of a sum near 0), also with the means
    and the timing sample (the same rows computed)."""
    monkeypatch.setattr(local.clusters, "_ROW_BLOCK", row_block)
    monkeypatch.setattr(local.products, "_TRUNCATED_ROWS", row_block)
    # small moments: many groups of a few output clusters, a few groups per shared pass
    monkeypatch.setattr(local.device, "_MOMENT_BYTES", 1 << 16)
    monkeypatch.setattr(local.products, "_SHARED_GROUPS", 8)
    X, Y = clouds("photo", 1500, 1300, seed=73)
    reg = 0.003
    kernel = LocalGaussianExpansion(reg, tau=2.0, rtol=1e-6, exact_below=0, truncate=1e-6, rng=0)
    kernel.fit(X, Y)
    log_v = 3 * np.random.default_rng(9).normal(size=Y.shape[0])
    args = (log_v, None, kernel._monomials, reg, kernel._truncate)
    reads: dict[int, int] = {}  # per batch's features: the groups that read them
    features = local.products._BatchFeatures.__call__

    def counted(self, rows):
        reads[id(self)] = reads.get(id(self), 0) + (rows is None)
        return features(self, rows)

    monkeypatch.setattr(local.products._BatchFeatures, "__call__", counted)
    shared = local._apply(kernel._x, kernel._y, *args)
    assert max(reads.values()) > 1  # a batch's features served several groups
    shared_means = kernel.log_means(log_v)
    shared_sample = local._apply(kernel._x, kernel._y, *args, stride=2)
    groups = []

    def one_by_one(product, ids_list, parallel):
        groups.append(len(ids_list))
        for ids in ids_list:
            product.one_group(ids, parallel)

    monkeypatch.setattr(local.products._Product, "shared_input_pass", one_by_one)
    for ours, theirs in zip(
        (shared, shared_means, shared_sample),
        (
            local._apply(kernel._x, kernel._y, *args),
            kernel.log_means(log_v),
            local._apply(kernel._x, kernel._y, *args, stride=2),
        ),
        strict=True,
    ):
        for mine, one_by_one_result in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(mine == 0.0, one_by_one_result == 0.0)
            np.testing.assert_allclose(mine, one_by_one_result, rtol=1e-13, atol=1e-15)
    assert groups[0] > 8  # more groups than one shared pass takes


@pytest.mark.parametrize("row_block", [64, 4096])
def test_compact_moments_hold_only_the_computed_pairs(monkeypatch, row_block):
    """On the host the moments of a truncated product's groups are one compact array of the
    pairs their input batches compute (``_Compact``), not a zero-filled kept x group x R array
    a group: when a group's rows are formed, each pair its input batches compute (a column of
    the batch, ``_Sparsity``) has a row of its own, every other pair the one empty row (zero
    moments, shift -inf), and the array holds those rows only. The products stay within
    ``entry_error_bound_ + truncate`` of the exact ones (the means within
    ``means_error_bound_``), and are the same bits again and with 1 or 2 threads. Small
    moments: several chunks of groups share the buffer."""
    monkeypatch.setattr(local.clusters, "_ROW_BLOCK", row_block)
    monkeypatch.setattr(local.products, "_TRUNCATED_ROWS", row_block)
    monkeypatch.setattr(local.device, "_MOMENT_BYTES", 1 << 17)
    X, Y = clouds("photo", 1800, 1600, seed=75)
    reg, truncate = 0.003, 1e-6
    rng = np.random.default_rng(10)
    log_v = -0.5 * np.sum((Y - 0.5) ** 2, axis=1) / reg + 3 * rng.normal(size=Y.shape[0])
    kernel = LocalGaussianExpansion(
        reg, tau=2.0, rtol=1e-6, exact_below=0, truncate=truncate, rng=0
    ).fit(X, Y)
    compacts, checked = [], []
    make, outputs = local.products._Compact.__init__, local.products._Group.outputs

    def recorded(self, shared, users, buffer):
        make(self, shared, users, buffer)
        compacts.append(self)

    def checked_outputs(self, out_batches, pair_sq, parallel):
        compact = compacts[-1]
        assert self.moments is compact.store and self.position is compact.positions[id(self)]
        empty = compact.store.shape[0] - 1
        np.testing.assert_array_equal(compact.store[empty], 0.0)
        computed = np.zeros(self.position.shape, dtype=bool)
        rows = 0
        for *_, parts in compact.blocks.values():
            for group, batch, columns in parts:
                rows += (batch.stop - batch.first) * columns.size
                if group is self:
                    computed[batch.first : batch.stop, columns] = True
        assert rows == empty  # the computed pairs of the chunk's groups, and the empty row
        assert np.unique(self.position[computed]).size == computed.sum()
        assert np.all(self.position[computed] < empty)
        assert np.all(self.position[~computed] == empty)
        assert np.all(np.isneginf(self.shifts[~computed]))
        checked.append(computed.mean())
        return outputs(self, out_batches, pair_sq, parallel)

    monkeypatch.setattr(local.products._Compact, "__init__", recorded)
    monkeypatch.setattr(local.products._Group, "outputs", checked_outputs)
    got = kernel.log_matvec(log_v)
    assert len(compacts) > 1 and len(checked) > len(compacts)  # chunks of several groups
    assert min(checked) < 1.0  # some pairs of a group are not computed: the empty row
    tol = kernel.entry_error_bound_ + truncate + ROUNDING
    assert np.max(np.abs(got - gibbs_log_matvec(X, Y, reg, log_v))) <= tol
    log_sum, means = kernel.log_means(log_v)
    assert np.max(np.abs(log_sum - got)) <= 2 * kernel.entry_error_bound_
    exact_means = gibbs_softmax_average(X, Y, reg, log_v, Y)
    assert np.max(np.abs(means - exact_means)) <= kernel.means_error_bound_ + ROUNDING
    for threads in (1, 2, 2):
        with sketchot.thread_limit(threads):
            np.testing.assert_array_equal(kernel.log_matvec(log_v), got)


def test_truncate_is_validated():
    X = np.random.default_rng(0).random((10, 3))
    with pytest.raises(ValueError, match="truncate must be < 1"):
        LocalGaussianExpansion(0.1, truncate=1.0).fit(X)
    with pytest.raises(ValueError, match="truncate must be >= 0"):
        LocalGaussianExpansion(0.1, truncate=-1e-3).fit(X)


@pytest.mark.parametrize("exact_below", [0, 8])
def test_a_strided_sample_computes_whole_groups_of_the_product(monkeypatch, exact_below):
    """The timing sample (``stride``) computes every ``stride``-th group of output clusters
    and exactly those rows: each equals the full product's row (same arithmetic), the others
    are left at 0, so :meth:`iteration_seconds` divides by the fraction it computed."""
    X, Y = clouds("uniform", 1200, 1100, seed=61)
    reg = 0.003
    kernel = LocalGaussianExpansion(reg, exact_below=exact_below, rng=0).fit(X, Y)
    monkeypatch.setattr(local.products, "_TRUNCATED_GROUP", 4)  # many groups at this size
    x, y = kernel._x, kernel._y
    log_v = np.random.default_rng(2).normal(size=Y.shape[0])
    args = (log_v, None, kernel._monomials, reg, kernel._truncate)
    full_scale, full_Z = local._apply(x, y, *args)
    scale, Z = local._apply(x, y, *args, stride=3)
    computed = Z[:, 0] != 0.0
    assert 0.2 < computed.mean() < 0.5  # about a third of the rows, in whole groups
    np.testing.assert_array_equal(scale[computed], full_scale[computed])
    np.testing.assert_array_equal(Z[computed], full_Z[computed])
    assert kernel.iteration_seconds(stride=3) > 0.0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(1e-3), np.log(1.0)),
    spread=st.floats(0.1, 3.0),
    weight_spread=st.floats(0.0, 30.0),
)
@example(seed=0, log_reg=-6.75, spread=3.0, weight_spread=0.0)  # a bound equal to its row
@example(seed=1297, log_reg=-6.5, spread=3.0, weight_spread=0.0)  # rows that underflow
def test_row_sum_lower_bound_holds_for_every_row(seed, log_reg, spread, weight_spread):
    """Invariant: ``e^{L_A}`` is at most every row's exact sum over the input clusters (the
    skipping rule rests on it); with a zero weight the cluster's Jensen term drops out."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    X, Y = spread * rng.random((150, 3)), spread * rng.random((130, 3))
    kernel = LocalGaussianExpansion(reg, exact_below=0, rng=rng).fit(X, Y)
    log_v = weight_spread * rng.normal(size=130)
    log_v[rng.random(130) < 0.05] = -np.inf
    S, bounds = _pair_sums(kernel, log_v)
    x = kernel._x
    distance = np.sqrt(np.sum((x.centers[:, None, :] - kernel._y.centers[None]) ** 2, axis=2))
    lower = local._row_sum_lower_bound(distance, x.centers, x.cluster_radius, bounds, reg)
    labels = np.repeat(np.arange(x.n_clusters), np.diff(x.offsets))
    with np.errstate(divide="ignore"):
        exact = np.log(S.sum(axis=1))
    # a row whose sum underflows float64 (all its inputs thousands of nats away) has no
    # float to compare with; a one-point cluster's Jensen term is the row itself: equal up
    # to rounding, which is relative to the exponents' size (hundreds of nats at small reg)
    seen = np.isfinite(exact)
    bound = lower[labels][seen]
    assert np.all(bound <= exact[seen] + 1e-12 * (1.0 + np.abs(exact[seen])))


def test_jensen_bound_keeps_the_lower_bound_close_on_points_that_fill_space():
    """Where clusters are large against the kernel (tau = 4 on uniform points) the radius
    bound alone loses about 10 nats on a median cluster (measured here: 10.1, at most 18.1);
    with the Jensen term a cluster's bound is within 4.2 nats of its smallest row (at most
    7.5). Asserted with slack: at most 9, and at least 4 nats gained on the median."""
    X, Y = clouds("uniform", 3000, 3000, seed=67)
    reg = 0.01
    kernel = LocalGaussianExpansion(reg, tau=4.0, exact_below=0, rng=0).fit(X, Y)
    log_v = np.zeros(3000)
    S, bounds = _pair_sums(kernel, log_v)
    x = kernel._x
    distance = np.sqrt(np.sum((x.centers[:, None, :] - kernel._y.centers[None]) ** 2, axis=2))
    lower = local._row_sum_lower_bound(distance, x.centers, x.cluster_radius, bounds, reg)
    rows = np.log(S.sum(axis=1))
    smallest = np.minimum.reduceat(rows, x.offsets[:-1])
    assert np.all(lower <= smallest) and np.all(smallest - lower < 9.0)
    without = local._InputBounds(**{**vars(bounds), "mean": np.full_like(bounds.mean, -np.inf)})
    radius_only = local._row_sum_lower_bound(distance, x.centers, x.cluster_radius, without, reg)
    assert np.median(smallest - radius_only) > np.median(smallest - lower) + 4.0


def test_features_are_not_stored_beyond_a_share_of_the_memory_available(monkeypatch):
    """The stored features and their padded copies take at most a quarter of the memory
    available at fit (a loss keeps its previous step's kernels alive meanwhile): with less
    available than the features need, they are recomputed per block, as over the budget."""
    X, Y = clouds("uniform", 300, 200, seed=5)
    features = (300 + 200) * LocalGaussianExpansion(0.01, rng=0).fit(X, Y).n_features_ * 8
    monkeypatch.setattr(local.expansion, "available_bytes", lambda: 2 * features)
    kernel = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    assert kernel._x.features is None and kernel._y.padded_budget == 0
    monkeypatch.setattr(local.expansion, "available_bytes", lambda: 8 * features)
    kernel = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    assert kernel._x.features is not None
    assert kernel._y.padded_budget == (2 * features - features) // 2


@pytest.mark.parametrize("name", ["torch", "array_api_strict"])
@pytest.mark.parametrize("stored", [True, False], ids=["stored", "recomputed"])
@pytest.mark.parametrize("exact_below", [0, 8])
def test_products_on_a_device_equal_the_hosts(monkeypatch, name, stored, exact_below):
    """``to_device``: every product's per-point work in another Array API library (PyTorch
    CPU tensors and the standard's strict arrays here; CUDA tensors the same code) gives the
    host's numbers: the same arithmetic summed in other orders, to 1e-11 relative (log sums
    near 0 and signed products lose a few digits more than 1e-13). Features stored or
    recomputed there, small clusters exact or expanded, one large cluster in row blocks, the
    truncated log products, the means, new points and the timing sample."""
    module = pytest.importorskip(name)
    from sketchot._arrays import DeviceArrays, array_context

    monkeypatch.setattr(local.clusters, "_ROW_BLOCK", 64)  # the photo's large clusters in blocks
    X, Y = clouds("photo", 700, 600, seed=71)
    params = dict(tau=2.0, rtol=1e-7, truncate=1e-7, exact_below=exact_below, rng=0)
    params["max_feature_bytes"] = 1 << 30 if stored else 0
    host = LocalGaussianExpansion(0.003, **params).fit(X, Y)
    on = DeviceArrays(array_context(X=module.asarray(X)))
    device = LocalGaussianExpansion(0.003, **params).fit(X, Y).to_device(on)
    assert host.n_exact_points_ == device.n_exact_points_
    assert (host.n_exact_points_[0] > 0) == (exact_below > 0)
    rng = np.random.default_rng(72)
    log_v, log_u = rng.normal(scale=5.0, size=600), rng.normal(scale=5.0, size=700)
    log_v[3] = -np.inf
    V, new = rng.standard_normal((600, 2)), rng.random((40, 3))
    products = {
        "log_matvec": lambda e: e.log_matvec(log_v),
        "log_rmatvec": lambda e: e.log_rmatvec(log_u),
        "log_means": lambda e: np.column_stack(e.log_means(log_v, transpose=False)),
        "matmat": lambda e: e.matmat(V),
        "log_matvec_new": lambda e: e.log_matvec_new(new, log_v),
        "barycentric_map": lambda e: e.barycentric_map(new, log_v),
    }
    for label, product in products.items():
        np.testing.assert_allclose(
            product(device), product(host), rtol=1e-11, atol=1e-13, err_msg=label
        )
    assert type(device._x.device.local).__module__.split(".")[0] == name  # kept there
    args = (log_v, None, host._monomials, 0.003, host._truncate)
    sampled = local._apply(device._x, device._y, *args, stride=3, on=on)
    expected = local._apply(host._x, host._y, *args, stride=3)
    np.testing.assert_array_equal(sampled[1] == 0.0, expected[1] == 0.0)  # the same rows
    np.testing.assert_allclose(sampled[1], expected[1], rtol=1e-11)
    assert device.iteration_seconds(stride=3) > 0.0


def test_features_that_do_not_fit_the_device_are_recomputed_there(monkeypatch):
    """A device whose free memory holds less than the share the stored features need (a
    GPU smaller than the host's memory): the features are recomputed there block by block,
    no padded copies kept, and the products are the same."""
    torch = pytest.importorskip("torch")
    from sketchot._arrays import DeviceArrays, array_context

    X, Y = clouds("uniform", 500, 400, seed=73)
    host = LocalGaussianExpansion(0.01, rng=0).fit(X, Y)
    assert host._x.features is not None
    monkeypatch.setattr(DeviceArrays, "free_bytes", lambda self: 1000)
    on = DeviceArrays(array_context(X=torch.as_tensor(X)))
    device = LocalGaussianExpansion(0.01, rng=0).fit(X, Y).to_device(on)
    assert device._x.device.features is None and device._x.device._padded_budget <= 1000
    log_v = np.random.default_rng(74).normal(size=400)
    np.testing.assert_allclose(device.log_matvec(log_v), host.log_matvec(log_v), rtol=1e-11)
    assert not device._y.device._padded


DEVICE_MEMORY_CASES = [
    (None, local._MOMENT_BYTES),
    (1 << 20, local._MOMENT_BYTES),
    (1 << 33, 1 << 29),
    (1 << 40, local._DEVICE_MOMENT_BYTES),
]


@pytest.mark.parametrize("free, expected", DEVICE_MEMORY_CASES)
def test_groups_on_a_device_are_sized_from_its_free_memory(monkeypatch, free, expected):
    """A group's moments on a device take a share of its free memory between the host's
    budget and a cap (a device whose memory cannot be asked keeps the host's)."""
    torch = pytest.importorskip("torch")
    from sketchot._arrays import DeviceArrays, array_context

    X, Y = clouds("uniform", 200, 150, seed=75)
    monkeypatch.setattr(DeviceArrays, "free_bytes", lambda self: free)
    on = DeviceArrays(array_context(X=torch.as_tensor(X)))
    kernel = LocalGaussianExpansion(0.01, rng=0).fit(X, Y).to_device(on)
    assert kernel._x.arrays(on).moment_bytes() == expected
    assert kernel._x.arrays(None).moment_bytes() == local._MOMENT_BYTES


def test_products_with_exact_small_clusters_are_the_same_bits_every_time():
    """The pool's threads finish the groups in any order; the expanded rows go to the exact
    products of the small input clusters in a fixed order, so with 1 or 2 threads, again and
    again, the products are the same bits (they differed by 1e-13 between runs before: the
    rows' place in the matrix product changed its rounding)."""
    X, Y = colours(1500, 1), colours(1300, 2, "default_target.png")
    rng = np.random.default_rng(7)
    log_v, V = rng.normal(scale=5.0, size=len(Y)), rng.standard_normal((len(Y), 2))
    runs = []
    for threads in (1, 2, 2, 2, 2, 2):
        # a fresh fit each time: the first products gather the features on the pool
        kernel = LocalGaussianExpansion(0.003, rng=0).fit(X, Y)
        assert kernel.exact_below > 0  # small clusters are summed exactly
        with sketchot.thread_limit(threads):
            runs.append((kernel.matmat(V), kernel.log_matvec(log_v)))
    for products in runs[1:]:
        for mine, first in zip(products, runs[0], strict=True):
            np.testing.assert_array_equal(mine, first)


# ---------------------------------------------------------------------- truncated exact pairs
def _all_pair_sums(kernel, log_w, transpose=False):
    """Exact ``S_iB`` per output row (sorted order) and input cluster, EVERY input cluster
    (the exactly handled ones first, as ``_Product.kept_pairs`` numbers them)."""
    out, inn = (kernel._y, kernel._x) if transpose else (kernel._x, kernel._y)
    w = log_w[inn.order]
    with np.errstate(invalid="ignore"):  # a cluster of zero weights only: NaN, its sum is 0
        S = np.stack(
            [
                np.exp(gibbs_log_matvec(out.points, inn.points[s:e], kernel.reg, w[s:e]))
                for s, e in itertools.pairwise(inn.offsets)
            ],
            axis=1,
        )
    return np.nan_to_num(S, nan=0.0)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(0.002), np.log(0.03)),
    weight_spread=st.floats(0.0, 20.0),
    truncate=st.sampled_from([1e-9, 1e-5, 1e-2]),
    transpose=st.booleans(),
)
def test_one_budget_bounds_the_skipped_pairs_of_exact_and_expanded_clusters(
    seed, log_reg, weight_spread, truncate, transpose
):
    """Invariant: a truncated product keeps, for every output cluster (exactly handled or
    expanded), the input clusters of both kinds whose skipped share is at most ``truncate`` of
    each row's exact sum, one budget over all of them (``_Product.kept_pairs``)."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    # a dense core and sparse outliers: clusters below exact_below on both sides
    X = np.concatenate([0.3 * rng.random((160, 3)), rng.random((25, 3))])
    Y = np.concatenate([0.3 * rng.random((140, 3)) + 0.1, rng.random((30, 3))])
    kernel = LocalGaussianExpansion(reg, truncate=truncate, rng=0).fit(X, Y)
    out, inn = (kernel._y, kernel._x) if transpose else (kernel._x, kernel._y)
    assert out.n_small and inn.n_small  # both kinds take part
    log_w = weight_spread * rng.normal(size=inn.n_points)
    product = local.products._Product(
        out, inn, log_w, None, kernel._monomials, reg, truncate, None, None
    )
    keep = product.kept_pairs(np.arange(out.n_clusters))
    S = _all_pair_sums(kernel, log_w, transpose)
    labels = np.repeat(np.arange(out.n_clusters), np.diff(out.offsets))
    skipped = np.where(keep[labels], 0.0, S).sum(axis=1)
    assert np.all(skipped <= truncate * S.sum(axis=1) * (1 + 1e-12))
    # the exactly handled input clusters skip at most rounding's share of a row
    small = np.arange(inn.n_clusters) < inn.n_small
    skipped_exact = np.where(keep[labels] | ~small, 0.0, S).sum(axis=1)
    assert np.all(skipped_exact <= local.truncation.EXACT_SKIP * S.sum(axis=1) * (1 + 1e-12))


@pytest.mark.parametrize("transpose", [False, True])
def test_truncated_products_compute_only_the_kept_exact_pairs(transpose):
    """With clusters below ``exact_below`` on both sides (uniform points at small reg), a
    truncated product's log is within ``entry_error_bound_ + truncate`` of the exact one on
    every row, its exact entries are those of the kept pairs only (counted: far fewer than
    the small rows against every point), its means match the exact weighted means, and the
    same call gives the same bits twice."""
    X, Y = clouds("uniform", 3000, 2800, seed=71)
    reg, truncate = 0.002, 1e-6
    kernel = LocalGaussianExpansion(reg, tau=4.0, truncate=truncate, rng=0).fit(X, Y)
    full = LocalGaussianExpansion(reg, tau=4.0, rng=0).fit(X, Y)
    assert min(kernel.n_exact_points_) > 0
    A, B = (Y, X) if transpose else (X, Y)
    log_w = 5 * np.random.default_rng(3).normal(size=B.shape[0])
    product = kernel.log_rmatvec if transpose else kernel.log_matvec
    got = product(log_w)
    tol = kernel.entry_error_bound_ + truncate + ROUNDING
    assert np.max(np.abs(got - gibbs_log_matvec(A, B, reg, log_w))) <= tol
    assert np.array_equal(product(log_w), got)
    # skipping only removes positive terms: never above the untruncated product
    untruncated = full.log_rmatvec(log_w) if transpose else full.log_matvec(log_w)
    assert np.all(got <= untruncated + 1e-12)
    log_sum, means = kernel.log_means(log_w, transpose=transpose)
    # the same sums, the exact entries' rounded by a matrix product instead of a sum
    np.testing.assert_allclose(log_sum, got, rtol=0, atol=1e-12)
    expected = gibbs_softmax_average(A, B, reg, log_w, B)
    assert np.max(np.abs(means - expected)) <= kernel.means_error_bound_ + 1e-9
    # the exact entries counted are those of the kept pairs, not all small rows x points
    out, inn = (kernel._y, kernel._x) if transpose else (kernel._x, kernel._y)
    work = {"entries": 0.0, "exp": 0.0, "fma": 0.0, "exact": 0.0, "calls": 0.0}
    local._apply(out, inn, log_w, None, kernel._monomials, reg, truncate, work=work)
    every = out.small_rows * inn.n_points + (out.n_points - out.small_rows) * inn.small_rows
    assert 0 < work["exact"] < 0.5 * every


def _log_tolerance(kernel, truncate: float) -> float:
    """``|log K~v - log K v|`` allowed: each entry within ``(1 +- entry_error_bound_)`` and at
    most ``truncate`` of a row skipped, plus the exact reference's rounding."""
    return -np.log1p(-kernel.entry_error_bound_) - np.log1p(-truncate) + ROUNDING


@pytest.mark.parametrize(
    "shape, reg",
    [((120, 90), 0.01), ((300, 250), 0.01), ((300, 250), 0.003)],
)
def test_products_whose_clusters_are_all_exactly_handled_stay_exact_to_rounding(shape, reg):
    """Regression (CI, cd9bc28): at the default truncation, a product whose clusters are all
    below ``exact_below`` (the sizes and regs of tests/solver's warm log runs) is exact to
    rounding, as before exactly handled clusters shared the truncation budget: a solve asks
    it for marginals at 1e-11, which a product off by ``truncate`` ~ 2e-5 never reaches."""
    rng = np.random.default_rng(20261125)
    X, Y = rng.random((shape[0], 3)), rng.beta(2.0, 5.0, size=(shape[1], 3))
    kernel = LocalGaussianExpansion(reg, truncate=2e-5, rng=0).fit(X, Y)
    assert kernel.n_exact_points_ == shape  # every point exactly handled
    for spread in (0.0, 5.0, 50.0):
        log_v, log_u = spread * rng.normal(size=shape[1]), spread * rng.normal(size=shape[0])
        got = kernel.log_matvec(log_v)
        assert np.max(np.abs(got - gibbs_log_matvec(X, Y, reg, log_v))) <= ROUNDING
        back = kernel.log_rmatvec(log_u)
        assert np.max(np.abs(back - gibbs_log_matvec(Y, X, reg, log_u))) <= ROUNDING


@pytest.mark.parametrize("reg", REGS)
def test_truncated_products_with_both_kinds_of_clusters_stay_within_the_certified_error(reg):
    """The declared error of a truncated product (``entry_error_bound_`` per entry, at most
    ``truncate`` of a row skipped, exactly handled clusters sharing the budget) bounds its true
    error against the exact product, at every reg, on clouds with both kinds of clusters and
    weights spanning hundreds of orders; the same inputs and ``rng`` give the same bits."""
    rng = np.random.default_rng(83)
    # a dense core (expanded clusters) and sparse outliers (exactly handled ones)
    X = np.concatenate([0.3 * rng.random((900, 3)), rng.random((60, 3))])
    Y = np.concatenate([0.3 * rng.random((800, 3)) + 0.1, rng.random((70, 3))])
    truncate = 2e-5  # the policy's default
    kernel = LocalGaussianExpansion(reg, truncate=truncate, rng=0).fit(X, Y)
    again = LocalGaussianExpansion(reg, truncate=truncate, rng=0).fit(X, Y)
    for side in (kernel._x, kernel._y):
        assert 0 < side.n_small < side.n_clusters  # both kinds take part
    tol = _log_tolerance(kernel, truncate)
    for spread in (0.0, 5.0, 100.0):
        log_v, log_u = spread * rng.normal(size=Y.shape[0]), spread * rng.normal(size=X.shape[0])
        got = kernel.log_matvec(log_v)
        assert np.max(np.abs(got - gibbs_log_matvec(X, Y, reg, log_v))) <= tol
        back = kernel.log_rmatvec(log_u)
        assert np.max(np.abs(back - gibbs_log_matvec(Y, X, reg, log_u))) <= tol
        assert np.array_equal(again.log_matvec(log_v), got)
        assert np.array_equal(again.log_rmatvec(log_u), back)
