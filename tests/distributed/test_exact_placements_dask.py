"""The exact kernel's Dask placements (:class:`~sketchot.distributed.DaskStreamedExact`,
:class:`~sketchot.distributed.DaskStableExact`) against the in-memory one
(:class:`~sketchot.kernels.exact.HostExact`) on the same small clouds, on a real
LocalCluster (the ``client`` fixture of ``conftest.py``): one exact class, whose placement
decides where it runs (issue 43)."""

import importlib
import pkgutil

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import sketchot  # noqa: E402
from sketchot.distributed import (  # noqa: E402
    DaskExact,
    DaskGibbsGeometry,
    DaskStableExact,
    DaskStreamedExact,
    dask_exact_kernel,
    log_stable_kernel,
)
from sketchot.gibbs import GibbsGeometry  # noqa: E402
from sketchot.kernels import ExactKernel, KernelOperator  # noqa: E402
from sketchot.kernels.exact import AbsorbedExactKernel, HostExact  # noqa: E402
from sketchot.kernels.matrix_exact import SparseExactKernel  # noqa: E402

# float64 on both sides; the centre and the chunks' partial sums are added in another order
# (~1e-16 relative each): products agree to rounding, far below this
RTOL = 1e-12
# log-domain values are O(1) to O(max cost / reg): compared absolutely
LOG_ATOL = 1e-11
N, M = 83, 61


@pytest.fixture(scope="module", params=["sqeuclidean", "cityblock"])
def kernels(request, client):
    """``(dask, host, (X, Y, a, b))``: the streamed Dask kernel and the host kernel (never
    stored: streamed blocks too) of the same clouds, chunked unevenly."""
    rng = np.random.default_rng(20261129)
    X, Y = rng.random((N, 3)), rng.random((M, 3)) + 0.1
    a, b = rng.random(N), rng.random(M)
    a[[2, 50]] = 0.0  # zero weights: ratio 0, never bad
    a, b = a / a.sum(), b / b.sum()
    reg = 0.3
    geometry = DaskGibbsGeometry(
        da.from_array(X, chunks=(25, 3)), da.from_array(Y, chunks=(20, 3)), reg, request.param
    )
    dask_kernel = dask_exact_kernel(geometry)
    host = ExactKernel(
        GibbsGeometry(X, Y, reg, request.param), max_dense_bytes=0, placement=HostExact()
    )
    return dask_kernel, host, (X, Y, a, b)


def computed(value):
    return np.asarray(value.compute() if hasattr(value, "compute") else value)


def test_the_streamed_kernel_is_the_one_exact_class_on_a_dask_placement(kernels):
    kernel, _, _ = kernels
    assert type(kernel) is ExactKernel and isinstance(kernel.placement, DaskStreamedExact)
    assert kernel.info.capabilities == {"exact", "nonnegative", "deferred"}
    assert not kernel.is_dense and not kernel.on_device and not kernel.fused
    assert kernel.info.seconds_per_pass is None  # a pass's time is the cluster's
    Yc, y_sq = kernel.placement.whole_targets()
    assert Yc.numblocks == (1, 1) and y_sq.numblocks == (1,)  # one chunk, sent to each task


def test_products_rows_and_softmax_averages_match_the_host(kernels):
    kernel, host, (_, Y, _, b) = kernels
    rng = np.random.default_rng(1)
    V, U = rng.standard_normal((M, 3)), rng.standard_normal((N, 2))
    v, u = V[:, 0], U[:, 0]
    for got, want in [
        (kernel.matmat(V), host.matmat(V)),
        (kernel.matmat(da.from_array(V, chunks=(30, 3))), host.matmat(V)),
        (kernel.rmatmat(U), host.rmatmat(U)),
        (kernel.matvec(v), host.matvec(v)),
        (kernel.rmatvec(u), host.rmatvec(u)),
    ]:
        assert isinstance(got, da.Array)  # products stay on the cluster
        np.testing.assert_allclose(computed(got), want, rtol=RTOL)
    index = np.array([0, 7, 40, 82])
    np.testing.assert_allclose(kernel.to_dense(rows=index), host.to_dense(rows=index), rtol=RTOL)
    log_w = np.log(b + 1e-3)
    mapped = kernel.softmax_average(log_w, da.from_array(Y, chunks=(20, 3)))
    np.testing.assert_allclose(computed(mapped), host.softmax_average(log_w, Y), rtol=RTOL)
    # the inverse map's softmax over the sources, a zero weight among them (no mass there)
    X = kernel.geometry.Xc.compute() + kernel.geometry.center
    with np.errstate(divide="ignore"):
        log_u = np.log(np.linspace(0.0, 1.0, N))
    inverse = kernel.softmax_average(log_u, da.from_array(X, chunks=(25, 3)), transpose=True)
    assert isinstance(inverse, da.Array) and inverse.chunks[0] == kernel.geometry.Yc.chunks[0]
    np.testing.assert_allclose(
        computed(inverse), host.softmax_average(log_u, X, transpose=True), rtol=RTOL
    )


