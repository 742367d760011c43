"""Unbalanced and semi-relaxed solves on Dask arrays against the in-memory solve, on a real
LocalCluster (the ``client`` fixture of ``conftest.py``: two worker processes, no mocks).

The same call with ``X``, ``Y`` chunked by rows and the weights chunked alike returns Dask
``potentials`` and ``marginals`` and a float ``value_linear``, equal to the in-memory answer
for the backends that run on Dask, with the same ``rng``.
"""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import dask  # noqa: E402

import sketchot  # noqa: E402

# Sums over chunks run in another order than in memory: ~1e-16 per pass, far below this.
RTOL = 1e-12

INF = float("inf")
REG = 0.5  # the clouds' mean squared distance is ~0.6

# Twelve iterations whatever the error, no check against the true kernel: the two solves run
# the same iterations and are compared iterate for iterate.
SOLVE = {"max_iter": 12, "tol": 1e-300, "warn": False, "accuracy": None, "errors": "warn"}

# The same algorithm on both sides: the exact kernel's plain iteration (the in-memory default
# is the absorption-stabilised path, which Dask does not have), the global improved polyts
# sketch (its block-local form needs the clouds in memory) and no Anderson mixing (Dask
# solves cannot mix without gathering v).
SAME_ALGORITHM = {"polyts": {"variant": "improved"}, "exact": {"log_domain": False}}


def label(reg_m) -> str:
    if isinstance(reg_m, tuple):
        return "(" + ",".join("inf" if r == INF else f"{r:g}" for r in reg_m) + ")"
    return f"{reg_m:g}"


@pytest.fixture(scope="module")
def problem():
    """Clouds of odd sizes, positive non-uniform weights of masses 1 and 1.4."""
    rng = np.random.default_rng(20261201)
    X, Y = rng.random((613, 3)), rng.random((457, 3)) + 0.2
    a, b = rng.uniform(0.5, 1.5, 613), rng.uniform(0.5, 1.5, 457)
    return a / a.sum(), 1.4 * b / b.sum(), X, Y


def _dask(problem, chunks_x, chunks_y):
    a, b, X, Y = problem
    return (
        da.from_array(a, chunks=chunks_x),
        da.from_array(b, chunks=chunks_y),
        da.from_array(X, chunks=(chunks_x, 3)),
        da.from_array(Y, chunks=(chunks_y, 3)),
    )


def _options(backend: str, **extra) -> dict:
    return {**SOLVE, "anderson": 0, **SAME_ALGORITHM.get(backend, {}), **extra}


def _assert_same(result, expected):
    assert result.n_iter == expected.n_iter
    assert result.converged == expected.converged
    for got, want in zip(result.potentials, expected.potentials, strict=True):
        assert isinstance(got, da.Array)
        got = got.compute()
        assert np.all(np.isfinite(want))  # positive weights: finite scalings
        np.testing.assert_allclose(np.exp(got), np.exp(want), rtol=RTOL)
    for got, want in zip(result.marginals, expected.marginals, strict=True):
        assert isinstance(got, da.Array)
        np.testing.assert_allclose(got.compute(), want, rtol=RTOL, atol=1e-15)
    assert isinstance(result.value_linear, float)
    assert result.value_linear == pytest.approx(expected.value_linear, rel=RTOL)
    assert result.mass == pytest.approx(expected.mass, rel=RTOL)


# Every backend that runs on Dask, and every form of reg_m (both sides, semi-relaxed either
# way) on one of them; a cluster solve costs seconds on two shared cores, so not every pair.
CLUSTER_CASES = [
    ("exact", 0.5),
    ("nystrom", 0.5),
    ("nystrom", (INF, 0.5)),
    ("nystrom", (0.5, INF)),
    ("rff", (INF, 0.5)),
    ("polyts", (0.5, INF)),
]


@pytest.mark.parametrize(
    ("backend", "reg_m"), CLUSTER_CASES, ids=[f"{b}-{label(r)}" for b, r in CLUSTER_CASES]
)
def test_dask_matches_numpy_on_a_cluster(client, problem, backend, reg_m):
    options = _options(backend)
    expected = sketchot.sinkhorn(*problem, reg=REG, reg_m=reg_m, backend=backend, rng=7, **options)
    result = sketchot.sinkhorn(
        *_dask(problem, 97, 131), reg=REG, reg_m=reg_m, backend=backend, rng=7, **options
    )
    _assert_same(result, expected)


def test_converged_solve_stops_at_the_same_check(problem):
    """To convergence (the threaded scheduler: the cluster's part is above): the same checks,
    the same stop, the same answer."""
    options = _options("nystrom", max_iter=2000, tol=1e-10, check_every=5, rank=40)
    expected = sketchot.sinkhorn(*problem, reg=REG, reg_m=0.5, backend="nystrom", rng=3, **options)
    with dask.config.set(scheduler="threads"):
        result = sketchot.sinkhorn(
            *_dask(problem, 101, 77), reg=REG, reg_m=0.5, backend="nystrom", rng=3, **options
        )
    assert result.converged and expected.converged
    assert [i for i, _ in result.error_history] == [i for i, _ in expected.error_history]
    _assert_same(result, expected)


@pytest.mark.parametrize("backend", ["exact", "nystrom"])
def test_other_entries_and_the_threaded_scheduler(problem, backend):
    """No client (the local threaded scheduler), other chunks; ``sinkhorn_unbalanced`` and
    ``sinkhorn2`` on Dask arrays give the same numbers."""
    options = _options(backend)
    reg_m = (INF, 0.5)
    with dask.config.set(scheduler="threads"):
        expected = sketchot.sinkhorn(
            *problem, reg=REG, reg_m=reg_m, backend=backend, rng=7, **options
        )
        result = sketchot.sinkhorn_unbalanced(
            *_dask(problem, 613, 50), REG, reg_m, backend=backend, rng=7, **options
        )
        _assert_same(result, expected)
        value = sketchot.sinkhorn2(
            *_dask(problem, 200, 64), reg=REG, reg_m=reg_m, backend=backend, rng=7, **options
        )
        assert value == pytest.approx(expected.value_linear, rel=RTOL)


def test_unequal_masses_without_reg_m_are_refused_on_dask(problem):
    with dask.config.set(scheduler="threads"), pytest.raises(ValueError, match="reg_m"):
        sketchot.sinkhorn(*_dask(problem, 97, 131), reg=REG, backend="nystrom", rng=7, **SOLVE)
