"""The exact Gibbs kernel: dense when it fits a memory budget, streamed in row blocks otherwise.

``K_ij = exp(-||x_i - y_j||^2 / reg)`` is computed from the squared distances directly (never
through ``exp(2 x.y / reg)``, which overflows). Streaming costs ``O(n m d)`` time per product
and ``O(block x m)`` memory. The class also provides the log-domain sweeps of the stabilised
Sinkhorn iteration (log-sum-exp over rows and columns), which stay finite for any ``reg``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .._validation import check_int
from ..gibbs import (
    block_rows,
    gibbs_matmat,
    gibbs_softmax_average,
    neg_cost_over_reg,
    row_slices,
    sq_norms,
)
from .base import (
    DEFAULT_MAX_DENSE_BYTES,
    KernelOperator,
    PlanSummary,
    divide_guarded,
    fused_pass,
    pass_block_rows,
)
from .registry import register_backend

# Entries per block of a fused pass over a stored kernel: measured fastest at n = 5000 and
# 10^4 (2-core x86), where it matches or beats two full matrix-vector products.
DENSE_PASS_BLOCK_ENTRIES = 1 << 20


class ExactKernel(KernelOperator):
    """The true Gibbs kernel.

    Parameters
    ----------
    X, Y, reg, dtype
        As in :class:`~sketchot.kernels.KernelOperator`.
    max_dense_bytes : int, default=1 GiB
        The ``n x m`` matrix is precomputed when it takes at most this many bytes; beyond, every
        product recomputes it block by block (``O(block x m)`` memory).

    Notes
    -----
    A dense kernel costs ``O(n m)`` memory once and ``O(n m)`` per product; a streamed one
    ``O(n m d)`` per product plus one ``exp`` per entry. The fused Sinkhorn sweep computes each
    block once and applies it twice (``K v`` and ``K^T u``), halving that cost.
    """

    backend = "exact"
    is_exact = True

    def __init__(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        reg: float,
        *,
        dtype: Any = np.float64,
        max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    ) -> None:
        max_dense_bytes = check_int(max_dense_bytes, "max_dense_bytes", minimum=0)
        super().__init__(X, Y, reg, dtype=dtype, params={"max_dense_bytes": max_dense_bytes})
        n, m = self.shape
        self._x_sq = sq_norms(self._Xc)
        self._y_sq = sq_norms(self._Yc)
        self._rows_per_block = block_rows(m, self.dtype.itemsize)
        self.is_dense = n * m * self.dtype.itemsize <= max_dense_bytes
        self._dense = None
        if self.is_dense:
            self._dense = np.empty((n, m), dtype=self.dtype)
            for rows in row_slices(n, self._rows_per_block):
                self._dense[rows] = self._computed_block(rows)

    # ------------------------------------------------------------- blocks
    def _blocks(self) -> Iterator[tuple[slice, np.ndarray]]:
        """Row blocks of ``K`` (views of the dense matrix, or computed on the fly)."""
        for rows in self._block_slices():
            yield rows, self._block(rows)

    def _block_slices(self) -> list[slice]:
        if self._dense is None:
            return list(row_slices(self.shape[0], self._rows_per_block))
        rows_per_block = pass_block_rows(self.shape[1], DENSE_PASS_BLOCK_ENTRIES)
        return list(row_slices(self.shape[0], rows_per_block))

    def _block(self, rows: slice) -> np.ndarray:
        """Rows of ``K``: a view of the stored matrix, or computed."""
        return self._computed_block(rows) if self._dense is None else self._dense[rows]

    def _computed_block(self, rows: slice) -> np.ndarray:
        block = neg_cost_over_reg(
            self._Xc[rows], self._Yc, self.reg, self._x_sq[rows], self._y_sq, self.dtype
        )
        return np.exp(block, out=block)

    # ----------------------------------------------------------- products
    def matmat(self, V: np.ndarray) -> np.ndarray:
        V = self._check_operand(V, self.shape[1], "V", vector=False).astype(self.dtype)
        if self._dense is not None:
            return (self._dense @ V).astype(np.float64, copy=False)
        out = np.empty((self.shape[0], *V.shape[1:]))
        for rows, block in self._blocks():
            out[rows] = block @ V
        return out

    def rmatmat(self, U: np.ndarray) -> np.ndarray:
        U = self._check_operand(U, self.shape[0], "U", vector=False).astype(self.dtype)
        if self._dense is not None:
            return (self._dense.T @ U).astype(np.float64, copy=False)
        out = np.zeros((self.shape[1], *U.shape[1:]))
        for rows, block in self._blocks():
            out += block.T @ U[rows]
        return out

    def rows(self, index: Any) -> np.ndarray:
        if self._dense is not None:
            return self._dense[index].astype(np.float64)
        return self.exact_rows(index)

    def matmat_new(self, X_new: Any, V: Any) -> np.ndarray:
        X_new = self._check_new_points(X_new, "X_new")
        V = self._check_operand(V, self.shape[1], "V", vector=False)
        return gibbs_matmat(X_new - self.center, self._Yc, self.reg, V)

    def rmatmat_new(self, Y_new: Any, U: Any) -> np.ndarray:
        Y_new = self._check_new_points(Y_new, "Y_new")
        U = self._check_operand(U, self.shape[0], "U", vector=False)
        return gibbs_matmat(Y_new - self.center, self._Xc, self.reg, U)

    # ------------------------------------------------------ fused sweeps
    # K = L R^T with L = K and R = I: the left sweep does both products over K.
    def sweep_start(self, u: np.ndarray) -> np.ndarray:
        return self.rmatmat(u)

    def sweep_left(self, y, numerator, guard):
        return fused_pass(
            self._block_slices(),
            self._block,
            self.shape[0],
            y,
            numerator,
            guard,
            self.shape[1],
            self.dtype,
        )

    def sweep_right(self, z, numerator, guard):
        v = divide_guarded(numerator, z, slice(None), guard)
        return v, v, z

    # -------------------------------------------------- log-domain sweeps
    def log_sweep_start(self, log_u: np.ndarray) -> np.ndarray:
        """Column log-sum-exp ``log (K^T u)_j`` for ``u = exp(log_u)``."""
        columns = _OnlineColumnLSE(self.shape[1])
        for rows, block in self._log_blocks():
            columns.add(block + log_u[rows, None])
        return columns.result()

    def log_sweep_left(
        self, log_v: np.ndarray, log_a: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One pass: ``log u = log a - log(K v)`` and the column LSE ``log(K^T u)``.

        Returns ``(log_u, log_Ktu, log_Kv)``; zero weights give ``log u = -inf``.
        """
        n = self.shape[0]
        log_u = np.empty(n)
        log_Kv = np.empty(n)
        columns = _OnlineColumnLSE(self.shape[1])
        for rows, block in self._log_blocks():
            log_Kv[rows] = _row_lse(block + log_v[None, :])
            log_u[rows] = log_a[rows] - log_Kv[rows]
            block += log_u[rows, None]
            columns.add(block)
        return log_u, columns.result(), log_Kv

    def _log_blocks(self) -> Iterator[tuple[slice, np.ndarray]]:
        """Row blocks of ``-M / reg`` in float64 (recomputed: a stored ``K`` may underflow)."""
        for rows in row_slices(self.shape[0], block_rows(self.shape[1])):
            yield (
                rows,
                neg_cost_over_reg(self._Xc[rows], self._Yc, self.reg, self._x_sq[rows], self._y_sq),
            )

    # ------------------------------------------------------------- plans
    # Plans of the exact kernel are evaluated as exp(log u + log K + log v) entry by entry,
    # finite whatever the scalings (log-domain results can have u = inf and K = 0).
    def plan_summary(self, log_u: np.ndarray, log_v: np.ndarray) -> PlanSummary:
        # With a stored K, products with it cost O(n m) instead of O(n m d) plus an exp per
        # entry (about 6x faster at n = 10^4). They are exact as long as the entries of K that
        # underflowed to 0 (below exp(-log(1/tiny))) carry no mass: u_i v_j K_ij < e^-40.
        underflow = -np.log(np.finfo(self.dtype).tiny)
        if self._dense is not None and log_u.max() + log_v.max() < underflow - 40.0:
            return super().plan_summary(log_u, log_v)
        row = np.empty(self.shape[0])
        col = np.zeros(self.shape[1])
        cost = 0.0
        for rows, block in self._log_blocks():
            plan = np.exp(block + log_u[rows, None] + log_v[None, :])
            row[rows] = plan.sum(axis=1)
            col += plan.sum(axis=0)
            cost -= self.reg * float(np.sum(plan * block))
        return PlanSummary(row, col, cost, float(row.sum()))

    def plan_rows(self, log_u: np.ndarray, log_v: np.ndarray, index: Any) -> np.ndarray:
        index = np.arange(self.shape[0])[index]
        block = neg_cost_over_reg(self._Xc[index], self._Yc, self.reg)
        return np.exp(block + log_u[index, None] + log_v[None, :])

    def plan_matmat(self, log_u: np.ndarray, log_v: np.ndarray, V: np.ndarray) -> np.ndarray:
        out = np.empty((self.shape[0], *V.shape[1:]))
        for rows, block in self._log_blocks():
            out[rows] = np.exp(block + log_u[rows, None] + log_v[None, :]) @ V
        return out

    def plan_rmatmat(self, log_u: np.ndarray, log_v: np.ndarray, U: np.ndarray) -> np.ndarray:
        out = np.zeros((self.shape[1], *U.shape[1:]))
        for rows, block in self._log_blocks():
            out += np.exp(block + log_u[rows, None] + log_v[None, :]).T @ U[rows]
        return out

    def _barycentric(self, points, log_w, values, *, transpose):
        # The exact kernel always takes the log-stable softmax path: no fallback needed.
        if points is None:
            points = self._Yc if transpose else self._Xc
        else:
            points = self._check_new_points(points, "Y_new" if transpose else "X_new") - self.center
        other = self._Xc if transpose else self._Yc
        return gibbs_softmax_average(points, other, self.reg, log_w, values), 0


