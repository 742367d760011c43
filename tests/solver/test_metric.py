"""The problem's cost (``metric=``, POT's ``ot.dist`` names or a callable): the exact and
Nystrom kernels agree with POT on ``ot.dist(X, Y, metric)``, the other backends refuse by name,
``value_linear`` and the true-kernel check use the problem's cost, a user backend declares its
metrics."""

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cdist

import sketchot
from sketchot.gibbs import GibbsGeometry, make_cost
from sketchot.kernels import KernelInfo, LowRankKernel
from sketchot.solver.plans import sampled_true_kernel_check

REG = 0.1


def chebyshev(A, B):
    return cdist(A, B, "chebyshev")


# (metric, p, the cost matrix of POT's convention)
METRICS = [
    ("sqeuclidean", 2.0, lambda X, Y: ot.dist(X, Y, metric="sqeuclidean")),
    ("euclidean", 2.0, lambda X, Y: ot.dist(X, Y, metric="euclidean")),
    ("cityblock", 2.0, lambda X, Y: ot.dist(X, Y, metric="cityblock")),
    ("minkowski", 3.0, lambda X, Y: ot.dist(X, Y, metric="minkowski", p=3)),
    (chebyshev, 2.0, chebyshev),
]
IDS = ["sqeuclidean", "euclidean", "cityblock", "minkowski3", "callable"]


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(0)
    X, Y = rng.random((60, 2)), rng.random((50, 2)) + 0.3
    a = rng.random(60) + 0.5
    b = rng.random(50) + 0.5
    return a / a.sum(), b / b.sum(), X, Y


def reference(a, b, M):
    """POT's plan on the dense cost, converged to a marginal residual of 1e-13."""
    return ot.sinkhorn(a, b, M, REG, stopThr=1e-13, numItermax=100_000)


@pytest.mark.parametrize(("metric", "p", "cost"), METRICS, ids=IDS)
def test_exact_kernel_agrees_with_pot_for_every_metric(clouds, metric, p, cost):
    """The same problem as POT's: plan, <P, M> and marginals to 1e-8 (both sides converged to
    a marginal residual of ~1e-12; the plan's entries are O(1 / (n m)) = 3e-4)."""
    a, b, X, Y = clouds
    M = cost(X, Y)
    P = reference(a, b, M)
    res = sketchot.sinkhorn(a, b, X, Y, REG, "exact", metric=metric, p=p, tol=1e-12)
    np.testing.assert_allclose(res.plan, P, rtol=0, atol=1e-8)
    assert res.value_linear == pytest.approx(float(np.sum(P * M)), abs=1e-8)
    np.testing.assert_allclose(res.marginals[0], a, rtol=0, atol=1e-8)
    np.testing.assert_allclose(res.marginals[1], b, rtol=0, atol=1e-8)
    assert res.accuracy_met


@pytest.mark.parametrize(("metric", "p", "cost"), METRICS, ids=IDS)
def test_nystrom_agrees_with_pot_within_its_accuracy_contract(clouds, metric, p, cost):
    """The certified plan diag(u) K diag(v) (true K), its marginals and <P, M> are within a
    small multiple of the true-kernel bound of POT's (the factor 5 of test_unbalanced.py's
    accuracy contract; the bound is floored at 1e-9, the solves' own tolerance)."""
    a, b, X, Y = clouds
    M = cost(X, Y)
    P = reference(a, b, M)
    res = sketchot.sinkhorn(a, b, X, Y, REG, "nystrom", metric=metric, p=p, rank=110, rng=0)
    assert res.accuracy_met
    bound = max(res.true_kernel.bound, 1e-9)
    log_u, log_v = res.potentials
    certified = np.exp(log_u[:, None] - M / REG + log_v[None, :])
    assert np.abs(certified - P).sum() <= 5.0 * bound
    assert np.abs(res.marginals[0] - a).sum() <= 5.0 * bound
    assert np.abs(res.marginals[1] - b).sum() <= 5.0 * bound
    assert res.value_linear == pytest.approx(float(np.sum(P * M)), rel=5.0 * bound)


