"""Shared fixtures: small point clouds drawn from explicit generators."""

import numpy as np
import pytest


@pytest.fixture
def colours() -> tuple[np.ndarray, np.ndarray]:
    """Two colour-like clouds in [0, 1]^3 with different distributions (source, target)."""
    rng = np.random.default_rng(20261125)
    X = rng.random((120, 3))
    Y = rng.beta(2.0, 5.0, size=(90, 3))
    return X, Y
