"""Coarse-to-fine starts on tensor-product grids: a pyramid of halved grids.

On a grid (images, volumes, 1-D histograms) the cluster start of
:mod:`~sketchot.solver.multiscale` is the wrong tool (its extrapolation costs ``O(N x
clusters)`` exact log products, more than the axis-by-axis solve it would shorten). The grid
itself gives the coarse problems:

1. every axis of at least ``2 x`` :data:`MIN_AXIS` points is halved (neighbouring pairs of
   points merged, an odd axis's last three together), each coarse point at the mean of its
   coordinates carrying the sum of their weights; repeated until a grid has fewer than
   :data:`MIN_POINTS` points or no axis can be halved;
2. the coarsest problem (same cost, ``reg`` and penalties) is solved cold on its grid kernel
   with an epsilon schedule, each finer one warm-started from the one below, all to the loose
   tolerance :data:`COARSE_TOL` (a coarse problem is not the fine one: only a start);
3. the potentials of a coarse level are carried to the finer grid by the soft-min
   (c-transform) formula, the first half-step of the finer iteration against the coarse
   measure, ``log u0 = log a + step(-log sum_j exp(log v_j - |x - y_j|^2 / reg))``: one log
   convolution from the coarse grid to the fine one (:class:`~sketchot.grid.
   GridConvolution` between different grids), no interpolation;
4. the fine solve starts from there and stops and certifies as usual: the pyramid only
   changes the start, never the answer's certificate.

Everything is sized by the grids alone (no timing): the same problem gives the same start.
A 512 x 512 image at ``reg = 1e-3`` x its squared diameter: 60 fine iterations from a cold
start; after the pyramid (83 iterations over 256 x 256 down to 32 x 32), none
(``benchmarks/grids.py``).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from ..gibbs import GibbsGeometry
from ..grid import RegularGrid, grid_convolution
from ..kernels.grid import GridKernel, grid_of
from .engine import annealing_kernels, choose_strategy, iterate
from .multiscale import COARSE_MAX_ITER, CoarseStart
from .problem import Problem

#: An axis is halved only from ``2 x`` this many points on (shorter axes stay as they are).
MIN_AXIS = 16

#: A grid with fewer points than this is the pyramid's coarsest level (solved cold).
MIN_POINTS = 4096

#: Tolerance of every coarse level (L1 marginal residual over the mass). Measured on the
#: 512 x 512 images of ``benchmarks/grids.py`` at ``reg = 1e-3`` x the squared diameter:
#: 1e-4 costs 103 coarse iterations and the fine solve then needs none; 3e-4 costs 83 and
#: the fine solve needs none; 1e-3 costs 72 and the fine solve 7 (each 6x a 256 x 256 one).
COARSE_TOL = 3e-4


def halve(grid: RegularGrid, weights: np.ndarray) -> tuple[RegularGrid, np.ndarray] | None:
    """The grid with every axis of at least ``2 MIN_AXIS`` points halved and ``weights``
    (of the grid's shape) summed over the merged points; ``None`` when no axis is halved."""
    axes, out, halved = [], weights, False
    for k, axis in enumerate(grid.axes):
        n = axis.size
        if n < 2 * MIN_AXIS:
            axes.append(axis)
            continue
        halved = True
        # pairs of neighbours; an odd axis's last cell takes three points
        starts = np.arange(0, 2 * (n // 2), 2)
        counts = np.diff(np.append(starts, n))
        axes.append(np.add.reduceat(axis, starts) / counts)
        out = np.add.reduceat(out, starts, axis=k)
    return (RegularGrid(axes), out) if halved else None


def _pyramid(x_grid, a, y_grid, b):
    """``[(x_grid, a, y_grid, b), ...]`` from the given level down to the coarsest."""
    levels = [(x_grid, a, y_grid, b)]
    while min(levels[-1][0].size, levels[-1][2].size) >= MIN_POINTS:
        xs, ys = halve(*levels[-1][:2]), halve(*levels[-1][2:])
        if xs is None or ys is None:
            break
        levels.append((*xs, *ys))
    return levels


def _carry(problem: Problem, log_u, log_v, coarse, fine, reg: float):
    """Log-scalings on the ``fine`` level from those of the ``coarse`` one (module note 3)."""
    cx, _, cy, _ = coarse
    fx, a, fy, b = fine
    log_kv = grid_convolution(cy, fx, reg).log_apply(log_v.reshape(cy.shape)).ravel()
    log_ktu = grid_convolution(cx, fy, reg).log_apply(log_u.reshape(cx.shape)).ravel()
    pen_a, pen_b = problem.penalties
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a.ravel()), np.log(b.ravel())
    return pen_a.log_scaling(log_a, log_kv, reg), pen_b.log_scaling(log_b, log_ktu, reg)


def grid_coarse_start(
    problem: Problem, geometry: GibbsGeometry, *, anderson: int = 0
) -> CoarseStart | None:
    """A warm start for ``problem`` between two grid clouds from the pyramid of halved
    grids (module notes); ``None`` when the grids are too small to be halved.

    Parameters
    ----------
    problem : Problem
        The fine problem (weights in the clouds' row order, ``reg``, penalties).
    geometry : GibbsGeometry
        Squared-Euclidean cost between two tensor-product grid clouds.
    anderson : int, default=0
        Anderson memory of the coarse iterations.

    Returns
    -------
    CoarseStart or None
        ``info``: ``clusters`` (the first coarse level's point counts), ``grids`` (the
        shapes of every coarse level), ``coarse_iter`` (over all levels), ``coarse_status``
        and ``coarse_error`` (of the first coarse level), ``seconds``.
    """
    start = time.perf_counter()
    reg = problem.reg
    (x_grid, x_order), (y_grid, y_order) = grid_of(geometry.X, "X"), grid_of(geometry.Y, "Y")
    a = (problem.a if x_order is None else problem.a[x_order]).reshape(x_grid.shape)
    b = (problem.b if y_order is None else problem.b[y_order]).reshape(y_grid.shape)
    levels = _pyramid(x_grid, a, y_grid, b)
    if len(levels) < 2:
        return None
    log_u = log_v = None
    iterations, state = 0, None
    for depth in range(len(levels) - 1, 0, -1):
        cx, ca, cy, cb = levels[depth]
        if log_u is not None:
            log_u, log_v = _carry(problem, log_u, log_v, levels[depth + 1], levels[depth], reg)
        level = replace(problem, a=ca.ravel(), b=cb.ravel(), log_u0=log_u, log_v0=log_v,
                        notes=())  # fmt: skip
        kernel = GridKernel(
            GibbsGeometry(cx.points(), cy.points(), reg, geometry.cost),
            ((cx, None), (cy, None)),
        )
        state = iterate(
            kernel, level, tol=COARSE_TOL, max_iter=COARSE_MAX_ITER, norm="l1", check_every=1,
            strategy=choose_strategy(kernel, "auto"), anderson=anderson,
            schedule=annealing_kernels(kernel) if log_u is None else None,
        )  # fmt: skip
        iterations += state.n_iter
        log_u, log_v = state.log_u, state.log_v
    log_u0, log_v0 = _carry(problem, log_u, log_v, levels[1], levels[0], reg)
    # back to the clouds' row order: grid point r is row order[r]
    if x_order is not None:
        log_u0 = _unpermute(log_u0, x_order)
    if y_order is not None:
        log_v0 = _unpermute(log_v0, y_order)
    info = {
        "clusters": (levels[1][0].size, levels[1][2].size),
        "grids": [(lv[0].shape, lv[2].shape) for lv in levels[1:]],
        "coarse_iter": iterations,
        "coarse_status": state.status,
        "coarse_error": state.history[-1][1] if state.history else math.nan,
        "seconds": time.perf_counter() - start,
    }
    return CoarseStart(log_u0, log_v0, info)


def _unpermute(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[order] = values
    return out


__all__ = ["MIN_AXIS", "MIN_POINTS", "grid_coarse_start", "halve"]
