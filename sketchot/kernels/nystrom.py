"""Nystrom approximation of the Gibbs kernel (Williams and Seeger 2001; Han et al. 2020, App. C).

With landmarks ``Z`` (``s`` points drawn from both clouds),
``K ~ K(X, Z) K(Z, Z)^+ K(Z, Y)``. Writing ``K(Z, Z)^+ = Q diag(1 / lambda) Q^T`` over the
eigenvalues above ``rcond * lambda_max`` gives the factors ``A = K(X, Z) Q diag(lambda^-1/2)``
and ``B = K(Y, Z) Q diag(lambda^-1/2)``, and the feature map of a new point ``x`` is
``K(x, Z) Q diag(lambda^-1/2)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_choice, check_float, check_int, check_rng
from ..sketch import greedy_k_center
from ..gibbs import block_rows, gibbs_block, row_slices
from .base import LowRankKernel
from .registry import comparable_parameters, register_backend

LANDMARK_METHODS = ("kcenter", "uniform")

# Largest pool of points the k-center landmark search runs on.
KCENTER_POOL = 50_000


@register_backend("nystrom")
def build_nystrom(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    n_landmarks: int = comparable_parameters()["nystrom"]["n_landmarks"],
    landmarks: str = "kcenter",
    rcond: float = 1e-12,
) -> LowRankKernel:
    """Nystrom factors with ``s = n_landmarks`` landmarks (default ``ceil(max(sqrt(r m), r)) = 8``,
    the paper's comparable cost to Poly-TensorSketch with ``m = 20``, ``r = 3``).

    Parameters
    ----------
    n_landmarks : int
        ``1 <= s <= n + m``.
    landmarks : {'kcenter', 'uniform'}, default='kcenter'
        ``'kcenter'``: greedy k-center on the union of both clouds (on a uniform pool of at
        most 50,000 of their points), which spreads the landmarks so that no point is far
        from every landmark; measured 4-6x lower true-kernel marginal error than uniform
        landmarks on [0, 1]^3 at reg = 1 and 0.1 with 61 landmarks. ``'uniform'``: half of the
        landmarks drawn without replacement from each cloud, as POT's ``kernel_nystroem`` and
        the paper do.
    rcond : float
        Eigenvalues of ``K(Z, Z)`` below ``rcond * lambda_max`` are dropped (pseudo-inverse).

    Notes
    -----
    ``O((n + m) s d + s^3)`` time, ``O((n + m) s)`` memory.
    """
    n, m = X.shape[0], Y.shape[0]
    n_landmarks = check_int(n_landmarks, "n_landmarks", minimum=1, maximum=n + m)
    check_choice(landmarks, "landmarks", LANDMARK_METHODS)
    rcond = check_float(rcond, "rcond", positive=True)
    generator = check_rng(rng)
    center = (X.sum(axis=0) + Y.sum(axis=0)) / (n + m)
    Xc, Yc = X - center, Y - center

    if landmarks == "uniform":
        from_x = min(n, (n_landmarks + 1) // 2)
        from_y = n_landmarks - from_x
        if from_y > m:
            from_x, from_y = n_landmarks - m, m
        Z = np.vstack(
            [
                Xc[generator.choice(n, size=from_x, replace=False)],
                Yc[generator.choice(m, size=from_y, replace=False)],
            ]
        )
    else:
        union = np.vstack([Xc, Yc])
        if union.shape[0] > KCENTER_POOL:
            # k-center costs O(pool s d): on a uniform pool the landmarks cover the clouds
            # as well for all practical purposes, and the build stays O((n + m) s d).
            union = union[generator.choice(union.shape[0], size=KCENTER_POOL, replace=False)]
        Z = union[greedy_k_center(union, n_landmarks, generator).centers]

    eigvals, eigvecs = np.linalg.eigh(gibbs_block(Z, Z, reg))
    keep = eigvals > rcond * eigvals.max()
    whitening = eigvecs[:, keep] / np.sqrt(eigvals[keep])

    def landmark_kernel(points: np.ndarray) -> np.ndarray:
        return gibbs_block(points - center, Z, reg)

    def factor(points: np.ndarray) -> np.ndarray:
        # in row blocks: the n x s landmark kernel is never held whole next to the factor
        out = np.empty((points.shape[0], whitening.shape[1]), dtype=dtype)
        for rows in row_slices(points.shape[0], block_rows(Z.shape[0])):
            out[rows] = landmark_kernel(points[rows]) @ whitening
        return out

    return LowRankKernel(
        X,
        Y,
        reg,
        factor(X),
        factor(Y),
        # New points: K(x, Z) only; the whitening is folded into the small side of products.
        left_map=landmark_kernel,
        right_map=landmark_kernel,
        left_projection=whitening,
        right_projection=whitening,
        backend="nystrom",
        dtype=dtype,
        params={"n_landmarks": n_landmarks, "landmarks": landmarks, "rank": int(keep.sum())},
    )
