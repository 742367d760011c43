"""sketchot: fast approximate Sinkhorn solvers for the POT ecosystem.

``sketchot.sinkhorn(a, b, X, Y, reg=..., backend=...)`` solves entropic optimal transport
between point clouds with the Gibbs kernel ``exp(-||x - y||^2 / reg)`` exact or approximated
by random Fourier features, Nystrom, or the Poly-TensorSketch of Han, Avron and Shin (2020).

Layers, bottom up: :mod:`sketchot.sketch` (the sketch core, no optimal transport),
:mod:`sketchot.kernels` (one kernel-operator interface, one backend per module),
:mod:`sketchot.solver` (Sinkhorn on any operator), :mod:`sketchot.color` (colour transfer on
top of the solver).
"""

from .color import (
    color_transfer,
    load_image,
    map_image,
    sample_pixels,
    save_image,
    transfer_colors,
)
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


def __getattr__(name: str):
    # The POT-style transport class imports ot.da (about 1.5 s, it pulls in scikit-learn):
    # load it on first use only.
    if name == "SketchSinkhornTransport":
        from .color import SketchSinkhornTransport

        return SketchSinkhornTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ExactKernel",
    "KernelOperator",
    "KernelSafeguardWarning",
    "LazyPlan",
    "LowRankKernel",
    "NonPositiveKernelError",
    "SinkhornResult",
    "SketchSinkhornTransport",
    "TrueKernelCheck",
    "__version__",
    "available_backends",
    "color_transfer",
    "comparable_parameters",
    "load_image",
    "make_kernel",
    "map_image",
    "sample_pixels",
    "save_image",
    "sinkhorn",
    "sinkhorn2",
    "sinkhorn_kernel",
    "transfer_colors",
]
