"""The exact Gibbs kernel: dense when it fits a memory budget, streamed in row blocks otherwise.

``K_ij = exp(-c(x_i, y_j) / reg)`` for the geometry's cost (any metric); for the default
``||x_i - y_j||^2`` it is computed from the squared distances directly (never through
``exp(2 x.y / reg)``, which overflows). Streaming costs ``O(n m d)`` time per product
and ``O(block x m)`` memory; a stored kernel ``O(n m)`` memory once and ``O(n m)`` per
product. As ``K = L R^T`` with ``L = K`` and ``R = I``, a fused pass over the rows computes
``K v``, ``u = a / K v`` and ``K^T u`` from one read (or one computation) of each block.
"""

from __future__ import annotations

import copy
import time
import warnings
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from .._defaults import DEFAULT_MAX_DENSE_BYTES
from .._parallel import Part, run_parts
from .._validation import check_choice, check_int
from ..cost_matrix import block_dim, has_points, require_points
from ..fused import MAX_COLUMNS, FusedPoints, fused_available, fused_pass_seconds, fused_rows
from ..gibbs import (
    GibbsGeometry,
    block_rows,
    gibbs_log_matvec,
    gibbs_matmat,
    logsumexp_on_device,
    neg_cost_on_device,
    row_slices,
)
from .base import (
    IDENTITY_STEP,
    LOG_FLOOR,
    MIN_DENOMINATOR_RATIO,
    SIDES,
    THREADED_PASS_MIN_ENTRIES,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    blocked_fused_pass,
    check_operand,
    dense_fused_pass,
    fast_ratios_and_bad,
    identity_pass,
    log_fused_pass,
    ratios_and_bad,
)
from .device import device_block_bytes, runs_on_device
from .registry import register_backend

#: The exact Gibbs kernel's backend: the one kernel whose value has every gradient (the
#: public entries force it for tensors that require a gradient).
EXACT_BACKEND = "exact"

#: Entries the streamed kernel's pass time is measured on (a few cache-sized blocks).
TIMED_ENTRIES = 1 << 21


