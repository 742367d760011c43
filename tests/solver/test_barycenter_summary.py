"""``solve(..., column_moments=False)``: the summary the support updates of
:func:`sketchot.barycenter` read (the row side), one product with the stored absorbed kernel
instead of two; everything else as the default summary."""

import numpy as np
import pytest

from sketchot.kernels import build_kernel
from sketchot.solver import SolverOptions, check_problem, make_problem, solve


def _solved(column_moments, seed=0, n=120, m=90, reg=0.05, **problem_kwargs):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 3)), rng.random((m, 3)) + 0.2
    a, b = np.full(n, 1.0 / n), rng.random(m) + 0.1
    b /= b.sum()
    geometry = check_problem(X, Y, reg)
    kernel = build_kernel(geometry, "exact", rng=0)
    problem = make_problem(a, b, geometry.shape, reg, **problem_kwargs)
    options = SolverOptions(tol=1e-9, warn=False)
    return solve(problem, kernel, options, rng=0, column_moments=column_moments)


@pytest.mark.parametrize("seed", [0, 1])
def test_row_side_summary_agrees_with_the_full_one(seed):
    full, rows = _solved(True, seed), _solved(False, seed)
    assert full.iteration_info["strategy"] == rows.iteration_info["strategy"] == "absorb"
    # the same iterate: only the column sums come from another pass (v K^T u of the last
    # iteration, not a BLAS product): rounding, 1e-13 relative
    np.testing.assert_array_equal(full.potentials[0], rows.potentials[0])
    np.testing.assert_array_equal(full.marginals[0], rows.marginals[0])
    np.testing.assert_allclose(full.marginals[1], rows.marginals[1], rtol=1e-13, atol=0)
    np.testing.assert_array_equal(full.plan_moments[0], rows.plan_moments[0])
    assert rows.value == pytest.approx(full.value, rel=1e-13)
    assert rows.value_linear == pytest.approx(full.value_linear, rel=1e-13)
    np.testing.assert_array_equal(full.barycentric_map(), rows.barycentric_map())
    assert rows.accuracy_met == full.accuracy_met
    # left out, then computed when first asked for (from the true kernel: rounding)
    assert rows.plan_moments[1] is None
    np.testing.assert_allclose(rows.moment(1), full.plan_moments[1], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(
        rows.inverse_barycentric_map(), full.inverse_barycentric_map(), rtol=1e-9
    )


def test_the_default_summary_keeps_both_sides():
    full = _solved(True)
    assert full.plan_moments[0] is not None and full.plan_moments[1] is not None


def test_a_warm_start_after_absorptions_still_agrees():
    # a far warm start: the run absorbs again after its first passes (the column sums must
    # come from passes on the final absorbed kernel)
    rng = np.random.default_rng(3)
    start = {"log_u0": 30.0 * rng.standard_normal(120), "log_v0": 30.0 * rng.standard_normal(90)}
    full, rows = _solved(True, 3, **start), _solved(False, 3, **start)
    np.testing.assert_allclose(full.marginals[1], rows.marginals[1], rtol=1e-12, atol=0)
    assert rows.value == pytest.approx(full.value, rel=1e-12)