def _row_lse(block: np.ndarray) -> np.ndarray:
    """Row-wise log-sum-exp; rows that are all ``-inf`` give ``-inf``."""
    top = block.max(axis=1)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(block - safe[:, None]).sum(axis=1))


class _OnlineColumnLSE:
    """Column-wise log-sum-exp accumulated over row blocks (running max and rescaled sum)."""

    def __init__(self, n_cols: int) -> None:
        self.top = np.full(n_cols, -np.inf)
        self.total = np.zeros(n_cols)

    def add(self, block: np.ndarray) -> None:
        new_top = np.maximum(self.top, block.max(axis=0))
        safe = np.where(np.isfinite(new_top), new_top, 0.0)
        self.total *= np.exp(self.top - safe)
        self.total += np.exp(block - safe[None, :]).sum(axis=0)
        self.top = new_top

    def result(self) -> np.ndarray:
        safe = np.where(np.isfinite(self.top), self.top, 0.0)
        with np.errstate(divide="ignore"):
            return safe + np.log(self.total)


@register_backend("exact")
def build_exact(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
) -> ExactKernel:
    """The exact kernel (``rng`` is unused: nothing is random)."""
    del rng
    return ExactKernel(X, Y, reg, dtype=dtype, max_dense_bytes=max_dense_bytes)
