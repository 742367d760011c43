"""Where the products run: the per-point arrays of one side in NumPy on the host, or copies
on another Array API library's device, behind one small interface (``xp`` and a few
gathers), so that the products are written once.

The sides (``clusters._Side``) and batches (``clusters._Batch``) these arrays serve are
typed ``Any`` here: ``clusters`` builds the arrays, so this module does not import it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .fit import _FEATURE_MEMORY_SHARE

if TYPE_CHECKING:
    from ..._arrays import DeviceArrays

# Bytes for the per-group rank-R moments G (source clusters x R x target clusters): large
# enough for BLAS efficiency, small enough to keep the memory flat at n = 1e6.
_MOMENT_BYTES = 1 << 26
# On a device: the moments take this share of its free memory (at least _MOMENT_BYTES, at
# most _DEVICE_MOMENT_BYTES): larger groups, fewer and larger batched products.
_DEVICE_MOMENT_SHARE = 1 / 16
_DEVICE_MOMENT_BYTES = 1 << 30


class _HostArrays:
    """The per-point arrays of one side that products read, in NumPy on the host (the side's
    own, and its padded batches' features within the side's budget).

    :class:`_DeviceArrays` keeps copies on the caller's device behind the same small
    interface, so that :func:`_apply` is written once against the Array API (``xp``).
    """

    xp = np
    on_host = True

    def __init__(self, side: Any) -> None:
        self.side = side
        self.local, self.base, self.points = side.local, side.base, side.points

    def put(self, array: np.ndarray) -> np.ndarray:
        return array

    def get(self, array: np.ndarray) -> np.ndarray:
        return array

    def put_index(self, index: np.ndarray) -> np.ndarray:
        return index

    def moment_bytes(self) -> int:
        """Bytes a group's moments may take (they size the groups)."""
        return _MOMENT_BYTES

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape)

    def full(self, shape: tuple[int, ...], value: float) -> np.ndarray:
        return np.full(shape, value)

    def assign(self, target: np.ndarray, index: Any, value: Any) -> np.ndarray:
        """``target[index] = value``; the caller keeps the array returned (a new one on a
        library whose arrays are immutable: :meth:`~sketchot._arrays.DeviceArrays.assign`)."""
        target[index] = value
        return target

    def gather(self, batch: Any, values: np.ndarray) -> np.ndarray:
        return batch.gather(values)

    def padding(self, batch: Any) -> np.ndarray:
        return batch.padding

    def take_valid(self, batch: Any, values: np.ndarray) -> np.ndarray:
        """The real rows of padded ``values`` (clusters, size, ...), cluster by cluster."""
        return values[batch.valid]

    def batch_features(self, batch: Any) -> np.ndarray:
        return self.side.batch_features(batch)

    def block_features(self, rows: slice) -> np.ndarray:
        return self.side.block_features(rows)


