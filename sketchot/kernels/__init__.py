"""Gibbs-kernel operators: one contract, one backend per module, one record per backend."""

from . import exact, nystrom, polyts, rff  # noqa: F401  (registration side effects)
from .base import CAPABILITIES, FusedPass, KernelInfo, KernelOperator
from .exact import ExactKernel
from .lowrank import LowRankKernel
from .registry import (
    Backend,
    available_backends,
    backend_parameters,
    build_kernel,
    comparable_parameters,
    get_backend,
    make_kernel,
    register_backend,
    unregister_backend,
)

__all__ = [
    "CAPABILITIES",
    "Backend",
    "ExactKernel",
    "FusedPass",
    "KernelInfo",
    "KernelOperator",
    "LowRankKernel",
    "available_backends",
    "backend_parameters",
    "build_kernel",
    "comparable_parameters",
    "get_backend",
    "make_kernel",
    "register_backend",
    "unregister_backend",
]
