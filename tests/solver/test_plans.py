"""sketchot.solver.plans.value_error_estimate: the primal-dual gap shared by the loss and the
divergence matrix (the plan products themselves: tests/kernels/test_contract.py)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchot.solver.plans import value_error_estimate


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shift=st.floats(-50.0, 50.0))
def test_balanced_gap_ignores_the_potentials_gauge(seed, shift):
    """Balanced potentials are defined up to (f + s, g - s): the estimate is the same."""
    rng = np.random.default_rng(seed)
    f, g = rng.normal(size=(3, 7)), rng.normal(size=(3, 5))
    ea, eb = rng.random(3), rng.random(3)
    np.testing.assert_allclose(
        value_error_estimate(f + shift, g - shift, ea, eb), value_error_estimate(f, g, ea, eb),
        rtol=1e-9, atol=1e-9 * abs(shift),
    )  # fmt: skip


def test_the_estimate_by_hand_and_empty_sides():
    f = np.array([[1.0, 3.0, np.nan]])  # midpoint 2: max |f - 2| = 1
    g = np.array([[-1.0, -4.0]])  # max |g + 2| = 2
    assert value_error_estimate(f, g, 0.1, 0.01)[0] == 0.1 * 1 + 0.01 * 2
    assert value_error_estimate(f, g, 0.1, 0.01, balanced=False)[0] == 0.1 * 3 + 0.01 * 4
    assert value_error_estimate(np.full((1, 2), np.nan), g, 1.0, 1.0)[0] == 0.0
