"""The Dask path against the in-memory path, on a real LocalCluster (no mocks; the ``client``
fixture is in ``conftest.py``)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("dask.distributed")

import dask  # noqa: E402

import sketchot  # noqa: E402
from sketchot.distributed import DaskBlockLocal, DaskFactors, DaskStreamedExact  # noqa: E402
from sketchot.kernels import ExactKernel, LowRankKernel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# Sums over chunks run in another order than in memory: ~1e-16 per pass, far below this.
RTOL = 1e-12

LOW_RANK = ("nystrom", "rff", "polyts")


@pytest.fixture(scope="module")
def problem():
    """Clouds with odd sizes and weights with zeros."""
    rng = np.random.default_rng(20261126)
    X, Y = rng.random((613, 3)), rng.random((457, 3)) + 0.2
    a, b = rng.random(613), rng.random(457)
    a[[0, 17, 300]] = 0.0
    b[[5, 456]] = 0.0
    return a / a.sum(), b / b.sum(), X, Y


def _dask(problem, chunks_x, chunks_y):
    a, b, X, Y = problem
    return (
        da.from_array(a, chunks=chunks_x),
        da.from_array(b, chunks=chunks_y),
        da.from_array(X, chunks=(chunks_x, 3)),
        da.from_array(Y, chunks=(chunks_y, 3)),
    )


def _assert_same(result, expected):
    assert result.n_iter == expected.n_iter
    assert result.converged == expected.converged
    for got, want in zip(result.potentials, expected.potentials, strict=True):
        got = got.compute()
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(np.exp(got[finite]), np.exp(want[finite]), rtol=RTOL)
    for got, want in zip(result.marginals, expected.marginals, strict=True):
        np.testing.assert_allclose(got.compute(), want, rtol=RTOL, atol=1e-15)
    assert result.value_linear == pytest.approx(expected.value_linear, rel=RTOL)
    assert result.value == pytest.approx(expected.value, rel=RTOL)
    assert result.mass == pytest.approx(expected.mass, rel=RTOL)
    np.testing.assert_allclose(
        result.barycentric_map().compute(), expected.barycentric_map(), rtol=RTOL
    )


SOLVE = {"max_iter": 12, "tol": 1e-300, "warn": False, "accuracy": None, "errors": "warn"}

# The same algorithm on both sides: the global polyts sketch (its block-local form needs the
# clouds in memory) and the exact kernel's plain iteration (the in-memory default is the
# absorption-stabilised path, which Dask does not have).
SAME_ALGORITHM = {"polyts": {"variant": "improved"}, "exact": {"log_domain": False}}


@pytest.mark.parametrize("backend", [*LOW_RANK, "exact"])
def test_dask_matches_numpy_on_a_cluster(client, problem, backend):
    solve = {**SOLVE, **SAME_ALGORITHM.get(backend, {})}
    expected = sketchot.sinkhorn(*problem, reg=0.5, backend=backend, rng=7, **solve)
    result = sketchot.sinkhorn(*_dask(problem, 97, 131), reg=0.5, backend=backend, rng=7, **solve)
    assert isinstance(result.potentials[0], da.Array)
    assert isinstance(result.value_linear, float)
    if backend == "exact":  # the one exact class, its deferred passes on the cluster
        assert type(result.kernel) is ExactKernel
        assert isinstance(result.kernel.placement, DaskStreamedExact)
        assert "deferred" in result.kernel.info.capabilities
    else:  # the one low-rank class, its factors and passes on the cluster
        assert type(result.kernel) is LowRankKernel
        assert isinstance(result.kernel.placement, DaskFactors)
        assert "deferred" in result.kernel.info.capabilities
    _assert_same(result, expected)


@pytest.mark.parametrize("backend", [*LOW_RANK, "exact"])
def test_threaded_scheduler_without_client(problem, backend):
    """Dask arrays with no client (the local threaded scheduler), other chunks: same answer."""
    solve = {**SOLVE, **SAME_ALGORITHM.get(backend, {})}
    with dask.config.set(scheduler="threads"):
        result = sketchot.sinkhorn(
            *_dask(problem, 613, 50), reg=0.5, backend=backend, rng=7, **solve
        )
        expected = sketchot.sinkhorn(*problem, reg=0.5, backend=backend, rng=7, **solve)
        _assert_same(result, expected)
        value = sketchot.sinkhorn2(
            *_dask(problem, 200, 64), reg=0.5, backend=backend, rng=7, **solve
        )
        assert value == pytest.approx(expected.value_linear, rel=RTOL)


def _scheduler_calls(problem, monkeypatch, block=None, **options):
    """The size of the graph of every scheduler call of one low-rank solve (threaded
    scheduler; 0 for the collections' calls of build and summary); ``block``: at most that
    many iterations (two passes each) chained in one graph."""
    from sketchot.distributed import kernels

    if block is not None:
        monkeypatch.setattr(kernels, "MAX_CHAINED_PASSES", 2 * block)
    graphs = []

    def counting_get(graph, keys, **kwargs):
        graphs.append(len(graph) if isinstance(graph, dict) else 0)
        return dask.threaded.get(graph, keys, **kwargs)

    with dask.config.set(scheduler=counting_get):
        result = sketchot.sinkhorn(
            *_dask(problem, 200, 150), reg=0.5, backend="nystrom", rng=7, **{**SOLVE, **options}
        )
    expected = sketchot.sinkhorn(*problem, reg=0.5, backend="nystrom", rng=7, **SOLVE | options)
    _assert_same(result, expected)
    return graphs


def test_one_scheduler_call_per_check_block(problem, monkeypatch):
    """Iterations between two checks cost ONE scheduler call, whatever their number, and the
    graphs do not grow with the iterations. (The residual of this problem reaches exactly 0
    near iteration 21, which stops any tol: the runs stay below.)"""
    # check_every 5: blocks [1], [2-6], [7-11] at max_iter 11; one more block at 16
    short = _scheduler_calls(problem, monkeypatch, max_iter=11, check_every=5)
    long = _scheduler_calls(problem, monkeypatch, max_iter=16, check_every=5)
    assert len(long) - len(short) == 1  # 10 more half-steps, 1 more call
    assert max(long) == max(short)
    # blocks twice as long ([1], [2-11], [12-21]): as many calls as the short run
    wide = _scheduler_calls(problem, monkeypatch, max_iter=21, check_every=10)
    assert len(wide) == len(short) and max(wide) > max(short)
    # no check for 1000 iterations: cut every 4 ([1], [2-5], [6-9], [10-11])
    rare = _scheduler_calls(problem, monkeypatch, block=4, max_iter=11, check_every=1000)
    assert len(short) - len(rare) == 3 - 4


def test_converged_solve_and_inverse_map(client, problem):
    options = {"tol": 1e-10, "check_every": 5, "warn": False, "accuracy": None}
    expected = sketchot.sinkhorn(*problem, reg=0.5, backend="nystrom", rank=40, rng=3, **options)
    result = sketchot.sinkhorn(
        *_dask(problem, 101, 77), reg=0.5, backend="nystrom", rank=40, rng=3, **options
    )
    assert result.converged and expected.converged
    assert [i for i, _ in result.error_history] == [i for i, _ in expected.error_history]
    _assert_same(result, expected)
    np.testing.assert_allclose(
        result.inverse_barycentric_map().compute(), expected.inverse_barycentric_map(), rtol=RTOL
    )
    new = np.random.default_rng(5).random((33, 3))
    np.testing.assert_allclose(
        result.barycentric_map(da.from_array(new, chunks=10)).compute(),
        expected.barycentric_map(new),
        rtol=RTOL,
    )
    with pytest.raises(NotImplementedError, match="moments are not available for a Dask"):
        result.moments()  # the in-memory result's moments need the plan's products


def test_make_kernel_on_dask(client, problem):
    _, _, X, Y = problem
    for backend in LOW_RANK:
        expected = sketchot.make_kernel(X, Y, 0.5, backend, rng=11)
        kernel = sketchot.make_kernel(
            da.from_array(X, chunks=(200, 3)),
            da.from_array(Y, chunks=(99, 3)),
            0.5,
            backend,
            rng=11,
        )
        left, right = kernel.factors
        assert isinstance(left, da.Array) and left.chunks[0] == (200, 200, 200, 13)
        np.testing.assert_allclose(left.compute(), expected.left, rtol=RTOL, atol=1e-14)
        np.testing.assert_allclose(right.compute(), expected.right, rtol=RTOL, atol=1e-14)
        v = np.random.default_rng(1).random(Y.shape[0])
        np.testing.assert_allclose(kernel.matvec(v).compute(), expected.matvec(v), rtol=RTOL)


def test_exact_kernel_products_on_dask_keep_the_shapes_of_numpy(client, problem):
    """``K V`` and ``K^T U`` of the exact kernel on Dask, for vectors and for (m, k) and
    (n, k) blocks: the shapes and numbers of the in-memory kernel (2-D ``K^T U`` came back
    flattened to (m k,) before)."""
    _, _, X, Y = problem
    expected = sketchot.make_kernel(X, Y, 0.5, "exact")
    kernel = sketchot.make_kernel(
        da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=(99, 3)), 0.5, "exact"
    )
    rng = np.random.default_rng(2)
    V, U = rng.random((Y.shape[0], 3)), rng.random((X.shape[0], 3))
    for mine, theirs in (
        (kernel.matmat(V), expected.matmat(V)),
        (kernel.rmatmat(U), expected.rmatmat(U)),
        (kernel.matvec(V[:, 0]), expected.matvec(V[:, 0])),
        (kernel.rmatvec(U[:, 0]), expected.rmatvec(U[:, 0])),
    ):
        mine = mine.compute()
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, rtol=RTOL)


def test_killed_worker_does_not_lose_the_run(client):
    """A worker process dies mid-solve; Dask recomputes its chunks from the graph."""
    rng = np.random.default_rng(99)
    X, Y = rng.random((800, 3)), rng.random((600, 3))
    options = {"max_iter": 12, "tol": 1e-300, "warn": False, "accuracy": None}
    expected = sketchot.sinkhorn(
        None, None, X, Y, reg=0.3, backend="nystrom", rank=30, rng=1, **options
    )
    Xd, Yd = da.from_array(X, chunks=(100, 3)), da.from_array(Y, chunks=(100, 3))
    box = {}

    def solve():
        box["result"] = sketchot.sinkhorn(
            None, None, Xd, Yd, reg=0.3, backend="nystrom", rank=30, rng=1, **options
        )

    pids = client.run(os.getpid)
    worker = threading.Thread(target=solve)
    worker.start()
    # wait until the factors are persisted on both workers, then kill one mid-iteration
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        any("_factor_chunk" in str(key) for key in keys) for keys in client.has_what().values()
    ):
        time.sleep(0.02)
    time.sleep(0.3)
    victim = next(iter(client.scheduler_info()["workers"]))
    held = len(client.has_what()[victim])
    os.kill(pids[victim], signal.SIGKILL)  # the worker process dies; its nanny restarts it
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert held > 0
    result = box["result"]
    assert result.n_iter == expected.n_iter
    np.testing.assert_allclose(result.u.compute(), expected.u, rtol=RTOL)
    np.testing.assert_allclose(result.v.compute(), expected.v, rtol=RTOL)
    assert result.value_linear == pytest.approx(expected.value_linear, rel=RTOL)


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_in_memory_solve_does_not_import_dask():
    done = _run_python(
        "import sys, numpy as np, sketchot\n"
        "rng = np.random.default_rng(0)\n"
        "sketchot.sinkhorn(None, None, rng.random((50, 2)), rng.random((40, 2)), 1.0,\n"
        "                  'nystrom', rng=0, warn=False)\n"
        "print('dask' in sys.modules, 'distributed' in sys.modules)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_dask_array_without_dask_installed_says_how_to_install():
    done = _run_python(
        "import sys\n"
        "sys.modules['dask'] = None  # as if Dask were not installed\n"
        "import sketchot\n"
        "Fake = type('Array', (), {'chunks': ((2,), (3,)), 'shape': (2, 3), 'ndim': 2})\n"
        "Fake.__module__ = 'dask.array.core'\n"
        "try:\n"
        "    sketchot.sinkhorn(None, None, Fake(), Fake(), 1.0)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "dask[array]>=2024.1" "distributed>=2024.1"' in done.stdout


@pytest.mark.filterwarnings("ignore:Sinkhorn did not converge")
def test_unsupported_repairs_raise_clearly(client):
    """RFF at a small reg has negative denominators: 'exact' repairs are refused on Dask;
    'none' zeroes those scalings as in memory (the impossible result then warns)."""
    rng = np.random.default_rng(4)
    X, Y = rng.random((300, 3)) * 3, rng.random((200, 3)) * 3
    Xd, Yd = da.from_array(X, chunks=(100, 3)), da.from_array(Y, chunks=(100, 3))
    options = {"reg": 0.05, "backend": "rff", "rng": 0, "max_iter": 5, "accuracy": None}
    with pytest.raises(sketchot.NonPositiveKernelError, match="safeguard='none'"):
        sketchot.sinkhorn(None, None, Xd, Yd, warn=False, **options)
    with pytest.warns(sketchot.InvalidResultWarning):
        result = sketchot.sinkhorn(None, None, Xd, Yd, safeguard="none", errors="warn",
                                   **options)  # fmt: skip
    assert result.safeguard["faults"] > 0  # counted as in memory, scalings left at 0


def test_anderson_mixing_is_refused_on_dask(problem):
    """Mixing needs ``v`` on the client; ``'auto'`` (the default) and 0 run the plain iteration."""
    with dask.config.set(scheduler="threads"), pytest.raises(ValueError, match="anderson=5"):
        sketchot.sinkhorn(*_dask(problem, 97, 131), reg=0.5, backend="nystrom", rng=7,
                          anderson=5, **SOLVE)  # fmt: skip


def test_sinkhorn_kernel_on_a_dask_kernel_solves_with_dask(problem):
    """``make_kernel`` on Dask arrays, then ``sinkhorn_kernel``: the solve stays on Dask and
    equals the in-memory one."""
    a, b, X, Y = problem
    with dask.config.set(scheduler="threads"):
        kernel = sketchot.make_kernel(
            da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=(99, 3)), 0.5,
            "nystrom", rng=11,
        )  # fmt: skip
        result = sketchot.sinkhorn_kernel(a, b, kernel, **SOLVE)
        expected = sketchot.sinkhorn_kernel(
            a, b, sketchot.make_kernel(X, Y, 0.5, "nystrom", rng=11), **SOLVE
        )
        assert isinstance(result.potentials[0], da.Array)
        _assert_same(result, expected)


@pytest.mark.parametrize("reg_m", [1.0, (np.inf, 1.0)], ids=["relaxed", "semi-relaxed"])
@pytest.mark.parametrize("backend", ["nystrom", "exact"])
def test_unbalanced_dask_matches_numpy_on_a_cluster(client, problem, backend, reg_m):
    """Unbalanced transport (ratios raised to reg_m / (reg_m + reg) chunk by chunk): the
    same iterates, objective and true-kernel check as in memory, with the same rng."""
    a, b, X, Y = problem
    a = 2.0 * a  # unequal masses: allowed with a finite penalty
    solve = {**SOLVE, **SAME_ALGORITHM.get(backend, {}), "reg_m": reg_m}
    expected = sketchot.sinkhorn(a, b, X, Y, reg=0.5, backend=backend, rng=7, **solve)
    dask_problem = _dask((a, b, X, Y), 97, 131)
    result = sketchot.sinkhorn(*dask_problem, reg=0.5, backend=backend, rng=7, **solve)
    assert result.reg_m == expected.reg_m
    _assert_same(result, expected)
    assert result.value_dual == pytest.approx(expected.value_dual, rel=RTOL)
    got = result.check_true_kernel(n_samples=1000, rng=0)
    want = expected.check_true_kernel(n_samples=1000, rng=0)
    assert got.exhaustive and want.exhaustive
    np.testing.assert_allclose(
        [got.error_a, got.error_b], [want.error_a, want.error_b], rtol=1e-9, atol=1e-15
    )


def test_default_backend_on_dask_is_a_real_choice(problem):
    """``backend='auto'`` (the default) on Dask: Nystrom at a doubling rank checked against
    the true kernel on the cluster, else the exact kernel streamed."""
    _, _, X, Y = problem
    Xd, Yd = da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=(99, 3))
    with dask.config.set(scheduler="threads"):
        result = sketchot.sinkhorn(None, None, Xd, Yd, reg=1.0, rng=0, tol=1e-8)
        assert result.backend == "nystrom" and "rank 64" in result.reason
        assert result.converged and result.accuracy_met
        # at a small reg no rank meets the target; the block-local kernel's iteration is
        # predicted cheaper than the exact kernel's (the in-memory ladder's local rung)
        kernel = sketchot.make_kernel(Xd, Yd, 0.005, rng=0)
        assert isinstance(kernel.placement, DaskBlockLocal)
        assert "no global low rank meets the accuracy" in kernel.info.reason
        # a cost it does not expand: the exact kernel streamed
        kernel = sketchot.make_kernel(Xd, Yd, 0.005, rng=0, metric="cityblock")
        assert type(kernel) is ExactKernel and isinstance(kernel.placement, DaskStreamedExact)
        assert "no low rank met the target" in kernel.info.reason
        # rank='auto' for a named low-rank backend: the same ladder
        kernel = sketchot.make_kernel(Xd, Yd, 1.0, "nystrom", rank="auto", rng=0)
        assert type(kernel) is LowRankKernel and isinstance(kernel.placement, DaskFactors)
        assert kernel.info.rank == 64


def test_a_low_rank_miss_on_dask_is_warned_not_a_type_error(client):
    """A Nystrom kernel too small for its reg misses the accuracy: the weak-duality test of
    the result (an exact pass, small n x m) brings the chunked clouds to the host instead of
    slicing them by a mask (before: 'float' object cannot be interpreted as an integer)."""
    rng = np.random.default_rng(0)
    X = da.from_array(rng.random((600, 3)), chunks=200)
    Y = da.from_array(rng.random((500, 3)), chunks=200)
    with pytest.warns(sketchot.AccuracyWarning):
        res = sketchot.sinkhorn(None, None, X, Y, reg=0.05, backend="nystrom", rank=5, rng=0)
    assert res.accuracy_met is False
