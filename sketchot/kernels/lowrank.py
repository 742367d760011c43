"""The one operator every low-rank backend builds: ``K ~ A B^T``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from .._validation import check_choice
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


class FactorPlacement(ABC):
    """Where a :class:`LowRankKernel`'s factors live and its products run: the kernel holds
    one and hands it every placement-specific step (:class:`HostFactors`, NumPy;
    :class:`DeviceFactors`, the caller's device; ``sketchot.distributed.DaskFactors``, Dask
    arrays on a cluster).

    Attributes
    ----------
    deferred : bool
        The passes are lazy (:class:`~sketchot.kernels.base.DeferredPass`): the kernel
        declares the ``'deferred'`` capability.
    on_device : bool
        The factors and products live on the caller's device (``kernel.on_device``).
    """

    deferred: bool = False
    on_device: bool = False

    @abstractmethod
    def hold(self, factor: Any, dtype: Any) -> Any:
        """A factor as stored here, in ``dtype``."""

    @abstractmethod
    def to_host(self, held: Any, dtype: Any) -> Any:
        """A stored factor as ``left``/``right`` show it (the kernel keeps the result)."""

    def operand(self, values: Any, length: int, name: str) -> Any:
        """The operand of ``matmat``/``rmatmat`` as :meth:`product` takes it: checked
        NumPy values of shape (length,) or (length, k)."""
        return check_operand(values, length, name, vector=False)

    @abstractmethod
    def product(self, first: Any, second: Any, values: Any, dtype: Any) -> Any:
        """``first @ (second.T @ values)`` with stored factors, float64."""

    @abstractmethod
    def rows(self, left: Any, right: Any, index: np.ndarray) -> np.ndarray:
        """Dense rows ``(left @ right.T)[index]`` of stored factors, float64 on the host."""

    def apply_new(self, kernel: LowRankKernel, points: Any, values: Any, side: str) -> Any:
        """Out-of-sample products: checked as every operator checks them (NumPy points),
        then computed on the host by the kernel's maps (``kernel._apply_new``)."""
        return KernelOperator.apply_new(kernel, points, values, side=side)

    @abstractmethod
    def fused_pass(
        self,
        kernel: LowRankKernel,
        side: str,
        factor: Any,
        w: Any,
        numerator: Any,
        step: RatioStep,
    ) -> Any:
        """One linear-domain pass over the stored ``factor`` of ``side`` (see
        :meth:`KernelOperator.fused_pass`)."""

    @abstractmethod
    def project(self, kernel: LowRankKernel, factor: Any, values: Any, index: Any) -> Any:
        """``factor[index]^T values`` (``index=None``: every row) of a stored factor."""


class HostFactors(FactorPlacement):
    """NumPy factors in host memory: NumPy's products, threaded fused passes."""

    def hold(self, factor: Any, dtype: Any) -> np.ndarray:
        return np.ascontiguousarray(factor, dtype=dtype)

    def to_host(self, held: np.ndarray, dtype: Any) -> np.ndarray:
        return held

    def product(self, first: Any, second: Any, values: Any, dtype: Any) -> np.ndarray:
        inner = second.T @ values.astype(dtype, copy=False)
        return (first @ inner).astype(np.float64, copy=False)

    def rows(self, left: Any, right: Any, index: np.ndarray) -> np.ndarray:
        return (left[index] @ right.T).astype(np.float64, copy=False)

    def take(self, factor: Any, index: Any) -> Any:
        """Rows ``index`` (integers, a mask or a slice) of a stored factor."""
        return factor[index]

    def fused_pass(
        self,
        kernel: LowRankKernel,
        side: str,
        factor: Any,
        w: np.ndarray,
        numerator: np.ndarray,
        step: RatioStep,
    ) -> FusedPass:
        # threaded row blocks on the host
        return matrix_fused_pass(factor, w, numerator, kernel.dtype, step)

    def project(self, kernel: LowRankKernel, factor: Any, values: Any, index: Any) -> np.ndarray:
        if index is not None:
            factor = self.take(factor, index)
        return (values.astype(kernel.dtype) @ factor).astype(np.float64)