class ExactPlacement(ABC):
    """Where an :class:`ExactKernel`'s clouds live and its blocks and products run: the kernel
    (and the kernels derived from it) holds one and hands it every placement-specific step
    (:class:`HostExact`, NumPy; :class:`DeviceExact`, the caller's device).

    The in-memory placements take and return NumPy float64 vectors on the host; another
    placement (:mod:`sketchot.distributed`'s Dask placements) overrides the whole-operation
    hooks (:meth:`operand`, :meth:`fused_pass`, :meth:`project`, :meth:`offsets`,
    :meth:`softmax_average`) to take and return its own arrays.

    Attributes
    ----------
    on_device : bool
        The blocks and products run on the caller's device (``kernel.on_device``).
    fused_points : tuple of FusedPoints or None
        The clouds as :mod:`sketchot.fused`'s one-launch programs take them, where they run.
    stores_whole : bool
        Whether the kernel may be stored whole when it fits ``max_dense_bytes`` (a
        placement that only streams, e.g. on a cluster, never stores it).
    """

    on_device: bool = False
    fused_points: tuple[FusedPoints, FusedPoints] | None = None
    stores_whole: bool = True

    @abstractmethod
    def hold(self, kernel: ExactKernel) -> None:
        """Hold the kernel's clouds where its products run."""

    def shared(self, kernel: ExactKernel) -> ExactPlacement:
        """The placement of ``kernel.at_reg``: the same clouds at another ``reg`` (a stateless
        placement is itself)."""
        return self

    def unfused(self) -> ExactPlacement:
        """The placement of an absorbed kernel, whose entries carry the scalings: never
        fused."""
        return self

    def capabilities(self, kernel: ExactKernel, capabilities: frozenset) -> frozenset:
        """The kernel's capabilities where it runs."""
        return capabilities

    @abstractmethod
    def rows_per_block(self, kernel: ExactKernel) -> int:
        """Rows of a block of the streamed kernel."""

    @abstractmethod
    def stored(self, kernel: ExactKernel) -> Any:
        """The whole kernel, from its computed blocks."""

    @abstractmethod
    def time_one_pass(self, kernel: ExactKernel) -> float | None:
        """Seconds of one streamed pass (``None``: not measured)."""

    @abstractmethod
    def computed_block(self, kernel: ExactKernel, rows: slice) -> Any:
        """The entries of ``rows``, computed."""

    def operand(self, values: Any, length: int, name: str) -> Any:
        """The values of a product, checked (``(length,)`` or ``(length, k)``): NumPy float64
        for the in-memory placements."""
        return check_operand(values, length, name, vector=False)

    @abstractmethod
    def matmat(self, kernel: ExactKernel, V: Any) -> Any:
        """``K V`` of values checked by :meth:`operand` (float64 on the host in memory)."""

    @abstractmethod
    def rmatmat(self, kernel: ExactKernel, U: Any) -> Any:
        """``K^T U`` of values checked by :meth:`operand` (float64 on the host in memory)."""

    @abstractmethod
    def rows(self, kernel: ExactKernel, index: np.ndarray) -> np.ndarray:
        """Dense rows ``K[index]``, float64 on the host."""

    def softmax_average(
        self, kernel: ExactKernel, log_weights: Any, values: Any, *, transpose: bool = False
    ) -> Any:
        """``sum_j softmax_j(log_w_j - c(x_i, y_j) / reg) values_j`` for every fitted source
        point ``x_i`` (the exact barycentric map; over the sources for every target with
        ``transpose``): the geometry's own, where its clouds are in memory."""
        return kernel.geometry.softmax_average(None, log_weights, values, transpose=transpose)

    @abstractmethod
    def log_matvec(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool, rows: Any
    ) -> np.ndarray:
        """See :meth:`ExactKernel._log_matvec`."""

    def log_means(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`ExactKernel.log_means` (on a device only)."""
        raise NotImplementedError("log_means runs on a device placement only")

    @abstractmethod
    def apply_new(
        self, kernel: ExactKernel, points: np.ndarray, values: np.ndarray, transpose: bool
    ) -> np.ndarray:
        """Out-of-sample products of uncentred host points (see
        :meth:`KernelOperator.apply_new`)."""

    @abstractmethod
    def linear_pass(
        self, kernel: ExactKernel, w: np.ndarray, numerator: np.ndarray, step: RatioStep
    ) -> FusedPass:
        """One linear-domain pass over the rows (see :meth:`KernelOperator.fused_pass`)."""

    def fused_pass(
        self,
        kernel: ExactKernel,
        side: str,
        w: Any,
        numerator: Any,
        *,
        log: bool,
        step: RatioStep,
    ) -> Any:
        """One pass over a side (see :meth:`KernelOperator.fused_pass`): the columns'
        elementwise (``R = I``), the rows' log-domain from :meth:`log_matvec`, or
        :meth:`linear_pass`."""
        if side == "cols":
            return identity_pass(w, numerator, log=log, step=step)
        if log:
            return log_fused_pass(
                lambda log_w: kernel._log_matvec(log_w, transpose=False),
                lambda log_u: kernel._log_matvec(log_u, transpose=True),
                w,
                numerator,
                step,
            )
        return self.linear_pass(kernel, w, numerator, step)

    def project(self, kernel: ExactKernel, side: str, values: Any, index: Any, *, log: bool) -> Any:
        """``K[index]^T values`` (rows) or ``values`` placed at ``index`` (columns; see
        :meth:`KernelOperator.project`)."""
        if side == "cols":
            out = np.full(kernel.shape[1], -np.inf if log else 0.0)
            out[slice(None) if index is None else index] = values
            return out
        if log:
            return kernel._log_matvec(values, transpose=True, rows=index)
        if index is None:
            return kernel.rmatmat(values)
        return values @ kernel._rows(np.arange(kernel.shape[0])[index])

    def offsets(self, parent: ExactKernel, alpha: Any, beta: Any) -> tuple[Any, Any]:
        """The log-scalings ``(alpha, beta)`` an absorbed kernel of ``parent`` holds (NumPy
        float64 in memory)."""
        return np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)

    @abstractmethod
    def hold_absorbed(
        self,
        kernel: AbsorbedExactKernel,
        parent: ExactKernel,
        previous: AbsorbedExactKernel | None,
    ) -> None:
        """Set an absorbed kernel's blocks, and its stored entries when it is stored."""

    @abstractmethod
    def absorbed_block(
        self, kernel: AbsorbedExactKernel, rows: slice, out: np.ndarray | None
    ) -> Any:
        """The entries of ``rows`` of an absorbed kernel (see
        :meth:`AbsorbedExactKernel._computed_block`)."""

    @abstractmethod
    def absorbed_rows(self, kernel: AbsorbedExactKernel, index: np.ndarray) -> np.ndarray:
        """Dense rows of an absorbed kernel, float64 on the host."""


class HostExact(ExactPlacement):
    """NumPy's blocks and threaded passes in host memory, any metric."""

    def hold(self, kernel: ExactKernel) -> None:
        """Nothing to copy: the blocks read the geometry's own arrays."""

    def rows_per_block(self, kernel: ExactKernel) -> int:
        m = kernel.shape[1]
        return block_rows(m, kernel.dtype.itemsize, dim=block_dim(kernel.geometry))

    def stored(self, kernel: ExactKernel) -> np.ndarray:
        n, m = kernel.shape
        stored = np.empty((n, m), dtype=kernel.dtype)
        for rows in row_slices(n, kernel._rows_per_block):
            stored[rows] = kernel._computed_block(rows)
        return stored

    def time_one_pass(self, kernel: ExactKernel) -> float:
        """Extrapolated from the first blocks (computed, then used) over at least
        :data:`TIMED_ENTRIES` entries."""
        n, m = kernel.shape
        last = min(n, max(kernel._rows_per_block, TIMED_ENTRIES // max(1, m)))
        ones = np.ones(m, dtype=kernel.dtype)
        start = time.perf_counter()
        for rows in row_slices(last, kernel._rows_per_block):
            block = kernel._computed_block(rows)
            block @ ones
            block.T @ np.ones(block.shape[0], dtype=block.dtype)
        return (time.perf_counter() - start) * n / last

    def computed_block(self, kernel: ExactKernel, rows: slice) -> np.ndarray:
        block = kernel.geometry.log_block(rows, kernel.dtype)
        return np.exp(block, out=block)

    def matmat(self, kernel: ExactKernel, V: np.ndarray) -> np.ndarray:
        V = V.astype(kernel.dtype)
        if kernel._dense is not None:
            return (kernel._dense @ V).astype(np.float64, copy=False)
        out = np.empty((kernel.shape[0], *V.shape[1:]))
        for rows in kernel._block_slices():
            out[rows] = kernel._block(rows) @ V
        return out

    def rmatmat(self, kernel: ExactKernel, U: np.ndarray) -> np.ndarray:
        U = U.astype(kernel.dtype)
        if kernel._dense is not None:
            return (kernel._dense.T @ U).astype(np.float64, copy=False)
        out = np.zeros((kernel.shape[1], *U.shape[1:]))
        for rows in kernel._block_slices():
            out += kernel._block(rows).T @ U[rows]
        return out

    def rows(self, kernel: ExactKernel, index: np.ndarray) -> np.ndarray:
        if kernel._dense is not None:
            return kernel._dense[index].astype(np.float64)
        return kernel.geometry.block(index)

    def log_matvec(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool, rows: Any
    ) -> np.ndarray:
        over = slice(None) if rows is None else rows
        return _true_log_matvec(kernel.geometry, log_w, transpose=transpose, over=over)

    def apply_new(
        self, kernel: ExactKernel, points: np.ndarray, values: np.ndarray, transpose: bool
    ) -> np.ndarray:
        return _host_apply_new(kernel.geometry, points, values, transpose)

    def linear_pass(
        self, kernel: ExactKernel, w: np.ndarray, numerator: np.ndarray, step: RatioStep
    ) -> FusedPass:
        if kernel._dense is not None:
            return dense_fused_pass(kernel._dense, w, numerator, step)
        n, m = kernel.shape
        return blocked_fused_pass(
            kernel._block_slices(), kernel._block, n, m, w, numerator, kernel.dtype, step
        )

    def hold_absorbed(
        self,
        kernel: AbsorbedExactKernel,
        parent: ExactKernel,
        previous: AbsorbedExactKernel | None,
    ) -> None:
        n, m = kernel.shape
        # blocks are computed in float64
        kernel._rows_per_block = block_rows(m, 8, dim=block_dim(parent.geometry))
        kernel._factors = _absorbed_factors(parent.geometry, kernel.alpha, kernel.beta)
        if kernel.is_dense:
            reuse = previous is not None and previous._stored is not None
            kernel._stored = previous._stored if reuse else np.empty((n, m), dtype=kernel.dtype)

            def fill(part: Part[slice]) -> None:
                for rows in part:
                    kernel._computed_block(rows, out=kernel._stored[rows])

            # elementwise numpy work (it releases the GIL): on threads
            blocks = list(row_slices(n, kernel._rows_per_block))
            run_parts(fill, blocks, n * m >= THREADED_PASS_MIN_ENTRIES)

    def absorbed_block(
        self, kernel: AbsorbedExactKernel, rows: slice, out: np.ndarray | None
    ) -> np.ndarray:
        in_place = out is not None and out.dtype == np.float64
        if kernel._factors is not None:
            left, right = kernel._factors
            block = np.matmul(left[rows], right, out=out if in_place else None)
        else:
            block = kernel.geometry.log_block(rows)
            block += kernel.alpha[rows, None]
            block += kernel.beta[None, :]
        np.maximum(block, LOG_FLOOR[kernel.dtype], out=block)
        np.exp(block, out=block)
        if kernel.dtype != np.float64:
            block = block.astype(kernel.dtype)
        if out is not None and block is not out:
            out[...] = block
        return block

    def absorbed_rows(self, kernel: AbsorbedExactKernel, index: np.ndarray) -> np.ndarray:
        if kernel._dense is not None:
            return kernel._dense[index].astype(np.float64)
        return np.vstack([kernel._computed_block(slice(i, i + 1)) for i in np.atleast_1d(index)])


class DeviceExact(ExactPlacement):
    """The clouds on the caller's device (CUDA tensors, JAX, ...; squared-Euclidean and
    Euclidean costs): the centred clouds copied there once and every block, product and
    log-sum-exp run there through the library's Array API namespace, as
    :mod:`sketchot.fused`'s one-launch passes where they run for these arrays.

    Parameters
    ----------
    on : DeviceArrays
        The host <-> device moves of the caller's context.

    Attributes
    ----------
    X, Y, x_sq, y_sq : array or None
        The centred clouds and their squared norms on the device (``None`` until a kernel
        is built on this placement).
    pass_seconds : float or None
        The timed pass of the kernel a derived one comes from (a pass costs the same at any
        ``reg``).
    """

    on_device = True

    def __init__(self, on: DeviceArrays) -> None:
        self.on = on
        self.X = self.Y = self.x_sq = self.y_sq = None
        self.pass_seconds: float | None = None
        # the clouds and precision of the kernel the copies were made for
        self._source: tuple[Any, Any, np.dtype] | None = None

    def hold(self, kernel: ExactKernel) -> None:
        """Copy the centred clouds and their squared norms to the device (unless this
        placement holds them already: the same clouds at another ``reg``), and prepare the
        fused programs where they run. A placement holding other clouds, or made for
        another precision, is refused: its copies would silently answer for those."""
        g = kernel.geometry
        if self._source is not None:
            X, Y, dtype = self._source
            same = (X is g.X or np.array_equal(X, g.X)) and (Y is g.Y or np.array_equal(Y, g.Y))
            if not same or dtype != kernel.dtype:
                raise ValueError(
                    "placement holds the device copies of another kernel's clouds (or of "
                    f"another precision: {dtype}); got a kernel of {g.shape[0]} x "
                    f"{g.shape[1]} points in {kernel.dtype}: pass placement=None (the "
                    "geometry's default) or a new DeviceExact"
                )
            return
        self._source = (g.X, g.Y, np.dtype(kernel.dtype))
        self.X, self.Y = self.on.put(g.Xc), self.on.put(g.Yc)
        self.x_sq, self.y_sq = self.on.put(g.x_sq), self.on.put(g.y_sq)
        if fused_available(g.context, g.cost, (*g.shape, g.Xc.shape[1])):
            float32 = np.dtype(kernel.dtype) != np.float64
            precision = self.on.xp.float32 if float32 else self.X.dtype
            self.fused_points = (FusedPoints(self.X, precision), FusedPoints(self.Y, precision))

    def shared(self, kernel: ExactKernel) -> DeviceExact:
        """The same device copies and fused programs, and ``kernel``'s pass time."""
        derived = copy.copy(self)
        derived.pass_seconds = kernel.info.seconds_per_pass
        return derived

    def unfused(self) -> DeviceExact:
        derived = copy.copy(self)
        derived.fused_points = None
        derived.pass_seconds = None
        return derived

    def capabilities(self, kernel: ExactKernel, capabilities: frozenset) -> frozenset:
        # a log-domain plan's moments in one pass over the entries, where they live
        capabilities = capabilities | {"log_means"}
        if self.fused_points is not None and not kernel.is_dense:
            # fused log-domain passes cost what linear ones do and never underflow: no
            # absorptions (the engine's 'log' strategy)
            capabilities = capabilities - {"absorb"}
        return capabilities

    def rows_per_block(self, kernel: ExactKernel) -> int:
        n, m = kernel.shape
        rows = device_block_bytes(kernel.geometry.context) // max(1, 8 * m)
        return int(max(1, min(n, rows)))

    def stored(self, kernel: ExactKernel) -> Any:
        blocks = row_slices(kernel.shape[0], kernel._rows_per_block)
        return self.on.xp.concat([kernel._computed_block(r) for r in blocks], axis=0)

    def time_one_pass(self, kernel: ExactKernel) -> float:
        """The fused programs' own timing where they run, else extrapolated from the first
        block."""
        n, m = kernel.shape
        if self.fused_points is not None:
            if self.pass_seconds is not None:  # a pass costs the same at any reg
                return self.pass_seconds
            try:
                return fused_pass_seconds(
                    *self.fused_points, kernel.geometry.reg, _sqrt(kernel.geometry)
                )
            except Exception as exc:  # e.g. a GPU that Triton does not compile for
                warnings.warn(
                    f"sketchot.fused's passes could not run on {kernel.geometry.context.device} "
                    f"({type(exc).__name__}: {str(exc)[:200]}); the exact kernel uses its "
                    "unfused device blocks",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.fused_points = None
        rows = slice(0, kernel._rows_per_block)
        start = time.perf_counter()
        block = kernel._computed_block(rows)
        ones = self.on.xp.ones(m, dtype=block.dtype, device=kernel.geometry.context.device)
        float(self.on.xp.sum(block @ ones))  # a host read waits for the device
        return (time.perf_counter() - start) * n / rows.stop

    def computed_block(self, kernel: ExactKernel, rows: slice) -> Any:
        xp = self.on.xp
        block = xp.exp(self.neg_cost_rows(kernel, rows))
        return block if kernel.dtype == np.float64 else xp.astype(block, xp.float32)

    def neg_cost(
        self, kernel: ExactKernel, X: Any, x_sq: Any, Y: Any = None, y_sq: Any = None
    ) -> Any:
        """``-c(x_i, y_j) / reg`` of device points (``Y`` the fitted targets by default),
        float64 on the device."""
        Y, y_sq = (self.Y, self.y_sq) if Y is None else (Y, y_sq)
        g = kernel.geometry
        return neg_cost_on_device(self.on.xp, X, x_sq, Y, y_sq, g.reg, g.cost)

    def neg_cost_rows(self, kernel: ExactKernel, rows: slice) -> Any:
        return self.neg_cost(kernel, self.X[rows, ...], self.x_sq[rows])

    def cast(self, kernel: ExactKernel, values: Any) -> Any:
        """Host values on the device, in the kernel's precision."""
        return self.on.put(values, kernel.dtype)

    def fused_matmat(self, kernel: ExactKernel, V: np.ndarray, *, transpose: bool) -> np.ndarray:
        """``K V`` (``K^T V``) in fused passes of :data:`~sketchot.fused.MAX_COLUMNS`
        columns: ``exp(t) s`` of :func:`~sketchot.fused.fused_rows` with zero log weights."""
        own, other = self.fused_points[::-1] if transpose else self.fused_points
        V = V.reshape(V.shape[0], -1)
        out = np.empty((len(own), V.shape[1]))
        for start in range(0, V.shape[1], MAX_COLUMNS):
            cols = slice(start, start + MAX_COLUMNS)
            values = self.on.put(V[:, cols], np.float64)
            _, top, sums = fused_rows(own, other, kernel.geometry.reg,
                                      sqrt=_sqrt(kernel.geometry), values=values)  # fmt: skip
            out[:, cols] = self.on.get(self.on.xp.exp(top)[:, None] * sums)
        return out

    def matmat(self, kernel: ExactKernel, V: np.ndarray) -> np.ndarray:
        if self.fused_points is not None and kernel._dense is None:
            return self.fused_matmat(kernel, np.asarray(V), transpose=False).reshape(
                kernel.shape[0], *np.shape(V)[1:]
            )
        V = self.cast(kernel, V)
        if kernel._dense is not None:
            return self.on.get(kernel._dense @ V)
        return np.concatenate(
            [self.on.get(kernel._block(rows) @ V) for rows in kernel._block_slices()], axis=0
        )

    def rmatmat(self, kernel: ExactKernel, U: np.ndarray) -> np.ndarray:
        if self.fused_points is not None and kernel._dense is None:
            return self.fused_matmat(kernel, np.asarray(U), transpose=True).reshape(
                kernel.shape[1], *np.shape(U)[1:]
            )
        if kernel._dense is not None:
            return self.on.get(kernel._dense.T @ self.cast(kernel, U))
        out = 0.0
        for rows in kernel._block_slices():
            out = out + kernel._block(rows).T @ self.cast(kernel, U[rows])
        return self.on.get(out)

    def rows(self, kernel: ExactKernel, index: np.ndarray) -> np.ndarray:
        index = np.atleast_1d(np.arange(kernel.shape[0])[index])
        picked = self.on.put(index, np.int64)
        if kernel._dense is not None:
            return self.on.get(self.on.xp.take(kernel._dense, picked, axis=0))
        X = self.on.xp.take(self.X, picked, axis=0)
        x_sq = self.on.xp.take(self.x_sq, picked, axis=0)
        return self.on.get(self.on.xp.exp(self.neg_cost(kernel, X, x_sq)))

    def log_matvec(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool, rows: Any
    ) -> np.ndarray:
        """In fused passes or streamed row blocks of the output side."""
        xp = self.on.xp
        if self.fused_points is not None:
            own, other = self.fused_points[::-1] if transpose else self.fused_points
            if transpose and rows is not None:
                other = other.take(self.on.put(np.arange(kernel.shape[0])[rows], np.int64))
            shift = _weight_shift(log_w)
            lse, _, _ = fused_rows(own, other, kernel.geometry.reg, sqrt=_sqrt(kernel.geometry),
                                   log_w=self.on.put(log_w - shift))  # fmt: skip
            return self.on.get(lse) + shift
        own, own_sq, other, other_sq = self.X, self.x_sq, self.Y, self.y_sq
        if transpose:
            own, own_sq, other, other_sq = other, other_sq, own, own_sq
            if rows is not None:
                picked = self.on.put(np.arange(kernel.shape[0])[rows], np.int64)
                other, other_sq = xp.take(other, picked, axis=0), xp.take(other_sq, picked, axis=0)
        weights = self.on.put(log_w)
        step = max(1, device_block_bytes(kernel.geometry.context) // (8 * max(1, other.shape[0])))
        out = []
        for start in range(0, own.shape[0], step):
            block = slice(start, min(start + step, own.shape[0]))  # the standard's bounds
            logits = self.neg_cost(kernel, own[block, ...], own_sq[block], other, other_sq)
            logits += weights[None, :]
            out.append(self.on.get(logsumexp_on_device(xp, logits, axis=1)))
        return np.concatenate(out)

    def log_means(
        self, kernel: ExactKernel, log_w: np.ndarray, *, transpose: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The fused program where it runs, streamed blocks with a per-row shift otherwise."""
        xp = self.on.xp
        length = kernel.shape[0 if transpose else 1]
        if self.fused_points is not None:
            own, other = self.fused_points[::-1] if transpose else self.fused_points
            shift = _weight_shift(log_w)
            weights = self.on.put(log_w - shift)
            parts, lse = [], None
            for start in range(0, other.points.shape[1], MAX_COLUMNS):
                columns = other.points[:, start : start + MAX_COLUMNS]
                lse, top, sums = fused_rows(own, other, kernel.geometry.reg,
                                            sqrt=_sqrt(kernel.geometry), log_w=weights,
                                            values=columns)  # fmt: skip
                parts.append(sums / xp.exp(lse - top)[:, None])
            log_sums = self.on.get(lse) + shift
            means = self.on.get(xp.concat(parts, axis=1))
        else:
            own, own_sq, other, other_sq = (self.X, self.x_sq, self.Y, self.y_sq)
            if transpose:
                own, own_sq, other, other_sq = other, other_sq, own, own_sq
            weights = self.on.put(log_w)
            step = max(1, device_block_bytes(kernel.geometry.context) // (8 * max(1, length)))
            sums_parts, means_parts = [], []
            for start in range(0, own.shape[0], step):
                block = slice(start, min(start + step, own.shape[0]))  # the standard's bounds
                logits = self.neg_cost(kernel, own[block, ...], own_sq[block], other, other_sq)
                logits += weights[None, :]
                top = xp.max(logits, axis=1, keepdims=True)
                shares = xp.exp(logits - xp.where(xp.isfinite(top), top, 0.0))
                totals = xp.sum(shares, axis=1)
                sums_parts.append(self.on.get(xp.log(totals) + top[:, 0]))
                means_parts.append(self.on.get((shares @ other) / totals[:, None]))
            log_sums = np.concatenate(sums_parts) if sums_parts else np.zeros(0)
            means = (
                np.concatenate(means_parts, axis=0)
                if means_parts
                else np.zeros((0, kernel.geometry.Xc.shape[1]))
            )
        return log_sums, means

    def apply_new(
        self, kernel: ExactKernel, points: np.ndarray, values: np.ndarray, transpose: bool
    ) -> np.ndarray:
        g = kernel.geometry
        # out-of-sample columns are rarely many: the host path is exact
        if transpose:
            return _host_apply_new(g, points, values, transpose)
        xp = self.on.xp
        centred = points - g.center
        X, x_sq = self.on.put(centred), self.on.put((centred**2).sum(axis=1))
        V = self.cast(kernel, values)
        out = []
        step = kernel._rows_per_block
        for start in range(0, len(points), step):
            rows = slice(start, min(start + step, len(points)))
            block = xp.exp(self.neg_cost(kernel, X[rows, ...], x_sq[rows]))
            out.append(self.on.get(xp.astype(block, V.dtype) @ V))
        return np.concatenate(out, axis=0)

    def linear_pass(
        self, kernel: ExactKernel, w: np.ndarray, numerator: np.ndarray, step: RatioStep
    ) -> FusedPass:
        if self.fused_points is not None and kernel._dense is None:
            return self.fused_linear_pass(kernel, w, numerator, step)
        weights = self.cast(kernel, w)
        if kernel._dense is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                products = self.on.get(kernel._dense @ weights)
                ratios, bad = fast_ratios_and_bad(numerator, products, step)
            projection = self.on.get(self.cast(kernel, ratios) @ kernel._dense)
            return FusedPass(products, ratios, projection, bad)
        return self.streamed_pass(kernel, weights, numerator, step)

    def fused_linear_pass(
        self, kernel: ExactKernel, w: np.ndarray, numerator: np.ndarray, step: RatioStep
    ) -> FusedPass:
        """The linear pass as two fused products (``K w``, then ``K^T`` of the ratios; any
        sign), ratios and bad entries by the NumPy rules."""
        with np.errstate(over="ignore", invalid="ignore"):
            products = self.fused_matmat(kernel, w, transpose=False)[:, 0]
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
            projection = self.fused_matmat(kernel, ratios, transpose=True)[:, 0]
        return FusedPass(products, ratios, projection, bad)

    def streamed_pass(
        self, kernel: ExactKernel, weights: Any, numerator: np.ndarray, step: RatioStep
    ) -> FusedPass:
        """Block by block: products on the device, their ratios on the host (the NumPy
        rules), the projection accumulated on the device."""
        n = kernel.shape[0]
        products = np.empty(n)
        ratios = np.empty(n)
        bad = np.zeros(n, dtype=bool)
        projection = 0.0
        floor = MIN_DENOMINATOR_RATIO * numerator.max()
        with np.errstate(over="ignore", invalid="ignore"):
            for rows in kernel._block_slices():
                block = kernel._block(rows)
                p = products[rows]
                p[...] = self.on.get(block @ weights)
                smallest = p.min()
                # the fast path of the NumPy pass: every numerator positive, every product sound
                if (
                    numerator[rows].min() > 0
                    and smallest >= floor
                    and smallest > 0
                    and np.isfinite(p.max())
                ):
                    ratios[rows] = step.take(rows).apply(numerator[rows] / p)
                else:
                    ratios[rows], bad[rows] = ratios_and_bad(numerator[rows], p, step.take(rows))
                projection = projection + self.cast(kernel, ratios[rows]) @ block
        return FusedPass(products, ratios, self.on.get(projection), bad)

    def hold_absorbed(
        self,
        kernel: AbsorbedExactKernel,
        parent: ExactKernel,
        previous: AbsorbedExactKernel | None,
    ) -> None:
        # its entries carry (alpha, beta): blocks, stored or streamed, never fused
        kernel._rows_per_block = parent._rows_per_block
        kernel._alpha_d, kernel._beta_d = self.on.put(kernel.alpha), self.on.put(kernel.beta)
        if kernel.is_dense:
            kernel._stored = self.stored(kernel)

    def absorbed_block(self, kernel: AbsorbedExactKernel, rows: slice, out: Any) -> Any:
        xp = self.on.xp
        exponent = self.neg_cost_rows(kernel, rows) + kernel._alpha_d[rows][:, None]
        exponent = exponent + kernel._beta_d[None, :]
        block = xp.exp(xp.maximum(exponent, LOG_FLOOR[kernel.dtype]))
        return block if kernel.dtype == np.float64 else xp.astype(block, xp.float32)

    def absorbed_rows(self, kernel: AbsorbedExactKernel, index: np.ndarray) -> np.ndarray:
        index = np.atleast_1d(np.arange(kernel.shape[0])[index])
        blocks = [self.on.get(kernel._computed_block(slice(i, i + 1))) for i in index]
        return np.vstack(blocks)


def default_exact_placement(geometry: GibbsGeometry) -> ExactPlacement:
    """Where an exact kernel's clouds live: on the caller's device where the geometry computes
    there (:func:`~sketchot.kernels.device.runs_on_device`: CUDA tensors, JAX, ...), else
    NumPy."""
    if runs_on_device(geometry):  # the caller's points are e.g. tensors: products there
        return DeviceExact(DeviceArrays(geometry.context))
    return HostExact()


class ExactKernel(KernelOperator):
    """The true Gibbs kernel, where its placement holds the caller's points.

    Parameters
    ----------
    geometry : GibbsGeometry
        Its ``context`` gives the default placement (:func:`default_exact_placement`):
        NumPy's blocks and threaded passes on the host, any metric (:class:`HostExact`); or,
        where the geometry computes on the caller's device
        (:meth:`~sketchot.gibbs.GibbsGeometry.computes_on_device`: CUDA tensors, JAX, ...;
        squared-Euclidean and Euclidean costs), the centred clouds copied there once and
        every block, product and log-sum-exp run there (:class:`DeviceExact`).
    dtype : numpy dtype
        Precision of the stored kernel or of the streamed blocks' products.
    max_dense_bytes : int, default=1 GiB
        ``K`` is stored (on the placement's device) when it takes at most this many bytes
        and the placement stores kernels (:attr:`ExactPlacement.stores_whole`); beyond,
        every product recomputes it block by block.
    placement : ExactPlacement, optional
        Where the clouds live and the products run (``None``: the geometry's default). A
        :class:`DeviceExact` holds the clouds of the first kernel built on it. Clouds that
        are Dask arrays take :mod:`sketchot.distributed`'s placements
        (:class:`~sketchot.distributed.DaskStreamedExact`,
        :class:`~sketchot.distributed.DaskStableExact`), passed in by its builders.

    Attributes
    ----------
    placement : ExactPlacement
    is_dense : bool
        Whether ``K`` is stored (computed on the first product that needs it).

    Notes
    -----
    On a device ``-c(x_i, y_j) / reg`` is computed from the centred points as
    ``-(||x||^2 + ||y||^2 - 2 x.y) / reg`` (clamped at 0 before the division), as the NumPy
    kernel does; vectors in and out are NumPy float64 on the host, the ratios of a pass
    computed there by the NumPy rules, so that each half-step moves ``O(n + m)`` numbers.
    """

    def __init__(
        self,
        geometry: GibbsGeometry,
        *,
        dtype: Any = np.float64,
        max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
        placement: ExactPlacement | None = None,
    ) -> None:
        # exact entries: the products' only error is the storage precision's rounding
        rounding = 0.0 if np.dtype(dtype) == np.float64 else 8.0 * float(np.finfo(dtype).eps)
        info = KernelInfo(
            "exact",
            {"max_dense_bytes": max_dense_bytes},
            capabilities=frozenset(
                {"exact", "nonnegative", "log_products", "absorb"}
                | ({"out_of_sample"} if has_points(geometry) else set())
            ),
            product_rtol=rounding,
        )
        super().__init__(geometry, info, dtype)
        self.max_dense_bytes = max_dense_bytes
        self.placement = default_exact_placement(geometry) if placement is None else placement
        self.placement.hold(self)
        self._rows_per_block = self.placement.rows_per_block(self)
        n, m = self.shape
        self.is_dense = (
            self.placement.stores_whole and n * m * self.dtype.itemsize <= max_dense_bytes
        )
        self._stored = None
        if not self.is_dense:
            self.info.seconds_per_pass = self.placement.time_one_pass(self)
        self.info.capabilities = self.placement.capabilities(self, self.info.capabilities)

    @property
    def on_device(self) -> bool:
        """Whether the blocks and products run on the caller's device."""
        return self.placement.on_device

    @property
    def fused(self) -> bool:
        """Whether the passes run as :mod:`sketchot.fused`'s one-launch programs (streamed on
        a CUDA device) rather than as blocks."""
        return self.placement.fused_points is not None

    @property
    def _dense(self) -> Any:
        """The stored kernel, computed on first use (a solver with its own exact path, such
        as the absorption-stabilised one, never needs it)."""
        if self.is_dense and self._stored is None:
            self._stored = self.placement.stored(self)
        return self._stored

    # ---------------------------------------------------------------- blocks
    def _block_slices(self) -> list[slice]:
        """Row blocks of the streamed kernel (a stored one is multiplied whole)."""
        return list(row_slices(self.shape[0], self._rows_per_block))

    def _block(self, rows: slice) -> Any:
        return self._computed_block(rows) if self._dense is None else self._dense[rows, ...]

    def _computed_block(self, rows: slice) -> Any:
        return self.placement.computed_block(self, rows)

    # -------------------------------------------------------------- products
    def matmat(self, V: Any) -> Any:
        V = self.placement.operand(V, self.shape[1], "V")
        return self.placement.matmat(self, V)

    def rmatmat(self, U: Any) -> Any:
        U = self.placement.operand(U, self.shape[0], "U")
        return self.placement.rmatmat(self, U)

    def softmax_average(self, log_weights: Any, values: Any, *, transpose: bool = False) -> Any:
        """``sum_j softmax_j(log_w_j - c(x_i, y_j) / reg) values_j`` (n, k) for every fitted
        source point ``x_i``, ``values`` of shape (m, k): the exact barycentric map, computed
        where the placement holds the clouds. With ``transpose``, ``sum_i softmax_i(log_w_i -
        c(x_i, y_j) / reg) values_i`` (m, k) for every target ``y_j`` (the inverse map;
        ``log_weights`` (n,), ``values`` (n, k)). ``O(n m (d + k))``, never an ``n x m``
        array.
        """
        return self.placement.softmax_average(self, log_weights, values, transpose=transpose)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self.placement.rows(self, index)

    def _log_matvec(self, log_w: np.ndarray, *, transpose: bool, rows: Any = None) -> np.ndarray:
        """``log sum_j exp(log_w_j - c_ij / reg)`` per row (per column with ``transpose``,
        over the rows ``rows`` only) of the true kernel, with a per-row maximum shift (finite
        for any ``reg``): on the host from the centred clouds or the geometry's cost matrix,
        on a device in fused passes or streamed row blocks of the output side."""
        return self.placement.log_matvec(self, log_w, transpose=transpose, rows=rows)

    def log_means(self, side: str, log_w: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(log(K exp(w)), means)``, one pass over the entries on the device (the
        ``'log_means'`` capability: kernels on a device only).

        ``side='rows'``: ``log sum_j exp(w_j - c_ij / reg)`` and the means of the centred
        targets ``Yc`` under the weights ``exp(w_j - c_ij / reg)`` of each row; ``'cols'``:
        the same over the columns of ``K`` (means of ``Xc``). A row whose weights are all zero
        gives ``-inf`` and 0. ``O(n m d)`` on the device, ``O((n + m) d)`` numbers moved; the
        fused program where it runs (value columns in launches of
        :data:`~sketchot.fused.MAX_COLUMNS`), streamed blocks with a per-row shift otherwise.
        """
        if "log_means" not in self.info.capabilities:
            raise NotImplementedError(
                "log_means needs the 'log_means' capability: the exact kernel declares it on "
                "a device placement only"
            )
        check_choice(side, "side", SIDES)
        transpose = side == "cols"
        length = self.shape[0 if transpose else 1]
        log_w = np.asarray(check_operand(log_w, length, "log_w", vector=True)).ravel()
        log_sums, means = self.placement.log_means(self, log_w, transpose=transpose)
        means[~np.isfinite(log_sums)] = 0.0  # an empty row: no mass, no mean
        return log_sums, means

    def apply_new(self, points: Any, values: Any, *, side: str = "source") -> np.ndarray:
        require_points(self.geometry, "an out-of-sample product (apply_new)")
        return super().apply_new(points, values, side=side)

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        return self.placement.apply_new(self, points, values, transpose)

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        return self.placement.fused_pass(self, side, w, numerator, log=log, step=step)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        return self.placement.project(self, side, values, index, log=log)

    def at_reg(self, reg: float) -> ExactKernel:
        """The exact kernel of the same clouds at another ``reg`` (an epsilon schedule) on the
        same placement (on a device the same device copies, fused programs and pass time; on
        Dask the same persisted target cloud)."""
        return ExactKernel(
            self.geometry.at_reg(reg),
            dtype=self.dtype,
            max_dense_bytes=self.max_dense_bytes,
            placement=self.placement.shared(self),
        )

    def absorbed(
        self, alpha: np.ndarray, beta: np.ndarray, previous: Any = None
    ) -> AbsorbedExactKernel:
        """``diag(e^alpha) K diag(e^beta)`` entry by entry (see :class:`AbsorbedExactKernel`)."""
        return AbsorbedExactKernel(self, alpha, beta, previous)


class AbsorbedExactKernel(ExactKernel):
    """``K~_ij = exp(alpha_i + beta_j - c(x_i, y_j) / reg)``: the exact kernel with scalings
    absorbed into it (Schmitzer 2019, Sec. 3), stored when ``K`` would be, streamed otherwise,
    on the parent's placement (never fused: its entries carry the scalings).

    Exponents are computed in float64 and clamped below at :data:`LOG_FLOOR` (entries never
    denormal); ``alpha_i`` or ``beta_j = -inf`` (zero weights) gives the floor too. Right after
    an absorption at a Sinkhorn iterate the rows of ``K~`` sum to the current row marginal,
    so its entries are at most the mass and the scalings that follow stay near 1: products
    of scalings of any range stay finite. An entry clamped at the floor ``t`` adds at most
    ``m t e^tau`` to a row sum of at least ``a_i e^-tau`` while the scalings stay in
    ``[e^-tau, e^tau]``: relative ``m t e^(2 tau) / a_i``, far below rounding for the
    thresholds the solver uses (``tau = 100`` in float64; in float32 20, raised for smaller
    problems only while this bound stays within float32's epsilon:
    :func:`sketchot.solver.strategies.absorb_threshold`).

    Parameters
    ----------
    parent : ExactKernel
    alpha, beta : ndarray, shape (n,), (m,)
        Log-scalings absorbed into the rows and the columns.
    previous : AbsorbedExactKernel, optional
        An earlier absorbed form of the same kernel whose storage is reused (on the host; a
        device frees the previous storage when it is dropped).
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
        self.max_dense_bytes = parent.max_dense_bytes
        self.placement = parent.placement.unfused()
        self.alpha, self.beta = self.placement.offsets(parent, alpha, beta)
        self.is_dense = parent.is_dense
        self._stored = None
        self.placement.hold_absorbed(self, parent, previous)

    @property
    def _dense(self) -> Any:
        return self._stored

    def _computed_block(self, rows: slice, out: np.ndarray | None = None) -> Any:
        """The entries of ``rows``, written into ``out`` (a stored block on the host) when
        given: the exponents then never take a temporary (a quarter of the build at 10^4
        points)."""
        return self.placement.absorbed_block(self, rows, out)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self.placement.absorbed_rows(self, index)

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


def _sqrt(geometry: GibbsGeometry) -> bool:
    """Whether the fused programs take the square root of the squared distances."""
    return not geometry.cost.sqeuclidean


def _host_apply_new(
    geometry: GibbsGeometry, points: np.ndarray, values: np.ndarray, transpose: bool
) -> np.ndarray:
    """Out-of-sample products on the host, exact for any cost."""
    g = geometry
    other, cost = (g.Xc, g.cost.transposed()) if transpose else (g.Yc, g.cost)
    return gibbs_matmat(points - g.center, other, g.reg, values, cost)


def _true_log_matvec(
    geometry: Any, log_w: np.ndarray, *, transpose: bool = False, over: Any = slice(None)
) -> np.ndarray:
    """``log (K exp(log_w))`` over every row (``log (K^T exp(log_w))`` over every column,
    summed over the rows ``over`` only, when ``transpose``) of the true kernel: from the
    centred clouds, or from the geometry's cost matrix."""
    if not has_points(geometry):
        return geometry.log_matvec(slice(None), log_w, transpose=transpose, over=over)
    g = geometry
    if transpose:
        return gibbs_log_matvec(g.Yc, g.Xc[over], g.reg, log_w, g.cost.transposed())
    return gibbs_log_matvec(g.Xc, g.Yc, g.reg, log_w, g.cost)


def _weight_shift(log_w: np.ndarray) -> float:
    """The largest finite log weight (0 if none): subtracted in float64 before a fused pass
    and added back to its log sums, so that a pass in float32 rounds the weights' spread, not
    their gauge (balanced potentials are defined up to a constant)."""
    finite = log_w[np.isfinite(log_w)]
    return float(finite.max()) if finite.size else 0.0


def _absorbed_factors(
    geometry: GibbsGeometry, alpha: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(L, R)`` with ``L R = alpha_i + beta_j - ||x_i - y_j||^2 / reg`` for the squared-
    Euclidean cost (``None`` for another cost), in centred coordinates::

        L = [2 X / reg, alpha - ||x||^2 / reg, 1],  R = [Y, 1, beta - ||y||^2 / reg]^T

    so that a block of exponents is one product with ``d + 2`` inner terms instead of
    seven elementwise passes (half the time of an absorbed kernel's build). Infinite
    offsets (zero weights) keep the elementwise form (``0 * inf`` inside a product). The
    rounding is that of the norms' form of the distance, about
    ``eps (||x||^2 + ||y||^2) / reg + eps (|alpha| + |beta|)`` in the exponent.
    """
    if not geometry.cost.sqeuclidean:
        return None
    reg = geometry.reg
    ones_x, ones_y = np.ones(len(alpha)), np.ones(len(beta))
    with np.errstate(invalid="ignore"):
        left = np.column_stack([geometry.Xc * (2.0 / reg), alpha - geometry.x_sq / reg, ones_x])
        right = np.column_stack([geometry.Yc, ones_y, beta - geometry.y_sq / reg]).T
    if not (np.all(np.isfinite(left)) and np.all(np.isfinite(right))):
        return None
    return left, np.ascontiguousarray(right)


@register_backend(
    EXACT_BACKEND,
    signed=False,
    exact=True,
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
    """The exact kernel of the geometry's cost, any metric, on the geometry's placement
    (``rng`` is unused: nothing is random)."""
    del rng
    max_dense_bytes = check_int(max_dense_bytes, "max_dense_bytes", minimum=0)
    return ExactKernel(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
