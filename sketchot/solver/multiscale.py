"""Coarse-to-fine starts: solve on cluster centres, extrapolate the potentials to the points.

At small ``reg`` the fine kernel is expensive (its products cost ``O(n m)`` exactly, or many
cluster pairs for the block-local kernel) and a cold iteration needs many of them. The
multiscale idea of Schmitzer (2019) and Feydy (2020) moves most of the work to a small
problem:

1. both clouds are clustered (k-means: :func:`coarsen`), each cluster a Dirac at its
   weighted mean carrying the cluster's mass;
2. the coarse problem (same cost, ``reg`` and ``reg_m``) is solved on the exact kernel of
   the centres with an epsilon schedule (:func:`~sketchot.solver.engine.epsilon_schedule`),
   ``O(k^2)`` per iteration;
3. its potentials are extrapolated to the points by the soft-min (c-transform) formula

   .. math:: f(x) = -\\rho_a \\, \\mathrm{reg} \\log \\sum_B \\beta_B
             \\exp\\big((G_B - c(x, y_B)) / \\mathrm{reg}\\big),

   the first half-step of the fine iteration against the coarse measure (no interpolation
   guesswork; ``rho_a = 1`` for a balanced problem), and symmetrically for ``g``;
4. the fine iteration starts from these potentials on whatever kernel was chosen, and stops
   at the caller's tolerance as usual: the coarse stage only changes the start, never the
   answer or its certificate.

Cost of the start: the k-means ``O(s k d)`` on a sample, the assignment ``O(n log k)``, the
coarse solve ``O(k^2)`` per iteration and the extrapolation ``O((n + m) k d)``.

References
----------
B. Schmitzer, "Stabilized sparse scaling algorithms for entropy regularized transport
problems", SIAM J. Sci. Comput. 41(3), 2019.
J. Feydy, "Geometric data analysis, beyond convolutions", PhD thesis, ENS Paris-Saclay, 2020,
Sec. 3.3 (multiscale Sinkhorn).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.cluster.vq import vq
from scipy.spatial import cKDTree

from .._parallel import get_num_threads
from .._validation import check_rng
from ..gibbs import GibbsGeometry, gibbs_log_matvec
from ..kernels import build_kernel
from ..kernels.registry import EXACT_KIND, backends_of_kind
from .engine import annealing_kernels, choose_strategy, iterate
from .problem import Problem

#: Points of the sample the k-means runs on (the rest is assigned to the nearest centre).
KMEANS_SAMPLE = 20_000

#: Lloyd iterations of the k-means on the sample.
KMEANS_ITER = 10

#: Largest dimension whose k-means assignments use a k-d tree (above, brute force is faster).
KDTREE_MAX_DIMENSION = 10

#: Tolerance of the coarse solve (L1 marginal residual over the mass): the fine iteration
#: corrects what remains, so the coarse stage only needs to be close.
COARSE_TOL = 1e-4

#: Iterations of the coarse solve at most (over its epsilon schedule).
COARSE_MAX_ITER = 2000

#: Clusters per cloud: at most this many (the coarse kernel is ``k x k``, stored) ...
MAX_CLUSTERS = 2000
#: ... and at most one per this many points (a coarse problem of the size of the fine one
#: would be no cheaper).
POINTS_PER_CLUSTER = 8

#: ``coarse_to_fine='auto'`` uses the start from this many kernel entries ``n m`` on: below,
#: a fine iteration costs little against the stage (k-means, the ``k x k`` solve) ...
COARSE_MIN_ENTRIES = 50_000_000
#: ... when the largest cost over ``reg`` is at least this (at larger ``reg`` a cold start
#: converges in a few iterations anyway).
COARSE_MIN_SPREAD = 30.0


def coarse_pays(shape: tuple[int, int], spread: float) -> bool:
    """Whether ``coarse_to_fine='auto'`` starts from a coarse solve: ``n m`` at least
    :data:`COARSE_MIN_ENTRIES` and ``spread`` (largest cost over ``reg``) at least
    :data:`COARSE_MIN_SPREAD`."""
    return shape[0] * shape[1] >= COARSE_MIN_ENTRIES and spread >= COARSE_MIN_SPREAD


def coarse_wanted(coarse_to_fine: Any, warm: bool, geometry: Any) -> bool:
    """Whether a solve starts from a coarse solve (in memory and on Dask): never when
    ``coarse_to_fine`` is False or the caller gave a warm start; with True always, for a
    named (symmetric) metric, else ``ValueError``; with ``'auto'`` when a named metric's
    problem is large and spread enough (:func:`coarse_pays`)."""
    if coarse_to_fine is False or warm:
        return False
    named = geometry.cost.translation_invariant
    if coarse_to_fine is True and not named:
        raise ValueError(
            "coarse_to_fine=True needs a named metric (the clusters' costs and the "
            f"extrapolation use c(x, y) = c(y, x)); got {geometry.cost}"
        )
    if coarse_to_fine == "auto":
        return named and coarse_pays(geometry.shape, geometry.max_cost() / geometry.reg)
    return True


def cluster_count(shape: tuple[int, int]) -> int:
    """Clusters per cloud for clouds of ``shape = (n, m)`` points."""
    return max(1, min(MAX_CLUSTERS, min(shape) // POINTS_PER_CLUSTER))


@dataclass
class Coarsening:
    """One cloud clustered: ``centers`` with the ``masses`` of their clusters.

    Attributes
    ----------
    centers : ndarray, shape (k, d)
        Weighted means of the clusters (empty clusters dropped).
    masses : ndarray, shape (k,)
        Sum of the weights in each cluster.
    labels : ndarray of int, shape (n,)
        Cluster of every point.
    """

    centers: np.ndarray
    masses: np.ndarray
    labels: np.ndarray


@dataclass
class CoarseStart:
    """What :func:`coarse_to_fine_start` returns.

    Attributes
    ----------
    log_u0, log_v0 : ndarray
        Extrapolated log-scalings of the fine problem (``u = a e^(f / reg)``).
    info : dict
        ``clusters`` ``(k_X, k_Y)``, ``coarse_iter``, ``coarse_status``, ``coarse_error`` and
        ``seconds`` of the stage.
    """

    log_u0: np.ndarray
    log_v0: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


def coarsen(points: np.ndarray, weights: np.ndarray, k: int, rng: Any = None) -> Coarsening:
    """Cluster ``points`` into at most ``k`` clusters (k-means), with the clusters' masses.

    The k-means (:func:`kmeans_seeds`) runs on a sample of at most :data:`KMEANS_SAMPLE`
    points drawn in proportion to the weights; every point then joins its nearest seed (a
    k-d tree) and each centre moves to its cluster's weighted mean. Points of zero weight
    are assigned but carry no mass; clusters without mass are dropped (their points get
    label ``-1``).
    """
    generator = check_rng(rng)
    positive = np.flatnonzero(weights > 0)
    k = max(1, min(int(k), positive.size))
    if positive.size <= KMEANS_SAMPLE:
        sample = points[positive]
    else:
        p = weights[positive] / weights[positive].sum()
        sample = points[generator.choice(positive, KMEANS_SAMPLE, replace=True, p=p)]
    seeds = kmeans_seeds(sample, k, generator)
    labels, masses, sums = assign_to_seeds(points, weights, seeds)
    used = masses > 0
    # -1: a zero-weight point whose cluster carries no mass (it was dropped)
    remap = np.where(used, np.cumsum(used) - 1, -1)
    return Coarsening(sums[used] / masses[used, None], masses[used], remap[labels])


def kmeans_seeds(sample: np.ndarray, k: int, generator: np.random.Generator) -> np.ndarray:
    """``k`` k-means centres of ``sample`` (:func:`_lloyd`), or the sample itself when it
    has at most ``k`` points."""
    return sample if k >= sample.shape[0] else _lloyd(sample, k, generator)


def assign_to_seeds(
    points: np.ndarray, weights: np.ndarray, seeds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(labels, masses, sums)``: the nearest seed of every point (a k-d tree), the weight
    of each seed's cluster, and the weighted sum of its points (shape ``(k, d)``): the
    pieces a chunk of a cloud adds up (:mod:`sketchot.distributed.multiscale`)."""
    _, labels = cKDTree(seeds).query(points, workers=get_num_threads())
    k = seeds.shape[0]
    masses = np.bincount(labels, weights=weights, minlength=k)
    sums = np.stack(
        [np.bincount(labels, weights=weights * points[:, j], minlength=k)
         for j in range(points.shape[1])],
        axis=1,
    ).reshape(k, points.shape[1])  # fmt: skip
    return labels, masses, sums


