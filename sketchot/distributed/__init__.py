"""Sinkhorn beyond one machine: the same solvers on Dask arrays and Dask clusters.

``sketchot.sinkhorn``, ``sinkhorn2``, ``sinkhorn_kernel`` and ``make_kernel`` dispatch here
when given Dask arrays (:mod:`sketchot.api`; this package imports Dask, the rest of sketchot
never does). Layers as in sketchot: :mod:`.geometry` (clouds on the cluster) ->
:mod:`.kernels` (the Dask placements of the one exact and the one low-rank kernel
class, deferred passes), :mod:`.local` (the block-local kernel's placement: the clouds in
blocks of whole clusters) and :mod:`.builders` (the
backends on Dask, ``'auto'``) -> :mod:`.solver` (the solve, through the solver's own
iteration, and its result).

**Same seed, same answer.** The fitted state is drawn exactly as in memory: RFF frequencies
depend only on ``rng``; Nystrom draws the same landmark indices (uniform) or the same
50,000-point k-center pool indices with the same generator and gathers those rows; the
Poly-TensorSketch is fitted on every row while each side has at most :data:`FIT_ROWS` rows
(beyond, on ``FIT_ROWS`` rows per side drawn uniformly without replacement with ``rng``
plus the row of largest norm, with the centre of all points: then it is a different,
equally valid sketch). Factors are the same row-wise functions. What differs is only the
order of floating-point sums (the centre, and each pass's ``F^T ratios`` as a tree over
chunks instead of blocks and threads): ~1e-16 relative per pass. For positive kernels the
Sinkhorn map contracts (Hilbert metric), so these do not accumulate: scalings, potentials,
marginals, cost and maps agree to 1e-12 relative (measured ~1e-14), whatever the chunking
and number of workers, as long as the iteration count is the same (a convergence check that
lands within rounding of ``tol`` could stop one path 10 iterations apart) and no pass has
entries on the edge of the bad-denominator test (signed kernels at small ``reg``).
"""

from .builders import choose_dask_kernel, dask_backends, make_kernel_dask
from .geometry import FIT_ROWS, DaskGibbsGeometry
from .images import VisiblePixels, map_image_dask, visible_pixels_dask
from .jobs import (
    DaskBarycenterResult,
    DaskDivergenceResult,
    barycenter_dask,
    sinkhorn_divergence_dask,
)
from .kernels import (
    ArrayPass,
    ChainedPass,
    DaskExact,
    DaskFactors,
    DaskStableExact,
    DaskStreamedExact,
    LazyRatios,
    dask_exact_kernel,
    log_stable_kernel,
)
from .local import DaskBlockLocal, DaskClusterBlocks, cluster_blocks, dask_local_kernel
from .solver import DaskSinkhornResult, sinkhorn_dask, sinkhorn_kernel_dask, solve_dask

__all__ = [
    "FIT_ROWS",
    "ArrayPass",
    "ChainedPass",
    "DaskBarycenterResult",
    "DaskBlockLocal",
    "DaskClusterBlocks",
    "DaskDivergenceResult",
    "DaskExact",
    "DaskFactors",
    "DaskGibbsGeometry",
    "DaskSinkhornResult",
    "DaskStableExact",
    "DaskStreamedExact",
    "LazyRatios",
    "VisiblePixels",
    "barycenter_dask",
    "choose_dask_kernel",
    "cluster_blocks",
    "dask_backends",
    "dask_exact_kernel",
    "dask_local_kernel",
    "log_stable_kernel",
    "make_kernel_dask",
    "map_image_dask",
    "sinkhorn_dask",
    "sinkhorn_divergence_dask",
    "sinkhorn_kernel_dask",
    "solve_dask",
    "visible_pixels_dask",
]