def test_every_entry_point_and_make_kernel_take_the_metric(clouds):
    """sinkhorn2, sinkhorn_unbalanced, solve_sample (ot.solve_sample's name), make_kernel and
    sinkhorn_kernel (the kernel carries it) all solve the cityblock problem."""
    a, b, X, Y = clouds
    M = ot.dist(X, Y, metric="cityblock")
    expected = float(np.sum(reference(a, b, M) * M))
    # tol 1e-12 on the marginals: <P, M> to 1e-9 (costs are at most 4)
    common = {"metric": "cityblock", "tol": 1e-12}
    assert sketchot.sinkhorn2(a, b, X, Y, REG, "exact", **common) == pytest.approx(
        expected, abs=1e-9
    )
    res = sketchot.solve_sample(X, Y, a, b, reg=REG, backend="exact", **common)
    assert res.value_linear == pytest.approx(expected, abs=1e-9)
    kernel = sketchot.make_kernel(X, Y, REG, "exact", metric="cityblock")
    assert kernel.geometry.cost == make_cost("cityblock")
    res = sketchot.sinkhorn_kernel(a, b, kernel, tol=1e-12)
    assert res.value_linear == pytest.approx(expected, abs=1e-9)
    assert sketchot.sinkhorn_kernel(a, b, kernel, metric="cityblock", tol=1e-12).converged
    with pytest.raises(ValueError, match="built with metric='cityblock'; got metric='euclidean'"):
        sketchot.sinkhorn_kernel(a, b, kernel, metric="euclidean")
    unbalanced = sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, 1.0, "exact", **common)
    ref = ot.unbalanced.sinkhorn_unbalanced(a, b, M, REG, 1.0, stopThr=1e-13, numItermax=10**5)
    assert unbalanced.value_linear == pytest.approx(float(np.sum(ref * M)), abs=1e-8)


