"""The block-local polynomial kernel as an operator, and the solver's log-domain path on it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from sketchot import sinkhorn_kernel
from sketchot.gibbs import GibbsGeometry
from sketchot.kernels.local import build_local, rtol_for


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(8)
    X = np.clip(rng.normal(0.5, 0.15, size=(400, 3)), 0, 1)
    Y = np.clip(rng.normal(0.4, 0.2, size=(300, 3)), 0, 1)
    return X, Y


@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_entries_are_relative_to_the_bound(problem, reg):
    X, Y = problem
    # entries sized for the accuracy: rtol_for(1e-6) = 2e-8, plus rounding
    kernel = build_local(GibbsGeometry(X, Y, reg), rng=0, accuracy=1e-6)
    truth = np.exp(-cdist(X, Y, "sqeuclidean") / reg)
    dense = kernel.to_dense()
    bound = kernel.info.params["entry_error_bound"]
    positive = truth > 1e-250  # entries that do not underflow in float64
    relative = np.abs(dense[positive] / truth[positive] - 1)
    assert relative.max() <= bound <= 1.01 * rtol_for(1e-6)


def test_log_passes_agree_with_linear_ones(problem):
    X, Y = problem
    kernel = build_local(GibbsGeometry(X, Y, 0.05), rng=0, accuracy=1e-6)  # entries to 1e-9
    rng = np.random.default_rng(1)
    v, a = rng.random(300) + 0.1, np.full(400, 1 / 400)
    linear = kernel.fused_pass("rows", v, a)
    logged = kernel.fused_pass("rows", np.log(v), np.log(a), log=True)
    # both are ~1e-9-accurate evaluations of the same products
    np.testing.assert_allclose(np.exp(logged.products), linear.products, rtol=1e-9)
    np.testing.assert_allclose(np.exp(logged.projection), linear.projection, rtol=1e-9)
    u = rng.random(400)
    np.testing.assert_allclose(
        np.exp(kernel.project("rows", np.log(u), log=True)), kernel.rmatvec(u), rtol=1e-9
    )


def test_small_reg_solve_meets_the_accuracy_where_scalings_overflow(problem):
    """reg = 0.002: the scalings span more than float64's range (e^700), so only log-domain
    products work; the true-kernel check (exact here: 400 x 300) must still pass."""
    X, Y = problem
    kernel = build_local(GibbsGeometry(X, Y, 0.002), rng=0, accuracy=1e-6)
    a, b = np.full(400, 1 / 400), np.full(300, 1 / 300)
    res = sinkhorn_kernel(a, b, kernel, max_iter=5000, tol=1e-9, accuracy=1e-6)
    assert res.converged and res.log_domain
    assert res.true_kernel.exhaustive and res.accuracy_met
    mapped = res.barycentric_map()
    assert np.all(mapped >= Y.min(axis=0) - 1e-9) and np.all(mapped <= Y.max(axis=0) + 1e-9)


@pytest.mark.parametrize(
    ("accuracy", "rtol", "degree"), [(1e-1, 1e-4, 5), (1e-3, 2e-5, 6), (1e-6, 2e-8, 8)]
)
def test_entries_are_sized_from_the_accuracy(problem, accuracy, rtol, degree):
    """``rtol = accuracy / 50`` within [1e-12, 1e-4]; the entries keep to it."""
    X, Y = problem
    kernel = build_local(GibbsGeometry(X, Y, 0.01), rng=0, accuracy=accuracy)
    params = kernel.info.params
    assert params["rtol"] == pytest.approx(rtol) and params["degree"] == degree
    assert params["truncate"] == pytest.approx(rtol)
    truth = np.exp(-cdist(X, Y, "sqeuclidean") / 0.01)
    positive = truth > 1e-250
    relative = np.abs(kernel.to_dense()[positive] / truth[positive] - 1)
    assert relative.max() <= params["entry_error_bound"] <= rtol
    # a named rtol wins over the accuracy
    named = build_local(GibbsGeometry(X, Y, 0.01), rng=0, rtol=1e-9, accuracy=accuracy)
    assert named.info.params["rtol"] == 1e-9


def test_dimension_limit_is_refused_clearly():
    rng = np.random.default_rng(2)
    X = rng.random((50, 7))
    with pytest.raises(ValueError, match="d = 7"):
        build_local(GibbsGeometry(X, X, 0.1))


def test_the_timed_iteration_estimate_times_whole_iterations(monkeypatch):
    """The timed estimate (``tau='timed'``, asked for): a slow sampled estimate is the
    answer (no whole pass); below, each timed pass computes its projection (read lazily), and
    a slow first pass is not timed twice."""
    from sketchot.kernels import local

    rng = np.random.default_rng(5)
    kernel = build_local(GibbsGeometry(rng.random((300, 3)), rng.random((200, 3)), 0.05), rng=0)
    projections, samples = [], []
    original = kernel.expansion.log_rmatvec
    sampled = kernel.expansion.iteration_seconds

    def counted(log_u):
        projections.append(1)
        return original(log_u)

    def counted_sample(stride):
        samples.append(stride)
        return sampled(stride)

    monkeypatch.setattr(kernel.expansion, "log_rmatvec", counted)
    monkeypatch.setattr(kernel.expansion, "iteration_seconds", counted_sample)
    monkeypatch.setattr(local, "SLOW_PASS_SECONDS", 1e9)
    local.local_iteration_seconds(kernel)
    assert len(projections) == 2 and samples == [local.TIMING_STRIDE] * 2
    monkeypatch.setattr(local, "SLOW_PASS_SECONDS", 0.0)
    local.local_iteration_seconds(kernel)
    assert len(projections) == 2 and len(samples) == 4  # the sample's estimate, no pass


@pytest.mark.parametrize(
    ("samples", "rtol", "chosen", "seconds", "taken"),
    [
        ({1.0: [0.5, 0.45]}, 1e-6, 1.0, 0.45, [1, 1]),  # fast enough: no search
        # a first sample over the threshold holding one-time costs: the second decides
        ({1.0: [1.5, 0.8]}, 1e-6, 1.0, 0.8, [1, 1]),
        ({1.0: [9.5, 9.0], 2.0: [4.2, 4.0], 4.0: [3.0, 2.0]}, 1e-6, 4.0, 2.0, [1, 1, 2, 2, 4, 4]),
        # 3.8 is not TAU_GAIN times 4.0: the search stops at 2
        ({1.0: [9.0, 9.0], 2.0: [4.0, 4.0], 4.0: [3.8, 3.8]}, 1e-6, 2.0, 4.0, [1, 1, 2, 2, 4, 4]),
        ({1.0: [9.0, 9.0], 2.0: [8.5, 8.5]}, 1e-6, 1.0, 9.0, [1, 1, 2, 2]),
        # a first sample mostly one-time costs (the gathering scaled up by the stride) never
        # decides against a candidate: measured at 10^5 points, tau = 4 sampled 9.6 s, then 2.2
        ({1.0: [3.0, 2.5], 2.0: [8.0, 2.0], 4.0: [9.6, 2.2]}, 1e-6, 2.0, 2.0, [1, 1, 2, 2, 4, 4]),
        # tau = 4 rounds beyond rtol = 1e-9: not fitted
        ({1.0: [9.0, 9.0], 2.0: [4.0, 3.9]}, 1e-9, 2.0, 3.9, [1, 1, 2, 2]),
        ({1.0: [9.0, 8.0]}, 1e-12, 1.0, 8.0, [1, 1]),  # no degree reaches 1e-12 at tau = 2
    ],
)
def test_tau_timed_keeps_the_fastest_sampled_candidate(
    monkeypatch, samples, rtol, chosen, seconds, taken
):
    """``tau='timed'`` (timing asked for) searches only when tau = 1 is slow, keeps a
    candidate only when it is TAU_GAIN times faster, and never one whose features or
    rounding miss ``rtol``; every candidate is sampled twice and judged by its faster sample
    (the first one also pays the gathering of the padded features, a one-time cost). The
    timing is not kept as ``auto``'s prediction (that one is counted)."""
    from sketchot.kernels import local
    from sketchot.sketch.local import LocalGaussianExpansion

    timed = []
    left = {tau: list(values) for tau, values in samples.items()}

    def fake(expansion, stride=1):
        assert stride == local.TIMING_STRIDE
        timed.append(expansion.tau)
        return left[expansion.tau].pop(0)

    monkeypatch.setattr(LocalGaussianExpansion, "iteration_seconds", fake)
    rng = np.random.default_rng(9)
    geometry = GibbsGeometry(rng.random((400, 3)), rng.random((300, 3)), 0.01)
    kernel = build_local(geometry, rng=0, rtol=rtol, tau="timed")
    assert kernel.info.params["tau"] == chosen
    assert kernel.predicted_seconds is None
    assert timed == taken  # tried in order, stopped at the first that does not pay
    # a larger tau only when its rounding stays within rtol (tau = 1 is kept as it comes)
    assert chosen == 1.0 or kernel.expansion.entry_error_bound_ <= rtol


