"""Sinkhorn beyond one machine: the same solvers on Dask arrays and Dask clusters.

``sketchot.sinkhorn``, ``sinkhorn2`` and ``make_kernel`` dispatch here when given Dask arrays
(this package imports Dask; the rest of sketchot never does). Layers as in sketchot:
:mod:`.geometry` (clouds on the cluster) -> :mod:`.kernels` (operators with Dask factors)
-> :mod:`.solver` (the solve and its result).
"""

from .geometry import FIT_ROWS, DaskGibbsGeometry
from .kernels import DaskExactKernel, DaskFusedPass, DaskLowRankKernel
from .solver import DaskSinkhornResult, sinkhorn_dask, sinkhorn_kernel_dask, solve_dask

__all__ = [
    "FIT_ROWS",
    "DaskExactKernel",
    "DaskFusedPass",
    "DaskGibbsGeometry",
    "DaskLowRankKernel",
    "DaskSinkhornResult",
    "sinkhorn_dask",
    "sinkhorn_kernel_dask",
    "solve_dask",
]