def test_streamed_annealed_and_mapped_exact_paths_use_the_metric(clouds):
    """The streamed exact kernel with an epsilon schedule at a small reg (cost / reg up to
    ~500: the absorbed, log-form path) solves POT's log-domain problem: <P, M> to 1e-8 (both
    converged to 1e-12); the barycentric map is the plan's (P Y) / (P 1) to 1e-10."""
    a, b, X, Y = clouds
    M = ot.dist(X, Y, metric="cityblock")
    reg = 0.005
    P = ot.sinkhorn(a, b, M, reg, method="sinkhorn_log", stopThr=1e-13, numItermax=100_000)
    res = sketchot.sinkhorn(
        a, b, X, Y, reg, "exact", metric="cityblock", max_dense_bytes=0,
        epsilon_scaling=True, tol=1e-12, max_iter=20_000,
    )  # fmt: skip
    assert res.converged
    assert res.value_linear == pytest.approx(float(np.sum(P * M)), abs=1e-8)
    plan = res.plan
    np.testing.assert_allclose(
        res.barycentric_map(), (plan @ Y) / plan.sum(1)[:, None], rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("backend", ["rff", "polyts"])
def test_polynomial_and_fourier_backends_refuse_other_metrics_by_name(clouds, backend):
    a, b, X, Y = clouds
    message = (
        f"backend '{backend}' supports metric='sqeuclidean' only; got metric='cityblock'; "
        "use backend='cur' or 'exact' or 'nystrom'"
    )
    with pytest.raises(ValueError, match=message):
        sketchot.sinkhorn(a, b, X, Y, REG, backend, metric="cityblock")
    with pytest.raises(ValueError, match=message):
        sketchot.make_kernel(X, Y, REG, backend, metric="cityblock")


def test_records_declare_their_metrics():
    assert sketchot.get_backend("exact").metrics == "any"
    assert sketchot.get_backend("nystrom").metrics == "any"
    assert sketchot.get_backend("rff").metrics == ("sqeuclidean",)
    assert sketchot.get_backend("polyts").metrics == ("sqeuclidean",)


def test_invalid_metrics_are_refused_clearly(clouds):
    a, b, X, Y = clouds
    with pytest.raises(ValueError, match=r"metric must be one of 'sqeuclidean'.*got 'cosine'"):
        sketchot.sinkhorn(a, b, X, Y, REG, "exact", metric="cosine")
    with pytest.raises(ValueError, match="finite p >= 1"):
        sketchot.sinkhorn(a, b, X, Y, REG, "exact", metric="minkowski", p=0.5)
    with pytest.raises(ValueError, match=r"shape \(len\(A\), len\(B\)\)"):
        sketchot.sinkhorn(a, b, X, Y, REG, "exact", metric=lambda A, B: cdist(A, B)[:, :1])


@pytest.mark.parametrize(
    ("d", "reg"),
    [(2, 0.01), (20, 20.0)],
    ids=["low-dimension-local-rung", "high-dimension-sketch-rung"],
)
def test_auto_builds_only_backends_that_support_the_metric(monkeypatch, d, reg):
    """With the direct exact size set to 0, 'auto' runs its ladder on a small problem: for the
    squared-Euclidean cost it builds a polynomial kernel (the block-local one in dimension 2
    when Nystrom misses at small reg, the improved sketch beside Nystrom in dimension 20);
    for a cityblock cost it builds only exact and Nystrom, and meets the accuracy against
    the cityblock kernel."""
    import sketchot.policy.ladder as auto

    monkeypatch.setattr(auto, "DIRECT_DENSE_ENTRIES", 0)
    rng = np.random.default_rng(3)
    X, Y = rng.random((60, d)), rng.random((50, d))

    def built(res):
        return {attempt.backend for attempt in res.attempts} | {res.backend}

    control = sketchot.sinkhorn(None, None, X, Y, reg, rng=0, warn=False)
    assert any(name.startswith("polyts") for name in built(control))  # a polynomial rung
    res = sketchot.sinkhorn(None, None, X, Y, reg, metric="cityblock", rng=0, warn=False)
    assert built(res) <= {"exact", "nystrom"}
    assert res.accuracy_met
    assert res.kernel.geometry.cost == make_cost("cityblock")


# ------------------------------------------------------------------ a user's backend
def l1_kernel(geometry, *, rng=None, dtype=np.float64):
    """exp(-||x - y||_1 / reg) stored whole as the factors (K, I): the issue's example."""
    del rng
    K = np.exp(-cdist(geometry.X, geometry.Y, "cityblock") / geometry.reg)
    return LowRankKernel(
        geometry,
        KernelInfo("user_l1", {}),
        K,
        np.eye(geometry.shape[1]),
        left_map=None,
        right_map=None,
        dtype=dtype,
    )


@pytest.fixture
def user_l1():
    sketchot.register_backend("user_l1", l1_kernel, metrics=("cityblock",))
    yield "user_l1"
    sketchot.unregister_backend("user_l1")


def test_user_backend_for_cityblock_reports_the_cityblock_cost(user_l1):
    """A user kernel of ||x - y||_1 registered with metrics=('cityblock',): value_linear is
    POT's ot.sinkhorn2 on ot.dist(X, Y, 'cityblock') (0.2171 here, where the squared-Euclidean
    expansion would report 0.0445); both converged to 1e-12, so 1e-8."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((40, 2)), rng.random((30, 2))
    a, b = np.full(40, 1 / 40), np.full(30, 1 / 30)
    expected = float(
        ot.sinkhorn2(a, b, ot.dist(X, Y, metric="cityblock"), 0.05, stopThr=1e-13, numItermax=10**5)
    )
    res = sketchot.sinkhorn(a, b, X, Y, 0.05, user_l1, metric="cityblock", tol=1e-12)
    assert res.value_linear == pytest.approx(expected, abs=1e-8)
    assert res.accuracy_met  # the true-kernel check evaluates exp(-||x - y||_1 / reg) too
    with pytest.raises(ValueError, match="supports metric='cityblock' only; got metric="):
        sketchot.sinkhorn(a, b, X, Y, 0.05, user_l1)


# ------------------------------------------------------------------ the true-kernel check
def test_true_kernel_check_is_honest_for_other_metrics(clouds):
    """The check of a Nystrom solve on a cityblock cost, exhaustive, equals the L1 marginal
    errors computed from the dense true kernel exp(-ot.dist(X, Y, 'cityblock') / reg) (to
    rounding: 1e-12 of the mass); sampled, its bound is above that truth."""
    a, b, X, Y = clouds
    res = sketchot.sinkhorn(
        a, b, X, Y, REG, "nystrom", metric="cityblock", rank=40, rng=0, warn=False
    )
    log_u, log_v = res.potentials
    K = np.exp(-ot.dist(X, Y, metric="cityblock") / REG)
    P = np.exp(log_u)[:, None] * K * np.exp(log_v)[None, :]
    truth_a, truth_b = np.abs(P.sum(1) - a).sum(), np.abs(P.sum(0) - b).sum()
    check = res.true_kernel
    assert check.exhaustive
    assert check.error_a == pytest.approx(truth_a, abs=1e-12)
    assert check.error_b == pytest.approx(truth_b, abs=1e-12)
    assert truth_a > 1e-6  # rank 20 leaves a visible error: the comparison is not vacuous
    sampled = sampled_true_kernel_check(
        res.kernel, a, b, log_u, log_v, 40, np.random.default_rng(1)
    )
    assert not sampled.exhaustive
    assert sampled.bound >= max(truth_a, truth_b)


# ------------------------------------------------------------------ the geometry's cost
@settings(max_examples=25, deadline=None)
@given(
    metric=st.sampled_from(["sqeuclidean", "euclidean", "cityblock", "minkowski"]),
    p=st.floats(1.0, 6.0),
    shift=st.floats(-50.0, 50.0),
    seed=st.integers(0, 2**16),
)
def test_geometry_cost_blocks_and_max_cost(metric, p, shift, seed):
    """The geometry's cost rows equal ot.dist on the raw points (centring changes nothing:
    every named metric is translation invariant; 1e-9 relative is the rounding of the centred
    squared expansion at coordinates up to 50), and max_cost bounds every entry."""
    rng = np.random.default_rng(seed)
    X, Y = rng.random((7, 3)) + shift, rng.random((5, 3))
    g = GibbsGeometry(X, Y, 1.0, make_cost(metric, p))
    M = ot.dist(X, Y, metric=metric, p=p) if metric == "minkowski" else ot.dist(X, Y, metric)
    scale = M.max()
    np.testing.assert_allclose(g.cost_block(slice(None)), M, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(-g.reg * g.log_block(slice(None)), M, rtol=0, atol=1e-9 * scale)
    assert g.max_cost() >= M.max() * (1 - 1e-12)


def test_callable_costs_are_evaluated_on_the_points_as_given():
    """A callable need not be translation invariant: it sees the raw points, and transposed
    products use c(x, y), not c(y, x)."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((6, 2)) + 3.0, rng.random((4, 2))

    def asymmetric(A, B):
        return np.abs(A[:, :1] - 2.0 * B[:, :1].T) + A[:, 1:] ** 2

    g = GibbsGeometry(X, Y, 0.5, make_cost(asymmetric))
    K = np.exp(-asymmetric(X, Y) / 0.5)
    np.testing.assert_allclose(g.block(slice(None)), K, rtol=1e-12)
    u = rng.random(6)
    np.testing.assert_allclose(g.matmat(slice(None), u, transpose=True), K.T @ u, rtol=1e-12)
    np.testing.assert_allclose(
        g.log_matvec(slice(None), np.log(u), transpose=True), np.log(K.T @ u), rtol=1e-12
    )
    assert g.max_cost() == pytest.approx(asymmetric(X, Y).max(), rel=1e-15)


