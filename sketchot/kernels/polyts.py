"""Coreset-TS: the Poly-TensorSketch feature map of the Gibbs kernel (Han et al. 2020).

``exp(-||x - y||^2 / reg)`` is the Gaussian kernel with ``gamma = 1 / reg``; the sketch core's
:class:`~sketchot.sketch.GaussianPolySketch` centres both clouds, fits the polynomial of
``exp(2 u.v)`` and returns thin factors of rank ``1 + r m``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_int, check_rng
from ..gibbs import GibbsGeometry
from ..sketch import GaussianPolySketch
from .base import KernelInfo
from .lowrank import LowRankKernel, low_rank_from_maps
from .registry import PAPER_DEGREE, PAPER_SKETCH_DIM, register_backend

#: The paper's coreset size (k = 10); clipped to the number of points when not given.
DEFAULT_CORESET_SIZE = 10


def _params_for_rank(rank: int) -> dict[str, Any]:
    """The paper's sketch with ``1 + m r`` features closest to ``rank`` at degree 3."""
    return {"sketch_dim": max(1, (rank - 1) // PAPER_DEGREE), "degree": PAPER_DEGREE}


@register_backend(
    "polyts",
    rank_parameter="sketch_dim",
    params_for_rank=_params_for_rank,
    paper_cost=lambda sketch_dim, degree: {"sketch_dim": sketch_dim, "degree": degree},
    signed=True,
    test_params={"sketch_dim": 8, "degree": 3},
    memory=lambda n, m, d, params, itemsize: (
        (n + m) * (1 + params["sketch_dim"] * params["degree"]) * (8 + itemsize) * 2
    ),
    advice="raise sketch_dim and degree only helps at large reg (>= the squared spread of "
    "the data); below it prefer backend='nystrom' with more landmarks, or 'auto'",
    summary="Coreset-TS: the Poly-TensorSketch of Han, Avron and Shin (ICML 2020)",
)
def build_polyts(
    geometry: GibbsGeometry,
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
    reg = geometry.reg
    n, m = geometry.shape
    if coreset_size is None:
        coreset_size = min(DEFAULT_CORESET_SIZE, n, m)
    else:
        check_int(coreset_size, "coreset_size", minimum=1)
    # In memory: every point. A chunked geometry: a sample drawn with the generator when a
    # side is larger than it fits on the client, with the centre of ALL points.
    generator = check_rng(rng)
    X, Y = geometry.fit_clouds(generator)
    if isinstance(center, str) and center == "mean":
        center = geometry.center  # the same formula as the sketch's own mean centre
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
        rng=generator,
    ).fit(X, Y)

    def left_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_x(points, dtype=dtype)

    def right_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_y(points, dtype=dtype)

    info = KernelInfo(
        "polyts",
        {
            "sketch_dim": sketch_dim,
            "degree": degree,
            "coreset_size": coreset_size,
            "coefficients": coefficients,
        },
    )
    operator = low_rank_from_maps(
        geometry,
        info,
        left_map,
        right_map,
        left_map=left_map,
        right_map=right_map,
        dtype=dtype,
    )
    operator.sketch = sketch
    return operator
