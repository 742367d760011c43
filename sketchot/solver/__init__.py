"""Sinkhorn solver: owns the iteration; reaches kernels only through the operator contract.

This package's namespace is the solver's one entry for the layers above it (the policy, the
jobs, :mod:`sketchot.api`, the Dask placement): they import ``sketchot.solver``, never its
submodules (``tests/test_architecture.py``). What they use, by what it does:

- validate a problem: :func:`check_problem` (clouds, ``reg``, cost), :func:`make_problem`
  (weights, penalty, warm start), :func:`check_reg_m`, :func:`check_backend_params`;
- solve it: :func:`sinkhorn` (clouds in, the kernel built or, given a policy, chosen),
  :func:`sinkhorn_targets` and :func:`solve_targets` (``k`` targets ``b`` of shape
  ``(m, k)`` on one kernel),
  :func:`solve` (a validated problem on a built kernel), :func:`sinkhorn_kernel`,
  :func:`sinkhorn_batch` and :func:`solve_batch` (many small problems at once);
- certify and summarise the result: :func:`finish_solve`, :func:`check_from_masses`,
  :func:`true_kernel_check`, :func:`plan_summary`, :func:`value_error_estimate`;
- drive the iteration on another placement (:mod:`sketchot.distributed`):
  :func:`choose_strategy`, :func:`iterate`, :class:`Safeguard`, :class:`IterationTable`.
"""

from .batch import (
    BatchResult,
    check_batch_keywords,
    check_clouds,
    check_stacked_weights,
    sinkhorn_batch,
    solve_batch,
    stack_clouds,
    stack_weights,
)
from .engine import annealing_kernels, choose_strategy, iterate
from .errors import (
    AccuracyWarning,
    InvalidResultError,
    InvalidResultWarning,
    KernelSafeguardWarning,
    LinearRangeError,
    NonPositiveKernelError,
)
from .matrix import sinkhorn_matrix
from .options import SAFEGUARD_POLICIES, SolverOptions
from .penalties import KL, PENALTY_TYPES, TV, Balanced, Penalty, make_penalty
from .plain import PlainRun, entropic_dual, plain_sinkhorn, plan_summaries
from .plans import (
    LazyPlan,
    PlanSummary,
    TrueKernelCheck,
    check_from_masses,
    plan_summary,
    sample_indices,
    sampled_true_kernel_check,
    true_kernel_check,
    value_error_estimate,
)
from .problem import MASS_RTOL, Problem, check_reg_m, check_unbalanced_type, make_problem
from .progress import IterationTable, Progress
from .result import NumpyInDtype, ResultView, SinkhornResult, in_points_dtype
from .safeguard import Safeguard
from .sinkhorn import (
    EPSILON_SCALING_SPREAD,
    SAMPLED_CHECK_SIZE,
    check_backend_params,
    check_problem,
    finish_solve,
    join_runs,
    sinkhorn,
    sinkhorn_kernel,
    solve,
)
from .targets import (
    TargetsProblem,
    TargetsResult,
    make_targets,
    several_targets,
    sinkhorn_kernel_targets,
    sinkhorn_targets,
    sinkhorn_targets_matrix,
    solve_targets,
)

__all__ = [
    "EPSILON_SCALING_SPREAD",
    "KL",
    "MASS_RTOL",
    "PENALTY_TYPES",
    "SAFEGUARD_POLICIES",
    "SAMPLED_CHECK_SIZE",
    "TV",
    "AccuracyWarning",
    "Balanced",
    "BatchResult",
    "InvalidResultError",
    "InvalidResultWarning",
    "IterationTable",
    "KernelSafeguardWarning",
    "LazyPlan",
    "LinearRangeError",
    "NonPositiveKernelError",
    "NumpyInDtype",
    "Penalty",
    "PlainRun",
    "PlanSummary",
    "Problem",
    "Progress",
    "ResultView",
    "Safeguard",
    "SinkhornResult",
    "SolverOptions",
    "TargetsProblem",
    "TargetsResult",
    "TrueKernelCheck",
    "annealing_kernels",
    "check_backend_params",
    "check_batch_keywords",
    "check_clouds",
    "check_from_masses",
    "check_problem",
    "check_reg_m",
    "check_stacked_weights",
    "check_unbalanced_type",
    "choose_strategy",
    "entropic_dual",
    "finish_solve",
    "in_points_dtype",
    "iterate",
    "join_runs",
    "make_penalty",
    "make_problem",
    "make_targets",
    "plain_sinkhorn",
    "plan_summaries",
    "plan_summary",
    "sample_indices",
    "sampled_true_kernel_check",
    "several_targets",
    "sinkhorn",
    "sinkhorn_batch",
    "sinkhorn_kernel",
    "sinkhorn_kernel_targets",
    "sinkhorn_matrix",
    "sinkhorn_targets",
    "sinkhorn_targets_matrix",
    "solve",
    "solve_batch",
    "solve_targets",
    "stack_clouds",
    "stack_weights",
    "true_kernel_check",
    "value_error_estimate",
]