class DeviceFactors(FactorPlacement):
    """Factors on the caller's device (CUDA tensors, JAX, ...): every product runs there
    through the library's Array API namespace and moves ``O(n + m)`` numbers.

    Parameters
    ----------
    on : DeviceArrays
        The host <-> device moves of the caller's context.
    """

    on_device = True

    def __init__(self, on: DeviceArrays) -> None:
        self.on = on

    def hold(self, factor: Any, dtype: Any) -> Any:
        # a NumPy factor is copied there once; one built there is kept
        return self.on.put(factor, dtype) if isinstance(factor, np.ndarray) else factor

    def to_host(self, held: Any, dtype: Any) -> np.ndarray:
        return np.ascontiguousarray(self.on.context.to_host(held), dtype=dtype)

    def product(self, first: Any, second: Any, values: Any, dtype: Any) -> np.ndarray:
        return self.on.get(first @ (second.T @ self.on.put(values, dtype)))

    def rows(self, left: Any, right: Any, index: np.ndarray) -> np.ndarray:
        return self.on.get(self.take(left, index) @ right.T)

    def take(self, factor: Any, index: Any) -> Any:
        """Rows ``index`` (integers, a mask or a slice) of a stored factor, on the device."""
        rows = np.arange(factor.shape[0])[index].ravel()
        return self.on.xp.take(factor, self.on.put(rows, np.int64), axis=0)

    def fused_pass(
        self,
        kernel: LowRankKernel,
        side: str,
        factor: Any,
        w: np.ndarray,
        numerator: np.ndarray,
        step: RatioStep,
    ) -> FusedPass:
        on, dtype = self.on, kernel.dtype
        with np.errstate(over="ignore", invalid="ignore"):
            products = on.get(factor @ on.put(w, dtype))
            ratios, bad = fast_ratios_and_bad(numerator, products, step)
        projection = on.get(on.put(ratios, dtype) @ factor)
        return FusedPass(products, ratios, projection, bad)

    def project(self, kernel: LowRankKernel, factor: Any, values: Any, index: Any) -> np.ndarray:
        if index is not None:
            factor = self.take(factor, index)
        return self.on.get(self.on.put(values, kernel.dtype) @ factor)


def default_placement(geometry: GibbsGeometry) -> FactorPlacement:
    """Where an in-memory geometry's factors live: on the caller's device where the geometry
    computes there (:meth:`~sketchot.gibbs.GibbsGeometry.computes_on_device`), else NumPy."""
    if geometry.computes_on_device():
        return DeviceFactors(DeviceArrays(geometry.context))
    return HostFactors()


