"""Coarse-to-fine starts on Dask (:mod:`sketchot.distributed.multiscale`) against the
in-memory start of the same data, on a real LocalCluster (``client`` of ``conftest.py``)."""

from unittest import mock

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import dask  # noqa: E402

import sketchot  # noqa: E402
from sketchot.distributed import multiscale  # noqa: E402

# Both solves stop at the caller's tolerance (POT's 1e-9 stopThr is not at stake: these are
# certified to the default 1e-3 L1 marginal error); the values of two certified solves of
# one problem differ by far less than 1e-4 relative (measured below 1e-6).
VALUE_RTOL = 1e-4


def clouds(rng, n, m):
    return rng.random((n, 3)), rng.random((m, 3)) + 0.1


def small_reg(X, Y, factor):
    return factor * float(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1).mean())


def started(result):
    return result.iteration_info.get("coarse_to_fine")


@pytest.mark.parametrize("reg_m", [None, 0.5])
def test_coarse_start_on_a_cluster_is_the_in_memory_start(client, reg_m):
    """Below KMEANS_SAMPLE rows the Dask start draws the in-memory sample and seeds: the
    same clusters and coarse iterations, a certified solve of the same value, and fewer
    fine iterations than a cold solve (in memory: the same iteration from a cold start)."""
    rng = np.random.default_rng(4)
    X, Y = clouds(rng, 300, 240)
    a, b = rng.random(300), rng.random(240)
    a[[5, 77]] = 0.0
    a, b = a / a.sum(), b / b.sum()
    reg = small_reg(X, Y, 0.01)
    options = {"reg_m": reg_m, "rng": 3, "coarse_to_fine": True}
    expected = sketchot.sinkhorn(a, b, X, Y, reg, backend="exact", **options)
    Xd, Yd = da.from_array(X, chunks=(70, 3)), da.from_array(Y, chunks=(100, 3))
    result = sketchot.sinkhorn(da.from_array(a, chunks=70), b, Xd, Yd, reg, backend="exact",
                               **options)  # fmt: skip
    cold = sketchot.sinkhorn(a, b, X, Y, reg, backend="exact", reg_m=reg_m, rng=3,
                             coarse_to_fine=False)  # fmt: skip
    mine, theirs = started(result), started(expected)
    assert mine["used"] and theirs["used"] and started(cold) is None
    assert mine["clusters"] == theirs["clusters"]
    assert mine["coarse_iter"] == theirs["coarse_iter"]
    assert result.converged and result.true_kernel.bound <= result.options["accuracy"]
    assert result.value == pytest.approx(expected.value, rel=VALUE_RTOL)
    assert result.n_iter < cold.n_iter
    assert any("started from a coarse solve" in note for note in result.notes)
    f = dask.compute(result.potentials[0])[0]
    assert np.isneginf(f[[5, 77]]).all() and np.isfinite(np.delete(f, [5, 77])).all()


def test_sampled_seeds_do_not_depend_on_the_chunks(client):
    """Above KMEANS_SAMPLE rows (lowered here to 150) the seeds come from rows drawn by
    index and then by weight: two chunkings draw the same rows and give the same start."""
    rng = np.random.default_rng(8)
    X, Y = clouds(rng, 400, 350)
    a = rng.random(400)
    a[:40] = 0.0
    reg = small_reg(X, Y, 0.01)
    starts = []
    with mock.patch.object(multiscale, "KMEANS_SAMPLE", 150):
        for chunks in (57, 200):
            result = sketchot.sinkhorn(
                da.from_array(a / a.sum(), chunks=chunks), None,
                da.from_array(X, chunks=(chunks, 3)), da.from_array(Y, chunks=(chunks, 3)),
                reg, backend="exact", rng=1, coarse_to_fine=True,
            )  # fmt: skip
            assert started(result)["used"] and result.converged
            starts.append(result)
    first, second = starts
    assert started(first)["clusters"] == started(second)["clusters"]
    assert started(first)["coarse_iter"] == started(second)["coarse_iter"]
    assert first.value == pytest.approx(second.value, rel=VALUE_RTOL)


def test_auto_and_a_warm_start_leave_the_start_cold(client):
    """'auto' starts coarse only where the in-memory rule does (n m >= 5e7 entries and a
    spread of 30); a caller's warm start wins over coarse_to_fine=True."""
    rng = np.random.default_rng(2)
    X, Y = clouds(rng, 120, 90)
    Xd, Yd = da.from_array(X, chunks=(40, 3)), da.from_array(Y, chunks=(30, 3))
    reg = small_reg(X, Y, 0.05)
    auto = sketchot.sinkhorn(None, None, Xd, Yd, reg, backend="exact")
    assert started(auto) is None
    warm = sketchot.sinkhorn(None, None, Xd, Yd, reg, backend="exact",
                             warmstart=auto.potentials, coarse_to_fine=True)  # fmt: skip
    assert started(warm) is None and warm.n_iter < auto.n_iter


def test_coarsen_on_dask_is_coarsen_in_memory(client):
    """The clusters' centres and masses of a Dask cloud are those of the in-memory k-means
    with the same generator (the same sample and seeds), whatever the chunks."""
    from sketchot.solver.multiscale import coarsen

    rng = np.random.default_rng(6)
    X = rng.random((500, 2))
    w = rng.random(500)
    w[::7] = 0.0
    expected = coarsen(X, w, 20, np.random.default_rng(9))
    for chunks in (64, 500):
        centers, masses = multiscale.coarsen_dask(
            da.from_array(X, chunks=(chunks, 2)), da.from_array(w, chunks=chunks), 20,
            np.random.default_rng(9),
        )  # fmt: skip
        np.testing.assert_allclose(centers, expected.centers, rtol=1e-12)
        np.testing.assert_allclose(masses, expected.masses, rtol=1e-12)
