"""The exact squared-Euclidean Gibbs kernel between two tensor-product grids, applied axis by
axis (:mod:`sketchot.grid`): ``O(N (n_1 + ... + n_d))`` per product and ``O(n_1^2 + ... +
n_d^2)`` memory instead of ``N x M``.

The clouds may list the grid points in any order (:meth:`~sketchot.grid.RegularGrid.
from_points` finds the grid and the permutation); a cloud that is not a full grid is refused
by name. Linear products use the plain 1-D kernels (the exact kernel's entries, underflow
included); log-domain products (the solver's small-``reg`` strategy) use the block-shifted
log convolution, exact up to rounding at every ``reg``. Certification: every entry is the
true kernel's, so the solve's own marginals are its true-kernel check, as for ``'exact'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_choice
from ..gibbs import GibbsGeometry, gibbs_matmat
from ..grid import MAX_AXIS_KERNEL_ENTRIES, RegularGrid, grid_convolution
from .base import (
    IDENTITY_STEP,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    check_operand,
    fast_ratios_and_bad,
    identity_pass,
    log_fused_pass,
)
from .registry import GRIDS_SUPPORT, register_backend

#: The grid kernel's backend name (the exact kernel between tensor-product grids).
GRID_BACKEND = "grid"


def grid_of(points: Any, name: str) -> tuple[RegularGrid, np.ndarray | None]:
    """``(grid, order)`` of a cloud (``order=None`` when the rows are in C order)."""
    grid, order = RegularGrid.from_points(np.asarray(points), name=name)
    if np.array_equal(order, np.arange(order.size)):
        return grid, None
    return grid, order


class GridKernel(KernelOperator):
    """``K_ij = exp(-||x_i - y_j||^2 / reg)`` with ``X`` and ``Y`` tensor-product grids.

    Parameters
    ----------
    geometry : GibbsGeometry
        Squared-Euclidean cost; ``X`` and ``Y`` grids of the same dimension.
    grids : tuple, optional
        ``((x_grid, x_order), (y_grid, y_order))`` already found (``at_reg`` reuses them).
    """

    def __init__(self, geometry: GibbsGeometry, grids: Any = None) -> None:
        if not geometry.cost.sqeuclidean:
            raise ValueError(
                f"backend 'grid' supports metric='sqeuclidean' only; got {geometry.cost}"
            )
        if grids is None:
            grids = (grid_of(geometry.X, "X"), grid_of(geometry.Y, "Y"))
        (self.x_grid, self._x_order), (self.y_grid, self._y_order) = grids
        if self.x_grid.ndim != self.y_grid.ndim:
            raise ValueError(f"X and Y must be grids of the same dimension; got "
                             f"{self.x_grid.ndim} and {self.y_grid.ndim}")  # fmt: skip
        info = KernelInfo(
            GRID_BACKEND,
            {},
            capabilities=frozenset(
                {"exact", "nonnegative", "log_products", "log_means", "out_of_sample"}
            ),
            product_rtol=0.0,
        )
        super().__init__(geometry, info, np.float64)
        self._mats: list[np.ndarray] | None = None  # the linear products' 1-D kernels, lazy
        self._conv = grid_convolution(self.y_grid, self.x_grid, geometry.reg)

    # ----------------------------------------------------------- layout
    def _to_grid(self, values: np.ndarray, side: str) -> np.ndarray:
        """``(N,)`` or ``(N, k)`` in the cloud's order -> ``(k, *shape)`` grid arrays."""
        grid, order = (self.y_grid, self._y_order) if side == "y" else (self.x_grid, self._x_order)
        flat = values if values.ndim == 2 else values[:, None]
        # the inverse permutation: grid point r is row order[r] of the cloud
        flat = flat if order is None else flat[order]
        return np.ascontiguousarray(flat.T).reshape(-1, *grid.shape)

    def _from_grid(self, arrays: np.ndarray, side: str, vector: bool) -> np.ndarray:
        grid, order = (self.y_grid, self._y_order) if side == "y" else (self.x_grid, self._x_order)
        flat = arrays.reshape(arrays.shape[0], grid.size).T
        if order is not None:
            out = np.empty_like(flat)
            out[order] = flat
            flat = out
        return flat[:, 0].copy() if vector else np.ascontiguousarray(flat)

    # ----------------------------------------------------------- products
    def _linear(self, arrays: np.ndarray, transpose: bool) -> np.ndarray:
        axes = zip(self.y_grid.axes, self.x_grid.axes, strict=True)
        if any(s.size * t.size > MAX_AXIS_KERNEL_ENTRIES for s, t in axes):
            return self._linear_by_logs(arrays, transpose)
        if self._mats is None:
            # the plain 1-D kernels (target rows, source columns)
            self._mats = [
                np.exp(-((t[:, None] - s[None, :]) ** 2) / self.geometry.reg)
                for s, t in zip(self.y_grid.axes, self.x_grid.axes, strict=True)
            ]
        current = arrays
        for k, mat in enumerate(self._mats):
            current = np.moveaxis(np.moveaxis(current, k + 1, -1) @ (mat if transpose else mat.T),
                                  -1, k + 1)  # fmt: skip
        return current

    def _linear_by_logs(self, arrays: np.ndarray, transpose: bool) -> np.ndarray:
        """The linear product on axes too long to store a 1-D kernel (a histogram of
        ``10^6`` bins): the log convolution of the positive and the negative parts (each
        exact to rounding, underflow included, as the stored kernel's product)."""
        apply = self._conv.log_apply_transpose if transpose else self._conv.log_apply
        out = 0.0
        with np.errstate(divide="ignore"):
            for sign in (1.0, -1.0):
                part = np.maximum(sign * arrays, 0.0)
                if part.any():
                    out = out + sign * np.exp(apply(np.log(part)))
        shape = self.y_grid.shape if transpose else self.x_grid.shape
        return np.broadcast_to(out, (arrays.shape[0], *shape)).copy()

    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False)
        return self._from_grid(self._linear(self._to_grid(V, "y"), False), "x", V.ndim == 1)

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False)
        return self._from_grid(self._linear(self._to_grid(U, "x"), True), "y", U.ndim == 1)

    def _log_matvec(self, log_w: np.ndarray, transpose: bool = False) -> np.ndarray:
        """``log(K exp(w))`` (or ``log(K^T exp(w))``), exact up to rounding at any reg."""
        if transpose:
            out = self._conv.log_apply_transpose(self._to_grid(log_w, "x"))
            return self._from_grid(out, "y", log_w.ndim == 1)
        out = self._conv.log_apply(self._to_grid(log_w, "y"))
        return self._from_grid(out, "x", log_w.ndim == 1)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self.geometry.block(index)

    def log_means(self, side: str, log_w: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(log(K exp(w)), means)``: ``side='rows'``, ``log sum_j exp(w_j - c_ij / reg)``
        and the means of the centred targets ``Yc`` under those weights (``'cols'``: over the
        columns, means of ``Xc``); an empty row gives ``-inf`` and 0. Each coordinate's
        numerator is one more log convolution of the weights times ``y_k - min y_k >= 0``
        (all terms non-negative: exact to rounding), ``d + 1`` convolutions in all."""
        check_choice(side, "side", ("rows", "cols"))
        transpose = side == "cols"
        length = self.shape[0 if transpose else 1]
        log_w = np.asarray(check_operand(log_w, length, "log_w", vector=True), float).ravel()
        other = self.geometry.Xc if transpose else self.geometry.Yc
        low = other.min(axis=0)
        with np.errstate(divide="ignore"):
            shifted = np.log(other - low[None, :])  # -inf at the lowest coordinate
        stacked = np.column_stack([log_w, log_w[:, None] + shifted])
        logs = self._log_matvec(stacked, transpose=transpose)
        log_sums = logs[:, 0]
        live = np.isfinite(log_sums)
        means = np.zeros((logs.shape[0], other.shape[1]))
        with np.errstate(invalid="ignore", over="ignore"):
            means[live] = np.exp(logs[live, 1:] - log_sums[live, None]) + low[None, :]
        return log_sums, means

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        # new points need not lie on the grid: the true kernel, block by block
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
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        if side == "cols":
            return identity_pass(w, numerator, log=log, step=step)
        if log:
            return log_fused_pass(
                self._log_matvec,
                lambda log_u: self._log_matvec(log_u, transpose=True),
                w,
                numerator,
                step,
            )
        with np.errstate(over="ignore", invalid="ignore"):
            products = self.matmat(w)
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
            projection = self.rmatmat(ratios)
        return FusedPass(products, ratios, projection, bad)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        if side == "cols":
            out = np.full(self.shape[1], -np.inf if log else 0.0)
            out[slice(None) if index is None else index] = values
            return out
        if index is not None:
            full = np.full(self.shape[0], -np.inf if log else 0.0)
            full[index] = values
            values = full
        if log:
            return self._log_matvec(np.asarray(values, dtype=np.float64), transpose=True)
        return self.rmatmat(values)

    def at_reg(self, reg: float) -> GridKernel:
        """The grid kernel of the same grids at another ``reg`` (an epsilon schedule)."""
        grids = ((self.x_grid, self._x_order), (self.y_grid, self._y_order))
        return GridKernel(self.geometry.at_reg(reg), grids)


def grid_memory(n: int, m: int, d: int, params: dict, itemsize: int) -> float:
    """Bytes of a grid kernel: the 1-D kernels (at most ``(n m)^(1/1)`` entries per axis for
    a 1-D grid, ``sqrt`` of it per axis in 2-D, ...) and a few ``N``-sized work arrays."""
    dim = max(1, d)
    # an axis beyond MAX_AXIS_KERNEL_ENTRIES stores no kernel: its banded pass caches blocks
    per_axis = min((float(n) * m) ** (1.0 / dim), MAX_AXIS_KERNEL_ENTRIES)
    return 2 * dim * per_axis * itemsize + 8 * (n + m) * 8


@register_backend(
    GRID_BACKEND,
    signed=False,
    exact=True,
    memory=grid_memory,
    summary="the true kernel between tensor-product grids, applied axis by axis",
    advice="the grid kernel is exact; raise max_iter or reg",
    support=GRIDS_SUPPORT,
)
def build_grid(geometry: GibbsGeometry, *, rng: Any = None, dtype: Any = np.float64) -> GridKernel:
    """The exact kernel between two tensor-product grids (``rng`` is unused). Products run
    in float64 whatever ``dtype`` (float32 would save nothing: the stored 1-D kernels are
    small), so the operator's ``dtype`` is float64."""
    del rng, dtype
    return GridKernel(geometry)
