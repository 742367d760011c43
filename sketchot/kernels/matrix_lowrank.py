"""A low-rank kernel on a cost matrix: the skeleton (CUR) approximation of ``K = exp(-M / reg)``
from ``s`` of its rows and ``s`` of its columns, chosen by adaptive cross approximation.

Why this form. Nystrom (:mod:`.nystrom`) needs a square, symmetric, positive semi-definite
kernel of landmark POINTS; a cost matrix ``M`` given by the caller is rectangular, has no
points and need not give a positive definite ``exp(-M / reg)``. What it does give is its
entries, and for a matrix known only by its entries the standard low-rank form is the
skeleton (CUR, "cross") approximation ``K ~ K[:, J] K[I, J]^+ K[I, :]`` (Goreinov,
Tyrtyshnikov and Zamarashkin 1997): exact on the rows ``I`` and the columns ``J``, built from
``s (n + m)`` kernel entries, never ``n x m``. The rows and columns are chosen by adaptive
cross approximation with partial pivoting (Bebendorf 2000): from a first row drawn by
``rng``, each step takes the largest entry of the current residual row as the next column,
and the largest entry of the residual of that column as the next row, which picks the
rows and columns that the previous ones explain worst (``O((n + m) s^2)`` time, no search
over ``M``). Uniform columns are the alternative the issue names; at the small ``reg``
where a low rank is worth having only for smooth kernels, pivoting finds the few rows and
columns that carry the kernel's range where uniform draws spend them on rows it already
explains. The pseudo-inverse of ``K[I, J]`` drops singular values below ``rcond`` times
the largest (the pivots' cross is ill-conditioned once the kernel is numerically of lower
rank), and the factors are ``A = K[:, J] V S^-1/2`` and ``B = K[I, :]^T U S^-1/2`` with
``K[I, J] = U S V^T``.

Like every approximation it is certified: the solve's true-kernel check evaluates rows of
``exp(-M / reg)`` itself (:meth:`~sketchot.cost_matrix.CostMatrixGeometry.log_matvec`),
never the factors, and ``backend='auto'`` keeps it only when that check meets the accuracy.
The factors are signed (``K[I, J]^+`` is), so products may go negative, as Nystrom's.

On point clouds (any metric) the same skeleton is built from kernel rows and columns
computed from the points; ``'auto'`` tries it on cost matrices only (its rule in
:mod:`sketchot.policy.table`), where it is the one low rank.

Forbidden pairs (``+inf`` costs) are refused: a low rank does not keep the kernel's zeros,
and the plan would move mass along forbidden pairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_float, check_int, check_rng
from ..cost_matrix import has_points
from ..gibbs import gibbs_block
from .base import KernelInfo
from .lowrank import LowRankKernel
from .registry import register_backend

#: The backend's name.
SKELETON_BACKEND = "cur"

#: Rows and columns when ``n_pivots`` is not given (``'auto'``'s first rung is 64 too).
DEFAULT_PIVOTS = 64

#: A residual pivot below this fraction of the first one ends the cross: the kernel is
#: numerically of that rank (float64 rounding of the entries' sums).
PIVOT_RTOL = 1e-13


class _Entries:
    """True rows and columns of the geometry's kernel: read from ``M`` for a cost matrix,
    computed from the centred points otherwise (on the host: the factors are built there)."""

    def __init__(self, geometry: Any) -> None:
        self.geometry = geometry
        self.points = has_points(geometry)

    def rows(self, index: Any) -> np.ndarray:
        g = self.geometry
        if not self.points:
            return g.block(index)
        return gibbs_block(g.Xc[index], g.Yc, g.reg, cost=g.cost)

    def columns(self, index: Any) -> np.ndarray:
        g = self.geometry
        if not self.points:
            return g.columns(index)
        return gibbs_block(g.Xc, g.Yc[index], g.reg, cost=g.cost)


def cross_pivots(
    entries: _Entries, n_pivots: int, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``I`` and columns ``J`` of the kernel chosen by adaptive cross approximation with
    partial pivoting (module notes): at most ``n_pivots`` of each, fewer when the residual
    vanishes. ``O((n + m) s^2)`` time, ``O((n + m) s)`` memory; reads ``s`` rows and ``s``
    columns of the kernel."""
    n, m = entries.geometry.shape
    left = np.zeros((n, n_pivots))
    right = np.zeros((m, n_pivots))
    rows: list[int] = []
    cols: list[int] = []
    free_rows = np.ones(n, dtype=bool)
    free_cols = np.ones(m, dtype=bool)
    row = int(generator.integers(n))
    first = None
    while len(rows) < n_pivots and free_rows.any() and free_cols.any():
        k = len(rows)
        residual = entries.rows([row])[0] - left[row, :k] @ right[:, :k].T
        free_rows[row] = False
        size = np.where(free_cols, np.abs(residual), -1.0)
        col = int(size.argmax())
        pivot = residual[col]
        if first is None:
            first = abs(pivot)
        if not abs(pivot) > PIVOT_RTOL * first:
            # this row is explained already: try the free row the last column explains worst
            if k == 0 or not free_rows.any():
                break
            row = int(np.where(free_rows, np.abs(left[:, k - 1]), -1.0).argmax())
            if np.abs(left[row, k - 1]) <= PIVOT_RTOL * first:
                break
            continue
        column = entries.columns([col])[:, 0] - left[:, :k] @ right[col, :k]
        left[:, k] = column / pivot
        right[:, k] = residual
        rows.append(row)
        cols.append(col)
        free_cols[col] = False
        if not free_rows.any():
            break
        row = int(np.where(free_rows, np.abs(left[:, k]), -1.0).argmax())
    return np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)