class _DeviceArrays(_HostArrays):
    """Copies of one side's per-point arrays on the caller's device
    (:class:`~sketchot._arrays.DeviceArrays`, float64), with each batch's padded row index
    and mask kept there. Where the side stores its features they are computed there from
    the local coordinates (``O(n R)`` on the device instead of moving ``n R`` numbers) when
    they fit ``_FEATURE_MEMORY_SHARE`` of the device's free memory, and recomputed there
    block by block otherwise, as when the side does not store them; padded batches'
    features are kept within the side's budget and what that share leaves.

    Memory on the device: ``O(n d)``, plus ``O(n R)`` within the share.
    """

    on_host = False

    def __init__(self, side: Any, on: DeviceArrays) -> None:
        self.side, self.on, self.xp = side, on, on.xp
        self.local, self.base = on.put(side.local), on.put(side.base)
        self.points = on.put(side.points)
        plan = side.plan
        self._parents = [on.put(p, np.int64) for p in plan.parents]
        self._coords = [on.put(c, np.int64) for c in plan.coords]
        self._scale = on.put(plan.scale)
        free = on.free_bytes()
        share = side.padded_budget if free is None else int(_FEATURE_MEMORY_SHARE * free)
        stored = 0 if side.features is None else side.features.nbytes
        self.features = None
        if side.features is not None and (free is None or stored <= share):
            self.features = self._monomials(self.local)
            share -= stored if free is not None else 0
        self._padded_budget = min(side.padded_budget, max(share, 0))
        # fixed here, so that every product groups the clusters alike
        self._moment_bytes = _MOMENT_BYTES
        if free is not None:
            moments = max(_MOMENT_BYTES, _DEVICE_MOMENT_SHARE * free)
            self._moment_bytes = int(min(_DEVICE_MOMENT_BYTES, moments))
        self._index: dict[bytes, tuple[Any, Any]] = {}
        self._padded: dict[bytes, Any] = {}
        self._padded_bytes = 0

    def put(self, array: np.ndarray) -> Any:
        return self.on.put(array)

    def get(self, array: Any) -> np.ndarray:
        return self.on.get(array)

    def put_index(self, index: np.ndarray) -> Any:
        return self.on.put(index, np.int64)

    def moment_bytes(self) -> int:
        return self._moment_bytes

    def empty(self, shape: tuple[int, ...]) -> Any:
        return self.xp.empty(shape, dtype=self.on.float_dtype(), device=self.local.device)

    def full(self, shape: tuple[int, ...], value: float) -> Any:
        return self.xp.full(shape, value, dtype=self.on.float_dtype(), device=self.local.device)

    def assign(self, target: Any, index: Any, value: Any) -> Any:
        return self.on.assign(target, index, value)

    def _padded_rows(self, batch: Any) -> tuple[Any, Any, Any]:
        """The batch's padded row index, padding offsets and real positions, kept on the
        device (gathers by integer index: no boolean mask, whose shape a GPU must wait for)."""
        key = batch.ids.tobytes()
        if key not in self._index:
            self._index[key] = (
                self.put_index(batch.index.ravel()),
                self.put(batch.padding),
                self.put_index(np.flatnonzero(batch.valid.ravel())),
            )
        return self._index[key]

    def gather(self, batch: Any, values: Any) -> Any:
        if batch.index is None:
            return values[batch.rows, ...][None, ...]
        flat = self.xp.take(values, self._padded_rows(batch)[0], axis=0)
        return self.xp.reshape(flat, (*batch.index.shape, *values.shape[1:]))

    def padding(self, batch: Any) -> Any:
        return self._padded_rows(batch)[1]

    def take_valid(self, batch: Any, values: Any) -> Any:
        flat = self.xp.reshape(values, (-1, *values.shape[2:]))
        return self.xp.take(flat, self._padded_rows(batch)[2], axis=0)

    def batch_features(self, batch: Any) -> Any:
        if batch.index is None:
            return self.block_features(batch.rows)[None, ...]
        key = batch.ids.tobytes()
        cached = self._padded.get(key)
        if cached is None:
            if self.features is not None:
                cached = self.gather(batch, self.features)
            else:
                cached = self._monomials(self.gather(batch, self.local))
            nbytes = cached.shape[0] * cached.shape[1] * cached.shape[2] * 8
            if self._padded_bytes + nbytes <= self._padded_budget:
                self._padded[key] = cached
                self._padded_bytes += nbytes
        return cached

    def block_features(self, rows: slice) -> Any:
        if self.features is not None:
            return self.features[rows, ...]
        return self._monomials(self.local[rows, ...])

    def _monomials(self, local: Any) -> Any:
        """:func:`_local_monomials` of ``local`` (any leading shape) on the device: one
        gather-multiply per degree along the last axis, ``O(n R)``."""
        xp = self.xp
        U = local * float(np.sqrt(2.0 / self.side.reg))
        columns, previous = [xp.ones_like(U[..., :1]), U], U
        for parents, coords in zip(self._parents, self._coords, strict=True):
            previous = xp.take(previous, parents, axis=-1) * xp.take(U, coords, axis=-1)
            columns.append(previous)
        return xp.concat(columns, axis=-1) * self._scale