def test_dask_arrays_take_other_metrics_and_their_squared_distance_jobs_refuse_them(clouds):
    """Dask solves and kernels take every metric (Dask's threaded scheduler here; on a
    cluster: tests/distributed/test_metrics_dask.py); the divergence, whose gradients are
    the squared distance's, refuses another one by name."""
    da = pytest.importorskip("dask.array")
    import dask

    a, b, X, Y = clouds
    expected = sketchot.sinkhorn(a, b, X, Y, REG, backend="exact", metric="cityblock")
    with dask.config.set(scheduler="threads"):
        got = sketchot.sinkhorn(a, b, da.from_array(X, chunks=(7, -1)), da.from_array(Y), REG,
                                backend="exact", metric="cityblock")  # fmt: skip
        kernel = sketchot.make_kernel(da.from_array(X), Y, REG, "exact", metric=chebyshev)
        with pytest.raises(NotImplementedError, match="for sinkhorn_divergence on Dask"):
            sketchot.sinkhorn_divergence(da.from_array(X), da.from_array(Y), a, b, reg=REG,
                                         metric="cityblock")  # fmt: skip
    # the same iteration, the chunks' sums in another order (measured ~1e-15)
    assert got.n_iter == expected.n_iter
    assert got.value == pytest.approx(expected.value, rel=1e-9)
    assert kernel.geometry.cost.metric is chebyshev


