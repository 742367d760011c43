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
from .registry import register_backend

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
    sketch_dim: int | None = None,
    degree: int | None = None,
    coreset_size: int | None = None,
    coefficients: str = "coreset",
    regularizer: str | None = "shifted",
    nonnegative: bool = False,
    taylor_center: float | str = 0.0,
    center: Any = "auto",
    variant: str = "improved",
    rank: int | None = None,
) -> LowRankKernel:
    """Poly-TensorSketch factors of rank ``rank`` (default ``1 + r m``).

    Parameters
    ----------
    sketch_dim : int, optional
        TensorSketch dimension ``m`` (default 20); exclusive with ``rank``.
    degree : int, optional
        Polynomial degree ``r`` (default 3) for ``variant='paper'``. For ``'improved'``
        ``(degree, sketch_dim)`` size the rank ``1 + r m`` when ``rank`` is not given (the
        degree is then searched up to 16); with ``rank``, ``degree`` caps the search.
    coreset_size : int, optional
        k-center clusters ``k`` for ``coefficients='coreset'``; default ``min(10, n, m)``.
        An explicit value must satisfy ``1 <= k <= min(n, m)``.
    coefficients : {'coreset', 'optimal', 'chebyshev', 'taylor'}, default='coreset'
    regularizer : {'shifted', 'theorem', 'none'}, default='shifted'
    nonnegative : bool, default=False
    taylor_center : float or 'mean', default=0.0
        Expansion point of ``coefficients='taylor'``.
    center : {'auto', 'mean', 'bbox'}, None or array, default='auto'
        Common translation of both clouds before sketching (``'auto'``: ``'mean'`` for
        ``'paper'``, ``'bbox'`` for ``'improved'``).
    variant : {'improved', 'paper'}, default='improved'
        ``'paper'``: Han et al.'s Coreset-TS unchanged. ``'improved'``: exact low degrees,
        calibrated per-degree sketch sizes, relative-error fit
        (:class:`~sketchot.sketch.PolyTensorSketch`).
    rank : int, optional
        Total number of features (the constant included): equal-rank comparisons with
        ``nystrom`` (``n_landmarks``) and ``rff`` (``n_features``) take one argument.

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
        variant=variant,
        rank=rank,
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
            "sketch_dim": sketch.sketch_.sketch_dim_,
            "degree": sketch.sketch_.degree_,
            "coreset_size": coreset_size,
            "coefficients": coefficients,
            "variant": variant,
            "rank": sketch.n_features_out_,
        },
    )
    operator.sketch = sketch
    return operator
