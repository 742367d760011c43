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
    """``K ~ A B^T`` from factors ``A`` (n x r) and ``B`` (m x r).

    Parameters
    ----------
    geometry : GibbsGeometry
    info : KernelInfo
        ``rank`` is set from the factors; ``'factors'`` and ``'out_of_sample'`` are added to
        the capabilities.
    left, right : ndarray
        ``A`` and ``B`` (stored in ``dtype``).
    left_map, right_map : callable
        Feature maps of new points: ``left_map(X_new) @ left_projection`` are the rows of
        ``A`` for ``X_new`` (likewise on the right), with the fitted randomness.
    left_projection, right_projection : ndarray, optional
        Fixed matrix applied after the map (``None``: identity). Products with new points fold
        it into the small side, which matters when the map is wider than the rank (Nystrom:
        ``K(x, Z)`` then whitening).
    dtype : numpy dtype

    Notes
    -----
    Memory ``O((n + m) r)``; every product ``O((n + m) r)``; no ``n x m`` array except by an
    explicit :meth:`to_dense`. ``factors`` can be given to POT's
    ``ot.lowrank.sinkhorn_low_rank_kernel(A, B, a, b)``.
    """

    def __init__(
        self,
        geometry: GibbsGeometry,
        info: KernelInfo,
        left: np.ndarray,
        right: np.ndarray,
        *,
        left_map: Callable[[np.ndarray], np.ndarray],
        right_map: Callable[[np.ndarray], np.ndarray],
        dtype: Any,
        left_projection: np.ndarray | None = None,
        right_projection: np.ndarray | None = None,
    ) -> None:
        super().__init__(geometry, info, dtype)
        self.left, self.right = self._hold(left), self._hold(right)
        info.rank = int(left.shape[1])
        info.capabilities = info.capabilities | {"factors", "out_of_sample"}
        self._maps = (left_map, right_map)
        self._projections = (left_projection, right_projection)

    def _hold(self, factor: Any) -> np.ndarray:
        """A factor as stored: contiguous, in ``dtype``."""
        return np.ascontiguousarray(factor, dtype=self.dtype)

    @property
    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A, B)`` with ``K ~ A B^T``."""
        return self.left, self.right

    def matmat(self, V: Any) -> np.ndarray:
        V = check_operand(V, self.shape[1], "V", vector=False)
        inner = self.right.T @ V.astype(self.dtype, copy=False)
        return (self.left @ inner).astype(np.float64, copy=False)

    def rmatmat(self, U: Any) -> np.ndarray:
        U = check_operand(U, self.shape[0], "U", vector=False)
        inner = self.left.T @ U.astype(self.dtype, copy=False)
        return (self.right @ inner).astype(np.float64, copy=False)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return (self.left[index] @ self.right.T).astype(np.float64, copy=False)

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

    def _factor(self, side: str) -> np.ndarray:
        return self.left if side == "rows" else self.right

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
        return matrix_fused_pass(self._factor(side), w, numerator, self.dtype, step)

    def project(
        self, side: str, values: np.ndarray, index: Any = None, *, log: bool = False
    ) -> np.ndarray:
        refuse_log(self, log)
        factor = self._factor(side)
        if index is not None:
            factor = factor[index]
        return (values.astype(self.dtype) @ factor).astype(np.float64)


class DeviceLowRankKernel(LowRankKernel):
    """``K ~ A B^T`` with the factors held on the caller's device, where every product runs.

    ``left`` and ``right`` may be given on that device (built there by the backend's maps:
    :attr:`FactorMaps.device_left_factor`) or as NumPy arrays (copied there once). The
    attributes ``left``, ``right`` and ``factors`` are NumPy copies, fetched when first read
    (for users, POT and the host-side helpers: rows of the kernel, new points), so the host
    holds no factor unless asked.
    """

    def __init__(self, geometry: GibbsGeometry, *args: Any, **kwargs: Any) -> None:
        self._on = DeviceArrays(geometry.context)
        self._host: dict[str, np.ndarray] = {}  # the NumPy copies fetched so far
        super().__init__(geometry, *args, **kwargs)  # sets left and right: kept on the device

    def _hold(self, factor: Any) -> Any:
        """The factor on the device, in ``dtype`` (a NumPy factor is copied there)."""
        if isinstance(factor, np.ndarray):
            return self._on.put(factor, self.dtype)
        return factor

    def _fetch(self, name: str) -> np.ndarray:
        if name not in self._host:
            host = self._on.context.to_host(getattr(self, f"_{name}_d"))
            self._host[name] = np.ascontiguousarray(host, dtype=self.dtype)
        return self._host[name]

    def _store(self, name: str, factor: Any) -> None:
        setattr(self, f"_{name}_d", factor)
        self._host.pop(name, None)

    left = property(
        lambda self: self._fetch("left"),
        lambda self, factor: self._store("left", factor),
        doc="``A`` as a NumPy array (fetched from the device when first read).",
    )
    right = property(
        lambda self: self._fetch("right"),
        lambda self, factor: self._store("right", factor),
        doc="``B`` as a NumPy array (fetched from the device when first read).",
    )

    def _factor_d(self, side: str) -> Any:
        return self._left_d if side == "rows" else self._right_d

    def matmat(self, V: Any) -> np.ndarray:
        V = self._on.put(check_operand(V, self.shape[1], "V", vector=False), self.dtype)
        return self._on.get(self._left_d @ (self._right_d.T @ V))

    def rmatmat(self, U: Any) -> np.ndarray:
        U = self._on.put(check_operand(U, self.shape[0], "U", vector=False), self.dtype)
        return self._on.get(self._right_d @ (self._left_d.T @ U))

    def fused_pass(self, side, w, numerator, *, log=False, step=IDENTITY_STEP) -> FusedPass:
        if log:
            return super().fused_pass(side, w, numerator, log=log, step=step)
        factor = self._factor_d(side)
        with np.errstate(over="ignore", invalid="ignore"):
            products = self._on.get(factor @ self._on.put(w, self.dtype))
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
        projection = self._on.get(self._on.put(ratios, self.dtype) @ factor)
        return FusedPass(products, ratios, projection, bad)

    def project(self, side, values, index=None, *, log=False) -> np.ndarray:
        refuse_log(self, log)
        factor = self._factor_d(side)
        if index is not None:
            factor = self._take(factor, index)
        return self._on.get(self._on.put(values, self.dtype) @ factor)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self._on.get(self._take(self._left_d, index) @ self._right_d.T)

    def _take(self, factor: Any, index: Any) -> Any:
        """Rows ``index`` (integers, a mask or a slice) of a device factor, on the device."""
        rows = np.arange(factor.shape[0])[index].ravel()
        return self._on.xp.take(factor, self._on.put(rows, np.int64), axis=0)


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
        operator = DeviceLowRankKernel(
            geometry, maps.info, left, right, **maps.operator_arguments()
        )
    for name, value in maps.attributes.items():
        setattr(operator, name, value)
    return operator
