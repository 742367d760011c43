"""sketchot: fast approximate Sinkhorn solvers for the POT ecosystem.

``sketchot.sinkhorn(a, b, X, Y, reg=..., backend=...)`` solves entropic optimal transport
between point clouds with the Gibbs kernel ``exp(-||x - y||^2 / reg)`` exact or approximated
by random Fourier features, Nystrom, or the Poly-TensorSketch of Han, Avron and Shin (2020).

Layers, bottom up (imports only point down): :mod:`sketchot.sketch` (the sketch core, no
optimal transport) and :mod:`sketchot.gibbs` (true-kernel values) -> :mod:`sketchot.kernels`
(the operator contract, one record per backend) -> :mod:`sketchot.solver` (owns the
iteration, repairs, checks) -> :mod:`sketchot.da` (POT-style estimator) and
:mod:`sketchot.color` (colour transfer). :mod:`sketchot.distributed` holds the same layers
on Dask arrays; :mod:`sketchot.api`, on top, is where the public entries send Dask inputs
there and everything else to the in-memory layers. :mod:`sketchot.loss` (the Sinkhorn
divergence and its gradients, ``sinkhorn_divergence``) sits on the public entries, and
:mod:`sketchot.nn` (its PyTorch autograd function and ``SamplesLoss``, loaded on first use so
that ``import sketchot`` never imports torch) on top of it.
"""

import functools as _functools

from . import api as _api
from . import barycenter as _barycenter
from . import loss as _loss
from ._parallel import get_num_threads, set_num_threads, thread_limit
from .api import (
    GridResult,
    make_kernel,
    sinkhorn,
    sinkhorn2,
    sinkhorn_kernel,
    sinkhorn_unbalanced,
    solve_grid,
    solve_sample,
)
from .barycenter import BarycenterResult
from .batch import (
    BatchResult,
    PairwiseDivergences,
    pairwise_divergences,
    sinkhorn_batch,
    solve_sample_batch,
)
from .convolutional import (
    GridBarycenterResult,
    GridDivergenceResult,
    convolutional_barycenter,
    convolutional_barycenter2d,
    convolutional_barycenter2d_debiased,
    sinkhorn_divergence_grid,
)
from .grid import RegularGrid, log_convolve
from .kernels import (
    Backend,
    ExactKernel,
    KernelInfo,
    KernelOperator,
    LowRankKernel,
    available_backends,
    comparable_parameters,
    get_backend,
    register_backend,
    unregister_backend,
)
from .loss import DivergenceResult, SinkhornDivergence
from .matrix import solve
from .solver import (
    AccuracyWarning,
    InvalidResultError,
    InvalidResultWarning,
    KernelSafeguardWarning,
    LazyPlan,
    LinearRangeError,
    NonPositiveKernelError,
    SinkhornResult,
    SolverOptions,
    TargetsResult,
    TrueKernelCheck,
)

__version__ = "0.15.0"

# Loaded on first use: the colour layer imports Pillow and matplotlib, the estimator POT's
# ot.da (which pulls in scikit-learn); plain solves need neither.
_LAZY = {
    "SketchSinkhornTransport": "da",
    "SketchUnbalancedSinkhornTransport": "da",
    "color_transfer": "color",
    "load_image": "color",
    "map_image": "color",
    "sample_pixels": "color",
    "save_image": "color",
    "transfer_colors": "color",
    "SamplesLoss": "nn",
    "nn": "nn",  # the module itself: ``sketchot.nn.sinkhorn_divergence`` without an import
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return module if name == _LAZY[name] else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@_functools.wraps(_loss.sinkhorn_divergence)
def sinkhorn_divergence(X, Y, a=None, b=None, *args, **kwargs):
    # PyTorch tensors go to the autograd front (a differentiable 0-d tensor, as POT returns
    # its input's type); the package sits above both layers, so it may load the upper one
    if any(type(value).__module__.split(".")[0] == "torch" for value in (X, Y, a, b)):
        from .nn import sinkhorn_divergence as on_tensors

        return on_tensors(X, Y, a, b, *args, **kwargs)
    return _loss.sinkhorn_divergence(X, Y, a, b, *args, **kwargs)


@_functools.wraps(_barycenter.barycenter)
def barycenter(clouds, weights=None, *args, **kwargs):
    # Dask clouds go to their Dask form through the public entries (sketchot.api tells Dask
    # inputs apart); the barycentre job stands beside them, so the package routes here
    if _api.on_dask(clouds, weights, kwargs.get("X_init"), *args[3:4]):
        return _api.barycenter_dask(clouds, weights, *args, **kwargs)
    return _barycenter.barycenter(clouds, weights, *args, **kwargs)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AccuracyWarning",
    "Backend",
    "BarycenterResult",
    "BatchResult",
    "DivergenceResult",
    "ExactKernel",
    "GridBarycenterResult",
    "GridDivergenceResult",
    "GridResult",
    "InvalidResultError",
    "InvalidResultWarning",
    "KernelInfo",
    "KernelOperator",
    "KernelSafeguardWarning",
    "LazyPlan",
    "LinearRangeError",
    "LowRankKernel",
    "NonPositiveKernelError",
    "PairwiseDivergences",
    "RegularGrid",
    "SamplesLoss",
    "SinkhornDivergence",
    "SinkhornResult",
    "SketchSinkhornTransport",
    "SketchUnbalancedSinkhornTransport",
    "SolverOptions",
    "TargetsResult",
    "TrueKernelCheck",
    "__version__",
    "available_backends",
    "barycenter",
    "color_transfer",
    "comparable_parameters",
    "convolutional_barycenter",
    "convolutional_barycenter2d",
    "convolutional_barycenter2d_debiased",
    "get_backend",
    "get_num_threads",
    "load_image",
    "log_convolve",
    "make_kernel",
    "map_image",
    "pairwise_divergences",
    "register_backend",
    "sample_pixels",
    "save_image",
    "set_num_threads",
    "sinkhorn",
    "sinkhorn2",
    "sinkhorn_batch",
    "sinkhorn_divergence",
    "sinkhorn_divergence_grid",
    "sinkhorn_kernel",
    "sinkhorn_unbalanced",
    "solve",
    "solve_grid",
    "solve_sample",
    "solve_sample_batch",
    "thread_limit",
    "transfer_colors",
    "unregister_backend",
]