@pytest.mark.parametrize(
    ("predicted", "rtol", "chosen", "counted"),
    [
        ({1.0: 0.5}, 1e-6, 1.0, [1]),  # cheap enough: no search
        ({1.0: 9.0, 2.0: 4.0, 4.0: 2.0}, 1e-6, 4.0, [1, 2, 4]),
        # 3.8 is not TAU_GAIN times 4.0: the search stops at 2
        ({1.0: 9.0, 2.0: 4.0, 4.0: 3.8}, 1e-6, 2.0, [1, 2, 4]),
        ({1.0: 9.0, 2.0: 8.5}, 1e-6, 1.0, [1, 2]),
        # tau = 4 rounds beyond rtol = 1e-9: not fitted
        ({1.0: 9.0, 2.0: 3.9}, 1e-9, 2.0, [1, 2]),
        ({1.0: 9.0}, 1e-12, 1.0, [1]),  # no degree reaches 1e-12 at tau = 2
    ],
)
def test_tau_auto_keeps_the_cheapest_counted_candidate(
    monkeypatch, predicted, rtol, chosen, counted
):
    """``tau='auto'`` (the default) runs the same search on PREDICTED seconds, from the
    counted work of each candidate once (:meth:`iteration_work`), never a timing: the
    prediction is kept for ``auto``'s comparison."""
    from sketchot.kernels import local
    from sketchot.sketch.local import LocalGaussianExpansion

    seen = []

    def fake_work(expansion, stride=1):
        assert stride == local.COUNT_STRIDE
        seen.append(expansion.tau)
        return {"seconds": predicted[expansion.tau]}

    def never(*args, **kwargs):
        raise AssertionError("tau='auto' timed an iteration")

    monkeypatch.setattr(LocalGaussianExpansion, "iteration_work", fake_work)
    monkeypatch.setattr(LocalGaussianExpansion, "iteration_seconds", never)
    monkeypatch.setattr(local.cost, "local_iteration_cost", lambda work: work["seconds"])
    rng = np.random.default_rng(9)
    geometry = GibbsGeometry(rng.random((400, 3)), rng.random((300, 3)), 0.01)
    kernel = build_local(geometry, rng=0, rtol=rtol)
    assert kernel.info.params["tau"] == chosen and seen == counted
    assert kernel.predicted_seconds == predicted[chosen]
    assert local.local_iteration_cost(kernel) == predicted[chosen]  # kept, not counted again


