"""The plain iteration, plan summaries of plain scalings and the sampled true-kernel check."""

from __future__ import annotations

import numpy as np
import pytest

import sketchot
from sketchot.solver import (
    entropic_dual,
    plain_sinkhorn,
    plan_summaries,
    plan_summary,
    sampled_true_kernel_check,
)


@pytest.fixture
def problem():
    rng = np.random.default_rng(3)
    X, Y = rng.random((60, 3)), rng.random((50, 3))
    return X, Y, np.full(60, 1 / 60), np.full(50, 1 / 50)


def test_paper_order_is_the_papers_update(problem):
    """Algorithm 1 of Han et al. from v = 1: u = a / K v, then v = b / K^T u. One iteration in
    closed form, and any later one as its two half-steps from the iterate before it (the
    same rounding: 1e-13)."""
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 0.5, "exact")
    K = kernel.to_dense()
    first = plain_sinkhorn(kernel, a, b, n_iter=1, order="paper")
    u1 = a / (K @ np.ones(50))
    np.testing.assert_allclose(first.u, u1, rtol=1e-13)
    np.testing.assert_allclose(first.v, b / (K.T @ u1), rtol=1e-13)
    six, seven = (plain_sinkhorn(kernel, a, b, n_iter=k, order="paper") for k in (6, 7))
    np.testing.assert_allclose(seven.u, a / (K @ six.v), rtol=1e-13)
    np.testing.assert_allclose(seven.v, b / (K.T @ seven.u), rtol=1e-13)
    assert len(seven.iteration_times) == 7 and seven.faults == 0 and seven.valid


def test_pot_order_matches_the_library_without_safeguard_needs(problem):
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 0.5, "exact")
    run = plain_sinkhorn(kernel, a, b, n_iter=10, order="pot")
    result = sketchot.sinkhorn_kernel(a, b, kernel, max_iter=10, tol=1e-300, accuracy=None,
                                      log_domain=False, warn=False)  # fmt: skip
    np.testing.assert_allclose(np.log(run.u), result.potentials[0], atol=1e-10)
    np.testing.assert_allclose(np.log(run.v), result.potentials[1], atol=1e-10)


def test_faults_are_counted_and_propagate(problem):
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 0.01, "rff", n_features=4, rng=0)
    with np.errstate(all="ignore"):
        run = plain_sinkhorn(kernel, a, b, n_iter=3)
    assert run.faults > 0 and not run.valid


def test_options_are_validated(problem):
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 1.0, "exact")
    with pytest.raises(ValueError, match="order"):
        plain_sinkhorn(kernel, a, b, order="posthoc")
    with pytest.raises((ValueError, TypeError), match="n_iter"):
        plain_sinkhorn(kernel, a, b, n_iter=0)


@pytest.mark.parametrize("backend", ["exact", "nystrom", "polyts"])
def test_plan_summaries_match_plan_summary_and_are_batch_independent(problem, backend):
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 1.0, backend, rng=1)
    exact = sketchot.make_kernel(X, Y, 1.0, "exact")
    runs = [plain_sinkhorn(kernel, a, b, n_iter=k) for k in (2, 5)]
    batch = plan_summaries(exact, [(r.u, r.v) for r in runs])
    for run, summary in zip(runs, batch, strict=True):
        reference = plan_summary(exact, np.log(run.u), np.log(run.v))
        assert summary.cost == pytest.approx(reference.cost, rel=1e-12)
        assert summary.mass == pytest.approx(reference.mass, rel=1e-12)
        np.testing.assert_allclose(summary.col_marginal, reference.col_marginal, rtol=1e-12)
        P = np.exp(np.log(run.u)[:, None] + np.log(run.v)[None, :]) * exact.to_dense()
        M = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
        assert summary.cost == pytest.approx(float((P * M).sum()), rel=1e-10)
    assert plan_summaries(exact, []) == []


def test_entropic_dual(problem):
    X, Y, a, b = problem
    kernel = sketchot.make_kernel(X, Y, 0.5, "exact")
    run = plain_sinkhorn(kernel, a, b, n_iter=3)
    [summary] = plan_summaries(kernel, [(run.u, run.v)])
    expected = 0.5 * (a @ np.log(run.u) + b @ np.log(run.v) - (summary.mass - 1.0))
    assert entropic_dual(a, b, run.u, run.v, summary.mass, 0.5) == pytest.approx(expected)


def test_sampled_check_draws_as_the_result_does(problem):
    X, Y, a, b = problem
    result = sketchot.sinkhorn(a, b, X, Y, 1.0, "nystrom", rank=10, rng=0, accuracy=None,
                               warn=False)  # fmt: skip
    mine = sampled_true_kernel_check(result.kernel, a, b, *result.potentials, 20,
                                     np.random.default_rng(7))  # fmt: skip
    theirs = result.check_true_kernel(20, rng=np.random.default_rng(7))
    assert mine == theirs and mine.n_rows == 20 and not mine.exhaustive