def test_a_geometry_sample_keeps_the_cost_on_a_subset_of_each_cloud(clouds):
    """``GibbsGeometry.sample`` (auto's stand-in for a large problem): rows of each cloud,
    without repetition, the same cost and reg."""
    _, _, X, Y = clouds
    g = GibbsGeometry(X, Y, REG, "cityblock")
    sub = g.sample(5, np.random.default_rng(2))
    assert sub.shape == (5, 5) and sub.reg == REG and sub.cost is g.cost
    for part, whole in ((sub.X, X), (sub.Y, Y)):
        matches = (part[:, None, :] == whole[None, :, :]).all(axis=2)
        assert (matches.sum(axis=1) >= 1).all() and np.unique(part, axis=0).shape[0] == 5
    assert g.sample(10**6, np.random.default_rng(2)).shape == g.shape


def _sq(A, B):
    return cdist(A, B, "sqeuclidean")


def _with_inf(A, B):
    C = _sq(A, B)
    C[0, 0] = np.inf  # a forbidden pair (POT: a zero kernel entry)
    return C


def _with_nan(A, B):
    C = _sq(A, B)
    C[1, 2] = np.nan
    return C


def _shifted(A, B):
    return _sq(A, B) - 1.0  # a constant shift of ot.dist: negative costs


@pytest.mark.parametrize(
    ("metric", "words"),
    [(_with_inf, "infinite costs"), (_with_nan, "NaN"), (_shifted, "negative costs")],
    ids=["inf", "nan", "negative"],
)
@pytest.mark.parametrize("backend", ["exact", "auto"])
def test_a_callable_with_nan_inf_or_negative_costs_is_refused_naming_metric(metric, words, backend):
    # issue 42 item 5: these gave a raw OverflowError, "Tighten tol" or "Pass reg=0 or larger"
    rng = np.random.default_rng(1)
    X, Y = rng.random((30, 2)), rng.random((25, 2))
    a, b = np.full(30, 1 / 30), np.full(25, 1 / 25)
    with pytest.raises(ValueError, match=f"metric callable returned {words}"):
        sketchot.sinkhorn(a, b, X, Y, reg=0.1, backend=backend, metric=metric)


def test_the_shift_remedy_of_negative_costs_gives_pots_plan():
    # the message's remedy (subtract the smallest cost) solves POT's problem on the shifted M:
    # same plan, value shifted by c * mass; POT's sinkhorn at stopThr=1e-12 as the reference
    rng = np.random.default_rng(2)
    X, Y = rng.random((30, 2)), rng.random((25, 2))
    a, b = np.full(30, 1 / 30), np.full(25, 1 / 25)
    M = _shifted(X, Y)
    c = float(M.min())
    res = sketchot.sinkhorn(
        a, b, X, Y, reg=0.1, backend="exact", metric=lambda A, B: _shifted(A, B) - c, tol=1e-12
    )
    plan = ot.sinkhorn(a, b, M, 0.1, stopThr=1e-12, numItermax=100_000)
    np.testing.assert_allclose(res.plan, plan, atol=1e-9)  # both at 1e-12 marginal error
    np.testing.assert_allclose(res.value_linear + c * a.sum(), np.sum(plan * M), rtol=1e-8)


@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_the_large_cost_remedy_of_forbidden_pairs_gives_pots_plan_with_inf(reg):
    # the message's remedy (1e3 times the largest allowed cost) against POT's sinkhorn_log on
    # M with +inf (a zero kernel entry); both solved to ~1e-12 marginal error
    rng = np.random.default_rng(1)
    X, Y = rng.random((30, 2)), rng.random((25, 2))
    a, b = np.full(30, 1 / 30), np.full(25, 1 / 25)

    def large(A, B):
        C = _sq(A, B)
        C[0, 0] = 1e3 * C.max()
        return C

    M = _with_inf(X, Y)
    res = sketchot.sinkhorn(a, b, X, Y, reg=reg, backend="exact", metric=large, tol=1e-10)
    plan = ot.sinkhorn(a, b, M, reg, method="sinkhorn_log", stopThr=1e-12, numItermax=100_000)
    assert res.converged and res.plan[0, 0] == 0.0
    np.testing.assert_allclose(res.plan, plan, atol=1e-9)
