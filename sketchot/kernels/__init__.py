"""Gibbs-kernel operators: one interface, one backend per module, looked up by name."""

from . import exact, nystrom, polyts, rff  # noqa: F401  (registration side effects)
from .base import Guard, KernelOperator, LowRankKernel, PlanSummary
from .exact import ExactKernel
from .registry import (
    available_backends,
    backend_parameters,
    comparable_parameters,
    make_kernel,
    register_backend,
)

__all__ = [
    "ExactKernel",
    "Guard",
    "KernelOperator",
    "LowRankKernel",
    "PlanSummary",
    "available_backends",
    "backend_parameters",
    "comparable_parameters",
    "make_kernel",
    "register_backend",
]
