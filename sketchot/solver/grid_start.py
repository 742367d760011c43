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

1-D grids (histograms of up to ``10^6`` bins, uniform axes) go further: the pyramid goes down
to :data:`MIN_POINTS_1D` points (halved so the axes stay uniform, the banded pass's need), and
the epsilon schedule climbs it: the stage at ``eps`` runs on the coarsest level whose spacing
is at most :data:`RESOLUTION` ``sqrt(eps)`` (so every stage's kernel is a few points wide and
its passes cost ``O(points)``), to :data:`STAGE_TOL_1D`; the target ``reg`` then starts on
the level that resolves it and climbs the remaining levels as in 2. and 3. At 10^6 bins and
``reg = 1e-7`` no solve at the target reg iterates beyond 15,625 points
(``benchmarks/grids.py``); before, the coarsest level (3,906 points) alone ran the whole
schedule at that reg.

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
from .engine import annealing_kernels, choose_strategy, epsilon_schedule, iterate
from .multiscale import COARSE_MAX_ITER, CoarseStart
from .problem import Problem

#: An axis is halved only from ``2 x`` this many points on (shorter axes stay as they are).
MIN_AXIS = 16

#: A grid with fewer points than this is the pyramid's coarsest level (solved cold).
MIN_POINTS = 4096

#: A 1-D pyramid goes down to grids of fewer than this many points (its coarse levels are
#: solved along the epsilon schedule: see :func:`grid_coarse_start`).
MIN_POINTS_1D = 4 * MIN_AXIS

#: 1-D grids: the stage of the epsilon schedule at ``eps`` runs on the coarsest level whose
#: spacing is at most this times ``sqrt(eps)`` (a kernel a few points wide: the level resolves
#: the stage's blur, and its pass costs ``O(points)``).
RESOLUTION = 0.25

#: Tolerance (L1 marginal residual over the mass) of the stages of a 1-D schedule above the
#: target reg. Measured on ``benchmarks/grids.py``'s 10^5 bins at reg 1e-6: with 1e-3 (the
#: engine's STAGE_TOL) the target reg then needs 124 iterations on 6250 points, 10 s in all;
#: with 1e-4, 12, 7.6 s (low frequencies converge while eps is large; 10^6 bins at 1e-7: 572
#: iterations on 15625 points with 1e-3, 0 with 1e-4).
STAGE_TOL_1D = 1e-4

#: Tolerance of every coarse level (L1 marginal residual over the mass). Measured on the
#: 512 x 512 images of ``benchmarks/grids.py`` at ``reg = 1e-3`` x the squared diameter:
#: 1e-4 costs 103 coarse iterations and the fine solve then needs none; 3e-4 costs 83 and
#: the fine solve needs none; 1e-3 costs 72 and the fine solve 7 (each 6x a 256 x 256 one).
COARSE_TOL = 3e-4


def halve(
    grid: RegularGrid, weights: np.ndarray, *, uniform: bool = False
) -> tuple[RegularGrid, np.ndarray] | None:
    """The grid with every axis of at least ``2 MIN_AXIS`` points halved and ``weights``
    (of the grid's shape) summed over the merged points; ``None`` when no axis is halved.

    ``uniform=True`` (1-D pyramids; the axes must be uniform): an odd axis's last point is a
    cell of its own, placed half a fine step beyond it, so the coarse axis stays uniform (the
    banded pass of :mod:`sketchot.grid` needs uniform axes; a start may move that much mass
    by half a step). Otherwise an odd axis's last cell takes three points."""
    axes, out, halved = [], weights, False
    for k, axis in enumerate(grid.axes):
        n = axis.size
        if n < 2 * MIN_AXIS:
            axes.append(axis)
            continue
        halved = True
        if uniform:
            starts = np.arange(0, n, 2)
            step = (axis[-1] - axis[0]) / (n - 1)
            axes.append(axis[0] + step * (2.0 * np.arange(starts.size) + 0.5))
        else:
            # pairs of neighbours; an odd axis's last cell takes three points
            starts = np.arange(0, 2 * (n // 2), 2)
            counts = np.diff(np.append(starts, n))
            axes.append(np.add.reduceat(axis, starts) / counts)
        out = np.add.reduceat(out, starts, axis=k)
    return (RegularGrid(axes), out) if halved else None


def _uniform(axis: np.ndarray) -> bool:
    """Whether a 1-D axis is uniform to rounding of its coordinates."""
    if axis.size < 2:
        return False
    step = (axis[-1] - axis[0]) / (axis.size - 1)
    scale = 16 * np.finfo(float).eps * max(np.abs(axis).max(), step)
    return bool(np.abs(axis - (axis[0] + step * np.arange(axis.size))).max() <= scale)


def _pyramid(x_grid, a, y_grid, b):
    """``[(x_grid, a, y_grid, b), ...]`` from the given level down to the coarsest."""
    levels = [(x_grid, a, y_grid, b)]
    oned = x_grid.ndim == 1 and all(_uniform(g.axes[0]) for g in (x_grid, y_grid))
    smallest = MIN_POINTS_1D if oned else MIN_POINTS
    while min(levels[-1][0].size, levels[-1][2].size) >= smallest:
        xs, ys = halve(*levels[-1][:2], uniform=oned), halve(*levels[-1][2:], uniform=oned)
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


def _kernel(x_grid: RegularGrid, y_grid: RegularGrid, reg: float, geometry: GibbsGeometry):
    """The grid kernel between two levels' grids at ``reg`` (the fine problem's cost)."""
    return GridKernel(
        GibbsGeometry(x_grid.points(), y_grid.points(), reg, geometry.cost),
        ((x_grid, None), (y_grid, None)),
    )


def _spacing(grid: RegularGrid) -> float:
    """The largest distance between neighbours of a 1-D grid."""
    return float(np.diff(grid.axes[0]).max()) if grid.size > 1 else math.inf


def _stages(problem: Problem, levels: list, geometry: GibbsGeometry, anderson: int):
    """The epsilon schedule of a 1-D problem on the pyramid: the stage at ``eps`` runs on
    the coarsest level of spacing at most :data:`RESOLUTION` ``sqrt(eps)`` (so the levels
    get finer as ``eps`` falls), to :data:`STAGE_TOL_1D`, warm-started
    from the previous stage's potentials (in cost units, carried by the c-transform when
    the level changes).

    Returns ``(log_u, log_v, depth, iterations, stages)``: the log-scalings at the target
    ``reg`` on level ``depth`` (the coarsest that resolves it; ``None`` when the schedule
    has no stage above ``reg``), the iterations over the stages, and one record per stage.
    """
    reg = problem.reg
    spacing = [max(_spacing(lv[0]), _spacing(lv[2])) for lv in levels]

    def depth_of(eps: float) -> int:
        fits = [d for d in range(1, len(levels)) if spacing[d] <= RESOLUTION * math.sqrt(eps)]
        return max(fits) if fits else 1

    f = g = None  # potentials in cost units on level `at`
    at, iterations, stages = None, 0, []
    for eps in epsilon_schedule(reg, geometry.max_cost())[:-1]:
        depth = depth_of(eps)
        cx, ca, cy, cb = levels[depth]
        log_u = log_v = None
        if f is not None:
            log_u, log_v = f / eps, g / eps
            if depth != at:
                log_u, log_v = _carry(problem, log_u, log_v, levels[at], levels[depth], eps)
        level = replace(problem, a=ca.ravel(), b=cb.ravel(), reg=eps, log_u0=log_u,
                        log_v0=log_v, notes=())  # fmt: skip
        kernel = _kernel(cx, cy, eps, geometry)
        state = iterate(
            kernel, level, tol=STAGE_TOL_1D, max_iter=max(1, COARSE_MAX_ITER - iterations),
            norm="l1", check_every=1, strategy=choose_strategy(kernel, "auto"),
            anderson=anderson,
        )  # fmt: skip
        iterations += state.n_iter
        stages.append({"shape": cx.shape, "reg": eps, "n_iter": state.n_iter,
                       "status": state.status})  # fmt: skip
        f, g, at = eps * state.log_u, eps * state.log_v, depth
    depth = depth_of(reg)
    if f is None:
        return None, None, depth, iterations, stages
    log_u, log_v = f / reg, g / reg
    if depth != at:
        log_u, log_v = _carry(problem, log_u, log_v, levels[at], levels[depth], reg)
    return log_u, log_v, depth, iterations, stages


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
        and ``coarse_error`` (of the first coarse level), ``seconds``; 1-D: ``stages``, one
        record (``shape``, ``reg``, ``n_iter``, ``status``) per stage of the schedule.
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
    iterations, state, stages, top = 0, None, None, len(levels) - 1
    if x_grid.ndim == 1 and _uniform(x_grid.axes[0]) and _uniform(y_grid.axes[0]):
        # 1-D: the epsilon schedule climbs the pyramid; the target reg from the level that
        # resolves it, its potentials already carried there
        log_u, log_v, top, iterations, stages = _stages(problem, levels, geometry, anderson)
    for depth in range(top, 0, -1):
        cx, ca, cy, cb = levels[depth]
        if log_u is not None and depth < top:
            log_u, log_v = _carry(problem, log_u, log_v, levels[depth + 1], levels[depth], reg)
        level = replace(problem, a=ca.ravel(), b=cb.ravel(), log_u0=log_u, log_v0=log_v,
                        notes=())  # fmt: skip
        kernel = _kernel(cx, cy, reg, geometry)
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
    if stages is not None:
        info["stages"] = stages
    return CoarseStart(log_u0, log_v0, info)


def _unpermute(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[order] = values
    return out


__all__ = ["MIN_AXIS", "MIN_POINTS", "MIN_POINTS_1D", "RESOLUTION", "grid_coarse_start", "halve"]
