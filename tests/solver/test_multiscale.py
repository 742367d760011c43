"""Coarse-to-fine starts (:mod:`sketchot.solver.multiscale`): the clustering keeps the mass,
the extrapolated start is close to the fine solution, the start changes the iterations but
not the answer (balanced and unbalanced, every backend the fine solve may use), and
``'auto'`` uses it only where it pays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.gibbs import GibbsGeometry
from sketchot.solver import multiscale
from sketchot.solver.problem import make_problem


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(3)
    return rng.random((600, 3)), rng.random((500, 3)) * 0.8 + 0.1


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 300),
    k=st.integers(1, 50),
    zeros=st.integers(0, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_coarsening_keeps_mass_and_means(n, k, zeros, seed):
    """Invariants of any clustering: the masses sum to the total weight, every centre is its
    cluster's weighted mean, massless clusters are dropped."""
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(n, 2))
    weights = rng.random(n)
    weights[: min(zeros, n - 1)] = 0.0
    coarse = multiscale.coarsen(points, weights, k, rng=rng)
    assert coarse.centers.shape[0] <= k
    assert np.all(coarse.masses > 0)
    # sums of n positive terms: float64 rounding, far below 1e-12 relative
    assert coarse.masses.sum() == pytest.approx(weights.sum(), rel=1e-12)
    for c in range(coarse.centers.shape[0]):
        members = coarse.labels == c
        mean = (weights[members, None] * points[members]).sum(0) / weights[members].sum()
        np.testing.assert_allclose(coarse.centers[c], mean, rtol=1e-10, atol=1e-12)
    assert np.all(coarse.labels[weights > 0] >= 0)


@pytest.mark.parametrize("reg_m", [None, 0.5])
def test_the_extrapolated_start_is_close_to_the_solution(clouds, reg_m):
    """From a coarse solve on 100 clusters per cloud the fine iteration needs fewer
    iterations than from POT's start, and reaches the same value."""
    X, Y = clouds
    reg = 0.01
    geometry = GibbsGeometry(X, Y, reg)
    problem = make_problem(None, None, geometry.shape, reg, reg_m)
    start = multiscale.coarse_to_fine_start(problem, geometry, clusters=100, rng=0)
    assert start.info["clusters"] == (100, 100)
    assert start.info["coarse_status"] == "converged"
    common = {"reg_m": reg_m, "tol": 1e-6, "check_every": 1, "coarse_to_fine": False}
    cold = sketchot.sinkhorn(None, None, X, Y, reg, "exact", **common)
    warm = sketchot.sinkhorn(
        None, None, X, Y, reg, "exact", warmstart=(start.log_u0, start.log_v0), **common
    )
    assert warm.n_iter < cold.n_iter
    # both stopped at tol = 1e-6 on the marginals: their values agree to that order
    assert warm.value == pytest.approx(cold.value, rel=1e-5)


@pytest.mark.parametrize("backend", ["exact", "polyts_local", "nystrom"])
def test_the_start_changes_the_iterations_not_the_answer(clouds, backend):
    """Forced on, every backend still stops at the caller's tolerance and passes the
    true-kernel check; the result records the stage."""
    X, Y = clouds
    reg = 0.05 if backend == "nystrom" else 0.01
    params = {"rank": 300} if backend == "nystrom" else {}
    common = {"rng": 0, "tol": 1e-7, **params}
    cold = sketchot.sinkhorn(None, None, X, Y, reg, backend, coarse_to_fine=False, **common)
    warm = sketchot.sinkhorn(None, None, X, Y, reg, backend, coarse_to_fine=True, **common)
    assert "coarse_to_fine" not in cold.iteration_info
    stage = warm.iteration_info["coarse_to_fine"]
    assert stage["clusters"][0] <= multiscale.cluster_count(X.shape[:1] + Y.shape[:1])
    assert any("coarse solve" in note for note in warm.notes)
    assert warm.converged and warm.accuracy_met
    # both stopped at tol = 1e-7 on the (L2) marginal: values agree far below 1e-4
    assert warm.value == pytest.approx(cold.value, rel=1e-4)


def test_auto_uses_the_start_only_where_it_pays(clouds, monkeypatch):
    """Small problems start cold; above the size and spread thresholds 'auto' starts from
    the coarse solve, and a caller's warm start always wins."""
    X, Y = clouds
    small = sketchot.sinkhorn(None, None, X, Y, 0.01, "exact")
    assert "coarse_to_fine" not in small.iteration_info
    monkeypatch.setattr(multiscale, "COARSE_MIN_ENTRIES", 1000)
    assert multiscale.coarse_pays((600, 500), 100.0)
    assert not multiscale.coarse_pays((600, 500), 1.0)
    forced = sketchot.sinkhorn(None, None, X, Y, 0.01, "exact")
    assert "coarse_to_fine" in forced.iteration_info
    large_reg = sketchot.sinkhorn(None, None, X, Y, 10.0, "exact")
    assert "coarse_to_fine" not in large_reg.iteration_info
    warm = sketchot.sinkhorn(None, None, X, Y, 0.01, "exact", warmstart=forced.potentials)
    assert "coarse_to_fine" not in warm.iteration_info


def test_bad_requests_are_refused(clouds):
    X, Y = clouds
    with pytest.raises(ValueError, match="coarse_to_fine must be one of"):
        sketchot.sinkhorn(None, None, X, Y, 0.1, "exact", coarse_to_fine="yes")
    with pytest.raises(ValueError, match="coarse_to_fine=True needs a named metric"):
        sketchot.sinkhorn(
            None, None, X, Y, 0.1, "exact", coarse_to_fine=True,
            metric=lambda A, B: np.abs(A[:, None, 0] - B[None, :, 0]),
        )  # fmt: skip


def test_a_failed_coarse_solve_starts_cold(clouds, monkeypatch):
    """Non-finite extrapolated potentials (a coarse solve that broke down) are no start: the
    fine iteration runs cold, and the result says so."""
    import importlib

    body = importlib.import_module("sketchot.solver.sinkhorn")  # the module, not the function
    X, Y = clouds

    def broken(problem, geometry, **kwargs):
        bad = np.full(problem.a.shape, np.nan), np.full(problem.b.shape, np.nan)
        return multiscale.CoarseStart(*bad, {"coarse_status": "breakdown"})

    monkeypatch.setattr(body, "coarse_to_fine_start", broken)
    res = sketchot.sinkhorn(None, None, X, Y, 0.01, "exact", coarse_to_fine=True)
    assert res.converged and res.accuracy_met
    assert res.iteration_info["coarse_to_fine"]["used"] is False
    assert any("started cold" in note for note in res.notes)
