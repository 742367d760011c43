"""Sinkhorn solver: depends only on the kernel-operator interface."""

from .result import LazyPlan, SinkhornResult, TrueKernelCheck
from .safeguard import (
    SAFEGUARD_POLICIES,
    KernelSafeguardWarning,
    NonPositiveKernelError,
)
from .sinkhorn import sinkhorn, sinkhorn2, sinkhorn_kernel

__all__ = [
    "SAFEGUARD_POLICIES",
    "KernelSafeguardWarning",
    "LazyPlan",
    "NonPositiveKernelError",
    "SinkhornResult",
    "TrueKernelCheck",
    "sinkhorn",
    "sinkhorn2",
    "sinkhorn_kernel",
]
