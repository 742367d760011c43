"""Gibbs-kernel operators: one contract, one backend per module, one record per backend."""

from . import exact, local, nystrom, polyts, rff  # noqa: F401  (registration side effects)
from .base import CAPABILITIES, DeferredPass, FusedPass, KernelInfo, KernelOperator
from .build import build_kernel, make_kernel
from .exact import ExactKernel, build_exact_from_cost
from .lowrank import FactorMaps, LowRankKernel
from .paper import comparable_parameters
from .registry import (
    Backend,
    available_backends,
    backend_parameters,
    get_backend,
    register_backend,
    unregister_backend,
)

__all__ = [
    "CAPABILITIES",
    "Backend",
    "DeferredPass",
    "ExactKernel",
    "FactorMaps",
    "FusedPass",
    "KernelInfo",
    "KernelOperator",
    "LowRankKernel",
    "available_backends",
    "backend_parameters",
    "build_exact_from_cost",
    "build_kernel",
    "comparable_parameters",
    "get_backend",
    "make_kernel",
    "register_backend",
    "unregister_backend",
]
