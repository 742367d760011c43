"""The skeleton (CUR) kernel ``'cur'`` (``sketchot/kernels/matrix_lowrank.py``): a low rank
of ``exp(-M / reg)`` for a cost matrix, certified by the true-kernel check and chosen by
``'auto'`` only where that check passes.

Tolerances: a skeleton of full rank reproduces ``K`` to 1e-8 relative to its largest entry
(the pseudo-inverse of ``K[I, J]`` at ``rcond=1e-12`` loses at most ``cond(K[I, J])`` times
float64's eps on these small, well-conditioned cases); a kernel of exact rank 1 to 1e-12.
"""

from __future__ import annotations

import numpy as np
import ot
import pytest

import sketchot
import sketchot.policy.ladder
from sketchot.cost_matrix import CostMatrixGeometry
from sketchot.kernels import build_exact_from_cost, get_backend, make_kernel
from sketchot.kernels.matrix_lowrank import build_skeleton
from sketchot.solver.errors import InvalidResultError
from sketchot.solver.plans import sampled_true_kernel_check


def cost(seed=0, n=80, m=60, d=3):
    rng = np.random.default_rng(seed)
    M = ot.dist(rng.random((n, d)), rng.random((m, d)))
    return M / M.max()


def test_a_full_skeleton_is_the_kernel():
    M = cost()
    geometry = CostMatrixGeometry(M, 0.5)
    kernel = build_skeleton(geometry, rng=0, n_pivots=60)
    K = np.exp(-M / 0.5)
    np.testing.assert_allclose(kernel.to_dense(), K, atol=1e-8 * K.max())
    left, right = kernel.factors  # memory O((n + m) rank): no n x m array held
    assert left.shape[0] == 80 and right.shape[0] == 60 and left.shape[1] <= 60
    assert "out_of_sample" not in kernel.info.capabilities  # no points


def test_the_cross_stops_at_the_kernels_rank():
    """``exp(-M / reg)`` of rank 1 (``M_ij = p_i + q_j``): one pivot, exact."""
    rng = np.random.default_rng(1)
    M = rng.random(30)[:, None] + rng.random(20)[None, :]
    kernel = build_skeleton(CostMatrixGeometry(M, 0.3), rng=0, n_pivots=10)
    assert kernel.info.params["pivots"] == 1 and kernel.info.rank == 1
    np.testing.assert_allclose(kernel.to_dense(), np.exp(-M / 0.3), rtol=1e-12)


def test_same_rng_same_bits_and_the_record():
    geometry = CostMatrixGeometry(cost(2), 0.2)
    one, two = (build_skeleton(geometry, rng=3, n_pivots=16) for _ in range(2))
    np.testing.assert_array_equal(one.factors[0], two.factors[0])
    record = get_backend("cur")
    assert record.kind == "low_rank" and record.rank_parameter == "n_pivots" and record.signed


def test_the_solve_is_certified_against_the_true_kernel():
    """The result's check evaluates exp(-M / reg) itself: the same bound as the check of the
    same scalings on the exact kernel's geometry."""
    M = cost(3)
    result = sketchot.solve(M, reg=0.3, backend="cur", n_pivots=32, rng=0)
    assert result.backend == "cur" and result.accuracy_met and result.true_kernel.exhaustive
    exact = build_exact_from_cost(M, 0.3)
    check = sampled_true_kernel_check(exact, result.a, result.b, *result.potentials, 10**6,
                                      np.random.default_rng(0))  # fmt: skip
    assert check.bound == pytest.approx(result.true_kernel.bound, rel=1e-12)
    # far too coarse at a small reg: the signed kernel's plan is impossible, and refused
    with pytest.raises(InvalidResultError, match=r"backend 'cur' .* raise n_pivots"):
        sketchot.solve(M, reg=0.01, backend="cur", n_pivots=4, rng=0)


def test_auto_takes_the_skeleton_only_where_it_is_certified(monkeypatch):
    """Above the direct exact size (made small here) ``'auto'`` tries the skeleton at doubling
    ranks and keeps it only when its solve passes the true-kernel check."""
    monkeypatch.setattr(sketchot.policy.ladder, "DIRECT_DENSE_ENTRIES", 100)
    M = cost(4, n=300, m=260)
    smooth = sketchot.solve(M, reg=0.5, rng=0)
    assert smooth.backend == "cur" and smooth.accuracy_met
    assert smooth.replay["backend"] == "cur" and "n_pivots" in smooth.replay
    again = sketchot.solve(M, reg=0.5, rng=0, **smooth.replay)  # the explicit call, same bits
    np.testing.assert_array_equal(again.potentials[0], smooth.potentials[0])
    sharp = sketchot.solve(M, reg=0.002, rng=0)
    assert sharp.backend == "exact" and sharp.accuracy_met
    assert sharp.attempts and all(not attempt.accepted for attempt in sharp.attempts)


def test_forbidden_pairs_refuse_the_skeleton_and_auto_takes_the_exact_kernel(monkeypatch):
    M = cost(5)
    M[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"backend 'cur' cannot represent M's 1 forbidden"):
        sketchot.solve(M, reg=0.5, backend="cur")
    monkeypatch.setattr(sketchot.policy.ladder, "DIRECT_DENSE_ENTRIES", 100)
    result = sketchot.solve(M, reg=0.5)
    assert result.backend == "exact" and "forbidden pairs" in result.reason


def test_point_cloud_kernels_skip_the_skeleton_in_auto_but_build_it_by_name():
    """On points 'auto' keeps Nystrom and polyts (the rule's max_dimension=0); by name the
    skeleton builds from kernel rows and columns of the points, with new points' products."""
    rng = np.random.default_rng(6)
    X, Y = rng.random((70, 2)), rng.random((50, 2))
    kernel = make_kernel(X, Y, 1.0, "cur", rng=0, n_pivots=50)
    K = np.exp(-ot.dist(X, Y) / 1.0)
    np.testing.assert_allclose(kernel.to_dense(), K, atol=1e-8)
    new = rng.random((5, 2))
    np.testing.assert_allclose(
        kernel.apply_new(new, np.ones(50)), np.exp(-ot.dist(new, Y)).sum(1), rtol=1e-7
    )
    from sketchot.policy import auto_rule

    assert not auto_rule("cur").applies_to(2) and auto_rule("cur").applies_to(0)
