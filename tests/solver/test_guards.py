"""Guards on size, memory and numerical range (issue 13, items 9-14)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import sketchot
import sketchot._memory as memory
from sketchot import AccuracyWarning

solver_module = importlib.import_module("sketchot.solver.sinkhorn")


@pytest.fixture
def cloud():
    rng = np.random.default_rng(5)
    return rng.random((300, 3)), rng.random((250, 3))


def test_build_memory_is_estimated_and_refused_naming_the_parameter(cloud, monkeypatch):
    X, Y = cloud
    # 300 landmarks on 550 points: factors 550 x 300 and a 300 x 300 eigenproblem, ~4 MB;
    # the exact kernel 300 x 250 x 8 bytes, ~0.6 MB. With half of 1 MiB available both are
    # refused before any work starts.
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 20)
    with pytest.raises(MemoryError, match=r"n_landmarks.*|lower n_landmarks"):
        sketchot.make_kernel(X, Y, 1.0, "nystrom", n_landmarks=300)
    with pytest.raises(MemoryError, match=r"MiB budget.*lower max_dense_bytes"):
        sketchot.make_kernel(X, Y, 1.0, "exact")


def test_slow_streamed_exact_run_is_announced(cloud, monkeypatch, capsys):
    X, Y = cloud
    monkeypatch.setattr(solver_module, "LONG_RUN_SECONDS", 0.0)
    with pytest.warns(UserWarning, match=r"estimated at .* s, so 100 iterations"):
        sketchot.sinkhorn(
            None, None, X, Y, 1.0, "exact", max_dense_bytes=0, verbose=True, max_iter=2
        )
    assert "estimated" in capsys.readouterr().out


def test_nystrom_rcond_and_tiny_problems():
    X = np.array([[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="rcond must be < 1"):
        sketchot.make_kernel(X, X, 1.0, "nystrom", rcond=2.0)
    # the default landmark count (8) is clipped to the 2 points there are
    res = sketchot.sinkhorn(None, None, X, X, 1.0, "nystrom")
    assert res.converged and res.kernel.info.params["n_landmarks"] == 2


def test_masses_equal_up_to_rounding_are_rescaled(cloud):
    X, Y = cloud
    a = np.full(300, 1 / 300, dtype=np.float32).astype(np.float64)
    b = np.full(250, 1 / 250, dtype=np.float32).astype(np.float64)
    assert a.sum() != b.sum()  # float32 uniform weights differ by ~6e-8
    res = sketchot.sinkhorn(a, b, X, Y, 1.0, "exact")
    assert res.converged and res.n_iter < 100
    assert any("rescaled" in note for note in res.notes)


def test_huge_total_mass_does_not_overflow_the_error(cloud):
    X, Y = cloud
    a, b = np.full(300, 1e160 / 300), np.full(250, 1e160 / 250)
    res = sketchot.sinkhorn(a, b, X, Y, 1.0, "exact")
    assert res.converged and all(np.isfinite(e) for _, e in res.error_history)


@pytest.mark.parametrize("reg", [1e-310, 5e-324])
def test_subnormal_reg_is_rejected(cloud, reg):
    X, Y = cloud
    with pytest.raises(ValueError, match=r"reg=.* is too small"):
        sketchot.sinkhorn(None, None, X, Y, reg, "exact")


def test_messages_do_not_mislead(cloud):
    X, Y = cloud
    with pytest.raises(ValueError, match="non-negative int seed"):
        sketchot.sinkhorn(None, None, X, Y, 1.0, "nystrom", rng=-1)
    # the exact kernel at a tiny reg: the advice concerns iterations, never a rank or itself
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sketchot.sinkhorn(None, None, X, Y, 1e-6, "exact", max_iter=3, errors="warn")
    texts = [str(w.message) for w in caught if issubclass(w.category, AccuracyWarning)]
    assert texts and all("backend='exact'" not in t and "rank" not in t for t in texts)
    assert any("max_iter" in t for t in texts)
