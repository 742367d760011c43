"""The exact Gibbs kernel ``K(x, y) = exp(-||x - y||^2 / reg)`` block by block: the one helper
every layer uses for true-kernel values (products, log-sum-exp, softmax averages).

These helpers never hold more than a block of rows times the other side at once; callers
choose the block so that it stays within a few tens of megabytes. Points should be centred
(the kernel is translation invariant) so that the expansion
``||x||^2 + ||y||^2 - 2 x.y`` loses no precision.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

# Target size of one block of kernel entries (bytes). Large enough for BLAS efficiency,
# small enough to stay in the last-level cache region and to keep memory flat.
BLOCK_BYTES = 1 << 24

FLOAT64 = np.dtype(np.float64)


def block_rows(n_cols: int, itemsize: int = 8, target_bytes: int = BLOCK_BYTES) -> int:
    """Rows per block so that ``rows * n_cols * itemsize`` is about ``target_bytes``."""
    return max(1, target_bytes // max(1, n_cols * itemsize))


def row_slices(n_rows: int, rows_per_block: int) -> Iterator[slice]:
    """Consecutive slices covering ``range(n_rows)``."""
    for start in range(0, n_rows, rows_per_block):
        yield slice(start, min(start + rows_per_block, n_rows))


def sq_norms(points: np.ndarray) -> np.ndarray:
    """Squared Euclidean norm of each row."""
    return np.einsum("ij,ij->i", points, points)


def neg_cost_over_reg(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    x_sq: np.ndarray | None = None,
    y_sq: np.ndarray | None = None,
    dtype: np.dtype = FLOAT64,
) -> np.ndarray:
    """``-||x_i - y_j||^2 / reg`` for a block, shape ``(len(X), len(Y))``, in ``dtype``."""
    x_sq = sq_norms(X) if x_sq is None else x_sq
    y_sq = sq_norms(Y) if y_sq is None else y_sq
    out = (X @ Y.T).astype(dtype, copy=False)
    out *= -2.0
    out += x_sq[:, None].astype(dtype, copy=False)
    out += y_sq[None, :].astype(dtype, copy=False)
    np.maximum(out, 0.0, out=out)  # rounding can make tiny distances negative
    out *= -1.0 / reg
    return out


def gibbs_block(X: np.ndarray, Y: np.ndarray, reg: float, *args: Any, **kwargs: Any) -> np.ndarray:
    """``exp(-||x_i - y_j||^2 / reg)`` for a block of rows (never via ``exp(2 x.y / reg)``);
    the optional arguments are :func:`neg_cost_over_reg`'s."""
    out = neg_cost_over_reg(X, Y, reg, *args, **kwargs)
    np.exp(out, out=out)
    return out


def gibbs_matmat(X: np.ndarray, Y: np.ndarray, reg: float, V: np.ndarray) -> np.ndarray:
    """``K(X, Y) @ V`` streamed over row blocks of ``X``; ``V`` of shape (m,) or (m, k)."""
    out = np.empty((X.shape[0], *V.shape[1:]))
    y_sq = sq_norms(Y)
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0])):
        out[rows] = gibbs_block(X[rows], Y, reg, y_sq=y_sq) @ V
    return out


def gibbs_softmax_average(
    X: np.ndarray, Y: np.ndarray, reg: float, log_weights: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """``sum_j p_ij values_j`` with ``p_ij ~ exp(log_w_j - ||x_i - y_j||^2 / reg)``.

    Computed with a per-row maximum shift, so it is finite for any ``reg`` (no underflow of
    the whole row). Columns with ``log_w_j = -inf`` get no weight.
    """
    out = np.empty((X.shape[0], *values.shape[1:]))
    y_sq = sq_norms(Y)
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0])):
        logits = neg_cost_over_reg(X[rows], Y, reg, y_sq=y_sq)
        logits += log_weights[None, :]
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        out[rows] = logits @ values
    return out


def gibbs_log_matvec(X: np.ndarray, Y: np.ndarray, reg: float, log_v: np.ndarray) -> np.ndarray:
    """``log sum_j exp(log_v_j - ||x_i - y_j||^2 / reg)`` for each row ``x_i`` (log-sum-exp).

    Finite whenever some ``log_v_j`` is finite, for any ``reg``.
    """
    out = np.empty(X.shape[0])
    y_sq = sq_norms(Y)
    for rows in row_slices(X.shape[0], block_rows(Y.shape[0])):
        logits = neg_cost_over_reg(X[rows], Y, reg, y_sq=y_sq)
        logits += log_v[None, :]
        top = logits.max(axis=1)
        logits -= top[:, None]
        np.exp(logits, out=logits)
        out[rows] = top + np.log(logits.sum(axis=1))
    return out