class LowRankKernel(KernelOperator):
    """``K ~ A B^T`` from factors ``A`` (n x r) and ``B`` (m x r), held where its placement
    says: the one low-rank operator, in memory, on a device or on Dask arrays.

    Parameters
    ----------
    geometry : GibbsGeometry
        Its ``context`` gives the default placement: NumPy's products on the host, or, where
        the geometry computes on the caller's device (:meth:`~sketchot.gibbs.GibbsGeometry.
        computes_on_device`: CUDA tensors, JAX, ...), the factors held there and every
        product run there through the library's Array API namespace.
    info : KernelInfo
        ``rank`` is set from the factors; ``'factors'`` and ``'out_of_sample'`` are added to
        the capabilities, and ``'deferred'`` where the placement's passes are lazy.
    left, right : array
        ``A`` and ``B`` (stored in ``dtype``): NumPy arrays, or arrays already where the
        placement holds them (built on a device by the backend's maps:
        :attr:`FactorMaps.device_left_factor`, NumPy ones copied there once; persisted Dask
        arrays for ``sketchot.distributed.DaskFactors``).
    left_map, right_map : callable
        Feature maps of new points: ``left_map(X_new) @ left_projection`` are the rows of
        ``A`` for ``X_new`` (likewise on the right), with the fitted randomness.
    left_projection, right_projection : ndarray, optional
        Fixed matrix applied after the map (``None``: identity). Products with new points fold
        it into the small side, which matters when the map is wider than the rank (Nystrom:
        ``K(x, Z)`` then whitening).
    dtype : numpy dtype
    placement : FactorPlacement, optional
        Where the factors live and the products run (``None``: :func:`default_placement`
        of the geometry).

    Attributes
    ----------
    placement : FactorPlacement
    left, right : ndarray
        ``A`` and ``B`` as NumPy arrays (on a device placement, copies fetched when first
        read: for users, POT and the host-side helpers, so the host holds no factor unless
        asked; on Dask, the persisted Dask arrays).

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
        placement: FactorPlacement | None = None,
    ) -> None:
        super().__init__(geometry, info, dtype)
        self.placement = default_placement(geometry) if placement is None else placement
        self._fetched: dict[str, Any] = {}  # the factors as left/right show them, once read
        self._left_held = self.placement.hold(left, self.dtype)
        self._right_held = self.placement.hold(right, self.dtype)
        info.rank = int(left.shape[1])
        added = {"factors", "out_of_sample"}
        if self.placement.deferred:  # lazy passes: the solver chains them between checks
            added.add("deferred")
        info.capabilities = info.capabilities | added
        self._maps = (left_map, right_map)
        self._projections = (left_projection, right_projection)

    @property
    def on_device(self) -> bool:
        """Whether the factors and products live on the caller's device."""
        return self.placement.on_device

    @property
    def rank(self) -> int:
        """Number of features ``r``."""
        return self.info.rank

    def _host_factor(self, name: str) -> Any:
        if name not in self._fetched:
            held = getattr(self, f"_{name}_held")
            self._fetched[name] = self.placement.to_host(held, self.dtype)
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

    def factor(self, side: str) -> Any:
        """The stored factor of a side (``'rows'``: ``A``, ``'cols'``: ``B``), where the
        products run."""
        return self._left_held if side == "rows" else self._right_held

    _factor = factor

    def matmat(self, V: Any) -> Any:
        V = self.placement.operand(V, self.shape[1], "V")
        return self.placement.product(self._left_held, self._right_held, V, self.dtype)

    def rmatmat(self, U: Any) -> Any:
        U = self.placement.operand(U, self.shape[0], "U")
        return self.placement.product(self._right_held, self._left_held, U, self.dtype)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return self.placement.rows(self._left_held, self._right_held, index)

    def apply_new(self, points: Any, values: Any, *, side: str = "source") -> Any:
        """Out-of-sample products (see :meth:`KernelOperator.apply_new`), where the placement
        takes them (on Dask, Dask points give a Dask array)."""
        return self.placement.apply_new(self, points, values, side)

    def new_points_map(self, side: str) -> tuple[Callable[[np.ndarray], np.ndarray], Any]:
        """``(feature_map, projection)`` of new points of a side (``'source'``: rows of
        ``A``, ``'target'``: rows of ``B``): ``feature_map(X_new) @ projection`` are their
        factor rows (``projection`` ``None``: the identity), with the fitted randomness."""
        check_choice(side, "side", ("source", "target"))
        index = 1 if side == "target" else 0
        return self._maps[index], self._projections[index]

    def _apply_new(self, points: np.ndarray, values: np.ndarray, transpose: bool) -> np.ndarray:
        fitted_other = self.left if transpose else self.right
        feature_map, projection = self.new_points_map("target" if transpose else "source")
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
        w: Any,
        numerator: Any,
        *,
        log: bool = False,
        step: RatioStep = IDENTITY_STEP,
    ) -> Any:
        """One pass over ``A`` (``'rows'``) or ``B`` (``'cols'``), run by the placement
        (see :meth:`KernelOperator.fused_pass`; lazy where the placement is deferred)."""
        refuse_log(self, log)
        return self.placement.fused_pass(self, side, self.factor(side), w, numerator, step)

    def project(self, side: str, values: Any, index: Any = None, *, log: bool = False) -> Any:
        refuse_log(self, log)
        return self.placement.project(self, self.factor(side), values, index)


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
    placement = default_placement(geometry)
    device_built = maps.device_left_factor is not None and maps.device_right_factor is not None
    if isinstance(placement, DeviceFactors) and device_built:
        # e.g. CUDA tensors: the products run there, and the factors are built there
        left = maps.device_left_factor(placement.on, geometry.X)
        right = maps.device_right_factor(placement.on, geometry.Y)
    else:
        left, right = maps.left_factor(geometry.X), maps.right_factor(geometry.Y)
    operator = LowRankKernel(
        geometry, maps.info, left, right, **maps.operator_arguments(), placement=placement
    )
    for name, value in maps.attributes.items():
        setattr(operator, name, value)
    return operator
