"""sketchot: fast approximate Sinkhorn solvers for the POT ecosystem.

``sketchot.sinkhorn(a, b, X, Y, reg=..., backend=...)`` solves entropic optimal transport
between point clouds with the Gibbs kernel ``exp(-||x - y||^2 / reg)`` exact or approximated
by random Fourier features, Nystrom, or the Poly-TensorSketch of Han, Avron and Shin (2020).

Layers, bottom up: :mod:`sketchot.sketch` (the sketch core, no optimal transport),
:mod:`sketchot.kernels` (one kernel-operator interface, one backend per module),
:mod:`sketchot.solver` (Sinkhorn on any operator).
"""

from .kernels import (
    ExactKernel,
    KernelOperator,
    LowRankKernel,
    available_backends,
    comparable_parameters,
    make_kernel,
)
from .solver import (
    KernelSafeguardWarning,
    LazyPlan,
    NonPositiveKernelError,
    SinkhornResult,
    TrueKernelCheck,
    sinkhorn,
    sinkhorn2,
    sinkhorn_kernel,
)

__version__ = "0.1.0"

__all__ = [
    "ExactKernel",
    "KernelOperator",
    "KernelSafeguardWarning",
    "LazyPlan",
    "LowRankKernel",
    "NonPositiveKernelError",
    "SinkhornResult",
    "TrueKernelCheck",
    "__version__",
    "available_backends",
    "comparable_parameters",
    "make_kernel",
    "sinkhorn",
    "sinkhorn2",
    "sinkhorn_kernel",
]
