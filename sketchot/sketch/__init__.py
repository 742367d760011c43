"""The sketch core: CountSketch, TensorSketch and Poly-TensorSketch of element-wise functions.

Nothing here knows about optimal transport: it approximates ``f(U V^T)`` for any
element-wise ``f`` by thin factors ``F_U F_V^T`` (Han, Avron and Shin, ICML 2020).
"""

from .accuracy import SketchAccuracyWarning
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
from .improved import ImprovedPlan, VanishingFunctionError, allocate_sizes, plan_improved
from .kcenter import KCenterResult, greedy_k_center
from .local import LocalGaussianExpansion
from .local.blocks import BlockExpansion, ClusterBlock, ClusterBounds
from .monomials import monomial_count, monomial_features, stacked_monomial_features
from .poly import VARIANTS, PolyTensorSketch, fold_buckets
from .tensorsketch import TensorSketch, convolve_count_sketches

__all__ = [
    "COEFFICIENT_METHODS",
    "REGULARIZERS",
    "VARIANTS",
    "BlockExpansion",
    "CallableFunction",
    "ClusterBlock",
    "ClusterBounds",
    "CoefficientFit",
    "CountSketch",
    "ElementwiseFunction",
    "Exponential",
    "GaussianPolySketch",
    "ImprovedPlan",
    "KCenterResult",
    "LocalGaussianExpansion",
    "PolyTensorSketch",
    "Sigmoid",
    "SketchAccuracyWarning",
    "TensorSketch",
    "VanishingFunctionError",
    "allocate_sizes",
    "as_function",
    "chebyshev_to_monomial",
    "convolve_count_sketches",
    "fold_buckets",
    "greedy_k_center",
    "monomial_count",
    "monomial_features",
    "plan_improved",
    "ridge_diagonal",
    "solve_regression",
    "stacked_monomial_features",
]
