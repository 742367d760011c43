"""Random Fourier features (Rahimi and Recht 2007) of the Gibbs kernel.

By Bochner's theorem, ``exp(-||x - y||^2 / reg) = E[2 cos(w.x + b) cos(w.y + b)]`` for
``w ~ N(0, (2 / reg) I)`` and ``b ~ U[0, 2 pi)``, so ``phi(x) = sqrt(2 / D) cos(W^T x + b)``
with ``D`` draws gives ``K ~ phi(X) phi(Y)^T``. The estimate is unbiased but signed: its
entries, and the products ``K~ v``, can be negative, increasingly so at small ``reg``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_int, check_rng
from .base import LowRankKernel
from .registry import PAPER_DEGREE, PAPER_SKETCH_DIM, register_backend


@register_backend("rff")
def build_rff(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    n_features: int = PAPER_SKETCH_DIM * PAPER_DEGREE,
) -> LowRankKernel:
    """Random Fourier features with ``D = n_features`` (default ``m r = 60``, the paper's
    comparable cost to Poly-TensorSketch with ``m = 20``, ``r = 3``).

    ``O((n + m) d D)`` time and ``O((n + m) D)`` memory.
    """
    n_features = check_int(n_features, "n_features", minimum=1)
    generator = check_rng(rng)
    d = X.shape[1]
    frequencies = generator.normal(scale=np.sqrt(2.0 / reg), size=(d, n_features))
    phases = generator.uniform(0.0, 2.0 * np.pi, size=n_features)
    amplitude = np.sqrt(2.0 / n_features)
    center = (X.sum(axis=0) + Y.sum(axis=0)) / (X.shape[0] + Y.shape[0])

    def feature_map(points: np.ndarray) -> np.ndarray:
        # Centred coordinates keep the cosine arguments small; the kernel is unchanged.
        features = (points - center) @ frequencies
        features += phases
        np.cos(features, out=features)
        features *= amplitude
        return features.astype(dtype, copy=False)

    return LowRankKernel(
        X,
        Y,
        reg,
        feature_map(X),
        feature_map(Y),
        left_map=feature_map,
        right_map=feature_map,
        backend="rff",
        dtype=dtype,
        params={"n_features": n_features},
    )