def test_the_counted_work_is_the_plan_of_the_products():
    """:meth:`iteration_work` counts without computing: a sixteenth of the groups scaled to
    all is within 10% of the whole count (the sample is spatially even; measured 3% at
    2 10^4 uniform points, reg 0.01), the count is the same at every call (a function of the
    fitted clusters), and a kernel with only exactly handled clusters counts its n m
    entries twice (both products)."""
    from sketchot.sketch.local import LocalGaussianExpansion

    rng = np.random.default_rng(12)
    X, Y = rng.random((3000, 3)), rng.random((2500, 3))
    expansion = LocalGaussianExpansion(0.01, tau=2.0, rtol=2e-5, truncate=2e-5, rng=0).fit(X, Y)
    whole, sampled = expansion.iteration_work(), expansion.iteration_work(stride=16)
    assert whole == expansion.iteration_work()
    assert whole["fma"] > 0 and whole["calls"] > 0
    for key in ("entries", "fma"):
        assert sampled[key] == pytest.approx(whole[key], rel=0.1)
    # at reg 1e-4 every point of 200 and 150 is its own (small, exactly handled) cluster
    tiny = LocalGaussianExpansion(1e-4, tau=1.0, rtol=2e-5, rng=0).fit(X[:200], Y[:150])
    assert tiny.n_clusters_ == (200, 150)
    assert tiny.iteration_work() == {
        "entries": 2 * 200 * 150,
        "exp": 0.0,
        "fma": 0.0,
        "exact": 2 * 200 * 150,
        "calls": 0.0,
    }


def test_tau_is_validated():
    rng = np.random.default_rng(9)
    geometry = GibbsGeometry(rng.random((40, 3)), rng.random((30, 3)), 0.1)
    with pytest.raises(ValueError, match="tau must be a positive number, 'auto' or 'timed'"):
        build_local(geometry, tau="fast")
    with pytest.raises(ValueError, match="tau"):
        build_local(geometry, tau=-1.0)


def test_products_keep_the_declared_product_rtol():
    """``product_rtol`` (the entries' bound plus the truncation) bounds every log-domain
    product, both ways: measured against dense sums of the true kernel, weights spread over
    60 nats so that the truncation skips pairs."""
    rng = np.random.default_rng(11)
    X, Y = rng.random((1500, 3)), rng.random((1200, 3))
    kernel = build_local(GibbsGeometry(X, Y, 0.01), rng=0)  # the default accuracy's rtol
    # the entries' bound plus the truncation, each at most rtol
    assert kernel.info.product_rtol <= 2 * kernel.info.params["rtol"]
    g = kernel.geometry
    K = np.exp(-((g.Xc[:, None] - g.Yc[None]) ** 2).sum(-1) / g.reg)
    log_v, log_u = rng.uniform(-30.0, 30.0, size=1200), rng.uniform(-30.0, 30.0, size=1500)
    log_v, log_u = log_v - log_v.max(), log_u - log_u.max()
    rows = kernel.fused_pass("rows", log_v, np.zeros(1500), log=True).products
    cols = kernel.project("rows", log_u, log=True)
    for got, expected in ((rows, K @ np.exp(log_v)), (cols, K.T @ np.exp(log_u))):
        assert np.max(np.abs(np.exp(got) / expected - 1.0)) <= kernel.info.product_rtol
