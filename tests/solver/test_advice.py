"""Advice in warnings and errors is computed from what was measured and works when followed.

Each case is one that sketchot 0.1 got wrong (issue 10): the default polyts and an
8-landmark Nystrom at reg = 0.1 on colours, RFF at reg = 0.01, and the exact kernel stopped
early at a small reg. The test reads the advice, applies it, and checks that the accuracy is
then met.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import sketchot
from sketchot import AccuracyWarning, InvalidResultError
from sketchot.color import load_image, sample_pixels
from sketchot.solver.advice import iterations_needed


@pytest.fixture(scope="module")
def colours():
    rng = np.random.default_rng(3)
    X = sample_pixels(load_image("images/default_source.png"), 600, rng=rng).colors
    Y = sample_pixels(load_image("images/default_target.png"), 500, rng=rng).colors
    return X, Y


def advice_of(call) -> str:
    """The message of the AccuracyWarning or InvalidResultError a call produces."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except InvalidResultError as error:
            return str(error)
    messages = [str(w.message) for w in caught if issubclass(w.category, AccuracyWarning)]
    assert messages, "expected an accuracy warning"
    return messages[-1]


def follow(advice: str, kwargs: dict) -> dict:
    """Apply 'pass backend=...' or 'pass max_iter=...' from an advice text."""
    backend = re.search(r"pass backend='(\w+)'", advice)
    if backend:
        kwargs = {k: v for k, v in kwargs.items() if k in ("reg", "rng")}
        return {**kwargs, "backend": backend.group(1)}
    max_iter = re.search(r"pass max_iter=(\d+)", advice)
    assert max_iter, f"no actionable advice in: {advice}"
    return {**kwargs, "max_iter": int(max_iter.group(1))}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": "polyts", "variant": "paper", "reg": 0.1},
        {"backend": "nystrom", "reg": 0.1},
        {"backend": "rff", "reg": 0.01},
        {"backend": "exact", "reg": 0.01, "max_iter": 12},
        {"backend": "exact", "reg": 0.01, "max_iter": 5},
    ],
    ids=["polyts", "nystrom-8", "rff", "exact-early-stop", "exact-no-rate"],
)
def test_following_the_advice_meets_the_accuracy(colours, kwargs):
    X, Y = colours
    kwargs = {**kwargs, "rng": 0}
    advice = advice_of(lambda: sketchot.sinkhorn(None, None, X, Y, **kwargs))
    failed = kwargs["backend"]
    assert f"pass backend='{failed}'" not in advice  # never its own fix
    fixed = follow(advice, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccuracyWarning)
        res = sketchot.sinkhorn(None, None, X, Y, **fixed)
    assert res.accuracy_met and res.converged


def test_iterations_are_extrapolated_from_the_measured_rate():
    # error 10^-k at iteration 10 k: 1e-9 is reached at iteration 90
    history = [(10 * k, 10.0**-k) for k in range(1, 6)]
    assert iterations_needed(history, 1e-9) == 90
    assert iterations_needed([(1, 1.0), (11, 0.5), (21, 2.0)], 1e-9) is None  # no decrease
    assert iterations_needed([(1, 1.0), (11, 0.5)], 1e-9) is None  # one check after the first


def test_a_plain_iteration_beyond_float64_is_advised_the_log_stable_one():
    """log_domain=False at reg 2e-4 on the unit cube (largest cost / reg ~1.5e4: kernel
    entries below float64) fails; the advice is the log-stable iteration, not more
    iterations, and following it meets the accuracy."""
    rng = np.random.default_rng(20261128)
    X, Y = rng.random((300, 3)), rng.random((200, 3))
    with pytest.raises(InvalidResultError) as refused:
        sketchot.sinkhorn(None, None, X, Y, reg=2e-4, backend="exact", log_domain=False)
    message = str(refused.value)
    assert "pass log_domain='auto'" in message and "max_iter=" not in message
    followed = sketchot.sinkhorn(None, None, X, Y, reg=2e-4, backend="exact", log_domain="auto")
    assert followed.converged and bool(followed.accuracy_met)
