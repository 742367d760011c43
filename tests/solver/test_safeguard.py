import warnings

import numpy as np
import pytest

from sketchot import KernelSafeguardWarning, NonPositiveKernelError, sinkhorn


def solve_recording_warnings(*args, **kwargs):
    """Run sinkhorn and return (result, list of warning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sinkhorn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.fixture
def hard_problem():
    """reg = 0.01 on colours: a 5-feature RFF or an 8-landmark Nystrom is far too coarse."""
    rng = np.random.default_rng(0)
    return rng.random((200, 3)), rng.beta(2, 5, size=(150, 3))


@pytest.mark.parametrize(
    ("backend", "params"), [("rff", {"n_features": 5}), ("nystrom", {"n_landmarks": 8})]
)
def test_exact_repair_finishes_without_nan_and_warns(hard_problem, backend, params):
    X, Y = hard_problem
    result, messages = solve_recording_warnings(
        None, None, X, Y, reg=0.01, backend=backend, rng=0, max_iter=50, errors="warn", **params
    )
    # three separate, explicit warnings: the repairs, the true-kernel check, non-convergence
    assert any(f"backend '{backend}' gave" in m and "recomputed" in m for m in messages)
    assert any("against the exact kernel" in m for m in messages)
    # stopped or stalled
    assert any(m.startswith("Sinkhorn s") and "iterations" in m for m in messages)
    counts = result.safeguard
    assert counts["policy"] == "exact"
    assert counts["rows_repaired"] + counts["cols_repaired"] > 0
    assert np.all(result.u >= 0) and np.all(result.v >= 0)
    assert np.all(np.isfinite(result.u)) and np.all(np.isfinite(result.v))
    assert np.isfinite(result.value_linear)
    assert np.all(np.isfinite(result.barycentric_map()))


def test_clip_policy(hard_problem):
    X, Y = hard_problem
    result, messages = solve_recording_warnings(
        None,
        None,
        X,
        Y,
        reg=0.01,
        backend="rff",
        n_features=5,
        rng=0,
        max_iter=50,
        safeguard="clip",
        errors="warn",
    )
    assert any("clipped them to a small positive floor" in m for m in messages)
    assert result.safeguard["clipped"] > 0
    assert np.all(np.isfinite(result.u)) and np.all(result.u >= 0)


def test_raise_policy(hard_problem):
    X, Y = hard_problem
    with pytest.raises(
        NonPositiveKernelError, match=r"backend .rff.: \d+ entries of K~.* are not positive"
    ):
        sinkhorn(None, None, X, Y, reg=0.01, backend="rff", n_features=5, rng=0, safeguard="raise")


def test_no_warning_when_nothing_was_repaired(hard_problem, recwarn):
    X, Y = hard_problem
    result = sinkhorn(None, None, X, Y, reg=1.0, backend="nystrom", n_landmarks=20, rng=0)
    assert result.safeguard["rows_repaired"] == result.safeguard["cols_repaired"] == 0
    assert not [w for w in recwarn if issubclass(w.category, KernelSafeguardWarning)]
