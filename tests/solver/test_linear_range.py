"""The plain multiplicative iteration with a KL penalty far below ``reg``
(``sketchot/solver/strategies.py``: :func:`check_linear_range`,
``sketchot/solver/penalties.py``: ``Penalty.linear_range``).

A KL penalty ``reg_m`` raises the weights to ``1 / rho = 1 + reg / reg_m`` in the linear
step (``u = (w^(1/rho) / K v)^rho``): at 300 x 200 points, ``reg = 0.5`` and ``reg_m =
0.002``, ``(1/300)^251 = e^-1432`` underflows and every scaling is 0. The solver used to
refuse that plan of mass 0 as "impossible" with the advice "Tighten tol", which does not
help. It now refuses the iteration up front, naming ``log_domain`` and the smallest
``reg_m`` that fits; each piece of advice is followed below and gives POT's answer
(``ot.sinkhorn_unbalanced(..., method='sinkhorn_stabilized')``, the stabilised iteration
that reaches these reg_m).

Tolerances: plans to ``1e-10`` of the largest entry at ``tol=1e-12`` (two converged
solutions of the same strictly convex problem agree to about the tolerance; POT's
stabilised solver at ``stopThr=1e-14``); values ``rel=1e-9``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.solver import KL, TV, Balanced
from sketchot.solver.penalties import LOG_HUGE, LOG_TINY

REG, REG_M = 0.5, 0.002
PLAN_RTOL = 1e-10


def case(seed: int = 0, n: int = 300, m: int = 200):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), rng.random((m, 2))
    return X, Y, ot.unif(n), ot.unif(m), ot.dist(X, Y)


def pot_objective(plan, M, a, b, reg, reg_m):
    """The objective with the generalised KL (POT's formula, ``kl_div(..., mass=True)``)."""
    nx = ot.backend.NumpyBackend()
    value = np.sum(plan * M) + reg * nx.kl_div(plan, a[:, None] * b[None, :], mass=True)
    value += reg_m * nx.kl_div(plan.sum(1), a, mass=True)
    return float(value + reg_m * nx.kl_div(plan.sum(0), b, mass=True))


def pot_plan(a, b, M, reg, reg_m):
    return ot.sinkhorn_unbalanced(
        a, b, M, reg, reg_m, method="sinkhorn_stabilized", stopThr=1e-14, numItermax=100_000
    )


def test_the_issue_case_is_refused_by_name_not_as_impossible():
    _, _, a, b, M = case()
    with pytest.raises(ValueError, match="plain multiplicative") as caught:
        sketchot.solve(M, a, b, reg=REG, unbalanced=REG_M, log_domain=False)
    message = str(caught.value)
    assert "Tighten tol" not in message
    # in solve()'s names, with the numbers of this problem
    assert "unbalanced=0.002 on a at reg=0.5" in message
    assert "1 / rho = 251" in message and "e^-1432" in message
    assert "log_domain='auto' (or True)" in message
    assert "unbalanced >= 0.0041" in message


def test_the_advice_log_domain_auto_gives_pots_answer():
    _, _, a, b, M = case()
    result = sketchot.solve(M, a, b, reg=REG, unbalanced=REG_M, log_domain="auto", tol=1e-12,
                            max_iter=100_000)  # fmt: skip
    assert result.converged and result.accuracy_met
    reference = pot_plan(a, b, M, REG, REG_M)
    np.testing.assert_allclose(result.plan, reference, rtol=0, atol=PLAN_RTOL * reference.max())
    assert result.value == pytest.approx(pot_objective(reference, M, a, b, REG, REG_M), rel=1e-9)
    again = sketchot.solve(M, a, b, reg=REG, unbalanced=REG_M, log_domain=True, tol=1e-12,
                           max_iter=100_000)  # fmt: skip
    np.testing.assert_allclose(again.plan, result.plan, rtol=0, atol=PLAN_RTOL * reference.max())


def test_the_advice_smallest_reg_m_runs_the_plain_iteration():
    """The suggested ``reg_m`` (rounded up) solves with ``log_domain=False`` and agrees with
    the log-stable iteration and POT; the rounded-down neighbour is still refused."""
    _, _, a, b, M = case()
    plain = sketchot.solve(M, a, b, reg=REG, unbalanced=0.0041, log_domain=False, tol=1e-12,
                           max_iter=100_000)  # fmt: skip
    assert plain.converged and not plain.log_domain
    reference = pot_plan(a, b, M, REG, 0.0041)
    np.testing.assert_allclose(plain.plan, reference, rtol=0, atol=PLAN_RTOL * reference.max())
    with pytest.raises(ValueError, match="plain multiplicative"):
        sketchot.solve(M, a, b, reg=REG, unbalanced=0.0040, log_domain=False)


@pytest.mark.parametrize("backend", ["nystrom", "rff", "polyts"])
def test_a_kernel_with_linear_products_only_is_told_to_use_one_with_a_log_form(backend):
    """Low-rank kernels have no log-stable iteration, so ``log_domain='auto'`` runs the
    plain one: the advice names the exact kernel (followed: POT's answer) or the smallest
    ``reg_m``."""
    X, Y, a, b, M = case()
    with pytest.raises(ValueError, match=f"backend '{backend}' offers only linear products"):
        sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, REG_M, backend=backend, rng=0)
    followed = sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, REG_M, backend="exact",
                                            tol=1e-12, max_iter=100_000)  # fmt: skip
    reference = pot_plan(a, b, M, REG, REG_M)
    np.testing.assert_allclose(followed.plan, reference, rtol=0, atol=PLAN_RTOL * reference.max())


