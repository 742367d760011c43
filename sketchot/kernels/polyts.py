"""Coreset-TS: the Poly-TensorSketch feature map of the Gibbs kernel (Han et al. 2020).

``exp(-||x - y||^2 / reg)`` is the Gaussian kernel with ``gamma = 1 / reg``; the sketch core's
:class:`~sketchot.sketch.GaussianPolySketch` centres both clouds, fits the polynomial of
``exp(2 u.v)`` and returns thin factors of rank ``1 + r m``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_int
from ..sketch import GaussianPolySketch
from .base import LowRankKernel
from .registry import PAPER_DEGREE, PAPER_SKETCH_DIM, register_backend

#: The paper's coreset size (k = 10); clipped to the number of points when not given.
DEFAULT_CORESET_SIZE = 10


@register_backend("polyts")
def build_polyts(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    sketch_dim: int = PAPER_SKETCH_DIM,
    degree: int = PAPER_DEGREE,
    coreset_size: int | None = None,
    coefficients: str = "coreset",
    regularizer: str | None = "shifted",
    nonnegative: bool = False,
    taylor_center: float | str = 0.0,
    center: Any = "mean",
) -> LowRankKernel:
    """Poly-TensorSketch factors of rank ``1 + r m``.

    Parameters
    ----------
    sketch_dim : int, default=20
        TensorSketch dimension ``m``.
    degree : int, default=3
        Polynomial degree ``r``.
    coreset_size : int, optional
        k-center clusters ``k`` for ``coefficients='coreset'``; default ``min(10, n, m)``.
        An explicit value must satisfy ``1 <= k <= min(n, m)``.
    coefficients : {'coreset', 'optimal', 'chebyshev', 'taylor'}, default='coreset'
    regularizer : {'shifted', 'theorem', 'none'}, default='shifted'
    nonnegative : bool, default=False
    taylor_center : float or 'mean', default=0.0
        Expansion point of ``coefficients='taylor'``.
    center : {'mean', 'bbox'}, None or array, default='mean'
        Common translation of both clouds before sketching.

    Notes
    -----
    Build ``O((n + m) r (d + m log m) + (n + m) k (d + r^2))``; memory ``O((n + m) r m)``.
    """
    if coreset_size is None:
        coreset_size = min(DEFAULT_CORESET_SIZE, X.shape[0], Y.shape[0])
    else:
        check_int(coreset_size, "coreset_size", minimum=1)
    sketch = GaussianPolySketch(
        1.0 / reg,
        degree=degree,
        sketch_dim=sketch_dim,
        coefficients=coefficients,
        coreset_size=coreset_size,
        regularizer=regularizer,
        nonnegative=nonnegative,
        taylor_center=taylor_center,
        center=center,
        rng=rng,
    ).fit(X, Y)

    def left_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_x(points, dtype=dtype)

    def right_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_y(points, dtype=dtype)

    operator = LowRankKernel(
        X,
        Y,
        reg,
        left_map(X),
        right_map(Y),
        left_map=left_map,
        right_map=right_map,
        backend="polyts",
        dtype=dtype,
        params={
            "sketch_dim": sketch_dim,
            "degree": degree,
            "coreset_size": coreset_size,
            "coefficients": coefficients,
        },
    )
    operator.sketch = sketch
    return operator
