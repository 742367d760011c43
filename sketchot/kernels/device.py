"""Kernel operators whose per-entry work runs where the caller's points live.

When a call passes PyTorch tensors (or another Array API library's arrays), every geometry
records the :class:`~sketchot._arrays.ArrayContext` of the inputs, and the exact and low-rank
builders return these operators: the clouds (or the factors) are copied once to that device,
and every product, the exact kernel's blocks, exponentials and log-sum-exps included, runs
there through the library's Array API namespace (``array-api-compat``). They keep the
operator contract of :mod:`sketchot.kernels.base` unchanged: vectors in and out are NumPy
float64 on the host, so the one iteration (:mod:`sketchot.solver.engine`) drives them as it
drives the NumPy operators, and each half-step moves ``O(n + m)`` numbers between host and
device, never a block of the kernel. The ratios and the bad-entry mask of a pass are computed
on the host by the same functions as the NumPy operators' (one definition of the rules).

Costs per pass as for the NumPy operators: ``O(n m d)`` streamed exact, ``O(n m)`` stored,
``O((n + m) r)`` low rank. Memory on the device: the stored kernel or one block of
:func:`device_block_bytes`, plus the clouds or factors.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..gibbs import BLOCK_BYTES, GibbsGeometry, row_slices
from .base import (
    MIN_DENOMINATOR_RATIO,
    FusedPass,
    KernelOperator,
    check_operand,
    fast_ratios_and_bad,
    identity_pass,
    log_ratios_and_bad,
    ratios_and_bad,
)
from .exact import LOG_FLOOR, ExactKernel
from .lowrank import LowRankKernel

#: A block of the streamed kernel on an accelerator takes at most this share of its free
#: memory (several temporaries of the block's size live at once).
DEVICE_MEMORY_SHARE = 0.125
#: ... and at most this many bytes (larger blocks no longer pay on any device measured).
MAX_DEVICE_BLOCK_BYTES = 1 << 30


def runs_on_device(geometry: GibbsGeometry) -> bool:
    """Whether a kernel of this geometry should run on the caller's device: arrays of a
    library other than NumPy, and a cost the device blocks compute (squared Euclidean or
    Euclidean)."""
    context = geometry.context
    return not context.is_numpy and geometry.cost.name in ("sqeuclidean", "euclidean")


def device_block_bytes(context: Any) -> int:
    """Bytes of one streamed block on the context's device: the NumPy block size on a CPU, a
    share of the free memory on an accelerator (CUDA through torch)."""
    if context.on_host:
        return BLOCK_BYTES
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(context.device)
        return int(min(MAX_DEVICE_BLOCK_BYTES, DEVICE_MEMORY_SHARE * free))
    except (ImportError, RuntimeError, TypeError, ValueError):
        return 8 * BLOCK_BYTES


class _OnDevice:
    """Host <-> device moves of one context (float64 on the way in unless told)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.xp = context.xp

    def put(self, array: np.ndarray, dtype: Any = np.float64) -> Any:
        array = np.ascontiguousarray(array, dtype=dtype)
        if self.context.library == "torch":
            import torch

            return torch.from_numpy(array).to(self.context.device)
        return self.xp.asarray(array, device=self.context.device)

    def get(self, array: Any) -> np.ndarray:
        return np.asarray(self.context.to_host(array), dtype=np.float64)

    def dtype(self, dtype: np.dtype) -> Any:
        return self.xp.float32 if dtype == np.float32 else self.xp.float64