def test_deferred_passes_match_the_host(kernels):
    kernel, host, (_, _, a, b) = kernels
    w = np.linspace(0.2, 1.0, M)
    numerator = da.from_array(a, chunks=25)
    rows = kernel.fused_pass("rows", w, numerator)
    want = host.fused_pass("rows", w, a)
    products, ratios, projection, bad, n_bad = rows.evaluate(
        rows.products, rows.ratios.to_dask(), rows.projection, rows.bad, rows.n_bad
    )
    np.testing.assert_allclose(products, want.products, rtol=RTOL)
    np.testing.assert_allclose(ratios, want.ratios, rtol=RTOL)
    np.testing.assert_allclose(projection, want.projection, rtol=RTOL)
    np.testing.assert_array_equal(bad, want.bad)
    assert int(n_bad) == want.n_bad
    # the columns (R = I): elementwise on the projection, whose value the pass took lazily
    cols = kernel.fused_pass("cols", rows.projection, da.from_array(b, chunks=20))
    want_cols = host.fused_pass("cols", want.projection, b)
    (ratios,) = cols.evaluate(cols.ratios.to_dask())
    np.testing.assert_allclose(ratios, want_cols.ratios, rtol=RTOL)
    np.testing.assert_allclose(
        computed(kernel.project("rows", numerator)), host.project("rows", a), rtol=RTOL
    )
    with pytest.raises(NotImplementedError, match="no log-domain products"):
        kernel.fused_pass("rows", w, numerator, log=True)
    with pytest.raises(NotImplementedError, match="no absorbed form"):
        kernel.absorbed(np.zeros(N), np.zeros(M))


def test_the_log_stable_form_shares_the_clouds_and_matches_the_host(kernels):
    """Its log passes, linear passes and projections; ``at_reg`` and ``absorbed`` keep the
    placement's persisted target cloud (nothing is recomputed)."""
    kernel, host, (_, _, a, b) = kernels
    stable = log_stable_kernel(kernel)
    assert type(stable) is ExactKernel and isinstance(stable.placement, DaskStableExact)
    assert stable.info.capabilities == {"exact", "nonnegative", "absorb", "log_products"}
    assert stable.placement.whole_targets() is kernel.placement.whole_targets()
    numerator = da.from_array(a, chunks=25)
    log_numerator = da.from_array(np.log(np.where(a > 0, a, 1e-300)), chunks=25)
    log_w = np.log(b)
    for derived, reference in [(stable, host), (stable.at_reg(0.05), host.at_reg(0.05))]:
        assert type(derived) is ExactKernel and derived.placement is stable.placement
        assert derived.geometry.reg == reference.geometry.reg
        got = derived.fused_pass("rows", log_w, log_numerator, log=True)
        want = reference.fused_pass("rows", log_w, np.log(np.where(a > 0, a, 1e-300)), log=True)
        np.testing.assert_allclose(computed(got.products), want.products, rtol=0, atol=LOG_ATOL)
        np.testing.assert_allclose(computed(got.ratios), want.ratios, rtol=0, atol=LOG_ATOL)
        np.testing.assert_allclose(got.projection, want.projection, rtol=0, atol=LOG_ATOL)
        linear = derived.fused_pass("rows", np.exp(log_w), numerator)
        want = reference.fused_pass("rows", np.exp(log_w), a)
        np.testing.assert_allclose(computed(linear.products), want.products, rtol=RTOL)
        np.testing.assert_allclose(linear.projection, want.projection, rtol=RTOL)
        assert linear.n_bad == want.n_bad
        u = np.linspace(0.0, 1.0, N)
        np.testing.assert_allclose(
            derived.project("rows", da.from_array(u, chunks=25)), reference.project("rows", u),
            rtol=RTOL,
        )  # fmt: skip
        np.testing.assert_allclose(
            derived.project("rows", da.from_array(np.log(u + 0.1), chunks=25), log=True),
            reference.project("rows", np.log(u + 0.1), log=True), rtol=0, atol=LOG_ATOL,
        )  # fmt: skip
        np.testing.assert_allclose(computed(derived.matvec(b)), reference.matvec(b), rtol=RTOL)
        np.testing.assert_allclose(
            derived.to_dense(rows=[1, 60]), reference.to_dense(rows=[1, 60]), rtol=RTOL
        )