def test_nystrom_with_the_suggested_reg_m_meets_its_accuracy():
    X, Y, a, b, _ = case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missed-accuracy warning either
        result = sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, 0.0041, backend="nystrom", rng=0)
    assert result.accuracy_met


def test_weights_above_one_overflow_and_are_refused_on_that_side():
    """The other end: ``w^(1/rho)`` overflows for ``w > 1`` (here ``b`` of mass 2e4 on 200
    points: ``w = 100``, ``100^251 = e^1156``); the message names ``b``. With the same
    penalty on ``a`` only (``(1/300)^(1/rho) = e^-63`` at ``rho = 0.091``) it solves
    plainly, as the log-stable iteration does."""
    _, _, a, b, M = case()
    with pytest.raises(ValueError, match=r"on b at reg=0\.5 .* e\^1156"):
        sketchot.solve(M, a, 2e4 * b, reg=REG, unbalanced=(math.inf, REG_M), log_domain=False)
    kwargs = dict(reg=REG, unbalanced=(0.05, math.inf), tol=1e-12, max_iter=100_000)
    plain = sketchot.solve(M, a, 2e4 * b, log_domain=False, **kwargs)
    stable = sketchot.solve(M, a, 2e4 * b, **kwargs)
    assert plain.converged and not plain.log_domain
    np.testing.assert_allclose(plain.plan, stable.plan, rtol=0, atol=PLAN_RTOL * stable.plan.max())


def test_balanced_and_tv_sides_never_refuse():
    log_w = np.log(np.full(5, 1e-300))
    assert Balanced().linear_range(log_w, 1.0) is None
    assert TV(1e-6).linear_range(log_w, 1.0) is None


@settings(max_examples=200, deadline=None)
@given(
    log_w=st.lists(st.floats(-700.0, 700.0), min_size=1, max_size=6),
    reg=st.floats(1e-3, 1e3),
    ratio=st.floats(1e-6, 1e3),
)
def test_linear_range_is_exactly_the_normal_float_range(log_w, reg, ratio):
    """Invariant: refused exactly when some ``log w / rho`` leaves ``[LOG_TINY, LOG_HUGE]``,
    and the suggested ``reg_m`` brings every numerator back inside (to rounding)."""
    log_w = np.array(log_w)
    penalty = KL(ratio * reg)
    rho = penalty.exponent(reg)
    found = penalty.linear_range(np.append(log_w, -np.inf), reg)  # a zero weight is skipped
    inside = bool(np.all(log_w / rho >= LOG_TINY) and np.all(log_w / rho <= LOG_HUGE))
    assert (found is None) == inside
    if found is None or not math.isfinite(found.smallest_reg_m):
        return
    assert found.low == pytest.approx(log_w.min() / rho)
    assert found.high == pytest.approx(log_w.max() / rho)
    fitted = KL(found.smallest_reg_m).exponent(reg)
    assert np.all(log_w / fitted >= LOG_TINY * (1 + 1e-9))
    assert np.all(log_w / fitted <= LOG_HUGE * (1 + 1e-9))


def test_on_dask_the_advice_is_computed_from_the_chunked_weights():
    """The Dask solve runs the plain iteration only: refused with the in-memory solve and the
    smallest ``reg_m`` as fixes; both followed agree with the log-stable in-memory answer."""
    da = pytest.importorskip("dask.array")
    X, Y, a, b, _ = case(n=60, m=40)
    Xd, Yd = da.from_array(X, chunks=20), da.from_array(Y, chunks=20)
    with pytest.raises(ValueError, match=r"solve in memory .* reg_m >= (\S+) on this side") as e:
        sketchot.sinkhorn_unbalanced(None, None, Xd, Yd, REG, REG_M)
    suggested = float(e.value.args[0].split("reg_m >= ")[1].split(" ")[0])
    assert suggested == 0.003  # (1/60)^(1/rho) normal from rho = log(60) / 708.4
    memory = sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, REG_M, tol=1e-12, max_iter=100_000)
    assert memory.converged and memory.log_domain
    kwargs = dict(tol=1e-12, max_iter=100_000, backend="exact")
    on_dask = sketchot.sinkhorn_unbalanced(None, None, Xd, Yd, REG, suggested, **kwargs)
    plain = sketchot.sinkhorn_unbalanced(a, b, X, Y, REG, suggested, **kwargs)
    # both converged to 1e-12: values to 1e-9
    assert float(on_dask.value) == pytest.approx(plain.value, rel=1e-9)
