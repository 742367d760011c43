"""The one operator every low-rank backend builds: ``K ~ A B^T``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from ..gibbs import GibbsGeometry
from .base import (
    IDENTITY_STEP,
    FusedPass,
    KernelInfo,
    KernelOperator,
    RatioStep,
    check_operand,
    fast_ratios_and_bad,
    matrix_fused_pass,
    refuse_log,
)

# Features of new points are built about 32 MB at a time.
NEW_POINTS_BLOCK_ENTRIES = 1 << 22


class LowRankKernel(KernelOperator):
    """``K ~ A B^T`` from factors ``A`` (n x r) and ``B`` (m x r), held where the caller's
    points live.

    Parameters
    ----------
    geometry : GibbsGeometry
        Its ``context`` is the placement: NumPy's products on the host, or, where the
        geometry computes on the caller's device (:meth:`~sketchot.gibbs.GibbsGeometry.
        computes_on_device`: CUDA tensors, JAX, ...), the factors held there and every
        product run there through the library's Array API namespace.
    info : KernelInfo
        ``rank`` is set from the factors; ``'factors'`` and ``'out_of_sample'`` are added to
        the capabilities.
    left, right : array
        ``A`` and ``B`` (stored in ``dtype``): NumPy arrays, or on a device placement
        arrays already there (built there by the backend's maps:
        :attr:`FactorMaps.device_left_factor`; NumPy ones are copied there once).
    left_map, right_map : callable
        Feature maps of new points: ``left_map(X_new) @ left_projection`` are the rows of
        ``A`` for ``X_new`` (likewise on the right), with the fitted randomness.
    left_projection, right_projection : ndarray, optional
        Fixed matrix applied after the map (``None``: identity). Products with new points fold
        it into the small side, which matters when the map is wider than the rank (Nystrom:
        ``K(x, Z)`` then whitening).
    dtype : numpy dtype

    Attributes
    ----------
    left, right : ndarray
        ``A`` and ``B`` as NumPy arrays (on a device placement, copies fetched when first
        read: for users, POT and the host-side helpers, so the host holds no factor unless
        asked).

    Notes
    -----
    Memory ``O((n + m) r)``; every product ``O((n + m) r)``; no ``n x m`` array except by an
    explicit :meth:`to_dense`. On a device each product moves ``O(n + m)`` numbers between
    host and device. ``factors`` can be given to POT's
    ``ot.lowrank.sinkhorn_low_rank_kernel(A, B, a, b)``.
    """

    def __init__(
        self,
        geometry: GibbsGeometry,
        info: KernelInfo,
        left: Any,
        right: Any,
        *,
        left_map: Callable[[np.ndarray], np.ndarray],
        right_map: Callable[[np.ndarray], np.ndarray],
        dtype: Any,
        left_projection: np.ndarray | None = None,
        right_projection: np.ndarray | None = None,
    ) -> None:
        super().__init__(geometry, info, dtype)
        # the placement: None on the host, else the caller's device, where the factors live
        self._on = DeviceArrays(geometry.context) if geometry.computes_on_device() else None
        self._fetched: dict[str, np.ndarray] = {}  # a device placement's NumPy copies
        self._left_held, self._right_held = self._hold(left), self._hold(right)
        info.rank = int(left.shape[1])
        info.capabilities = info.capabilities | {"factors", "out_of_sample"}
        self._maps = (left_map, right_map)
        self._projections = (left_projection, right_projection)

    def _hold(self, factor: Any) -> Any:
        """A factor as stored: contiguous, in ``dtype``, on the placement's device (a NumPy
        factor is copied there; one built there is kept)."""
        if self._on is None:
            return np.ascontiguousarray(factor, dtype=self.dtype)
        return self._on.put(factor, self.dtype) if isinstance(factor, np.ndarray) else factor

    @property
    def on_device(self) -> bool:
        """Whether the factors and products live on the caller's device."""
        return self._on is not None

    def _host_factor(self, name: str) -> np.ndarray:
        held = getattr(self, f"_{name}_held")
        if self._on is None:
            return held
        if name not in self._fetched:
            host = self._on.context.to_host(held)
            self._fetched[name] = np.ascontiguousarray(host, dtype=self.dtype)
        return self._fetched[name]

    @property
    def left(self) -> np.ndarray:
        """``A`` as a NumPy array."""
        return self._host_factor("left")

    @property
    def right(self) -> np.ndarray:
        """``B`` as a NumPy array."""
        return self._host_factor("right")

    @property
    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A, B)`` with ``K ~ A B^T``."""
        return self.left, self.right

    def _factor(self, side: str) -> Any:
        """The stored factor of a side (``'rows'``: ``A``), where the products run."""
        return self._left_held if side == "rows" else self._right_held

    def _product(self, first: Any, second: Any, values: Any) -> np.ndarray:
        """``first @ (second.T @ values)`` where the factors live, float64 on the host."""
        if self._on is None:
            inner = second.T @ values.astype(self.dtype, copy=False)
            return (first @ inner).astype(np.float64, copy=False)
        return self._on.get(first @ (second.T @ self._on.put(values, self.dtype)))

    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False)
        return self._product(self._left_held, self._right_held, V)

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False)
        return self._product(self._right_held, self._left_held, U)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        if self._on is None:
            return (self.left[index] @ self.right.T).astype(np.float64, copy=False)
        return self._on.get(self._take(self._left_held, index) @ self._right_held.T)

    def _take(self, factor: Any, index: Any) -> Any:
        """Rows ``index`` (integers, a mask or a slice) of a stored factor, where it lives."""
        if self._on is None:
            return factor[index]
        rows = np.arange(factor.shape[0])[index].ravel()
        return self._on.xp.take(factor, self._on.put(rows, np.int64), axis=0)

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        fitted_other = self.left if transpose else self.right
        feature_map = self._maps[1 if transpose else 0]
        projection = self._projections[1 if transpose else 0]
        inner = fitted_other.T @ values.astype(self.dtype)
        if projection is not None:
            inner = projection.astype(self.dtype, copy=False) @ inner
        out = np.empty((points.shape[0], *inner.shape[1:]))
        step = max(1, NEW_POINTS_BLOCK_ENTRIES // max(1, inner.shape[0]))
        for start in range(0, points.shape[0], step):
            rows = slice(start, start + step)
            out[rows] = feature_map(points[rows]) @ inner
        return out

    def fused_pass(
        self,
        side: str,
        w: np.ndarray,
        numerator: np.ndarray,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> FusedPass:
        refuse_log(self, log)
        factor = self._factor(side)
        if self._on is None:  # threaded row blocks on the host
            return matrix_fused_pass(factor, w, numerator, self.dtype, step)
        with np.errstate(over="ignore", invalid="ignore"):
            products = self._on.get(factor @ self._on.put(w, self.dtype))
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
        projection = self._on.get(self._on.put(ratios, self.dtype) @ factor)
        return FusedPass(products, ratios, projection, bad)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        refuse_log(self, log)
        factor = self._factor(side)
        if index is not None:
            factor = self._take(factor, index)
        if self._on is None:
            return (values.astype(self.dtype) @ factor).astype(np.float64)
        return self._on.get(self._on.put(values, self.dtype) @ factor)


@dataclass(frozen=True)
class FactorMaps:
    """A fitted low-rank kernel before its factors are built: the row maps and the
    out-of-sample maps, so that any geometry can apply them (to every row at once in
    memory, chunk by chunk where the clouds are chunked).

    Attributes
    ----------
    info : KernelInfo
    left_factor, right_factor : callable
        ``A = left_factor(X)`` and ``B = right_factor(Y)`` row by row, from uncentred
        points, with the fitted state.
    left_map, right_map, left_projection, right_projection
        The out-of-sample maps (see :class:`LowRankKernel`).
    dtype : numpy dtype
    attributes : mapping
        Set on the operator once built (e.g. ``sketch``, the fitted sketch).
    device_left_factor, device_right_factor : callable, optional
        ``A`` (``B``) of uncentred host points built on the device of a
        :class:`~sketchot._arrays.DeviceArrays` (its Array API namespace), in ``dtype``, the
        same numbers as ``left_factor`` (``right_factor``) to rounding; ``None``: built on the
        host and copied there.
    """

    info: KernelInfo
    left_factor: Callable[[np.ndarray], np.ndarray]
    right_factor: Callable[[np.ndarray], np.ndarray]
    left_map: Callable[[np.ndarray], np.ndarray]
    right_map: Callable[[np.ndarray], np.ndarray]
    dtype: Any
    left_projection: np.ndarray | None = None
    right_projection: np.ndarray | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    device_left_factor: Callable[[DeviceArrays, np.ndarray], Any] | None = None
    device_right_factor: Callable[[DeviceArrays, np.ndarray], Any] | None = None

    def operator_arguments(self) -> dict[str, Any]:
        """The keyword arguments of :class:`LowRankKernel` besides the factors."""
        return {
            "left_map": self.left_map,
            "right_map": self.right_map,
            "dtype": self.dtype,
            "left_projection": self.left_projection,
            "right_projection": self.right_projection,
        }


def low_rank_from_maps(geometry: GibbsGeometry, maps: FactorMaps) -> LowRankKernel:
    """The in-memory operator of fitted maps: ``A = left_factor(X)``, ``B = right_factor(Y)``."""
    if not geometry.computes_on_device():
        left, right = maps.left_factor(geometry.X), maps.right_factor(geometry.Y)
        operator = LowRankKernel(geometry, maps.info, left, right, **maps.operator_arguments())
    else:  # e.g. CUDA tensors: the products run there, the factors are built there if they can
        on = DeviceArrays(geometry.context)
        if maps.device_left_factor is not None and maps.device_right_factor is not None:
            left = maps.device_left_factor(on, geometry.X)
            right = maps.device_right_factor(on, geometry.Y)
        else:
            left, right = maps.left_factor(geometry.X), maps.right_factor(geometry.Y)
        operator = LowRankKernel(geometry, maps.info, left, right, **maps.operator_arguments())
    for name, value in maps.attributes.items():
        setattr(operator, name, value)
    return operator
