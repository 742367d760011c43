"""The block-local kernel (``backend='polyts_local'``) on Dask arrays
(:mod:`sketchot.distributed.local`), on a real LocalCluster (the ``client`` fixture): the
clouds in blocks of whole clusters on the workers, products against dense log-sum-exps,
solves against the in-memory kernel and the exact one, a worker killed mid-solve."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from scipy.special import logsumexp

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import sketchot  # noqa: E402
from sketchot.distributed import (  # noqa: E402
    DaskBlockLocal,
    DaskGibbsGeometry,
    cluster_blocks,
    dask_local_kernel,
)
from sketchot.distributed import local as local_module  # noqa: E402
from sketchot.sketch.local.blocks import BlockExpansion  # noqa: E402

N, M, REG = 700, 500, 0.01


def clouds(seed=20261129):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((N, 3)), rng.random((M, 3)) * 0.9 + 0.05
    a, b = rng.random(N) + 0.1, rng.random(M) + 0.1
    a[[3, 400]] = 0.0  # zero weights
    return X, Y, a / a.sum(), b / b.sum()


def dense_log_product(X, Y, log_w, reg):
    return logsumexp(log_w[None, :] - ((X[:, None] - Y[None]) ** 2).sum(-1) / reg, axis=1)


@pytest.fixture(scope="module")
def kernel(client):
    X, Y, _, _ = clouds()
    geometry = DaskGibbsGeometry(
        da.from_array(X, chunks=(150, 3)), da.from_array(Y, chunks=(130, 3)), REG
    )
    return dask_local_kernel(geometry, rng=0, tau=2.0, n_blocks=4)


def test_blocks_hold_every_point_once_and_route_vectors_both_ways(client):
    X, _, _, _ = clouds()
    Xd = da.from_array(X - X.mean(0), chunks=(150, 3))
    expansion = BlockExpansion(REG, 3, tau=2.0, rtol=1e-6)
    blocks = cluster_blocks(Xd, expansion, np.random.default_rng(0), n_blocks=5)
    rows = np.concatenate([client.compute(r).result() for r in blocks.rows])
    np.testing.assert_array_equal(np.sort(rows), np.arange(N))
    assert sum(blocks.sizes) == N and blocks.n_blocks == 5
    values = da.from_array(np.arange(N, dtype=float), chunks=(150,))
    back = blocks.to_cloud(blocks.to_blocks(values)).compute()
    np.testing.assert_array_equal(back, np.arange(N))


def test_the_number_of_blocks_comes_from_the_points_not_the_chunks(client, monkeypatch):
    """Fine chunks once meant as many small blocks, each term's work growing with their
    number: the default is ``max(2, ceil(n / BLOCK_POINTS))`` whatever the chunks."""
    X, _, _, _ = clouds()
    expansion = BlockExpansion(REG, 3, tau=2.0, rtol=1e-6)
    for chunk in (50, N):
        Xd = da.from_array(X - X.mean(0), chunks=(chunk, 3))
        assert cluster_blocks(Xd, expansion, np.random.default_rng(0)).n_blocks == 2
    monkeypatch.setattr(local_module, "BLOCK_POINTS", 300)
    assert cluster_blocks(Xd, expansion, np.random.default_rng(0)).n_blocks == 3
    with pytest.raises(ValueError, match="n_blocks"):
        cluster_blocks(Xd, expansion, np.random.default_rng(0), n_blocks=0)


def test_products_are_the_kernel_to_its_certified_error(kernel):
    """Log products both ways and the means, against dense log-sum-exps: within the
    kernel's ``product_rtol`` (entries within their bound, rows missing at most
    ``truncate``)."""
    X, Y, _, _ = clouds()
    rng = np.random.default_rng(1)
    placement = kernel.placement
    assert isinstance(placement, DaskBlockLocal)
    rtol = kernel.info.product_rtol
    log_v = rng.normal(size=M) * 20.0
    log_v[7] = -np.inf
    rows = placement.log_matvec(log_v).compute()
    assert np.max(np.abs(np.expm1(rows - dense_log_product(X, Y, log_v, REG)))) <= rtol
    log_u = rng.normal(size=N) * 20.0
    cols = placement.log_rmatvec(da.from_array(log_u, chunks=(150,)))
    assert np.max(np.abs(np.expm1(cols - dense_log_product(Y, X, log_u, REG)))) <= rtol
    _log_kv, means = kernel.log_means("rows", log_v)
    # linear products of non-negative values go through the log passes
    w = np.exp(log_v - log_v.max())
    np.testing.assert_allclose(
        kernel.matvec(w).compute(), np.exp(rows - log_v.max()), rtol=1e-12, atol=0
    )
    u = np.exp(log_u - log_u.max())
    got = kernel.rmatvec(da.from_array(u, chunks=(150,)))
    assert got.shape == (M,)
    np.testing.assert_allclose(got, np.exp(cols - log_u.max()), rtol=1e-12, atol=0)
    logits = log_v[None, :] - ((X[:, None] - Y[None]) ** 2).sum(-1) / REG
    weights = np.exp(logits - logsumexp(logits, axis=1)[:, None])
    centred = Y - kernel.geometry.center
    # a weighted mean of entries each within rtol: off by at most 2 rtol times the reach
    assert np.max(np.abs(means.compute() - weights @ centred)) <= 4 * rtol


@pytest.mark.parametrize("coarse", [False, True], ids=["cold", "coarse_to_fine"])
def test_the_solve_is_the_in_memory_one(client, coarse):
    """The Dask solve of the block-local kernel against the in-memory one on the same
    clouds: the same problem solved to the same certified accuracy (the clusters differ:
    each chunk covers its own outliers), values and maps to that accuracy; its summary
    (marginals, cost) is the plan of its own potentials, checked densely. The coarse start's
    potentials (offsets of thousands) once made blocks that skip a row swamp the others'
    terms."""
    X, Y, a, b = clouds()
    memory = sketchot.sinkhorn(a, b, X, Y, REG, backend="polyts_local", rng=0)
    Xd, Yd = da.from_array(X, chunks=(150, 3)), da.from_array(Y, chunks=(130, 3))
    ad, bd = da.from_array(a, chunks=(150,)), da.from_array(b, chunks=(130,))
    result = sketchot.sinkhorn(
        ad, bd, Xd, Yd, REG, backend="polyts_local", rng=0, coarse_to_fine=coarse
    )
    assert isinstance(result.kernel.placement, DaskBlockLocal)
    assert result.converged and result.true_kernel.bound <= 1e-3
    # both certified to 1e-3 in L1 on the marginals: the values agree to about that
    # times the largest cost
    assert abs(result.value_linear - memory.value_linear) <= 2e-3 * 2.0
    # the plan of the returned potentials, dense: the summary's products are within the
    # kernel's product_rtol of it (entries and truncation), far below the solve's accuracy
    log_u, log_v = (p.compute() for p in result.potentials)
    cost = ((X[:, None] - Y[None]) ** 2).sum(-1)
    plan = np.exp(log_u[:, None] + log_v[None, :] - cost / REG)
    rtol = 10 * result.kernel.info.product_rtol
    assert result.value_linear == pytest.approx(float((plan * cost).sum()), rel=rtol)
    np.testing.assert_allclose(result.marginals[1].compute(), plan.sum(0), rtol=rtol, atol=1e-15)
    row = result.marginals[0].compute()
    np.testing.assert_allclose(row.sum(), 1.0, atol=2e-3)
    assert np.all(row[a == 0] == 0)
    exact = sketchot.sinkhorn(a, b, X, Y, REG, backend="exact", tol=1e-9)
    mapped = result.barycentric_map().compute()
    assert np.nanmax(np.abs(mapped - exact.barycentric_map())[a > 0]) <= 0.05
    inverse = result.inverse_barycentric_map().compute()
    assert inverse.shape == (M, 3) and np.all(np.isfinite(inverse))


def test_the_same_call_twice_gives_the_same_answer(client):
    X, Y, _, _ = clouds(7)
    Xd, Yd = da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=(200, 3))
    first = sketchot.sinkhorn(None, None, Xd, Yd, REG, backend="polyts_local", rng=3)
    second = sketchot.sinkhorn(None, None, Xd, Yd, REG, backend="polyts_local", rng=3)
    assert first.value_linear == second.value_linear
    assert first.n_iter == second.n_iter
    np.testing.assert_array_equal(first.potentials[0].compute(), second.potentials[0].compute())


def test_one_kernel_solves_several_problems_with_warm_starts(kernel):
    X, Y, a, b = clouds()
    ad, bd = da.from_array(a, chunks=(150,)), da.from_array(b, chunks=(130,))
    cold = sketchot.sinkhorn_kernel(ad, bd, kernel)
    warm = sketchot.sinkhorn_kernel(ad, bd, kernel, warmstart=cold.potentials)
    assert cold.converged and warm.converged
    assert warm.n_iter < cold.n_iter
    unbalanced = sketchot.sinkhorn_kernel(ad, bd, kernel, reg_m=0.5)
    memory = sketchot.sinkhorn(a, b, X, Y, REG, backend="exact", reg_m=0.5, tol=1e-9)
    assert abs(unbalanced.value - memory.value) <= 1e-2 * abs(memory.value)


def test_what_is_not_available_is_refused_by_name(kernel):
    X, Y, _a, _b = clouds()
    Xd, Yd = da.from_array(X, chunks=(150, 3)), da.from_array(Y, chunks=(130, 3))
    with pytest.raises(ValueError, match="log_domain"):
        sketchot.sinkhorn_kernel(None, None, kernel, log_domain=False)
    with pytest.raises(ValueError, match="non-negative"):
        kernel.matvec(-np.ones(M))
    with pytest.raises(ValueError, match="tau must be"):
        sketchot.make_kernel(Xd, Yd, REG, backend="polyts_local", tau="timed")
    with pytest.raises(ValueError, match="metric"):
        sketchot.make_kernel(Xd, Yd, REG, backend="polyts_local", metric="cityblock")
    result = sketchot.sinkhorn_kernel(None, None, kernel)
    with pytest.raises(NotImplementedError, match="new points"):
        result.barycentric_map(X[:5])


def test_a_worker_killed_mid_solve_loses_nothing(client):
    """A worker process dies while the block products run (its blocks and persisted
    passes are lost): Dask rebuilds them from their graphs and the solve ends as a solve
    without the fault does."""
    X, Y, _, _ = clouds(11)
    Xd, Yd = da.from_array(X, chunks=(150, 3)), da.from_array(Y, chunks=(130, 3))
    expected = sketchot.sinkhorn(None, None, Xd, Yd, REG, backend="polyts_local", rng=5)
    box = {}

    def solve():
        try:
            box["result"] = sketchot.sinkhorn(
                None, None, Xd, Yd, REG, backend="polyts_local", rng=5
            )
        except BaseException as error:  # reported by the assertion below
            box["error"] = error

    pids = client.run(os.getpid)
    thread = threading.Thread(target=solve)
    thread.start()
    # kill once both workers hold blocks (the kernel is built: the passes have begun)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
        any("_build_block" in str(key) for key in keys) for keys in client.has_what().values()
    ):
        time.sleep(0.02)
    time.sleep(0.5)
    victim = next(iter(client.scheduler_info()["workers"]))
    held = len(client.has_what()[victim])
    os.kill(pids[victim], signal.SIGKILL)  # the worker process dies; its nanny restarts it
    thread.join(timeout=600)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    assert held > 0
    result = box["result"]
    assert result.n_iter == expected.n_iter
    assert result.value_linear == pytest.approx(expected.value_linear, rel=1e-12)


def test_the_divergence_and_its_gradients_on_the_block_local_kernel(client):
    """The Sinkhorn divergence of Dask clouds with the block-local kernel against the
    in-memory one: the value to the certified accuracy, the position gradients (read from
    one log pass with means) to about that times the coordinates."""
    X, Y, a, b = clouds(13)
    memory = sketchot.sinkhorn_divergence(X, Y, a, b, reg=REG, backend="exact")
    Xd, Yd = da.from_array(X, chunks=(150, 3)), da.from_array(Y, chunks=(130, 3))
    ad, bd = da.from_array(a, chunks=(150,)), da.from_array(b, chunks=(130,))
    result = sketchot.sinkhorn_divergence(Xd, Yd, ad, bd, reg=REG, backend="polyts_local", rng=0)
    assert result.value == pytest.approx(memory.value, abs=1e-2 * abs(memory.value) + 1e-4)
    grad = result.grad_X.compute()
    assert np.max(np.abs(grad - memory.grad_X)) <= 1e-2 * np.max(np.abs(memory.grad_X))


def test_the_barycenter_of_dask_clouds_on_the_block_local_kernel(client):
    """The free-support barycentre of Dask clouds at small ``reg`` with the block-local
    kernel, against the in-memory one with the exact kernel from the same support draw
    (the same ``rng``): each transport is certified to the default accuracy (1e-3), so the
    support moves to within about that times the clouds' spread of the exact step's
    (measured: 2.5e-4 in the support, 3.5e-6 relative in the objective). The Dask
    barycentre once ignored ``backend`` (every transport was ``'auto'``'s choice)."""
    rng = np.random.default_rng(7)
    first, second = rng.random((300, 3)), rng.random((250, 3)) * 0.8 + 0.1
    kw = {"reg": REG, "n_support": 120, "max_iter": 3, "tol": 0.0, "rng": 5, "warn": False}
    want = sketchot.barycenter([first, second], backend="exact", **kw)
    got = sketchot.barycenter(
        [da.from_array(first, chunks=(100, 3)), da.from_array(second, chunks=(90, 3))],
        backend="polyts_local", **kw,
    )  # fmt: skip
    assert got.backends == ["polyts_local", "polyts_local"]
    assert all(r.converged and r.accuracy_met for r in got.results)
    assert isinstance(got.results[0].kernel.placement, DaskBlockLocal)
    np.testing.assert_allclose(got.X.compute(), want.X, rtol=0, atol=5e-3)
    assert got.objective == pytest.approx(want.objective, rel=1e-3)