def _lloyd(sample: np.ndarray, k: int, generator: np.random.Generator) -> np.ndarray:
    """k-means centres of ``sample``: seeds drawn among its points, :data:`KMEANS_ITER`
    Lloyd steps (a centre that loses every point stays where it is; it is dropped later).

    The assignments use a k-d tree up to :data:`KDTREE_MAX_DIMENSION` (in 3-D it assigns
    2e4 points to 2000 centres 7x faster than :func:`scipy.cluster.vq.vq`'s brute force,
    1.7x in 10-D) and ``vq`` above."""
    seeds = sample[np.sort(generator.choice(sample.shape[0], k, replace=False))]
    d = sample.shape[1]
    for _ in range(KMEANS_ITER):
        if d <= KDTREE_MAX_DIMENSION:
            _, labels = cKDTree(seeds).query(sample, workers=get_num_threads())
        else:
            labels, _ = vq(sample, seeds, check_finite=False)
        counts = np.bincount(labels, minlength=k)
        sums = np.stack([np.bincount(labels, sample[:, j], minlength=k) for j in range(d)], 1)
        moved = counts > 0
        seeds[moved] = sums[moved] / counts[moved, None]
    return seeds


def coarse_to_fine_start(
    problem: Problem,
    geometry: GibbsGeometry,
    *,
    clusters: int,
    anderson: int = 0,
    rng: Any = None,
) -> CoarseStart:
    """A warm start for ``problem`` on ``geometry`` from a coarse solve (module notes).

    Parameters
    ----------
    problem : Problem
        The fine problem (weights, ``reg``, ``reg_m``).
    geometry : GibbsGeometry
        The fine clouds and cost.
    clusters : int
        Clusters per cloud at most.
    anderson : int, default=0
        Anderson memory of the coarse iteration.
    rng : None, int or Generator
        For the k-means seeding and samples.

    Returns
    -------
    CoarseStart
    """
    start = time.perf_counter()
    generator = check_rng(rng)
    reg = problem.reg
    coarse_x = coarsen(geometry.Xc, problem.a, clusters, generator)
    coarse_y = coarsen(geometry.Yc, problem.b, clusters, generator)
    coarse_geometry = GibbsGeometry(
        coarse_x.centers, coarse_y.centers, reg, geometry.cost, geometry.cost.p,
        context=geometry.context,
    )  # fmt: skip
    state = solve_coarse(problem, coarse_geometry, coarse_x.masses, coarse_y.masses, anderson)
    pen_a, pen_b = problem.penalties
    # soft-min of the fine points against the coarse measure, then the penalty's update
    # (u = a (K_coarse v)^-rho for a KL penalty)
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(problem.a), np.log(problem.b)
    log_kv = gibbs_log_matvec(geometry.Xc, coarse_y.centers, reg, state.log_v, cost=geometry.cost)
    log_ktu = gibbs_log_matvec(geometry.Yc, coarse_x.centers, reg, state.log_u, cost=geometry.cost)
    log_u0 = pen_a.log_scaling(log_a, log_kv, reg)
    log_v0 = pen_b.log_scaling(log_b, log_ktu, reg)
    return CoarseStart(log_u0, log_v0, coarse_info(coarse_geometry, state, start))


