"""Random Fourier features (Rahimi and Recht 2007) of the Gibbs kernel.

By Bochner's theorem, ``exp(-||x - y||^2 / reg) = E[2 cos(w.x + b) cos(w.y + b)]`` for
``w ~ N(0, (2 / reg) I)`` and ``b ~ U[0, 2 pi)``, so ``phi(x) = sqrt(2 / D) cos(W^T x + b)``
with ``D`` draws gives ``K ~ phi(X) phi(Y)^T``. The estimate is unbiased but signed: its
entries, and the products ``K~ v``, can be negative, increasingly so at small ``reg``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from .._validation import check_int, check_rng
from ..gibbs import GibbsGeometry
from .base import KernelInfo
from .lowrank import FactorMaps, LowRankKernel, low_rank_from_maps
from .paper import PAPER_DEGREE, PAPER_SKETCH_DIM
from .registry import register_backend


def rff_maps(geometry: GibbsGeometry, *, rng: Any, dtype: Any, n_features: int) -> FactorMaps:
    """The fitted feature map of :func:`build_rff` (every parameter explicit)."""
    n_features = check_int(n_features, "n_features", minimum=1)
    generator = check_rng(rng)
    d = geometry.X.shape[1]
    frequencies = generator.normal(scale=np.sqrt(2.0 / geometry.reg), size=(d, n_features))
    phases = generator.uniform(0.0, 2.0 * np.pi, size=n_features)
    amplitude = np.sqrt(2.0 / n_features)
    center = geometry.center

    def feature_map(points: np.ndarray) -> np.ndarray:
        # Centred coordinates keep the cosine arguments small; the kernel is unchanged.
        features = (points - center) @ frequencies
        features += phases
        np.cos(features, out=features)
        features *= amplitude
        return features.astype(dtype, copy=False)

    def device_feature_map(on: DeviceArrays, points: np.ndarray) -> Any:
        """:func:`feature_map` on the device of ``on``."""
        xp = on.xp
        features = on.put(points - center) @ on.put(frequencies)
        features = xp.cos(features + on.put(phases)) * float(amplitude)
        return xp.astype(features, on.float_dtype(dtype))

    return FactorMaps(
        KernelInfo("rff", {"n_features": n_features}),
        feature_map,
        feature_map,
        left_map=feature_map,
        right_map=feature_map,
        dtype=dtype,
        device_left_factor=device_feature_map,
        device_right_factor=device_feature_map,
    )


@register_backend(
    "rff",
    rank_parameter="n_features",
    signed=True,
    memory=lambda n, m, d, params, itemsize: (n + m) * params["n_features"] * (8 + itemsize),
    factor_maps=rff_maps,
    advice="random features converge slowly (error ~ 1/sqrt(n_features)) and go negative at "
    "small reg; prefer backend='nystrom' or 'auto'",
    summary="random Fourier features (Rahimi and Recht 2007)",
)
def build_rff(
    geometry: GibbsGeometry,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    n_features: int = PAPER_SKETCH_DIM * PAPER_DEGREE,
) -> LowRankKernel:
    """Random Fourier features with ``D = n_features`` (default ``m r = 60``, the paper's
    comparable cost to Poly-TensorSketch with ``m = 20``, ``r = 3``).

    ``O((n + m) d D)`` time and ``O((n + m) D)`` memory.
    """
    return low_rank_from_maps(
        geometry, rff_maps(geometry, rng=rng, dtype=dtype, n_features=n_features)
    )
