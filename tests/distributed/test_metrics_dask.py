"""Every metric the in-memory kernels take, on Dask arrays: the exact kernel's log-stable
solve, the plain iteration, the coarse-to-fine start, the true-kernel check, the barycentric
map, ``'auto'`` and the low-rank backends that declare the metric, against the in-memory
solve of the same data on a real LocalCluster (``client`` of ``conftest.py``)."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import dask  # noqa: E402

import sketchot  # noqa: E402
from sketchot.distributed import DaskStableExact  # noqa: E402
from sketchot.kernels import ExactKernel  # noqa: E402

# The same iteration on both sides; only the order of the chunks' partial sums differs
# (~1e-16 relative per pass; these runs take < 100 iterations): potentials agree to 1e-8 in
# cost units and values to 1e-9 relative (both measured at ~1e-14).
POTENTIAL_ATOL = 1e-8
VALUE_RTOL = 1e-9
# A coarse start and a certified stop: two certified solves of one problem (the default
# 1e-3 marginal error) agree in value to far less than 1e-4 (measured below 1e-6).
STARTED_VALUE_RTOL = 1e-4


def first_coordinate_cost(A, B):
    """An asymmetric callable cost: |a_0 - b_0|^1.5 plus 0.1 where a_1 > b_1."""
    gap = np.abs(A[:, None, 0] - B[None, :, 0]) ** 1.5
    return gap + 0.1 * (A[:, None, 1] > B[None, :, 1])


METRICS = [
    pytest.param({"metric": "euclidean"}, 0.05, id="euclidean"),
    pytest.param({"metric": "cityblock"}, 0.02, id="cityblock"),
    pytest.param({"metric": "minkowski", "p": 3}, 0.02, id="minkowski-3"),
    pytest.param({"metric": first_coordinate_cost}, 0.01, id="callable"),
]


def clouds(seed, n=240, m=200):
    rng = np.random.default_rng(seed)
    return rng.random((n, 3)), rng.random((m, 3)) + 0.1


def dask_clouds(X, Y):
    return da.from_array(X, chunks=(70, 3)), da.from_array(Y, chunks=(60, 3))


def assert_same_potentials(result, expected, reg):
    f, g = (np.asarray(p) for p in dask.compute(*result.potentials))
    f0, g0 = expected.potentials
    shift = np.mean(f - f0)  # the gauge (f + c, g - c)
    np.testing.assert_allclose(f - shift, f0, rtol=0, atol=POTENTIAL_ATOL / reg)
    np.testing.assert_allclose(g + shift, g0, rtol=0, atol=POTENTIAL_ATOL / reg)


@pytest.mark.parametrize(("metric", "reg"), METRICS)
def test_exact_solves_match_memory_for_every_metric(client, metric, reg):
    """The log-stable default stops at the in-memory iteration with its potentials and
    value, certified by the sampled true-kernel check on the workers; the plain iteration
    (``log_domain=False``, whose checks come at other iterations on Dask) converged tightly
    gives the in-memory value (its plan streamed with the metric's cost); the barycentric
    map (a streamed softmax of the metric) equals the in-memory map."""
    X, Y = clouds(1)
    Xd, Yd = dask_clouds(X, Y)
    options = {"backend": "exact", "rng": 2, **metric}
    expected = sketchot.sinkhorn(None, None, X, Y, reg, **options)
    result = sketchot.sinkhorn(None, None, Xd, Yd, reg, **options)
    assert type(result.kernel) is ExactKernel
    assert isinstance(result.kernel.placement, DaskStableExact)
    assert result.n_iter == expected.n_iter and result.converged
    assert result.value == pytest.approx(expected.value, rel=VALUE_RTOL)
    assert_same_potentials(result, expected, reg)
    assert result.true_kernel.bound <= result.options["accuracy"]
    np.testing.assert_allclose(
        np.asarray(result.barycentric_map()), expected.barycentric_map(), rtol=1e-10, atol=1e-12
    )


def test_the_plain_iteration_takes_a_metric(client):
    """``log_domain=False`` (the plain iteration, whose checks come at other iterations on
    Dask) converged tightly gives the in-memory value, its plan streamed with the metric's
    cost."""
    X, Y = clouds(2, 120, 100)
    Xd, Yd = dask_clouds(X, Y)
    options = {"backend": "exact", "metric": "cityblock", "log_domain": False, "tol": 1e-9}
    expected = sketchot.sinkhorn(None, None, X, Y, 0.3, **options)
    result = sketchot.sinkhorn(None, None, Xd, Yd, 0.3, **options)
    again = sketchot.sinkhorn(None, None, Xd, Yd, 0.3, **options)  # the same call: same bits
    assert again.value == result.value and again.n_iter == result.n_iter
    assert result.converged and expected.converged
    # both converged to a 1e-9 marginal residual: values agree far below 1e-6 relative
    assert result.value_linear == pytest.approx(expected.value_linear, rel=1e-6)
    assert result.value == pytest.approx(expected.value, rel=1e-6)


@pytest.mark.parametrize(("metric", "reg"), METRICS[1:3])
def test_coarse_to_fine_start_with_a_metric_matches_memory(client, metric, reg):
    """The coarse solve on the clusters' centres and the extrapolation on the workers use
    the metric: the same clusters and coarse iterations as in memory, and a certified solve
    of the same value. A callable is refused as in memory (the start assumes a symmetric
    cost)."""
    X, Y = clouds(3, 300, 240)
    Xd, Yd = dask_clouds(X, Y)
    with pytest.raises(ValueError, match="coarse_to_fine=True needs a named metric"):
        sketchot.sinkhorn(None, None, Xd, Yd, reg, metric=first_coordinate_cost,
                          coarse_to_fine=True)  # fmt: skip
    options = {"backend": "exact", "rng": 3, "coarse_to_fine": True, **metric}
    expected = sketchot.sinkhorn(None, None, X, Y, reg / 3, **options)
    result = sketchot.sinkhorn(None, None, Xd, Yd, reg / 3, **options)
    mine, theirs = (r.iteration_info["coarse_to_fine"] for r in (result, expected))
    assert mine["used"] and theirs["used"]
    assert mine["clusters"] == theirs["clusters"]
    assert mine["coarse_iter"] == theirs["coarse_iter"]
    assert result.converged and result.true_kernel.bound <= result.options["accuracy"]
    assert result.value == pytest.approx(expected.value, rel=STARTED_VALUE_RTOL)


def test_auto_and_low_rank_backends_take_the_metrics_they_declare(client):
    """``'auto'`` chooses among the backends that declare the metric and run on Dask; a
    backend that does not declare it is refused by name, as in memory; Nystrom on a
    metric's kernel builds the in-memory factors (same landmarks) on the workers."""
    X, Y = clouds(5)
    Xd, Yd = dask_clouds(X, Y)
    result = sketchot.sinkhorn(None, None, Xd, Yd, 0.05, metric="euclidean", rng=0)
    assert result.backend in ("exact", "nystrom")
    assert result.converged and result.true_kernel.bound <= result.options["accuracy"]
    with pytest.raises(ValueError, match=r"backend 'rff' supports metric='sqeuclidean' only"):
        sketchot.sinkhorn(None, None, Xd, Yd, 0.05, backend="rff", metric="euclidean")
    kernel = sketchot.make_kernel(Xd, Yd, 0.5, backend="nystrom", rank=40, metric="cityblock",
                                  rng=0)  # fmt: skip
    local = sketchot.make_kernel(X, Y, 0.5, backend="nystrom", rank=40, metric="cityblock", rng=0)
    v = np.random.default_rng(1).random(Y.shape[0])
    np.testing.assert_allclose(np.asarray(kernel.matvec(v)), local.matvec(v), rtol=1e-9)
    # a low-rank plan's cost against the metric's blocks, summed per chunk on the workers
    # (rank 40 is too coarse at this reg: both say so, from the true kernel's marginals)
    options = {"backend": "nystrom", "rank": 40, "metric": "cityblock", "rng": 0}
    with pytest.warns(sketchot.AccuracyWarning, match="'nystrom' kernel is too coarse"):
        expected = sketchot.sinkhorn(None, None, X, Y, 0.5, **options)
    with pytest.warns(sketchot.AccuracyWarning, match="'nystrom' kernel is too coarse"):
        result = sketchot.sinkhorn(None, None, Xd, Yd, 0.5, **options)
    assert result.n_iter == expected.n_iter
    assert result.value_linear == pytest.approx(expected.value_linear, rel=VALUE_RTOL)


def test_auto_never_sends_one_key_with_two_task_specs(client, caplog):
    """The sampled kernel check of ``'auto'`` on a cluster built its probes in two graphs
    that named one key with two task specs, which the scheduler logs as a possible deadlock
    ("Detected different `run_spec`"); the probes are persisted first now."""
    X, Y = clouds(7, 150, 120)
    Xd, Yd = dask_clouds(X, Y)
    with caplog.at_level("WARNING", logger="distributed.scheduler"):
        sketchot.sinkhorn2(None, None, Xd, Yd, 0.5, rng=0)
        sketchot.sinkhorn2(None, None, Xd, Yd, 0.05, metric="cityblock", rng=0)
    assert not [r for r in caplog.records if "run_spec" in r.getMessage()]


def test_the_jobs_that_need_the_squared_distance_refuse_other_metrics_by_name(client):
    """The divergence's gradients and the barycentre's support update are those of
    ``||x - y||^2``: another metric is refused, naming the job and what does take it."""
    X, Y = clouds(6, 60, 50)
    Xd, Yd = dask_clouds(X, Y)
    with pytest.raises(NotImplementedError, match=r"sinkhorn_divergence on Dask.*sinkhorn"):
        sketchot.sinkhorn_divergence(Xd, Yd, reg=0.1, metric="euclidean")
    with pytest.raises(NotImplementedError, match=r"barycenter on Dask"):
        sketchot.barycenter([Xd, Yd], reg=0.1, metric="cityblock")
