"""Guards on size, memory and numerical range (issue 13, items 9-14)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_rank_refusal_names_the_parameter_the_caller_passed(cloud, monkeypatch):
    X, Y = cloud
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 20)
    for backend in ("nystrom", "rff", "polyts"):
        own = sketchot.get_backend(backend).rank_parameter
        with pytest.raises(MemoryError, match=r"; lower rank$"):
            sketchot.make_kernel(X, Y, 1.0, backend, rank=10**9)
        with pytest.raises(MemoryError, match=r"; lower rank$"):
            sketchot.sinkhorn(None, None, X, Y, 1.0, backend, rank=10**9)
        with pytest.raises(MemoryError, match=f"; lower {own}$"):
            sketchot.make_kernel(X, Y, 1.0, backend, **{own: 10**9})


@settings(max_examples=30, deadline=None)
@given(
    exponent=st.floats(155.0, 307.0),
    side=st.sampled_from(["X", "Y"]),
    row=st.integers(0, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_points_whose_squares_overflow_are_blamed_not_reg(exponent, side, row, seed):
    """A value above ~1.3e154 squares to inf: the cloud holding it is named, never reg."""
    rng = np.random.default_rng(seed)
    clouds = {"X": rng.random((5, 3)), "Y": rng.random((4, 3))}
    clouds[side][min(row, len(clouds[side]) - 1), int(rng.integers(3))] = 10.0**exponent
    with pytest.raises(ValueError, match=f"^{side} has 1 point whose squared norm overflows"):
        sketchot.sinkhorn(None, None, clouds["X"], clouds["Y"], 1.0, "exact")
    with pytest.raises(ValueError, match=f"^{side} has 1 point whose squared norm overflows"):
        sketchot.make_kernel(clouds["X"], clouds["Y"], 1.0, "nystrom")


def test_following_the_rescaling_advice_works():
    # 1e154 in each of 4 columns: every value is finite but a squared norm is 4e308
    X = np.full((3, 4), 1e154) * np.array([[1.0], [0.5], [0.25]])
    Y = np.full((2, 4), 1e154) * np.array([[0.75], [0.125]])
    reg = 0.5 * 1e154**2
    with pytest.raises(ValueError, match=r"divide X, Y by s and reg by s\*\*2"):
        sketchot.sinkhorn(None, None, X, Y, reg, "exact")
    s = 1e154
    scaled = sketchot.sinkhorn(None, None, X / s, Y / s, reg / s**2, "exact")
    assert scaled.converged


def test_a_one_by_one_problem_is_exact_with_any_positive_kernel():
    X, Y = np.array([[0.0, 0.0]]), np.array([[1.0, 0.5]])
    kernel = sketchot.make_kernel(X, Y, 1.0, "rff", rng=0)
    assert kernel.to_dense()[0, 0] > 0  # a positive kernel (0.37 against the true 0.29)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccuracyWarning)
        res = sketchot.sinkhorn(None, None, X, Y, 1.0, "rff", rng=0)
    np.testing.assert_allclose(res.plan, [[1.0]], rtol=1e-12)
    assert res.accuracy_met
