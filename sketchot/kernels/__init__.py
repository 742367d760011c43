"""Gibbs-kernel operators: one contract, one backend per module, one record per backend."""

from . import exact, grid, local, matrix_lowrank, nystrom, polyts, rff  # noqa: F401  (registration)
from .base import (
    CAPABILITIES,
    IDENTITY_STEP,
    MIN_DENOMINATOR_RATIO,
    DeferredPass,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    ratios_and_bad,
)
from .build import build_kernel, make_kernel, require_policy
from .exact import EXACT_BACKEND, ExactKernel
from .grid import GRID_BACKEND
from .lowrank import FactorMaps, LowRankKernel
from .matrix_exact import SparseExactKernel, build_exact_from_cost, exact_cost_kernel
from .paper import comparable_parameters
from .registry import (
    Backend,
    available_backends,
    backend_parameters,
    get_backend,
    rebuild_parameters,
    register_backend,
    unregister_backend,
)

__all__ = [
    "CAPABILITIES",
    "EXACT_BACKEND",
    "GRID_BACKEND",
    "IDENTITY_STEP",
    "MIN_DENOMINATOR_RATIO",
    "Backend",
    "DeferredPass",
    "ExactKernel",
    "FactorMaps",
    "FusedPass",
    "KernelInfo",
    "KernelOperator",
    "LowRankKernel",
    "RatioStep",
    "SparseExactKernel",
    "available_backends",
    "backend_parameters",
    "build_exact_from_cost",
    "build_kernel",
    "comparable_parameters",
    "exact_cost_kernel",
    "get_backend",
    "make_kernel",
    "ratios_and_bad",
    "rebuild_parameters",
    "register_backend",
    "require_policy",
    "unregister_backend",
]
