"""The exact Gibbs kernel: dense when it fits a memory budget, streamed in row blocks otherwise.

``K_ij = exp(-c(x_i, y_j) / reg)`` for the geometry's cost (any metric); for the default
``||x_i - y_j||^2`` it is computed from the squared distances directly (never through
``exp(2 x.y / reg)``, which overflows). Streaming costs ``O(n m d)`` time per product
and ``O(block x m)`` memory; a stored kernel ``O(n m)`` memory once and ``O(n m)`` per
product. As ``K = L R^T`` with ``L = K`` and ``R = I``, a fused pass over the rows computes
``K v``, ``u = a / K v`` and ``K^T u`` from one read (or one computation) of each block.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._validation import check_int
from ..gibbs import (
    GibbsGeometry,
    block_rows,
    gibbs_log_matvec,
    gibbs_matmat,
    row_slices,
)
from .base import (
    FusedPass,
    KernelInfo,
    KernelOperator,
    blocked_fused_pass,
    check_operand,
    dense_fused_pass,
    identity_pass,
    log_ratios_and_bad,
)
from .registry import register_backend

#: Log of the floor of an absorbed kernel's entries: one unit above log(tiny) so that exp
#: never rounds into denormals (denormal operands make BLAS products many times slower).
LOG_FLOOR = {
    np.dtype(dtype): math.ceil(math.log(np.finfo(dtype).tiny)) + 1.0
    for dtype in (np.float64, np.float32)
}


class ExactKernel(KernelOperator):
    """The true Gibbs kernel.

    Parameters
    ----------
    geometry : GibbsGeometry
    dtype : numpy dtype
    max_dense_bytes : int, default=1 GiB
        ``K`` is stored when it takes at most this many bytes; beyond, every product recomputes
        it block by block.

    Attributes
    ----------
    is_dense : bool
        Whether ``K`` is stored (computed on the first product that needs it).
    """

    def __init__(
        self,
        geometry: GibbsGeometry,
        *,
        dtype: Any = np.float64,
        max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    ) -> None:
        info = KernelInfo(
            "exact",
            {"max_dense_bytes": max_dense_bytes},
            capabilities=frozenset(
                {"exact", "out_of_sample", "nonnegative", "log_products", "absorb"}
            ),
        )
        super().__init__(geometry, info, dtype)
        self.max_dense_bytes = max_dense_bytes
        n, m = self.shape
        self._rows_per_block = block_rows(m, self.dtype.itemsize)
        self.is_dense = n * m * self.dtype.itemsize <= max_dense_bytes
        self._stored = None
        if not self.is_dense:
            self.info.seconds_per_pass = self._time_one_pass()

    @property
    def _dense(self) -> np.ndarray | None:
        """The stored kernel, computed on first use (a solver with its own exact path, such
        as the absorption-stabilised one, never needs it)."""
        if self.is_dense and self._stored is None:
            n, m = self.shape
            self._stored = np.empty((n, m), dtype=self.dtype)
            for rows in row_slices(n, self._rows_per_block):
                self._stored[rows] = self._computed_block(rows)
        return self._stored

    def _time_one_pass(self) -> float:
        """Seconds of one streamed pass, extrapolated from one block (computed, then used)."""
        rows = slice(0, min(self.shape[0], self._rows_per_block))
        start = time.perf_counter()
        block = self._computed_block(rows)
        block @ np.ones(self.shape[1], dtype=self.dtype)
        block.T @ np.ones(rows.stop, dtype=self.dtype)
        return (time.perf_counter() - start) * self.shape[0] / rows.stop

    def _block_slices(self) -> list[slice]:
        """Row blocks of the streamed kernel (a stored one is multiplied whole)."""
        return list(row_slices(self.shape[0], self._rows_per_block))

    def _block(self, rows: slice) -> np.ndarray:
        return self._computed_block(rows) if self._dense is None else self._dense[rows]

    def _computed_block(self, rows: slice) -> np.ndarray:
        block = self.geometry.log_block(rows, self.dtype)
        return np.exp(block, out=block)

    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False).astype(self.dtype)
        if self._dense is not None:
            return (self._dense @ V).astype(np.float64, copy=False)
        out = np.empty((self.shape[0], *V.shape[1:]))
        for rows in self._block_slices():
            out[rows] = self._block(rows) @ V
        return out

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False).astype(self.dtype)
        if self._dense is not None:
            return (self._dense.T @ U).astype(np.float64, copy=False)
        out = np.zeros((self.shape[1], *U.shape[1:]))
        for rows in self._block_slices():
            out += self._block(rows).T @ U[rows]
        return out

    def _rows(self, index: np.ndarray) -> np.ndarray:
        if self._dense is not None:
            return self._dense[index].astype(np.float64)
        return self.geometry.block(index)

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        g = self.geometry
        other, cost = (g.Xc, g.cost.transposed()) if transpose else (g.Yc, g.cost)
        return gibbs_matmat(points - g.center, other, g.reg, values, cost)

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        exponent: float = 1.0,
    ) -> FusedPass:
        if side == "cols":
            return identity_pass(w, numerator, log=log, exponent=exponent)
        if log:
            g = self.geometry
            products = gibbs_log_matvec(g.Xc, g.Yc, g.reg, w, g.cost)
            ratios, bad = log_ratios_and_bad(numerator, products, exponent)
            back = gibbs_log_matvec(g.Yc, g.Xc, g.reg, ratios, g.cost.transposed())
            return FusedPass(products, ratios, back, bad)
        if self._dense is not None:
            return dense_fused_pass(self._dense, w, numerator, exponent)
        n, m = self.shape
        return blocked_fused_pass(
            self._block_slices(), self._block, n, m, w, numerator, self.dtype, exponent
        )

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        if side == "cols":
            out = np.full(self.shape[1], -np.inf if log else 0.0)
            out[slice(None) if index is None else index] = values
            return out
        if log:
            g = self.geometry
            rows = slice(None) if index is None else index
            return gibbs_log_matvec(g.Yc, g.Xc[rows], g.reg, values, g.cost.transposed())
        if index is None:
            return self.rmatmat(values)
        return values @ self._rows(np.arange(self.shape[0])[index])

    def at_reg(self, reg: float) -> ExactKernel:
        """The exact kernel of the same clouds at another ``reg`` (an epsilon schedule)."""
        g = self.geometry
        return ExactKernel(g.at_reg(reg), dtype=self.dtype, max_dense_bytes=self.max_dense_bytes)

    def absorbed(
        self, alpha: np.ndarray, beta: np.ndarray, previous: Any = None
    ) -> AbsorbedExactKernel:
        """``diag(e^alpha) K diag(e^beta)`` entry by entry (see :class:`AbsorbedExactKernel`)."""
        return AbsorbedExactKernel(self, alpha, beta, previous)


class AbsorbedExactKernel(ExactKernel):
    """``K~_ij = exp(alpha_i + beta_j - c(x_i, y_j) / reg)``: the exact kernel with scalings
    absorbed into it (Schmitzer 2019, Sec. 3), stored when ``K`` would be, streamed otherwise.

    Exponents are computed in float64 and clamped below at :data:`LOG_FLOOR` (entries never
    denormal); ``alpha_i`` or ``beta_j = -inf`` (zero weights) gives the floor too. Right after
    an absorption at a Sinkhorn iterate the rows of ``K~`` sum to the current row marginal,
    so its entries are at most the mass and the scalings that follow stay near 1: products
    of scalings of any range stay finite. An entry clamped at the floor ``t`` adds at most
    ``m t e^tau`` to a row sum of at least ``a_i e^-tau`` while the scalings stay in
    ``[e^-tau, e^tau]``: relative ``m t e^(2 tau) / a_i``, far below rounding for the
    thresholds the solver uses (``tau = 100`` in float64, 20 in float32).

    Parameters
    ----------
    parent : ExactKernel
    alpha, beta : ndarray, shape (n,), (m,)
        Log-scalings absorbed into the rows and the columns.
    previous : AbsorbedExactKernel, optional
        An earlier absorbed form of the same kernel whose storage is reused.
    """

    def __init__(
        self,
        parent: ExactKernel,
        alpha: np.ndarray,
        beta: np.ndarray,
        previous: AbsorbedExactKernel | None = None,
    ) -> None:
        info = KernelInfo("exact", dict(parent.info.params), capabilities=frozenset())
        KernelOperator.__init__(self, parent.geometry, info, parent.dtype)
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        n, m = self.shape
        self._rows_per_block = block_rows(m, 8)  # blocks are computed in float64
        self.is_dense = parent.is_dense
        self._stored = None
        if self.is_dense:
            reuse = previous is not None and previous._stored is not None
            self._stored = previous._stored if reuse else np.empty((n, m), dtype=self.dtype)
            for rows in row_slices(n, self._rows_per_block):
                self._stored[rows] = self._computed_block(rows)

    @property
    def _dense(self) -> np.ndarray | None:
        return self._stored

    def _computed_block(self, rows: slice) -> np.ndarray:
        block = self.geometry.log_block(rows)
        block += self.alpha[rows, None]
        block += self.beta[None, :]
        np.maximum(block, LOG_FLOOR[self.dtype], out=block)
        np.exp(block, out=block)
        return block if self.dtype == np.float64 else block.astype(self.dtype)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        if self._dense is not None:
            return self._dense[index].astype(np.float64)
        return np.vstack([self._computed_block(slice(i, i + 1)) for i in np.atleast_1d(index)])

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        exponent: float = 1.0,
    ) -> FusedPass:
        if log:
            raise NotImplementedError("an absorbed kernel runs linear passes only")
        return super().fused_pass(side, w, numerator, exponent=exponent)

    def absorbed(self, alpha, beta, previous=None):
        raise NotImplementedError("absorb into the parent kernel, not into an absorbed one")


@register_backend(
    "exact",
    signed=False,
    exact=True,
    auto_order=0,
    streamed_params={"max_dense_bytes": 0},
    metrics="any",
    memory=lambda n, m, d, params, itemsize: (
        min(n * m * itemsize, params["max_dense_bytes"]) + (n + m) * d * 8 * 3
    ),
    summary="the true kernel, stored when it fits max_dense_bytes, streamed otherwise",
)
def build_exact(
    geometry: GibbsGeometry,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
) -> ExactKernel:
    """The exact kernel of the geometry's cost, any metric (``rng`` is unused: nothing is
    random)."""
    del rng
    max_dense_bytes = check_int(max_dense_bytes, "max_dense_bytes", minimum=0)
    from .device import DeviceExactKernel, runs_on_device  # it builds on this module

    if runs_on_device(geometry):  # the caller's points are e.g. tensors: products there
        return DeviceExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
    return ExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
