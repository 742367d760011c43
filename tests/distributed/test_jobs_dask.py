"""Jobs on Dask arrays against the in-memory jobs, on a real LocalCluster (the ``client``
fixture is in ``conftest.py``): the divergence with its gradients, barycentres, warm starts."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

import sketchot  # noqa: E402
from sketchot.distributed import DaskBarycenterResult, DaskDivergenceResult  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# Both paths stop each solve at tol = 1e-11 on the same fixed point, but the symmetric
# problems run the averaged update in memory and the two-sided one on Dask (deferred passes):
# their potentials differ by the stopping residual's order times the cost scale (measured
# 2e-10 to 4e-10 relative on these clouds), far below this.
RTOL = 1e-7
SOLVE = {"tol": 1e-11, "max_iter": 5000}


@pytest.fixture(scope="module")
def clouds():
    """Odd sizes, uneven chunks, zero weights on both sides."""
    rng = np.random.default_rng(20261128)
    X, Y = rng.random((301, 3)), rng.random((257, 3)) + 0.3
    a, b = rng.random(301), rng.random(257)
    a[[0, 150]] = 0.0
    b[[7]] = 0.0
    return X, Y, a / a.sum(), b / b.sum()


def _dask(X, Y, a, b):
    return (
        da.from_array(X, chunks=(100, 3)),
        da.from_array(Y, chunks=(90, 3)),
        da.from_array(a, chunks=100),
        da.from_array(b, chunks=90),
    )


def _close(got, want, rtol=RTOL):
    got = got.compute() if hasattr(got, "compute") else got
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize(
    ("backend", "params"),
    [("nystrom", {"rank": 80}), ("exact", {"log_domain": False})],
)
def test_divergence_and_gradients_match_memory(client, clouds, backend, params):
    X, Y, a, b = clouds
    kw = {"reg": 0.5, "backend": backend, "rng": 0, **SOLVE, **params}
    got = sketchot.sinkhorn_divergence(*_dask(X, Y, a, b), **kw)
    want = sketchot.sinkhorn_divergence(X, Y, a, b, **kw)
    assert isinstance(got, DaskDivergenceResult)
    assert got.value == pytest.approx(want.value, rel=RTOL)
    assert got.converged and got.backend == backend
    for name in ("grad_a", "grad_b", "grad_X", "grad_Y"):
        gradient = getattr(got, name)
        assert isinstance(gradient, da.Array), name
        _close(gradient, getattr(want, name))
    # the gradient is read twice: the same persisted array
    assert got.grad_X is got.grad_X


@pytest.mark.parametrize("reg_m", [None, 0.7])
def test_unbalanced_and_plain_ot_match_memory(client, clouds, reg_m):
    X, Y, a, b = clouds
    kw = {"reg": 0.5, "backend": "nystrom", "rank": 80, "rng": 1, "reg_m": reg_m, **SOLVE}
    for debias in (True, False):
        got = sketchot.sinkhorn_divergence(*_dask(X, Y, a, b), debias=debias, **kw)
        want = sketchot.sinkhorn_divergence(X, Y, a, b, debias=debias, **kw)
        assert got.value == pytest.approx(want.value, rel=RTOL)
        for name in ("grad_a", "grad_b", "grad_Y"):
            _close(getattr(got, name), getattr(want, name))


def test_gradient_is_the_gradient_of_the_returned_value(client, clouds):
    """A central difference of the Dask value along a random move of X (and of Y) matches
    ``<grad, move>``: the exact kernel, step 1e-5 (truncation ~1e-10, the solves' residual
    at tol 1e-11 gives ~1e-9 noise on each value: a relative agreement of 1e-4 leaves room)."""
    X, Y, a, b = clouds
    X, Y, a, b = X[:80], Y[:70], a[:80] / a[:80].sum(), b[:70] / b[:70].sum()
    kw = {"reg": 1.0, "backend": "exact", "log_domain": False, "rng": 0, **SOLVE}
    rng = np.random.default_rng(5)
    base = sketchot.sinkhorn_divergence(*_dask(X, Y, a, b), **kw)
    step = 1e-5
    for side in ("X", "Y"):
        move = rng.normal(size=X.shape if side == "X" else Y.shape)
        values = []
        for sign in (1.0, -1.0):
            moved = (X + sign * step * move, Y) if side == "X" else (X, Y + sign * step * move)
            values.append(sketchot.sinkhorn_divergence(*_dask(*moved, a, b), **kw).value)
        slope = (values[0] - values[1]) / (2 * step)
        predicted = float((getattr(base, f"grad_{side}").compute() * move).sum())
        assert slope == pytest.approx(predicted, rel=1e-4), side


@pytest.mark.parametrize("as_numpy", [False, True])
def test_warm_start_on_dask_takes_fewer_iterations_and_the_same_answer(client, clouds, as_numpy):
    X, Y, a, b = clouds
    Xd, Yd, ad, bd = _dask(X, Y, a, b)
    kw = {"reg": 0.5, "backend": "nystrom", "rank": 80, "rng": 0, **SOLVE}
    cold = sketchot.sinkhorn(ad, bd, Xd, Yd, **kw)
    start = tuple(p.compute() for p in cold.potentials) if as_numpy else cold.potentials
    warm = sketchot.sinkhorn(ad, bd, Xd, Yd, warmstart=start, **kw)
    assert warm.converged and warm.n_iter < cold.n_iter
    # from the converged scalings the first check stops it: the same fixed point to tol
    assert warm.value == pytest.approx(cold.value, rel=1e-9)
    finite = np.isfinite(cold.potentials[1].compute())  # -inf at the zero weight
    _close(warm.potentials[1][finite], cold.potentials[1].compute()[finite], rtol=1e-8)
    # POT's name on solve_sample, and a kernel built once
    kernel = sketchot.make_kernel(Xd, Yd, reg=0.5, backend="nystrom", rank=80, rng=0)
    again = sketchot.sinkhorn_kernel(ad, bd, kernel, warmstart=start, **SOLVE)
    assert again.n_iter < cold.n_iter
    sampled = sketchot.solve_sample(Xd, Yd, ad, bd, reg=0.5, potentials_init=start, **{
        "backend": "nystrom", "rank": 80, "rng": 0, **SOLVE})  # fmt: skip
    assert sampled.n_iter < cold.n_iter


def test_warm_start_is_checked_by_name(client, clouds):
    X, Y, a, b = clouds
    Xd, Yd, ad, bd = _dask(X, Y, a, b)
    with pytest.raises(ValueError, match=r"warmstart\[1\] \(log v\) must have shape"):
        sketchot.sinkhorn(ad, bd, Xd, Yd, reg=0.5, warmstart=(np.zeros(301), np.zeros(3)))
    bad = np.zeros(257)
    bad[3] = np.nan
    with pytest.raises(ValueError, match=r"warmstart\[1\] must be finite"):
        sketchot.sinkhorn(ad, bd, Xd, Yd, reg=0.5, warmstart=(np.zeros(301), bad))


def test_divergence_warm_start_on_moved_clouds(client, clouds):
    """A loss object on a moving cloud: the second call starts from the first's potentials,
    takes fewer iterations and gives the cold answer."""
    X, Y, a, b = clouds
    kw = {"reg": 0.5, "backend": "nystrom", "rank": 80, "rng": 0, **SOLVE}
    loss = sketchot.SinkhornDivergence(**{k: v for k, v in kw.items() if k != "reg"}, reg=0.5)
    first = loss(*_dask(X, Y, a, b))
    moved = X - 0.01 * first.grad_X.compute() / float(first.grad_X.std().compute())
    second = loss(*_dask(moved, Y, a, b))
    assert second.warm == {"ab": True, "aa": True, "bb": True}
    cold = sketchot.sinkhorn_divergence(*_dask(moved, Y, a, b), **kw)
    assert sum(r.n_iter for r in second.results.values()) < sum(
        r.n_iter for r in cold.results.values()
    )
    assert second.value == pytest.approx(cold.value, rel=RTOL)
    assert second.value < first.value


@pytest.mark.parametrize("acceleration", [None, "anderson"])
def test_barycenter_of_dask_clouds_matches_memory(client, acceleration):
    """The same support draw (rng), the same fixed point: the exact kernel, inner solves to
    1e-12, 3 outer steps. Measured 1.7e-11 (plain) and 2.9e-8 (Anderson: its least squares
    amplify the solves' differences) on 30 steps; 1e-6 of the clouds' spread leaves room."""
    rng = np.random.default_rng(1)
    clouds = [rng.normal(size=(120, 2)), rng.normal(size=(90, 2)) + np.array([3.0, 0.0])]
    kw = {"reg": 1.0, "n_support": 40, "tol": 0.0, "max_iter": 3, "rng": 3, "backend": "exact",
          "acceleration": acceleration, "inner_tol": 1e-12, "inner_max_iter": 5000,
          "warn": False}  # fmt: skip
    got = sketchot.barycenter([da.from_array(c, chunks=(50, 2)) for c in clouds], **kw)
    want = sketchot.barycenter(clouds, **kw)
    assert isinstance(got, DaskBarycenterResult) and isinstance(got.X, da.Array)
    np.testing.assert_allclose(got.X.compute(), want.X, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.displacements, want.displacements, rtol=1e-5)
    assert got.objective == pytest.approx(want.objective, rel=1e-9)
    assert got.backends == ["exact", "exact"]


def test_debiased_barycenter_with_numpy_support_matches_memory(client):
    rng = np.random.default_rng(2)
    clouds = [rng.normal(size=(100, 2)), rng.normal(size=(80, 2)) + np.array([2.0, 1.0])]
    X_init = rng.normal(size=(30, 2)) + np.array([1.0, 0.5])
    kw = {"reg": 2.0, "tol": 0.0, "max_iter": 2, "rng": 0, "backend": "exact",
          "debiased": True, "inner_tol": 1e-12, "inner_max_iter": 5000, "warn": False}  # fmt: skip
    got = sketchot.barycenter([da.from_array(c, chunks=(40, 2)) for c in clouds], X_init=X_init,
                              **kw)  # fmt: skip
    want = sketchot.barycenter(clouds, X_init=X_init, **kw)
    np.testing.assert_allclose(got.X.compute(), want.X, rtol=0, atol=1e-6)
    assert got.self_result is not None
    assert got.objective == pytest.approx(want.objective, rel=1e-9)


def test_in_memory_jobs_do_not_import_dask():
    code = (
        "import sys, numpy as np, sketchot\n"
        "X = np.random.default_rng(0).random((50, 2))\n"
        "sketchot.sinkhorn_divergence(X, X + 0.1, reg=1.0, backend='exact')\n"
        "sketchot.barycenter([X, X + 1.0], reg=1.0, n_support=10, max_iter=2, rng=0, "
        "warn=False)\n"
        "assert 'dask' not in sys.modules, 'dask imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=300)
