"""Messages that name what the caller did, and defaults that hold what the README says."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.solver import SolverOptions


@pytest.fixture
def cloud():
    return np.random.default_rng(0).random((30, 2))


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(SolverOptions.names()), cut=st.integers(0, 40))
def test_a_misspelled_option_gets_a_did_you_mean(name, cut):
    X = np.random.default_rng(1).random((10, 2))
    wrong = name[:-1] if len(name) > 4 else name + "s"  # one letter off
    with pytest.raises(TypeError, match=f"{wrong!r} \\(did you mean {name!r}\\?\\)"):
        sketchot.sinkhorn(None, None, X, X, reg=1.0, **{wrong: cut})


def test_a_misspelled_backend_parameter_gets_a_did_you_mean(cloud):
    with pytest.raises(TypeError, match="did you mean 'n_landmarks'"):
        sketchot.sinkhorn(None, None, cloud, cloud, 1.0, "nystrom", n_landmark=5)
    with pytest.raises(TypeError, match="did you mean 'n_landmarks'"):
        sketchot.make_kernel(cloud, cloud, 1.0, "nystrom", n_landmark=5)


def test_sinkhorn_kernel_lists_what_it_accepts(cloud):
    kernel = sketchot.make_kernel(cloud, cloud, 1.0, "exact")
    expected = r"'reg' \(did you mean 'reg_m'\?\); the kernel already fixes reg.*max_iter"
    with pytest.raises(TypeError, match=expected):
        sketchot.sinkhorn_kernel(None, None, kernel, reg=0.1)


def test_get_backend_auto_explains_itself():
    with pytest.raises(ValueError, match="'auto' is not a backend but a choice among them"):
        sketchot.get_backend("auto")


def test_sinkhorn2_defaults_to_auto():
    """Held-out Gaussian clouds in d = 10 at reg 0.1 (the case where the old default,
    polyts, returned 1.558 against 0.415): the default agrees with POT's dense solver to the
    accuracy contract (1e-3 relative L1 of the marginals bounds the cost's error here)."""
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(400, 10)), rng.normal(size=(300, 10)) + 0.2
    a, b = np.full(400, 1 / 400), np.full(300, 1 / 300)
    M = ot.dist(X, Y)
    reg = 0.1 * M.mean()
    reference = float(np.sum(ot.sinkhorn(a, b, M, reg, stopThr=1e-12) * M))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sketchot.AccuracyWarning)
        cost = sketchot.sinkhorn2(a, b, X, Y, reg=reg, rng=0)
    assert cost == pytest.approx(reference, rel=1e-3)


def test_the_slow_run_warning_suggests_auto_only_when_auto_did_not_choose(cloud, monkeypatch):
    solver_module = importlib.import_module("sketchot.solver.sinkhorn")
    monkeypatch.setattr(solver_module, "LONG_RUN_SECONDS", 0.0)  # every streamed run is "long"
    kernel = sketchot.make_kernel(cloud, cloud, 1.0, "exact", max_dense_bytes=0)
    with pytest.warns(UserWarning, match="or backend='auto' cost less"):
        sketchot.sinkhorn_kernel(None, None, kernel, max_iter=2)
    kernel.info.reason = "chosen by auto"  # what the auto strategy records before its solve
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sketchot.sinkhorn_kernel(None, None, kernel, max_iter=2)
    slow = [str(w.message) for w in caught if "estimated at" in str(w.message)]
    assert slow and all("backend='auto'" not in text for text in slow)


@pytest.mark.parametrize(
    "call",
    [
        lambda X: sketchot.sinkhorn(None, None, X, X + 0.5, 2.0, "rff", n_features=5, rng=0),
        lambda X: sketchot.sinkhorn2(None, None, X, X + 0.5, 2.0, "rff", n_features=5, rng=0),
        lambda X: sketchot.solve_sample(X, X + 0.5, reg=2.0, backend="rff", n_features=5, rng=0),
    ],
    ids=["sinkhorn", "sinkhorn2", "solve_sample"],
)
def test_warnings_name_the_users_line(call):
    """Whatever the depth of the public entry, a warning points at the caller's code."""
    X = np.random.default_rng(0).random((80, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(X)
    assert caught and {w.filename for w in caught} == {__file__}


@pytest.mark.parametrize(
    ("d", "outliers", "reg", "n"),
    [(1, 1, 0.005, 60), (1, 10, 0.005, 60), (3, 10, 0.02, 400)],
)
def test_polyts_at_small_reg_with_outliers_speaks_of_the_callers_points(d, outliers, reg, n):
    """Issue 42: a raw ZeroDivisionError (rows 1 and 3 before the fix: the fit's weighted
    energy underflowed to 0), or a VanishingFunctionError about an ``f`` and a ``U V^T`` the
    caller never passed. Both are now one ValueError in terms of the points, reg and what to
    pass instead (the cases are those a sweep of 288 configurations found)."""
    rng = np.random.default_rng(d)
    X, Y = rng.random((n, d)), rng.random((n - 10, d))
    X[:outliers] += 1.5
    Y[:1] -= 1.5
    with pytest.raises(ValueError) as caught:
        sketchot.sinkhorn(None, None, X, Y, reg, backend="polyts", variant="improved", rng=0)
    message = str(caught.value)
    start = (
        f"backend='polyts' (variant='improved') cannot fit its global polynomial to these "
        f"{n} x {n - 10} points at reg={reg:g}"
    )
    assert message.startswith(start)
    assert "largest cost / reg" in message and "Pass a larger reg" in message
    assert "U V^T" not in message and " f " not in message


def test_polyts_advice_works_when_followed():
    """What the message proposes solves the same clouds (backend='auto' certifies it)."""
    rng = np.random.default_rng(1)
    X, Y = rng.random((60, 1)), rng.random((50, 1))
    X[:1] += 1.5
    Y[:1] -= 1.5
    result = sketchot.sinkhorn(None, None, X, Y, 0.005, backend="auto", rng=0)
    assert result.converged and result.accuracy_met
