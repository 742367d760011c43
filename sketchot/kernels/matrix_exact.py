"""The exact kernels of a cost matrix ``M`` given by the caller: :func:`build_exact_from_cost`
(dense or sparse ``M``) and, for a SciPy sparse ``M``, :class:`SparseExactKernel`:
``K = exp(-M / reg)`` on the stored entries of ``M`` (the allowed pairs), stored as a CSR
array of the same pattern.

Products are sparse products (``O(nnz)`` a column), log products segment reductions over
the stored entries (:meth:`~sketchot.sparse_cost.SparseCostMatrixGeometry.log_matvec`), and
the absorbed form of the log-stable path (``exp(alpha_i + beta_j - M_ij / reg)``) is the
same pattern with new values: the whole solve, epsilon schedule included, is ``O(nnz)`` in
time and memory per pass.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._validation import check_dtype, check_int
from ..sparse_cost import SparseCostMatrixGeometry, cost_geometry
from .base import IDENTITY_STEP, FusedPass, KernelInfo, KernelOperator, RatioStep, check_operand
from .exact import LOG_FLOOR, ExactKernel, HostExact


class SparseExactKernel(ExactKernel):
    """The true Gibbs kernel of a :class:`~sketchot.sparse_cost.SparseCostMatrixGeometry`,
    stored on the matrix's pattern (``nnz`` entries, whatever ``max_dense_bytes``).

    Parameters
    ----------
    geometry : SparseCostMatrixGeometry
    dtype : numpy dtype
        Storage and products' precision (float64 or float32).
    max_dense_bytes : int
        Kept for :meth:`at_reg` and the result's dense exports; the sparse kernel itself is
        always stored.
    """

    def __init__(
        self,
        geometry: SparseCostMatrixGeometry,
        *,
        dtype: Any = np.float64,
        max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    ) -> None:
        if not isinstance(geometry, SparseCostMatrixGeometry):
            raise TypeError(f"geometry must be a SparseCostMatrixGeometry; got {geometry!r}")
        rounding = 0.0 if np.dtype(dtype) == np.float64 else 8.0 * float(np.finfo(dtype).eps)
        info = KernelInfo(
            "exact",
            {"max_dense_bytes": max_dense_bytes},
            capabilities=frozenset({"exact", "nonnegative", "log_products", "absorb"}),
            product_rtol=rounding,
        )
        KernelOperator.__init__(self, geometry, info, dtype)
        self.max_dense_bytes = max_dense_bytes
        self.placement = HostExact()  # SciPy's products and segment reductions, in memory
        self.is_dense = True  # stored (on the pattern): the products never recompute it
        self._stored = self._build()

    def _build(self) -> Any:
        K = self.geometry.kernel_matrix()
        return K.astype(self.dtype) if self.dtype != np.float64 else K

    @property
    def _dense(self) -> Any:
        """The stored kernel (a CSR array on ``M``'s pattern)."""
        return self._stored

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self._stored[np.atleast_1d(index)].toarray().astype(np.float64)

    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False).astype(self.dtype)
        return np.asarray(self._stored @ V, dtype=np.float64)

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False).astype(self.dtype)
        return np.asarray(self._stored.T @ U, dtype=np.float64)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        if side == "rows" and not log and index is not None:
            rows = np.arange(self.shape[0])[index]
            return np.asarray(self._stored[rows].T @ values, dtype=np.float64)
        return super().project(side, values, index, log=log)

    def at_reg(self, reg: float) -> SparseExactKernel:
        """The exact kernel of the same matrix at another ``reg`` (an epsilon schedule)."""
        return SparseExactKernel(
            self.geometry.at_reg(reg), dtype=self.dtype, max_dense_bytes=self.max_dense_bytes
        )

    def absorbed(
        self, alpha: np.ndarray, beta: np.ndarray, previous: Any = None
    ) -> SparseAbsorbedKernel:
        """``diag(e^alpha) K diag(e^beta)`` on the stored entries."""
        del previous  # a new values array: the pattern is shared, never written
        return SparseAbsorbedKernel(self, alpha, beta)


class SparseAbsorbedKernel(SparseExactKernel):
    """``K~_ij = exp(alpha_i + beta_j - M_ij / reg)`` on the stored entries (Schmitzer 2019,
    Sec. 3, as :class:`~sketchot.kernels.exact.AbsorbedExactKernel`): exponents in float64,
    clamped below at :data:`~sketchot.kernels.exact.LOG_FLOOR` (a zero weight's ``-inf``
    gives the floor too)."""

    def __init__(self, parent: SparseExactKernel, alpha: np.ndarray, beta: np.ndarray) -> None:
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        info = KernelInfo("exact", dict(parent.info.params), capabilities=frozenset())
        KernelOperator.__init__(self, parent.geometry, info, parent.dtype)
        self.max_dense_bytes = parent.max_dense_bytes
        self.placement = parent.placement
        self.is_dense = True
        self._stored = self._build()

    def _build(self) -> Any:
        K = self.geometry.kernel_matrix(
            log_shift=(self.alpha, self.beta), floor=LOG_FLOOR[self.dtype]
        )
        return K.astype(self.dtype) if self.dtype != np.float64 else K

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        if log:
            raise NotImplementedError("an absorbed kernel runs linear passes only")
        return super().fused_pass(side, w, numerator, step=step)

    def absorbed(self, alpha, beta, previous=None):
        raise NotImplementedError("absorb into the parent kernel, not into an absorbed one")


def exact_cost_kernel(
    geometry: Any, *, dtype: Any = np.float64, max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES
) -> ExactKernel:
    """The exact kernel of a cost-matrix geometry: :class:`SparseExactKernel` on a sparse
    one, :class:`~sketchot.kernels.exact.ExactKernel` (stored or streamed) on a dense one."""
    if isinstance(geometry, SparseCostMatrixGeometry):
        return SparseExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
    return ExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)


def build_exact_from_cost(
    M: Any,
    reg: Any,
    *,
    dtype: Any = np.float64,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
) -> ExactKernel:
    """The exact kernel ``K = exp(-M / reg)`` of a cost matrix, with no point cloud (POT's
    ``ot.sinkhorn(a, b, M, reg)``): stored when it fits ``max_dense_bytes``, streamed from
    ``M`` otherwise; log-stable passes, the absorbed form and :meth:`~ExactKernel.at_reg`
    (an epsilon schedule) as for points.

    Parameters
    ----------
    M : array_like or scipy.sparse matrix, shape (n, m)
        Costs (:class:`~sketchot.cost_matrix.CostMatrixGeometry`; a sparse ``M``:
        :class:`~sketchot.sparse_cost.SparseCostMatrixGeometry`, its missing entries
        forbidden pairs).
    reg : float
        Entropic regularisation, ``> 0``.
    dtype : {numpy.float64, numpy.float32}
        Precision of the stored kernel and of its products.
    max_dense_bytes : int
        ``K`` is stored when it takes at most this many bytes.

    Returns
    -------
    ExactKernel
        Its ``geometry`` is the cost-matrix geometry; out-of-sample products are refused
        (they need points).
    """
    start = time.perf_counter()
    max_dense_bytes = check_int(max_dense_bytes, "max_dense_bytes", minimum=0)
    dtype = check_dtype(dtype)
    geometry = cost_geometry(M, reg)
    kernel = exact_cost_kernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
    kernel.info.build_time = time.perf_counter() - start
    return kernel
