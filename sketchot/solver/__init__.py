"""Sinkhorn solver: owns the iteration; reaches kernels only through the operator contract."""

from .errors import (
    AccuracyWarning,
    InvalidResultError,
    InvalidResultWarning,
    KernelSafeguardWarning,
    NonPositiveKernelError,
)
from .options import SAFEGUARD_POLICIES, SolverOptions
from .plain import PlainRun, entropic_dual, plain_sinkhorn, plan_summaries
from .plans import (
    LazyPlan,
    PlanSummary,
    TrueKernelCheck,
    plan_summary,
    sampled_true_kernel_check,
    true_kernel_check,
)
from .problem import Problem, make_problem
from .result import SinkhornResult
from .sinkhorn import (
    check_backend_params,
    sinkhorn,
    sinkhorn_kernel,
)

__all__ = [
    "SAFEGUARD_POLICIES",
    "AccuracyWarning",
    "InvalidResultError",
    "InvalidResultWarning",
    "KernelSafeguardWarning",
    "LazyPlan",
    "NonPositiveKernelError",
    "PlainRun",
    "PlanSummary",
    "Problem",
    "SinkhornResult",
    "SolverOptions",
    "TrueKernelCheck",
    "check_backend_params",
    "entropic_dual",
    "make_problem",
    "plain_sinkhorn",
    "plan_summaries",
    "plan_summary",
    "sampled_true_kernel_check",
    "sinkhorn",
    "sinkhorn_kernel",
    "true_kernel_check",
]