def solve_coarse(
    problem: Problem,
    coarse_geometry: GibbsGeometry,
    masses_x: np.ndarray,
    masses_y: np.ndarray,
    anderson: int = 0,
) -> Any:
    """The coarse problem (the clusters' masses, ``problem``'s ``reg`` and penalties) solved
    on the exact kernel of the centres with an epsilon schedule: the iteration's state."""
    coarse_problem = replace(
        problem, a=masses_x, b=masses_y, reg=problem.reg, log_u0=None, log_v0=None, notes=()
    )
    # the coarse kernel is small (k x k): the exact kind's record, stored
    exact = backends_of_kind(EXACT_KIND, cost=coarse_geometry.cost)[0]
    kernel = build_kernel(coarse_geometry, exact.name)
    return iterate(
        kernel, coarse_problem, tol=COARSE_TOL, max_iter=COARSE_MAX_ITER, norm="l1",
        strategy=choose_strategy(kernel, "auto"), anderson=anderson,
        schedule=annealing_kernels(kernel),
    )  # fmt: skip


def coarse_info(coarse_geometry: GibbsGeometry, state: Any, start: float) -> dict[str, Any]:
    """The stage's ``info`` of :class:`CoarseStart` (``start``: its ``perf_counter``)."""
    return {
        "clusters": coarse_geometry.shape,
        "coarse_iter": state.n_iter,
        "coarse_status": state.status,
        "coarse_error": state.history[-1][1] if state.history else math.nan,
        "seconds": time.perf_counter() - start,
    }