def _same_cloud(geometry: Any) -> bool:
    """Identical clouds under a named (symmetric) metric: the kernel is symmetric and the
    skeleton is built symmetric too (the symmetric iteration multiplies by ``K`` only)."""
    if not has_points(geometry) or not geometry.cost.translation_invariant:
        return False
    X, Y = geometry.X, geometry.Y
    return X is Y or (X.shape == Y.shape and bool(np.array_equal(X, Y)))


@register_backend(
    SKELETON_BACKEND,
    rank_parameter="n_pivots",
    signed=True,
    metrics=("any", "precomputed"),
    memory=lambda n, m, d, params, itemsize: (
        4 * (n + m) * (params["n_pivots"] or DEFAULT_PIVOTS) * 8
        + 4 * (params["n_pivots"] or DEFAULT_PIVOTS) ** 2 * 8
    ),
    advice="raise n_pivots (the skeleton's rows and columns); below reg ~ 0.1 x the spread of "
    "the costs no rank suffices: use backend='exact' or 'auto'",
    summary="skeleton (CUR) of the kernel, rows and columns by adaptive cross approximation; "
    "the low rank of a cost matrix",
)
def build_skeleton(
    geometry: Any,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    n_pivots: int | None = None,
    rcond: float = 1e-12,
) -> LowRankKernel:
    """The skeleton factors ``K ~ A B^T`` of the Gibbs kernel (module notes), of a cost
    matrix (:class:`~sketchot.cost_matrix.CostMatrixGeometry`) or of point clouds (any
    metric; identical clouds get a symmetric skeleton ``K[:, S] K[S, S]^+ K[S, :]`` on the
    union ``S`` of the pivots).

    Parameters
    ----------
    geometry : CostMatrixGeometry or GibbsGeometry
    rng : None, int or numpy.random.Generator
        Draws the first pivot row.
    dtype : {numpy.float64, numpy.float32}
        Storage of the factors.
    n_pivots : int, optional
        Rows and columns of the skeleton, ``>= 1`` (default 64; at most ``min(n, m)`` are
        used); the rank is at most ``s`` (fewer when the cross ends early or ``rcond`` drops
        singular values).
    rcond : float
        Singular values of ``K[I, J]`` below ``rcond`` times the largest are dropped.

    Returns
    -------
    LowRankKernel
        ``info.params`` holds ``n_pivots``, ``rcond`` and ``pivots`` (those found); on
        points, new points' factors are ``K(x, Y[J])`` (``K(X[I], y)``) times the fitted
        projection; on a cost matrix there are no out-of-sample products.

    Notes
    -----
    ``O((n + m) s^2)`` time (plus ``O((n + m) s d)`` on points), ``O((n + m) s)`` memory,
    ``s (n + m)`` kernel entries read.
    """
    if getattr(geometry, "forbidden", 0):
        raise ValueError(
            f"backend {SKELETON_BACKEND!r} cannot represent M's {geometry.forbidden} forbidden "
            "pairs (+inf costs): a low-rank kernel is not 0 there and the plan would move "
            "mass along them; use backend='exact' (or 'auto', which then takes it)"
        )
    n, m = geometry.shape
    if n_pivots is None:
        n_pivots = DEFAULT_PIVOTS
    n_pivots = check_int(n_pivots, "n_pivots", minimum=1)
    rcond = check_float(rcond, "rcond", positive=True)
    if rcond >= 1:
        raise ValueError(f"rcond must be < 1 (it drops every singular value); got {rcond:g}")
    entries = _Entries(geometry)
    # at most min(n, m) rows and columns exist (a fitted size rebuilds on fewer points)
    rows, cols = cross_pivots(entries, min(n_pivots, n, m), check_rng(rng))
    info = KernelInfo(
        SKELETON_BACKEND, {"n_pivots": n_pivots, "rcond": rcond, "pivots": int(rows.size)}
    )
    maps: dict[str, Any] = {"left_map": None, "right_map": None}
    if _same_cloud(geometry):
        union = np.union1d(rows, cols)
        C = entries.columns(union)
        W = C[union]
        eigvals, eigvecs = np.linalg.eigh(0.5 * (W + W.T))
        keep = eigvals > rcond * eigvals.max()
        projection = eigvecs[:, keep] / np.sqrt(eigvals[keep])
        left = right = C @ projection
        landmarks = geometry.Yc[union]
        maps = {"left_map": _landmark_map(geometry, landmarks, geometry.cost),
                "right_map": _landmark_map(geometry, landmarks, geometry.cost),
                "left_projection": projection, "right_projection": projection}  # fmt: skip
    else:
        C = entries.columns(cols)  # K[:, J], n x s
        R = entries.rows(rows)  # K[I, :], s x m
        U, S, Vt = np.linalg.svd(C[rows], full_matrices=False)
        keep = rcond * S[0] < S
        scale = 1.0 / np.sqrt(S[keep])
        left_projection, right_projection = Vt[keep].T * scale, U[:, keep] * scale
        left, right = C @ left_projection, R.T @ right_projection
        if entries.points:
            cost = geometry.cost
            maps = {
                "left_map": _landmark_map(geometry, geometry.Yc[cols], cost),
                "right_map": _landmark_map(geometry, geometry.Xc[rows], cost.transposed()),
                "left_projection": left_projection, "right_projection": right_projection,
            }  # fmt: skip
    kernel = LowRankKernel(geometry, info, left, right, dtype=dtype, **maps)
    if not entries.points:
        kernel.info.capabilities = kernel.info.capabilities - {"out_of_sample"}
    return kernel


def _landmark_map(geometry: Any, landmarks: np.ndarray, cost: Any) -> Any:
    """New (uncentred) points' kernel rows against fitted centred ``landmarks``."""
    center, reg = geometry.center, geometry.reg

    def feature_map(points: np.ndarray) -> np.ndarray:
        return gibbs_block(points - center, landmarks, reg, cost=cost)

    return feature_map
