"""The sketch core: CountSketch, TensorSketch and Poly-TensorSketch of element-wise functions.

Nothing here knows about optimal transport: it approximates ``f(U V^T)`` for any
element-wise ``f`` by thin factors ``F_U F_V^T`` (Han, Avron and Shin, ICML 2020).
"""

from .coefficients import (
    COEFFICIENT_METHODS,
    REGULARIZERS,
    CoefficientFit,
    chebyshev_to_monomial,
    ridge_diagonal,
    solve_regression,
)
from .countsketch import CountSketch
from .functions import CallableFunction, ElementwiseFunction, Exponential, Sigmoid, as_function
from .gaussian import GaussianPolySketch
from .kcenter import KCenterResult, greedy_k_center
from .local import LocalGaussianExpansion
from .poly import PolyTensorSketch
from .tensorsketch import TensorSketch, convolve_count_sketches

__all__ = [
    "COEFFICIENT_METHODS",
    "REGULARIZERS",
    "CallableFunction",
    "CoefficientFit",
    "CountSketch",
    "ElementwiseFunction",
    "Exponential",
    "GaussianPolySketch",
    "KCenterResult",
    "LocalGaussianExpansion",
    "PolyTensorSketch",
    "Sigmoid",
    "TensorSketch",
    "as_function",
    "chebyshev_to_monomial",
    "convolve_count_sketches",
    "greedy_k_center",
    "ridge_diagonal",
    "solve_regression",
]
