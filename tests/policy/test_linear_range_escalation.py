"""``backend='auto'`` passes over a kernel whose plain iteration cannot hold a KL step (a
penalty far below ``reg``: :class:`sketchot.LinearRangeError`) to one with a log-stable
iteration, as it passes over an inaccurate one; a named backend refuses by name."""

import numpy as np
import pytest

import sketchot
from sketchot.policy import ladder


def test_auto_escalates_past_a_linear_range_refusal(monkeypatch):
    """reg_m / reg = 1e-3: the low-rank attempts' plain iteration would raise the weights to
    the power 1001 (e^-4000, below float64), so each attempt is refused and recorded, and the
    solve ends on a kernel with a log-stable iteration, certified."""
    monkeypatch.setattr(ladder, "DIRECT_DENSE_ENTRIES", 1000)  # small clouds try low rank
    rng = np.random.default_rng(20261128)
    X, Y = rng.random((300, 3)), rng.random((250, 3))
    result = sketchot.sinkhorn(None, None, X, Y, reg=2.0, reg_m=0.002, rng=0)
    refused = [a for a in result.attempts if "numerators leave float64" in a.note]
    assert refused and not any(a.accepted for a in refused)
    assert result.backend not in {a.backend for a in refused}
    assert bool(result.accuracy_met) and result.mass > 0
    with pytest.raises(sketchot.LinearRangeError, match=r"reg_m=0.002.*backend='exact'"):
        sketchot.sinkhorn(None, None, X, Y, reg=2.0, reg_m=0.002, backend="nystrom", rng=0)