@pytest.mark.parametrize("zero_weights", [False, True])
def test_absorbed_passes_match_the_host(kernels, zero_weights):
    """``diag(e^alpha) K diag(e^beta)`` on the log-stable placement: ``alpha`` persisted on
    the rows' chunks, ``beta`` on the client, the host's floor and exponents (the product
    form, or the elementwise one for infinite offsets)."""
    kernel, host, (_, _, a, _) = kernels
    stable = log_stable_kernel(kernel)
    rng = np.random.default_rng(3)
    alpha, beta = rng.normal(size=N), rng.normal(size=M)
    if zero_weights:
        alpha[a == 0] = -np.inf
    absorbed = stable.absorbed(da.from_array(alpha, chunks=25), beta)
    reference = host.absorbed(alpha, beta)
    assert type(absorbed) is AbsorbedExactKernel and absorbed.placement is stable.placement
    assert isinstance(absorbed.alpha, da.Array) and isinstance(absorbed.beta, np.ndarray)
    got = absorbed.fused_pass("rows", np.ones(M), da.from_array(a, chunks=25))
    want = reference.fused_pass("rows", np.ones(M), a)
    np.testing.assert_allclose(computed(got.products), want.products, rtol=RTOL)
    np.testing.assert_allclose(computed(got.ratios), want.ratios, rtol=RTOL)
    np.testing.assert_allclose(got.projection, want.projection, rtol=RTOL)
    np.testing.assert_array_equal(computed(got.bad), want.bad)
    assert got.n_bad == want.n_bad
    # the ratios' whole-array statistics came with the pass (no scheduler call)
    assert got.ratios.sum() == pytest.approx(want.ratios.sum(), rel=RTOL)
    assert got.ratios.max() == pytest.approx(want.ratios.max(), rel=RTOL)
    u = np.linspace(0.0, 1.0, N)
    np.testing.assert_allclose(
        absorbed.project("rows", da.from_array(u, chunks=25)), reference.project("rows", u),
        rtol=RTOL,
    )  # fmt: skip
    with pytest.raises(NotImplementedError, match="linear passes only"):
        absorbed.fused_pass("rows", np.zeros(M), da.from_array(a, chunks=25), log=True)


def test_a_placement_of_other_clouds_is_refused(kernels):
    kernel, _, (X, Y, _, _) = kernels
    other = DaskGibbsGeometry(da.from_array(X, chunks=(25, 3)), da.from_array(Y + 1.0), 0.3)
    with pytest.raises(ValueError, match="another kernel"):
        ExactKernel(other, placement=kernel.placement)
    with pytest.raises(TypeError, match="exact kernel on Dask arrays"):
        log_stable_kernel(ExactKernel(GibbsGeometry(X, Y, 0.3)))


def test_one_exact_class_for_every_placement():
    """With every module loaded, no operator class is left for Dask: its exact kernels are
    the exact family's (``ExactKernel`` and its absorbed form) on Dask placements, its
    low-rank ones ``LowRankKernel`` on :class:`~sketchot.distributed.DaskFactors`."""
    for module in pkgutil.walk_packages(sketchot.__path__, "sketchot."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional dependency (torch, ...) is missing
            continue

    def subclasses(cls):
        found = set()
        for sub in cls.__subclasses__():
            found |= {sub} | subclasses(sub)
        return found

    every = subclasses(KernelOperator)
    assert not [c for c in every if c.__module__.startswith("sketchot.distributed")]
    assert set(ExactKernel.__subclasses__()) == {AbsorbedExactKernel, SparseExactKernel}
    assert issubclass(DaskStreamedExact, DaskExact) and issubclass(DaskStableExact, DaskExact)


@pytest.mark.parametrize("log_domain", [False, "auto"])
def test_the_inverse_barycentric_map_of_an_exact_solve_is_the_in_memory_one(client, log_domain):
    """The plain (deferred) and the log-stable Dask solves map the targets onto ``X`` as the
    in-memory exact solve does (the same potentials to the solves' tolerance: 1e-9)."""
    rng = np.random.default_rng(11)
    X, Y = rng.random((90, 2)), rng.random((70, 2)) + 0.3
    a, b = np.full(90, 1 / 90), np.full(70, 1 / 70)
    options = {"tol": 1e-12, "accuracy": None, "warn": False, "log_domain": log_domain}
    expected = sketchot.sinkhorn(a, b, X, Y, reg=0.05, backend="exact", **options)
    result = sketchot.sinkhorn(
        da.from_array(a, chunks=40), da.from_array(b, chunks=30),
        da.from_array(X, chunks=(40, 2)), da.from_array(Y, chunks=(30, 2)),
        reg=0.05, backend="exact", **options,
    )  # fmt: skip
    mapped = result.inverse_barycentric_map()
    assert isinstance(mapped, da.Array)
    np.testing.assert_allclose(
        mapped.compute(), expected.inverse_barycentric_map(), rtol=0, atol=1e-9
    )
    with pytest.raises(NotImplementedError, match="new points need a low-rank backend"):
        result.inverse_barycentric_map(Y)
