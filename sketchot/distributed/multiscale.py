"""Coarse-to-fine starts on Dask: the clusters' centres solved in memory, the potentials
extrapolated on the workers.

The in-memory start (:mod:`sketchot.solver.multiscale`) in three steps placed where they fit:

1. **clustering**: the k-means seeds from a sample of at most
   :data:`~sketchot.solver.multiscale.KMEANS_SAMPLE` rows brought to the client (every row
   of positive weight when there are no more: the in-memory sample; else rows drawn
   uniformly by index, then drawn again in proportion to their weights, so that neither the
   chunking nor an ``n``-sized array on the client enters); every chunk then assigns its
   points to the nearest seed and returns its clusters' masses and weighted sums, added up
   on the cluster (``O(k d)`` floats a chunk);
2. **the coarse solve** of the centres with their masses, in memory (``k <=``
   :data:`~sketchot.solver.multiscale.MAX_CLUSTERS` per side), exactly as in memory;
3. **the extrapolation**: each chunk's soft-min against the other side's coarse measure
   and the penalty's update, ``O(chunk k d)`` on its worker; the start is persisted there
   and handed to the Dask solve as a warm start.

The start only changes where the iteration begins: the fine solve stops at the caller's
tolerance and is certified as a cold one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._validation import check_rng
from ..gibbs import GibbsGeometry, gibbs_log_matvec
from ..solver.multiscale import (
    KMEANS_SAMPLE,
    assign_to_seeds,
    cluster_count,
    coarse_info,
    coarse_wanted,
    kmeans_seeds,
    solve_coarse,
)
from ..solver.options import DEFAULT_ANDERSON_MEMORY, SolverOptions
from ..solver.problem import Problem


def coarse_start_dask(
    problem: Problem, geometry: Any, options: SolverOptions, rng: Any
) -> tuple[Problem, dict[str, Any] | None]:
    """``problem`` warm-started from a coarse solve when ``options.coarse_to_fine`` asks for
    it (``'auto'``: the in-memory rule, :func:`~sketchot.solver.multiscale.coarse_wanted`), and
    the stage's ``info`` (``None``: cold). A caller's warm start wins.

    Parameters
    ----------
    problem : Problem
        The Dask problem (weights as Dask arrays chunked like the clouds' rows).
    geometry : DaskGibbsGeometry
        The clouds on the cluster and their cost.
    options : SolverOptions
        ``coarse_to_fine`` (``True``, ``False`` or ``'auto'``), ``verbose``.
    rng : None, int or Generator
        As in memory: a child stream of it draws the samples and seeds.
    """
    if not coarse_wanted(options.coarse_to_fine, problem.log_u0 is not None, geometry):
        return problem, None  # the in-memory rule
    start = time.perf_counter()
    generator = check_rng(rng).spawn(1)[0]  # the kernel's own draws stay those of rng
    clusters = cluster_count(geometry.shape)
    reg = problem.reg
    centers_x, masses_x = coarsen_dask(geometry.Xc, problem.a, clusters, generator)
    centers_y, masses_y = coarsen_dask(geometry.Yc, problem.b, clusters, generator)
    cost = geometry.cost
    coarse_geometry = GibbsGeometry(centers_x, centers_y, reg, cost, cost.p)
    state = solve_coarse(
        problem, coarse_geometry, masses_x, masses_y, anderson=DEFAULT_ANDERSON_MEMORY
    )
    pen_a, pen_b = problem.penalties
    log_u0 = _extrapolate(geometry.Xc, problem.a, centers_y, state.log_v, reg, pen_a, cost)
    log_v0 = _extrapolate(geometry.Yc, problem.b, centers_x, state.log_u, reg, pen_b, cost)
    log_u0, log_v0 = dask.persist(log_u0, log_v0)
    pairs = ((log_u0, problem.a), (log_v0, problem.b))
    bad = dask.compute(*[((~da.isfinite(s)) & (w > 0)).sum() for s, w in pairs])
    info = coarse_info(coarse_geometry, state, start)
    if any(bad):  # a failed coarse solve is no start: the fine iteration starts cold
        note = f"the coarse solve ended {info['coarse_status']}: started cold"
        return dataclasses.replace(problem, notes=(*problem.notes, note)), {**info, "used": False}
    info["used"] = True
    if options.verbose:
        print(
            f"sketchot.sinkhorn: coarse-to-fine start from {info['clusters']} clusters "
            f"({info['coarse_iter']} coarse iterations, {info['seconds']:.2f} s)"
        )
    note = (
        f"started from a coarse solve on {info['clusters'][0]} x {info['clusters'][1]} "
        f"cluster centres ({info['seconds']:.2f} s)"
    )
    warm = dataclasses.replace(problem, log_u0=log_u0, log_v0=log_v0, notes=(*problem.notes, note))
    return warm, info


def coarsen_dask(
    points: da.Array, weights: da.Array, k: int, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(centers, masses)`` of at most ``k`` k-means clusters of a Dask cloud (module notes,
    step 1), clusters without mass dropped, as
    :func:`~sketchot.solver.multiscale.coarsen` computes them in memory."""
    points = points.rechunk({1: -1})
    weights = weights.rechunk((points.chunks[0],))
    sample = _seed_sample(points, weights, generator)
    seeds = kmeans_seeds(sample, max(1, min(int(k), sample.shape[0])), generator)
    size, d = seeds.shape[0], points.shape[1]
    parts = da.map_blocks(
        _cluster_sums, points, weights[:, None], seeds,
        chunks=((1,) * points.numblocks[0], (size * (d + 1),)), dtype=np.float64,
    )  # fmt: skip
    totals = parts.sum(axis=0).compute().reshape(size, d + 1)
    masses, sums = totals[:, 0], totals[:, 1:]
    used = masses > 0
    return sums[used] / masses[used, None], masses[used]


def _seed_sample(points: da.Array, weights: da.Array, generator: np.random.Generator):
    """The rows the k-means seeds come from (module notes, step 1), in memory."""
    n = points.shape[0]
    if n <= KMEANS_SAMPLE:
        X, w = dask.compute(points, weights)
        return X[w > 0]
    index = np.unique(generator.integers(0, n, KMEANS_SAMPLE))
    X, w = dask.compute(points[index], weights[index])
    positive = np.flatnonzero(w > 0)
    if positive.size == 0:  # every drawn row weighs nothing: the rows of positive weight
        X, w = dask.compute(points[weights > 0], weights[weights > 0])
        positive = np.arange(w.shape[0])
    p = w[positive] / w[positive].sum()
    return X[generator.choice(positive, KMEANS_SAMPLE, replace=True, p=p)]


def _cluster_sums(points: np.ndarray, weights: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """One chunk's ``[mass, weighted sum]`` per cluster, flattened to one row."""
    _, masses, sums = assign_to_seeds(points, weights[:, 0], seeds)
    return np.column_stack([masses, sums]).reshape(1, -1)


def _extrapolate(
    points: da.Array, weights: da.Array, centers: np.ndarray, log_w: np.ndarray, reg: float,
    penalty: Any, cost: Any,
) -> da.Array:  # fmt: skip
    """Each chunk's start ``log u`` (module notes, step 3): the soft-min of its points
    against the coarse measure of the other side, then the penalty's update."""
    points = points.rechunk({1: -1})
    return da.map_blocks(
        _extrapolate_chunk, points, weights.rechunk((points.chunks[0],))[:, None], centers,
        log_w, reg, penalty, cost, drop_axis=1, dtype=np.float64,
    )  # fmt: skip


def _extrapolate_chunk(points, weights, centers, log_w, reg, penalty, cost) -> np.ndarray:
    with np.errstate(divide="ignore"):
        log_weights = np.log(weights[:, 0])
    return penalty.log_scaling(
        log_weights, gibbs_log_matvec(points, centers, reg, log_w, cost), reg
    )