def check_finite_norms(name: str, points: np.ndarray) -> None:
    """Refuse a cloud whose squared norms overflow float64 (values above ~1e154): every cost
    built from them would be inf or NaN, whatever ``reg``. ``O(n d)``."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(sq_norms(points))
    if not np.all(finite):
        bad = int(np.count_nonzero(~finite))
        raise ValueError(
            f"{name} has {bad} point{'s' if bad > 1 else ''} whose squared norm overflows "
            f"float64 (largest |value| {np.abs(points).max():.3g}; squares must stay below "
            f"{np.finfo(np.float64).max:.3g}): rescale the points, e.g. divide X, Y by s and "
            "reg by s**2 (the same kernel)"
        )


def dual_lower_bound(
    Xc: np.ndarray, Yc: np.ndarray, f: np.ndarray, a: np.ndarray, b: np.ndarray
) -> float:
    """A lower bound of the unregularised OT cost between ``(a, X)`` and ``(b, Y)`` (equal
    masses, cost ``||x - y||^2``) from any finite source potential ``f``.

    With its c-transform ``g_j = min_i (C_ij - f_i)``, ``(f, g)`` is dual-feasible, so
    ``<f, a> + <g, b> <= OT(a, b)`` (weak duality). ``O(n m d)``, block by block.
    """
    active = a > 0
    Xa, fa = Xc[active], f[active]
    g = np.full(Yc.shape[0], np.inf)
    y_sq = sq_norms(Yc)
    for rows in row_slices(Xa.shape[0], block_rows(Yc.shape[0])):
        cost = -neg_cost_over_reg(Xa[rows], Yc, 1.0, y_sq=y_sq)
        cost -= fa[rows, None]
        np.minimum(g, cost.min(axis=0), out=g)
    return float(fa @ a[active] + g @ b)


class GibbsGeometry:
    """Two point clouds and ``reg``: everything needed to evaluate the TRUE Gibbs kernel.

    Every kernel operator carries one (its ``geometry``); the solver uses it for the exact
    values it needs (repairs, the true-kernel check, plans in the log domain) without knowing
    how the operator represents ``K``.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    Y : ndarray, shape (m, d)
    reg : float
        ``K_ij = exp(-||x_i - y_j||^2 / reg)``.

    Attributes
    ----------
    center : ndarray, shape (d,)
        Mean of all points. The kernel is translation invariant; centred coordinates keep
        ``||x||^2 + ||y||^2 - 2 x.y`` accurate.
    Xc, Yc : ndarray
        Centred clouds.
    x_sq, y_sq : ndarray
        Squared norms of the centred points.
    """

    def __init__(self, X: np.ndarray, Y: np.ndarray, reg: float) -> None:
        self.X = X
        self.Y = Y
        self.reg = float(reg)
        self.center = (X.sum(axis=0) + Y.sum(axis=0)) / (X.shape[0] + Y.shape[0])
        self.Xc = X - self.center
        self.Yc = Y - self.center
        check_finite_norms("X", X)
        check_finite_norms("Y", Y)
        with np.errstate(over="ignore", invalid="ignore"):
            self.x_sq = sq_norms(self.Xc)
            self.y_sq = sq_norms(self.Yc)
            cost = self.max_cost()
        if not np.isfinite(cost):  # each cloud squares finely, but not their distances
            raise ValueError(
                "the squared distances between X and Y overflow float64 (largest |value| "
                f"{max(np.abs(X).max(), np.abs(Y).max()):.3g}): rescale the points, e.g. "
                "divide X, Y by s and reg by s**2 (the same kernel)"
            )
        with np.errstate(over="ignore", divide="ignore"):
            scale = cost / self.reg
            inverse = 1.0 / self.reg
        if not (np.isfinite(scale) and np.isfinite(inverse)):
            raise ValueError(
                f"reg={self.reg:g} is too small for these points: max cost / reg = {scale:g} "
                "is not a finite float64 (reg must be a normal positive number well above "
                "1e-300 times the squared diameter)"
            )

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``."""
        return (self.X.shape[0], self.Y.shape[0])

    def rows(self, side: str, index: Any) -> np.ndarray:
        """Centred rows ``Xc[index]`` (``side='x'``) or ``Yc[index]`` (``'y'``)."""
        return (self.Xc if side == "x" else self.Yc)[index]

    def union_rows(self, index: Any = None) -> np.ndarray:
        """Rows of ``vstack([Xc, Yc])``, all of them when ``index`` is None."""
        union = np.vstack([self.Xc, self.Yc])
        return union if index is None else union[index]

    def fit_clouds(self, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The clouds a data-dependent sketch is fitted on: all of ``X`` and ``Y`` in memory
        (a chunked geometry returns a sample drawn with ``generator``)."""
        del generator
        return self.X, self.Y

    def _sides(self, transpose: bool) -> tuple[np.ndarray, np.ndarray]:
        return (self.Yc, self.Xc) if transpose else (self.Xc, self.Yc)

    def max_cost(self) -> float:
        """Upper bound on ``max_ij ||x_i - y_j||^2`` from the centred norms (``O(n + m)``)."""
        return float((np.sqrt(self.x_sq.max()) + np.sqrt(self.y_sq.max())) ** 2)

    def matmat(self, index: Any, V: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``K[index, :] @ V`` (or ``K[:, index].T @ V``), ``O(len(index) m d)``."""
        own, other = self._sides(transpose)
        return gibbs_matmat(own[index], other, self.reg, V)

    def log_matvec(self, index: Any, log_v: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``log (K[index, :] @ exp(log_v))`` (or the transposed form), stable for any reg."""
        own, other = self._sides(transpose)
        return gibbs_log_matvec(own[index], other, self.reg, log_v)

    def block(self, index: Any) -> np.ndarray:
        """True rows ``K[index, :]``."""
        return gibbs_block(self.Xc[index], self.Yc, self.reg)

    def log_block(self, rows: slice) -> np.ndarray:
        """``-M[rows, :] / reg`` in float64."""
        return neg_cost_over_reg(self.Xc[rows], self.Yc, self.reg, self.x_sq[rows], self.y_sq)

    def softmax_average(
        self,
        points: np.ndarray | None,
        log_weights: np.ndarray,
        values: np.ndarray,
        *,
        transpose: bool = False,
    ) -> np.ndarray:
        """``sum_j softmax_j(log_w_j - ||p - y_j||^2 / reg) values_j`` for each point ``p``.

        ``points=None`` uses the fitted source points (target points when ``transpose``);
        otherwise ``points`` are in the original (uncentred) coordinates.
        """
        own, other = self._sides(transpose)
        centred = own if points is None else points - self.center
        return gibbs_softmax_average(centred, other, self.reg, log_weights, values)