class DeviceExactKernel(ExactKernel):
    """The exact Gibbs kernel with its blocks and products on the caller's device.

    Parameters
    ----------
    geometry : GibbsGeometry
        Its ``context`` names the device; the cost is squared Euclidean or Euclidean.
    dtype : numpy dtype
        Precision of the stored kernel or of the streamed blocks' products.
    max_dense_bytes : int
        The kernel is stored on the device when it takes at most this many bytes.

    Notes
    -----
    ``-c(x_i, y_j) / reg`` is computed from the centred points as ``-(||x||^2 + ||y||^2 - 2
    x.y) / reg`` (clamped at 0 before the division), as the NumPy kernel does.
    """

    def __init__(
        self, geometry: GibbsGeometry, *, dtype: Any = np.float64, max_dense_bytes: int
    ) -> None:
        self._on = _OnDevice(geometry.context)
        self._Xd = self._on.put(geometry.Xc)
        self._Yd = self._on.put(geometry.Yc)
        self._x_sq = self._on.put(geometry.x_sq)
        self._y_sq = self._on.put(geometry.y_sq)
        super().__init__(geometry, dtype=dtype, max_dense_bytes=max_dense_bytes)
        n, m = self.shape
        rows = device_block_bytes(geometry.context) // max(1, 8 * m)
        self._rows_per_block = int(max(1, min(n, rows)))

    # ---------------------------------------------------------------- blocks
    def _neg_cost(self, X: Any, x_sq: Any, Y: Any = None, y_sq: Any = None) -> Any:
        """``-c(x_i, y_j) / reg`` of device points (``Y`` the fitted targets by default),
        float64 on the device."""
        xp, g = self._on.xp, self.geometry
        Y, y_sq = (self._Yd, self._y_sq) if Y is None else (Y, y_sq)
        out = X @ Y.T  # in-place updates (the standard's operators) spare temporaries
        out *= -2.0
        out += x_sq[:, None]
        out += y_sq[None, :]
        out = xp.maximum(out, 0.0)  # rounding can make tiny distances negative
        if not g.cost.sqeuclidean:
            out = xp.sqrt(out)
        out *= -1.0 / g.reg
        return out

    def _neg_cost_rows(self, rows: slice) -> Any:
        return self._neg_cost(self._Xd[rows], self._x_sq[rows])

    def _computed_block(self, rows: slice) -> Any:
        block = self._on.xp.exp(self._neg_cost_rows(rows))
        return block if self.dtype == np.float64 else self._on.xp.astype(block, self._on.xp.float32)

    @property
    def _dense(self) -> Any:
        if self.is_dense and self._stored is None:
            rows = row_slices(self.shape[0], self._rows_per_block)
            self._stored = self._on.xp.concat([self._computed_block(r) for r in rows], axis=0)
        return self._stored

    def _time_one_pass(self) -> float:
        n, m = self.shape
        rows = slice(0, min(n, max(1, device_block_bytes(self.geometry.context) // (8 * m))))
        start = time.perf_counter()
        block = self._computed_block(rows)
        ones = self._on.xp.ones(m, dtype=block.dtype, device=self.geometry.context.device)
        float(self._on.xp.sum(block @ ones))  # a host read waits for the device
        return (time.perf_counter() - start) * n / rows.stop

    # -------------------------------------------------------------- products
    def _cast(self, values: Any) -> Any:
        return self._on.put(values, self.dtype)

    def matmat(self, V: Any) -> np.ndarray:
        V = self._cast(check_operand(V, self.shape[1], "V", vector=False))
        if self._dense is not None:
            return self._on.get(self._dense @ V)
        return np.concatenate(
            [self._on.get(self._block(rows) @ V) for rows in self._block_slices()], axis=0
        )

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False)
        if self._dense is not None:
            return self._on.get(self._dense.T @ self._cast(U))
        out = 0.0
        for rows in self._block_slices():
            out = out + self._block(rows).T @ self._cast(U[rows])
        return self._on.get(out)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        index = np.atleast_1d(np.arange(self.shape[0])[index])
        picked = self._on.put(index, np.int64)
        if self._dense is not None:
            return self._on.get(self._on.xp.take(self._dense, picked, axis=0))
        X = self._on.xp.take(self._Xd, picked, axis=0)
        x_sq = self._on.xp.take(self._x_sq, picked, axis=0)
        return self._on.get(self._on.xp.exp(self._neg_cost(X, x_sq)))

    def _log_matvec(self, log_w: np.ndarray, *, transpose: bool, rows: Any = None) -> np.ndarray:
        """``log sum_j exp(log_w_j - c_ij / reg)`` per row (per column with ``transpose``,
        over the rows ``rows`` only), streamed in row blocks of the output side, with a
        per-row maximum shift (finite for any ``reg``)."""
        xp = self._on.xp
        own, own_sq, other, other_sq = self._Xd, self._x_sq, self._Yd, self._y_sq
        if transpose:
            own, own_sq, other, other_sq = other, other_sq, own, own_sq
            if rows is not None:
                picked = self._on.put(np.arange(self.shape[0])[rows], np.int64)
                other, other_sq = xp.take(other, picked, axis=0), xp.take(other_sq, picked, axis=0)
        weights = self._on.put(log_w)
        step = max(1, device_block_bytes(self.geometry.context) // (8 * max(1, other.shape[0])))
        out = []
        for start in range(0, own.shape[0], step):
            block = slice(start, start + step)
            logits = self._neg_cost(own[block], own_sq[block], other, other_sq)
            logits += weights[None, :]
            out.append(self._on.get(_logsumexp(xp, logits, axis=1)))
        return np.concatenate(out)

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
            products = self._log_matvec(w, transpose=False)
            ratios, bad = log_ratios_and_bad(numerator, products, exponent)
            back = self._log_matvec(ratios, transpose=True)
            return FusedPass(products, ratios, back, bad)
        weights = self._cast(w)
        if self._dense is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                products = self._on.get(self._dense @ weights)
                ratios, bad = fast_ratios_and_bad(numerator, products, exponent)
            projection = self._on.get(self._cast(ratios) @ self._dense)
            return FusedPass(products, ratios, projection, bad)
        return self._streamed_pass(weights, numerator, exponent)

    def _streamed_pass(self, weights: Any, numerator: np.ndarray, exponent: float) -> FusedPass:
        """Block by block: products on the device, their ratios on the host (the NumPy
        rules), the projection accumulated on the device."""
        products = np.empty(self.shape[0])
        ratios = np.empty(self.shape[0])
        bad = np.zeros(self.shape[0], dtype=bool)
        projection = 0.0
        floor = MIN_DENOMINATOR_RATIO * numerator.max()
        with np.errstate(over="ignore", invalid="ignore"):
            for rows in self._block_slices():
                block = self._block(rows)
                p = products[rows]
                p[...] = self._on.get(block @ weights)
                smallest = p.min()
                # the fast path of the NumPy pass: every numerator positive, every product sound
                if (
                    numerator[rows].min() > 0
                    and smallest >= floor
                    and smallest > 0
                    and (np.isfinite(p.max()))
                ):
                    ratios[rows] = (numerator[rows] / p) ** exponent
                else:
                    ratios[rows], bad[rows] = ratios_and_bad(numerator[rows], p, exponent)
                projection = projection + self._cast(ratios[rows]) @ block
        return FusedPass(products, ratios, self._on.get(projection), bad)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        if side == "cols":
            return super().project(side, values, index, log=log)
        if log:
            return self._log_matvec(values, transpose=True, rows=index)
        if index is None:
            return self.rmatmat(values)
        return values @ self._rows(np.arange(self.shape[0])[index])

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        if transpose:  # out-of-sample columns: rarely large; the host path is exact
            return super()._apply_new(points, values, transpose)
        xp, g = self._on.xp, self.geometry
        centred = points - g.center
        X, x_sq = self._on.put(centred), self._on.put((centred**2).sum(axis=1))
        V = self._cast(values)
        out = []
        for start in range(0, len(points), self._rows_per_block):
            rows = slice(start, start + self._rows_per_block)
            block = xp.exp(self._neg_cost(X[rows], x_sq[rows]))
            out.append(self._on.get(xp.astype(block, V.dtype) @ V))
        return np.concatenate(out, axis=0)

    def at_reg(self, reg: float) -> DeviceExactKernel:
        return DeviceExactKernel(
            self.geometry.at_reg(reg), dtype=self.dtype, max_dense_bytes=self.max_dense_bytes
        )

    def absorbed(self, alpha: np.ndarray, beta: np.ndarray, previous: Any = None) -> Any:
        return DeviceAbsorbedExactKernel(self, alpha, beta, previous)


class DeviceAbsorbedExactKernel(DeviceExactKernel):
    """``exp(alpha_i + beta_j - c_ij / reg)`` on the device (the absorbed form of
    :class:`~sketchot.kernels.exact.AbsorbedExactKernel`, with its floor), stored where the
    parent would be, streamed otherwise."""

    def __init__(
        self,
        parent: DeviceExactKernel,
        alpha: np.ndarray,
        beta: np.ndarray,
        previous: DeviceAbsorbedExactKernel | None = None,
    ) -> None:
        KernelOperator.__init__(self, parent.geometry, type(parent.info)("exact"), parent.dtype)
        self.info.params = dict(parent.info.params)
        self._on = parent._on
        self._Xd, self._Yd, self._x_sq, self._y_sq = (
            parent._Xd, parent._Yd, parent._x_sq, parent._y_sq,
        )  # fmt: skip
        self.max_dense_bytes = parent.max_dense_bytes
        self._rows_per_block = parent._rows_per_block
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        self._alpha_d, self._beta_d = self._on.put(self.alpha), self._on.put(self.beta)
        self.is_dense = parent.is_dense
        self._stored = None
        if self.is_dense:
            del previous  # the device frees the previous storage when it is dropped
            rows = row_slices(self.shape[0], self._rows_per_block)
            self._stored = self._on.xp.concat([self._computed_block(r) for r in rows], axis=0)

    @property
    def _dense(self) -> Any:
        return self._stored

    def _computed_block(self, rows: slice) -> Any:
        xp = self._on.xp
        exponent = self._neg_cost_rows(rows) + self._alpha_d[rows][:, None] + self._beta_d[None, :]
        block = xp.exp(xp.maximum(exponent, LOG_FLOOR[self.dtype]))
        return block if self.dtype == np.float64 else xp.astype(block, xp.float32)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        index = np.atleast_1d(np.arange(self.shape[0])[index])
        return np.vstack([self._on.get(self._computed_block(slice(i, i + 1))) for i in index])

    def fused_pass(self, side, w, numerator, *, log=False, exponent=1.0) -> FusedPass:
        if log:
            raise NotImplementedError("an absorbed kernel runs linear passes only")
        return super().fused_pass(side, w, numerator, exponent=exponent)

    def absorbed(self, alpha, beta, previous=None):
        raise NotImplementedError("absorb into the parent kernel, not into an absorbed one")


class DeviceLowRankKernel(LowRankKernel):
    """``K ~ A B^T`` with the factors also held on the caller's device, where every product
    runs (``factors``, ``left`` and ``right`` stay NumPy arrays, for users and POT)."""

    def __init__(self, geometry: GibbsGeometry, *args: Any, **kwargs: Any) -> None:
        super().__init__(geometry, *args, **kwargs)
        self._on = _OnDevice(geometry.context)
        self._left_d = self._on.put(self.left, self.dtype)
        self._right_d = self._on.put(self.right, self.dtype)

    def _factor_d(self, side: str) -> Any:
        return self._left_d if side == "rows" else self._right_d

    def matmat(self, V: Any) -> np.ndarray:
        V = self._on.put(check_operand(V, self.shape[1], "V", vector=False), self.dtype)
        return self._on.get(self._left_d @ (self._right_d.T @ V))

    def rmatmat(self, U: Any) -> np.ndarray:
        U = self._on.put(check_operand(U, self.shape[0], "U", vector=False), self.dtype)
        return self._on.get(self._right_d @ (self._left_d.T @ U))

    def fused_pass(self, side, w, numerator, *, log=False, exponent=1.0) -> FusedPass:
        if log:
            return super().fused_pass(side, w, numerator, log=log, exponent=exponent)
        factor = self._factor_d(side)
        with np.errstate(over="ignore", invalid="ignore"):
            products = self._on.get(factor @ self._on.put(w, self.dtype))
            ratios, bad = fast_ratios_and_bad(numerator, products, exponent)
        projection = self._on.get(self._on.put(ratios, self.dtype) @ factor)
        return FusedPass(products, ratios, projection, bad)

    def project(self, side, values, index=None, *, log=False) -> np.ndarray:
        if log or index is not None:
            return super().project(side, values, index, log=log)
        return self._on.get(self._on.put(values, self.dtype) @ self._factor_d(side))


def _logsumexp(xp: Any, logits: Any, axis: int) -> Any:
    """``log sum exp`` along ``axis`` with a maximum shift (``-inf`` for an all ``-inf``
    line), in the Array API namespace ``xp``; ``logits`` is overwritten."""
    top = xp.max(logits, axis=axis, keepdims=True)
    shift = xp.where(xp.isfinite(top), top, 0.0)
    logits -= shift
    total = xp.sum(xp.exp(logits), axis=axis)
    return xp.log(total) + xp.squeeze(shift, axis=axis)
